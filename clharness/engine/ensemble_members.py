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
from . import flops
from .ensemble_policy import _steps

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
        self.counting = None  # what counts its run's FLOPs (engine.flops.counting_here), lent while paused
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
    """``f(*args)``, the member's own Python (its loss, a replay draw, a store), in the member's random streams,
    its FLOPs counted by the member's own meters (``flops.counting_as``: as its solo run counts them)."""
    with flops.counting_as(member.counting):
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
        member.counting = flops.counting_here()   # its run's meters, for the work done for it while it waits
        member.pause()
        error, member.error = member.error, None
        if error is not None:
            raise error
        return None
    fit.ensemble_hook = True
    return fit
