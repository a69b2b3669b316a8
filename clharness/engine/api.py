"""The Python API: run a suite, or build one case for inspection, without pytest.

``clharness.run`` expands a suite into the same units the pytest plugin collects and runs them in
order, serially, through the same results store: a record made here is reused by ``pytest
--clh-suite`` and the reverse (the keys are the same content hashes). ``clharness.load_case`` builds
one case's scenario, context and method, ready to step through in a debugger. See docs/api.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ..results import RunRecord, records_frame
from . import outcomes
from .session import Options, Session


@dataclass
class UnitResult:
    """How one unit ended: ``passed``, ``failed``, ``skipped`` or ``xfailed``, with the message."""
    name: str
    role: str
    outcome: str
    message: str = ""
    reused: bool = False


class Records(list):
    """The records ``clharness.run`` made or reused, in suite order (a list of ``RunRecord``), with
    every unit's outcome (``units``: cases, protocol steps and gates)."""

    def __init__(self, records: Iterable[RunRecord] = (), units: Iterable[UnitResult] = ()):
        super().__init__(records)
        self.units: list[UnitResult] = list(units)

    def frame(self):
        """One row per record (``clharness.results.records_frame``)."""
        return records_frame(self)

    @property
    def gates(self) -> list[UnitResult]:
        return [u for u in self.units if u.role == "gate"]

    @property
    def ok(self) -> bool:
        """True when no unit failed (the exit status a pytest session would give)."""
        return not any(u.outcome == "failed" for u in self.units)


def _options(results, quick, device, fresh, methods, seeds, data_root, download, plugins, presets,
             ensemble: bool | str | None = False) -> Options:
    return Options(results=results, fresh=fresh, quick=quick, seeds=seeds, ensemble=ensemble,
                   methods=tuple([methods] if isinstance(methods, str) else methods or ()), device=device,
                   data_root=str(data_root) if data_root else None, download=download,
                   presets=tuple(presets), plugins=tuple([plugins] if isinstance(plugins, str) else plugins))


def run(suite: str | Path, methods: str | Iterable[str] | None = None, seeds: int | None = None,
        results: str | Path = ".clharness/results.sqlite", quick: bool = False, device: str = "auto",
        fresh: bool = False, data_root: str | Path | None = None, download: bool = False,
        plugins: str | Iterable[str] = (), presets: Iterable[str] = (), ensemble: bool | str | None = False) -> Records:
    """Run ``suite`` (a registered name or a .toml path) and return its records.

    ``methods``: only these (default: the suite's); ``seeds``: seeds 0..N-1 (default: the suite's);
    ``results``: the SQLite store (stored runs are reused unless ``fresh``); ``quick``: the suite's
    ``[quick]`` budgets; ``plugins``: modules or .py files registering methods (``--clh-plugin``);
    ``ensemble``: True or "seeds": cases that differ only in seed train as one batched model; "hparams":
    also cases that differ only in float hyperparameters (engine.ensemble); "off": every case solo;
    False: as the suite's ``[suite] ensemble`` key says.
    A bad suite raises before anything trains; a failing case is a record with its status, never an
    exception."""
    from .plan import expand, resolve_suite
    session = Session(_options(results, quick, device, fresh, methods, seeds, data_root, download, plugins, presets,
                               ensemble))
    try:
        units = expand(session, resolve_suite(session, suite))
        session.schedule(units)
        out = Records()
        for unit in units:
            result = UnitResult(unit.name, unit.role, "passed")
            try:
                session.execute(unit)
            except outcomes.Skipped as exc:
                result.outcome, result.message = "skipped", exc.message
            except outcomes.ExpectedFailure as exc:
                result.outcome, result.message = "xfailed", exc.message
            except outcomes.Failed as exc:
                result.outcome, result.message = "failed", exc.message
            for name, value in unit.properties:
                if name == outcomes.RECORD:
                    out.append(RunRecord.from_json(value))
                elif name == outcomes.REUSED:
                    result.reused = True
                elif name == outcomes.GATE and not result.message:
                    result.message = value
            out.units.append(result)
        return out
    finally:
        session.close()


@dataclass
class LoadedCase:
    """One case, built and not trained: step through ``method.learn(scenario.experience(t))``."""
    case: Any                 # engine.runner.Case: suite, scenario spec, method, seed, resolved hparams
    scenario: Any             # the built scenario (its tasks hold train/val/test data: never give test data to the method)
    context: Any              # clharness.Context: what the method is told
    method: Any               # the constructed method
    key: str                  # the record key a run of this case stores under
    extra: dict = field(default_factory=dict)

    @property
    def model(self):
        """The method's ``model`` (None for methods without one)."""
        return getattr(self.method, "model", None)

    def experience(self, task: int):
        """The ``Experience`` the runner would give ``method.learn`` for ``task``."""
        return self.scenario.experience(task)


def load_case(suite: str | Path, scenario: str, method: str, seed: int = 0, quick: bool = False,
              device: str = "cpu", data_root: str | Path | None = None, download: bool = False,
              plugins: str | Iterable[str] = (), hparams: dict | None = None) -> LoadedCase:
    """Build the case ``suite::scenario[method-seed<seed>]`` as a run would (same seeding, same
    scenario, same context), without training it. ``hparams`` override the suite's."""
    from ..kinds import install
    from .plan import resolve_suite
    from .runner import Case, case_key, make_context, resolve_hparams, seed_everything
    from .suites import SuiteError, did_you_mean, load_suite
    session = Session(_options(".clharness/results.sqlite", quick, device, False, (method,), None, data_root,
                               download, plugins, ()))
    harness = session.harness
    install(harness.kinds)
    loaded = load_suite(resolve_suite(session, suite), quick=quick)
    specs = {s.name: s for s in loaded.scenarios}
    if scenario not in specs:
        raise SuiteError(f"suite {loaded.name!r} has no scenario {scenario!r}{did_you_mean(scenario, specs)}; "
                         f"its scenarios: {', '.join(specs)}")
    method_cls = harness.methods[method]
    case = Case(loaded.name, specs[scenario], method, seed,
                resolve_hparams(method_cls, loaded.hparams.get(method, {}), hparams or {}))
    seed_everything(seed)
    built = case.build_scenario(harness.datasets, session.device, Path(data_root) if data_root else None, download)
    context = make_context(case, built, harness, session.device)
    return LoadedCase(case, built, context, method_cls(context, **case.hparams), case_key(case, method_cls))
