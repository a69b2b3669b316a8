"""A session: the harness, the device, the results store, and running one case through the store.

Shared by every front end: the pytest plugin builds one per pytest session (and per xdist worker,
all with the controller's session id), ``clharness.run`` one per call. Nothing here knows pytest:
outcomes are raised as ``clharness.outcomes`` exceptions, and what a unit leaves behind goes to its
``properties`` list, which a front end reads.
"""
from __future__ import annotations

import time
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..results import REUSABLE, RunRecord
from .. import outcomes
from .family_session import FamilyServices


class ClhWarning(UserWarning):
    """Something a suite asked for that this session does not do."""


def note(message: str) -> None:
    warnings.warn(ClhWarning(message), stacklevel=3)


def _default(name: str):
    from .options import default
    return field(default_factory=lambda: default(name))


@dataclass
class Options:
    """What a session is asked to do: the pytest options ``--clh-*`` and ``clharness.run``'s arguments.
    Defaults, help and key rules are declared once, in ``engine.options.OPTIONS``."""
    results: str | Path = _default("results")
    fresh: bool = _default("fresh")
    reuse_stale: bool = _default("reuse-stale")      # reuse a record made by other code (said, never silent)
    quick: bool = _default("quick")
    seeds: int | None = _default("seeds")            # None: the suite's (or a family preset's)
    methods: tuple[str, ...] = ()                    # () : the suite's methods
    add_methods: tuple[str, ...] = ()                # run besides the suite's (or the selected) methods
    hparams: dict[str, dict[str, list]] = field(default_factory=dict)   # method -> name -> values (one case each)
    device: str = _default("device")
    data_root: str | None = None
    download: bool = _default("download")
    presets: tuple[str, ...] = ()                    # --clh-preset FAMILY:NAME
    plugins: tuple[str, ...] = ()                    # --clh-plugin MODULE
    cpus_per_run: float | None = _default("cpus-per-run")   # torch threads per run (and a Ray task's CPUs); None: 1
    save_models: str | None = _default("save-models")       # a folder for each case's final method state
    xdist_worker: bool = False               # this session is one pytest-xdist worker (its units are shared out)
    xdist_grouped: bool = False              # ... whose --dist keeps an ensemble's units on one worker (loadgroup)
    gate_timeout: float = _default("gate-timeout")
    compare: str | None = _default("compare")   # a saved scorecard JSON to gate against
    max_drops: dict[str, float] = field(default_factory=dict)
    # --clh-ensemble[=seeds|hparams] (True: seeds): cases differing only in seed (or float hyperparameters) train as
    # one batched model (engine.ensemble); None/False: as each suite's [suite] ensemble key says
    ensemble: bool | str | None = False


