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
from .. import outcomes
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


def api_options(**given) -> Options:
    """``clharness.run``'s keyword arguments as session ``Options``: the rows of ``engine.options.OPTIONS``
    offered to the API (an unknown name is a TypeError with a did-you-mean)."""
    from .options import API, OPTIONS, parse_hparams
    from .suites import did_you_mean
    known = {o.argument: o for o in OPTIONS if API in o.where and o.argument not in ("suite", "scorecard")}
    for name in given:
        if name not in known:
            raise TypeError(f"clharness.run: unknown argument {name!r}{did_you_mean(name, known)}; "
                            f"known: {', '.join(known)}")
    values = {}
    for name, value in given.items():
        if known[name].kind == "append" and name not in ("hparams", "max_drops"):
            value = tuple([value] if isinstance(value, str) else value or ())
        values[name] = value
    if "hparams" in values:
        values["hparams"] = parse_hparams(values["hparams"] or {})
    if values.get("compare") and not isinstance(values.get("max_drops"), dict):   # default: final_acc=0.02
        from ..reporting.compare import parse_drops
        values["max_drops"] = parse_drops(list(values.get("max_drops") or ()))
    if values.get("data_root") is not None:
        values["data_root"] = str(values["data_root"])
    return Options(**values)


def _options(results, quick, device, fresh, methods, seeds, data_root, download, plugins, presets) -> Options:
    return api_options(results=results, quick=quick, device=device, fresh=fresh, methods=methods, seeds=seeds,
                       data_root=data_root, download=download, plugins=plugins, presets=presets)


def run(suite: str | Path, **options) -> Records:
    """Run ``suite`` (a registered name or a .toml path) and return its records.

    The keyword arguments are the session options of ``engine.options.OPTIONS`` (the pytest options
    ``--clh-NAME`` without the prefix; see docs/api.md): ``methods``: only these (default: the suite's);
    ``add_methods``: the suite's methods plus these; ``hparams``: ``{METHOD: {NAME: value or [values]}}``
    (a list makes one case per value); ``seeds``: seeds 0..N-1 (default: the suite's); ``results``: the
    SQLite store (stored runs are reused unless ``fresh``); ``quick``: the suite's ``[quick]`` budgets;
    ``plugins``: modules or .py files registering methods (``--clh-plugin``); ``scorecard``: also write the
    scorecard (.md, .json, .csv); ``save_models``: a folder for each case's final method state;
    ``ensemble``: True or "seeds": cases that differ only in seed train as one batched model; "hparams":
    also cases that differ only in float hyperparameters (engine.ensemble); "off": every case solo;
    False: as the suite's ``[suite] ensemble`` key says.
    A bad suite raises before anything trains; a failing case is a record with its status, never an
    exception."""
    scorecard = options.pop("scorecard", None)
    from .plan import expand, resolve_suite
    session = Session(api_options(**options))
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
        if scorecard:
            from ..reporting.scorecard import write
            write(scorecard, out)
        return out
    finally:
        session.close()


def _signature():
    """``run(suite, *, <every API row of engine.options.OPTIONS>)``, for help() and editors."""
    import inspect
    from .options import API, OPTIONS
    defaults = Options()
    params = [inspect.Parameter("suite", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params += [inspect.Parameter(o.argument, inspect.Parameter.KEYWORD_ONLY, default=getattr(defaults, o.argument, o.value))
               for o in OPTIONS if API in o.where and o.argument != "suite"]
    return inspect.Signature(params, return_annotation=Records)


run.__signature__ = _signature()


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
              plugins: str | Iterable[str] = (), hparams: dict | None = None, trained: bool = False,
              models: str | Path | None = None) -> LoadedCase:
    """Build the case ``suite::scenario[method-seed<seed>]`` as a run would (same seeding, same
    scenario, same context), without training it. ``hparams`` override the suite's. ``trained=True``:
    the method is the one a run with ``--clh-save-models DIR`` saved (``models=DIR``), after its last
    task, ready to evaluate."""
    if trained and not models:
        raise ValueError("load_case(trained=True) needs models=DIR, the folder --clh-save-models wrote")
    from ..kinds import install
    from .plan import resolve_suite
    from .runner import Case, case_key, make_context, resolve_hparams, seed_everything
    from .suites import SuiteError, did_you_mean, load_suite
    session = Session(_options(".clharness/results.sqlite", quick, device, False, (method,), None, data_root,
                               download, plugins, ()))
    harness = session.harness
    install(harness.kinds)
    loaded = load_suite(resolve_suite(session, suite), quick=quick)
    from .validate import check
    check(session, loaded)   # names, backbone options and hyperparameter ranges, as a run checks them
    specs = {s.name: s for s in loaded.scenarios}
    if scenario not in specs:
        raise SuiteError(f"suite {loaded.name!r} has no scenario {scenario!r}{did_you_mean(scenario, specs)}; "
                         f"its scenarios: {', '.join(specs)}")
    method_cls = harness.methods[method]
    case = Case(loaded.name, specs[scenario], method, seed,
                resolve_hparams(method_cls, loaded.hparams.get(method, {}),
                                specs[scenario].hparams.get(method, {}), hparams or {}))
    seed_everything(seed)
    built = case.build_scenario(harness.datasets, session.device, Path(data_root) if data_root else None, download)
    context = make_context(case, built, harness, session.device)
    key = case_key(case, method_cls)
    if trained:
        from .saved_models import load
        return LoadedCase(case, built, context, load(models, key, context, session.device), key)
    return LoadedCase(case, built, context, method_cls(context, **case.hparams), key)
