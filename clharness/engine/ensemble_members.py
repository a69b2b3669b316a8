"""The members of an ensemble (engine.ensemble): each runs its case in a thread of its own, by the runner's
own ``run_case``, and pauses where its ``learn`` hands its batches to ``fit`` (``_fit_hook``), until the
coordinator has trained every paused member's task (engine.ensemble_step). The threads take turns (never two
at once): a baton handed by semaphores, each member's global random streams saved and restored at every
hand-over, so the interleaving changes nothing a member computes."""
from __future__ import annotations

import functools
import random
import threading

import numpy as np
import torch

from ..method import MethodError
from .ensemble_policy import _steps
from .flops import NOT_COUNTED

_local = threading.local()


def _rng_state():
    return random.getstate(), np.random.get_state(), torch.get_rng_state()


def _set_rng(state) -> None:
    random.setstate(state[0])
    np.random.set_state(state[1])
    torch.set_rng_state(state[2])


class _Member:
    def __init__(self, case, coordinator: threading.Semaphore):
        self.case = case
        self.turn = threading.Semaphore(0)
        self.coordinator = coordinator
        self.method = None
        self.batches = None
        self.error: BaseException | None = None      # raised in the member at its resume (Diverged)
        self.crash: BaseException | None = None      # escaped run_case (KeyboardInterrupt)
        self.record = None
        self.done = False
        self.step = None     # this task's (prepare, loss name, after), _step; None: the method's loss
        self.rng = None      # its global random streams while paused
        self.train_seconds = 0.0     # its share of the ensemble's training time
        self.ensemble_seconds = 0.0  # the ensemble's training time while it was a member

    def pause(self) -> None:
        """Hand the baton to the coordinator; resume when it hands it back (its random streams as it
        left them, or as its ``prepare`` and ``after`` calls left them, ``_in_member``)."""
        self.rng = _rng_state()
        self.coordinator.release()
        self.turn.acquire()
        _set_rng(self.rng)


def _in_member(member: _Member, f, *args):
    """``f(*args)``, the member's own Python (a replay draw, a store), in the member's random streams."""
    if member.rng is None:   # not paused (a test drives _train_task directly)
        return f(*args)
    _set_rng(member.rng)
    try:
        return f(*args)
    finally:
        member.rng = _rng_state()


def _step(method, loss_fn):
    """``fit``'s ``loss_fn`` (a bound method of ``method`` named in its ensemble_steps, or a partial of one with
    keywords) as (prepare, loss name, after); None when it is not one."""
    kw = {}
    if isinstance(loss_fn, functools.partial) and not loss_fn.args:
        loss_fn, kw = loss_fn.func, loss_fn.keywords
    parts = _steps(type(method)).get(getattr(loss_fn, "__name__", None))
    if parts is None or getattr(loss_fn, "__self__", None) is not method:
        return None
    prepare, loss, after = parts
    return functools.partial(getattr(method, prepare), **kw), loss, after and getattr(method, after)


def _fit_hook(original):
    def fit(self, batches, loss_fn=None, params=None, trainer=None):
        member = getattr(_local, "member", None)
        if member is None:
            return original(self, batches, loss_fn, params, trainer)
        step = None if loss_fn is None else _step(self, loss_fn)
        if ((loss_fn is not None and step is None) or params is not None or trainer is not None
                or member.batches is not None):
            raise MethodError(f"method {self.name!r}: --clh-ensemble batches only one fit(batches) per task with "
                              "the default loss (or one its ensemble_steps declare), parameters and trainer; run it "
                              "without --clh-ensemble")
        member.method, member.batches, member.step = self, batches, step
        member.pause()
        error, member.error = member.error, None
        if error is not None:
            raise error
        return None
    fit.ensemble_hook = True
    return fit




def run_ensemble(cases: list, harness, device: torch.device, data_root=None, download: bool = False,
                 on_task=None) -> list:
    """Run ``cases`` (the same case but for the seed) as one ensemble; their records, in order."""
    from .runner import run_case
    method_classes = {harness.methods[c.method] for c in cases}
    saved = {cls: cls.__dict__.get("fit") for cls in method_classes}
    coordinator = threading.Semaphore(0)
    members = [_Member(c, coordinator) for c in cases]

    def body(member: _Member, report) -> None:
        _local.member = member
        member.turn.acquire()
        try:
            member.record = run_case(member.case, harness, device, data_root, download, report)
        except BaseException as exc:   # noqa: BLE001 - handed to the coordinator, re-raised there
            member.crash = exc
        finally:
            member.done = True
            coordinator.release()

    for cls in method_classes:
        cls.fit = _fit_hook(getattr(cls, "fit"))
    try:
        threads = [_start(member, body, on_task if i == 0 else None) for i, member in enumerate(members)]
        _train_rounds(members)
        for thread in threads:
            thread.join()
    finally:
        for cls, fit in saved.items():
            if fit is None:
                del cls.fit
            else:
                cls.fit = fit
    for m in members:
        if m.crash is not None:
            raise m.crash
    return _stamped(members)


def _start(member: _Member, body, report) -> threading.Thread:
    """The member's thread, run until it first pauses (at its first fit) or ends: one at a time."""
    thread = threading.Thread(target=body, args=(member, report), name=f"clh-ensemble-{member.case.seed}", daemon=True)
    thread.start()
    member.turn.release()
    member.coordinator.acquire()
    return thread


def _train_rounds(members: list[_Member]) -> None:
    """Until every member has ended: train the paused members' task together, then let each run on to its
    next fit, in turn. The ensemble's own failure fails every waiting member with it."""
    from .ensemble_step import _train_task
    while True:
        waiting = [m for m in members if not m.done]
        if not waiting:
            return
        try:
            _train_task(waiting)
        except Exception as exc:   # noqa: BLE001 - each member raises it at its resume
            for m in waiting:
                m.error = MethodError(f"ensemble training failed: {type(exc).__name__}: {exc}")
        for m in waiting:
            m.batches = None
            m.turn.release()
            m.coordinator.acquire()


def _stamped(members: list[_Member]) -> list:
    """The members' records, each saying it ran in an ensemble of E, with its share of the training time."""
    E = len(members)
    for m in members:
        m.record.extra["executor"] = f"ensemble:{E}"
        m.record.extra["ensemble_train_seconds"] = m.ensemble_seconds
        m.record.train_seconds = m.train_seconds
        # its fit ran in this thread, outside its own FLOP meter (engine.flops): no training count, never a wrong one
        m.record.train_gflops, m.record.extra["flops"] = None, NOT_COUNTED
    return [m.record for m in members]