class Session(FamilyServices):   # FamilyServices: what a collecting family asks (kinds.FamilySession)
    """One session's state; ``reuse`` is the one place any executor decides to reuse a stored record,
    ``run_stored`` the one place a case's record is reused or made."""

    def __init__(self, options: Options, harness=None, session_id: str | None = None,
                 warn: Callable[[str], None] = note):
        self.options = options
        from .runner import set_cpu_threads, set_device
        set_cpu_threads(max(1, int(options.cpus_per_run or 1)))
        set_device(options.device)   # its type enters the record keys (engine.keys)
        self._harness = harness
        self._device = None
        self._store = None
        self._baseline = None
        self.warn = warn
        self.session_id = session_id or uuid.uuid4().hex
        self.remote = None          # an executor with result(key, case) (engine.ray_backend.RayExecutor)
        self.progress: Callable[[Any], Callable[[int, int], None] | None] | None = None   # unit -> on_task
        self.resources: dict[tuple[str, str], dict] = {}   # (suite, scenario) -> cpus/gpus_per_run
        self.units: list = []       # the units this session runs, in order (after -k, --lf)
        self.selected: set[str] = set()   # their record keys: waited for, never read stale
        self.stale_reused: dict[str, RunRecord] = {}   # key -> the record of other code --clh-reuse-stale gave it

    # --- what the session holds ---
    @property
    def harness(self):
        if self._harness is None:
            from ..plugins import Harness
            self._harness = Harness(plugins=tuple(self.options.plugins))
        return self._harness

    @property
    def device(self):
        if self._device is None:
            from .runner import pick_device
            self._device = pick_device(self.options.device)
        return self._device

    @property
    def store(self):
        if self._store is None:
            from ..results import ResultsStore
            self._store = ResultsStore(self.options.results, on_unreadable=self.warn)
        return self._store

    @property
    def baseline(self) -> dict:
        """``compare``: (suite, scenario, method) -> the saved scorecard's summary row."""
        if self._baseline is None:
            self._baseline = {}
            if self.options.compare:
                import json
                path = self.options.compare
                try:
                    rows = json.loads(Path(path).read_text())["summary"]
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    raise ValueError(f"--clh-compare {path}: not a clharness scorecard JSON ({exc}); "
                                     "write one with --clh-scorecard FILE.json") from None
                self._baseline = {(r["suite"], r["scenario"], r["method"]): r for r in rows}
        return self._baseline

    def schedule(self, units: list) -> None:
        """The units this session runs, in order: their keys are awaited, never read stale."""
        self.units = list(units)
        self.selected = {u.key for u in self.units if u.key}
        self._owners = None

    def owner(self, key: str):
        """The first scheduled unit that shares ``key`` (GTEP tuning and selection runs that several
        scenarios hold): it trains the run, the others wait for its record."""
        if getattr(self, "_owners", None) is None:
            self._owners = {}
            for unit in self.units:
                if unit.shared and unit.key:
                    self._owners.setdefault(unit.key, unit)
        return self._owners.get(key)

    def close(self) -> None:
        """Close the store (checkpointing its WAL): the .sqlite file alone then holds every record."""
        if self._store is not None:
            self._store.close()
            self._store = None

    # --- running ---
    def execute(self, unit) -> None:
        """Run one unit; its ``properties`` say what it left behind. Raises ``outcomes.Outcome``."""
        unit.properties = []
        unit.run(self, unit)

    def reuse(self, key: str, base_key: str | None = None) -> RunRecord | None:
        """The one reuse decision of every executor (serial, Ray, ensemble, a family's own steps): the stored
        record of ``key`` that can stand for a run, or None to run it. ``--clh-fresh``: never;
        ``--clh-reuse-stale``: else the newest record of ``base_key`` made by other code (the caller says so)."""
        if self.options.fresh:
            return None
        if key in self.stale_reused:
            return self.stale_reused[key]
        record = self.store.reusable(key)
        if record is None and self.options.reuse_stale and base_key:
            record = self.store.stale(base_key)
            if record is not None:
                self.stale_reused[key] = record   # one answer per key, also for waiters (wait_for)
        return record

    def reuse_case(self, case, method_cls=None) -> RunRecord | None:
        """``reuse`` for a case: its key and base key."""
        from .runner import base_key, case_key
        method_cls = method_cls or self.harness.methods[case.method]
        return self.reuse(case_key(case, method_cls), base_key(case, method_cls))

    def say_stale(self, unit, record: RunRecord, now: str) -> None:
        """What ``--clh-reuse-stale`` reused, on the unit (a front end sums them up): never silent."""
        unit.properties.append((outcomes.REUSED_STALE,
                                f"{record.case_id}: stored record {record.key} made by code {record.code_digest or '?'}"
                                f" (commit {record.git_commit or '-'}), the code now is {now}"))

    def run_stored(self, unit, case, amend=None, divergence_expected: bool = False) -> RunRecord:
        """Run ``case`` through the results store (a stored record with the same content hash is
        reused) and raise its status as an outcome. ``amend(record)`` edits a fresh record before it
        is stored. ``divergence_expected``: a diverged run is an outcome the protocol counts."""
        from .runner import base_key, case_key, run_case
        method_cls = self.harness.methods[case.method]
        key = case_key(case, method_cls)
        record = self.reuse(key, base_key(case, method_cls))
        if record is not None and record.key != key:
            from .code_identity import code_digest
            from .runner import _kind_file
            self.say_stale(unit, record, code_digest(method_cls, _kind_file(case.scenario.kind)))
        if record is not None:
            unit.properties.append((outcomes.REUSED, record.key))
        else:
            if self.remote is not None:   # a remote executor (Ray): the case's task, maybe submitted already
                record = self.remote.result(key, case)
            else:
                record = self._run_here(unit, case, method_cls, key)
            if amend is not None:
                amend(record)
            self.keep(record)
        unit.properties.append((outcomes.RECORD, record.to_json()))
        self._check_saved(record)
        if record.status == "not-applicable":
            raise outcomes.Skipped(record.message)
        if record.status == "diverged" and divergence_expected:
            raise outcomes.ExpectedFailure(f"[diverged] {record.case_id}: {record.message}")
        if record.status != "passed":
            raise outcomes.Failed(f"[{record.status}] {record.case_id}: {record.message}")
        return record

    def _run_here(self, unit, case, method_cls, key: str) -> RunRecord:
        """Run ``case`` in this process, marked as running in the store (so a waiter can tell when this
        process dies mid-run); a failure outside the method's own code is a record too, never a hang."""
        import time as _time
        import traceback

        from .ensemble import member_record, mode
        if mode(self, unit):   # a member of an ensemble (engine.ensemble), else solo
            record = member_record(self, unit, case, method_cls, key)
            if record is not None:
                return record
        from .runner import run_case, versions
        marker = RunRecord(suite=case.suite, scenario=case.scenario.name, method=case.method, seed=case.seed,
                           setting=case.scenario.setting, hparams=dict(case.hparams), key=key,
                           session=self.session_id, versions=dict(versions()), started_at=_time.time())
        self.store.mark_running(marker)
        root = self.options.data_root
        try:
            return run_case(case, self.harness, self.device, Path(root) if root else None, self.options.download,
                            on_task=self.progress(unit) if self.progress else None, keep=self._saver(key, case))
        except Exception as exc:   # outside the method's protocol: setup, a family's builder, the harness itself
            marker.status, marker.finished_at = "error", _time.time()
            marker.message = f"{type(exc).__name__}: {exc}\n" + "".join(traceback.format_exception(exc)[-4:])
            return marker

    def _saver(self, key: str, case):
        """--clh-save-models: ``keep(method, context)`` writing the trained method under its record key."""
        if not self.options.save_models:
            return None
        from .saved_models import save
        return lambda method, context: save(method, context, self.options.save_models, key, case.id)

    def _check_saved(self, record: RunRecord) -> None:
        """--clh-save-models: a passed record whose trained method is not on disk (reused from the store,
        trained as an ensemble member or on a Ray worker) is said once, with how to get it."""
        if not self.options.save_models or record.status != "passed":
            return
        from .saved_models import model_path
        if not model_path(self.options.save_models, record.key).exists():
            self.warn(f"{record.case_id}: no trained model saved in {self.options.save_models} (its record was reused, "
                      "or it trained as an ensemble member or a Ray task); rerun it with --clh-fresh (and without "
                      "--clh-ensemble / --clh-ray) to save it")

    def keep(self, record: RunRecord) -> None:
        """Store a fresh record (one transaction: a crash later loses nothing) and tell the loggers."""
        record.session = self.session_id
        record.budget = "quick" if self.options.quick else "full"   # a row of its own in reports
        self.store.put(record)
        self.harness.run_finished(record)

    def wait_for(self, keys: list[str]) -> tuple[list[RunRecord], list[str]]:
        """Records of ``keys``: runs this session schedules are awaited (other xdist workers may still
        be running them); others come from the store as they are. Returns (records, missing keys)."""
        deadline = time.monotonic() + self.options.gate_timeout
        found, pending = {}, set(keys)
        while True:
            for key in sorted(pending):
                record = self.stale_reused.get(key) or self.store.get(key)
                if record is None and key in self.selected:
                    record = self.store.dead_run(key)   # its process died mid-run: failed, not awaited
                    if record is None:
                        continue
                if record is not None and key in self.selected and record.session != self.session_id \
                        and key not in self.stale_reused and (self.options.fresh or record.status not in REUSABLE):
                    continue   # an older record; this session's run is still to come
                pending.discard(key)
                if record is not None:
                    found[key] = record
            if not pending or time.monotonic() > deadline:
                return list(found.values()), sorted(pending | (set(keys) - set(found)))
            time.sleep(0.2)

    def await_passed(self, key: str, what: str) -> RunRecord:
        """The record of ``key`` (a CLDyB search, say), waited for; a failure when it did not pass."""
        records, missing = self.wait_for([key])
        if missing or records[0].status != "passed":
            why = records[0].message if records else "no record (not run in this session, not in the results store)"
            raise outcomes.Failed(f"{what}: the run it depends on ({key}) did not pass: {why}")
        return records[0]
