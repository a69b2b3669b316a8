"""Running an ensemble (engine.ensemble): its members' cases in threads that take turns (engine.ensemble_members),
the paused members' tasks trained together (engine.ensemble_step), and each member's record stamped with how
it ran."""
from __future__ import annotations

import threading

import torch

from ..method import MethodError
from .ensemble_members import _fit_hook, _local, _Member
from .ensemble_step import _train_task


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
    """The members' records, each saying it ran in an ensemble of E, with its share of the training time (its
    FLOPs are its solo run's: counted by its own meter, ensemble_step)."""
    E = len(members)
    for m in members:
        m.record.extra["executor"] = f"ensemble:{E}"
        m.record.extra["ensemble_train_seconds"] = m.ensemble_seconds
        m.record.train_seconds = m.train_seconds
    return [m.record for m in members]
