"""Where a case is expanded: a suite becomes the ordered list of units a session runs.

A unit is one test id (``scenario[method-seedN]``): a run of one case, a protocol step (a GTEP
evaluation that selects H* from its tuning runs, a CLDyB search, a hyperparameter-selection
candidate), a gate, or a planned method that no plugin registers. Per scenario, in file order: the
kind's own units when its family defines ``collect`` (multi-run protocols), else selection units
(``select_hparams``), else one plain case per method and seed; then the not-registered units; then
the gates. The pytest plugin makes one item per unit; ``clharness.run`` runs them in order.
"""
from __future__ import annotations

from pathlib import Path

from .. import outcomes
from ..kinds import family
from .suites import Suite, SuiteError, did_you_mean, load_suite
from .units import Unit, case_unit, suite_hparams


def resolve_suite(session, name_or_path: str | Path) -> Path:
    """A registered suite name or a path to a suite file."""
    harness = session.harness
    text = str(name_or_path)
    if text in harness.suites:
        return Path(harness.suites[text])
    path = Path(text)
    if path.suffix == ".toml" or "/" in text:
        if not path.exists():
            raise SuiteError(f"suite {text}: no such file")
        return path
    known = list(harness.suites)
    raise SuiteError(f"suite {text}: unknown suite{did_you_mean(text, known)}; known suites: {', '.join(known) or 'none'} "
                     "(or give a path to a .toml suite file)")


def expand(session, path: Path) -> list[Unit]:
    """Every unit of the suite file at ``path``, in order. Raises SuiteError (and LookupError,
    ValueError) on a bad suite, before anything runs."""
    from ..kinds import install, preset_seeds
    from .runner import Case, resolve_hparams
    install(session.harness.kinds)   # every plugin's kinds (clharness_add_kinds), before the suite's are checked
    opts = session.options
    suite = load_suite(path, quick=opts.quick)
    from .validate import check
    check(session, suite)   # every name against the registries, before anything is built or trained
    session.resources.update({(suite.name, name): res for name, res in suite.resources.items()})
    seeds = opts.seeds or preset_seeds(list(opts.presets), suite) or suite.seeds
    from . import overrides
    chosen = {spec.name: methods_for(session, suite, spec.setting_enum) for spec in suite.scenarios}
    overrides.check(session, suite, {m for methods in chosen.values() for m in methods})
    suite = overrides.with_first_values(suite, opts.hparams)   # what the families' own units see
    units: list[Unit] = []
    plain: list[Unit] = []   # the plain cases: what the suite's gates judge
    for spec in suite.scenarios:
        fam = family(spec.kind)
        methods = chosen[spec.name]
        if fam.collect is not None or spec.select_hparams is not None:
            several = overrides.varied(opts.hparams, methods)
            if several:
                raise SuiteError(f"--clh-hparam: scenario {spec.name!r} (kind {spec.kind}) runs its own protocol; "
                                 f"give {', '.join(several)} one value per hyperparameter there (one session each)")
        if fam.collect is not None:   # multi-run protocols (GTEP, CLDyB) make their own units
            units += fam.collect(session, suite, spec, methods, seeds)
            continue
        if spec.select_hparams is not None:   # selection runs on the first tasks, then the full runs
            from .hparam_selection import collect as select
            units += select(session, suite, spec, methods, seeds)
            continue
        for method in methods:
            method_cls = session.harness.methods[method]
            suite_hparams(suite, method_cls)   # the suite's table checked, with its file in the message
            for tag, values in overrides.variants(opts.hparams, method):
                hparams = resolve_hparams(method_cls, suite.hparams.get(method, {}), spec.hparams.get(method, {}),
                                          values)
                label = f"{method}-{tag}" if tag else method
                for seed in range(seeds):
                    plain.append(case_unit(suite, f"{spec.name}[{label}-seed{seed}]",
                                           Case(suite.name, spec, method, seed, hparams), method_cls))
                    units.append(plain[-1])
    for spec in suite.scenarios:   # the suite's planned methods that no plugin registers
        for method in not_registered(session, suite):
            message = (f"not registered: method {method!r}, named in planned_methods of suite {suite.name!r}; "
                       "its cases are skipped until a plugin registers it")
            units.append(Unit(f"{spec.name}[{method}-not-registered]", _skip_not_registered, suite=suite.name,
                              path=suite.path, role="not-registered", data={"message": message}))
    units += gates(session, suite, plain)
    return units


def _skip_not_registered(session, unit: Unit) -> None:
    unit.properties.append((outcomes.NOT_REGISTERED, unit.data["message"]))
    raise outcomes.Skipped(unit.data["message"])


def methods_for(session, suite: Suite, setting) -> list[str]:
    """The registered methods to run: the session's ``methods``, else the suite's methods and its
    registered planned_methods, else every method supporting the setting; then ``add_methods``."""
    harness, requested = session.harness, list(session.options.methods)
    added = [m for m in session.options.add_methods if m not in requested]
    for name in added:   # --clh-add-method: a typo is an error naming the closest method
        if name not in harness.methods:
            raise SuiteError(f"--clh-add-method {name}: unknown method{did_you_mean(name, list(harness.methods))}; "
                             f"known: {', '.join(harness.methods)}")
    chosen = requested or ([*suite.methods, *suite.planned_methods] if suite.methods else [])
    missing = not_registered(session, suite)
    chosen = [name for name in chosen if name not in missing]
    for name in chosen:
        harness.methods.entry(name)   # unknown name: error listing the known ones
    if not (chosen or requested or suite.methods):
        chosen = [name for name in harness.methods if setting in set(harness.methods[name].settings)]
    return [*chosen, *(m for m in added if m not in chosen)]


def not_registered(session, suite: Suite) -> list[str]:
    """The suite's planned methods (those the session asks for, if any) that no plugin registers."""
    requested = session.options.methods
    return [m for m in suite.planned_methods if m not in session.harness.methods and (not requested or m in requested)]


# ----------------------------------------------------------------------------------------- gates
def gates(session, suite: Suite, cases: list[Unit]) -> list[Unit]:
    """Gate units, after the cases: the suite's own gates, then the compare baseline's regressions."""
    from ..reporting.gates import Gate
    running = {c.case.method for c in cases}
    found = []
    for gate in suite.gates:
        for m in gate.methods:
            if m != "*" and m not in suite.planned_methods:
                session.harness.methods.entry(m)   # a typo is an error listing the known methods
        absent = [m for m in gate.methods if m != "*" and m not in running]
        if absent:   # e.g. --clh-method mine: the suite's gates about other methods do not apply
            session.warn(f"{suite.name}: gate {gate.text!r} not judged: this session does not run {', '.join(absent)}")
            continue
        found.append((f"gate[{gate.text}]", gate))
    drops = session.options.max_drops if session.options.compare else {}
    for (b_suite, scenario, method), row in session.baseline.items():
        if b_suite != suite.name:
            continue
        if not any(c.case.method == method and c.case.scenario.name == scenario for c in cases):
            session.warn(f"--clh-compare: baseline has {b_suite}::{scenario}[{method}], not run in this session")
            continue
        for metric, drop in drops.items():
            if row.get(metric) is None:
                session.warn(f"--clh-compare: baseline {b_suite}::{scenario}[{method}] has no metric {metric!r}")
                continue
            text = f"{scenario}/{method}: {metric} drops at most {drop} from {row[metric]:.4f}"
            found.append((f"compare[{scenario}/{method}-{metric}]",
                          Gate(text, method, metric, "max-drop", drop, scenario=scenario, baseline=float(row[metric]))))
    units = []
    for name, gate in found:
        judged = [c.key for c in cases if (gate.method == "*" or c.case.method in gate.methods)
                  and (gate.scenario is None or c.case.scenario.name == gate.scenario)]
        units.append(Unit(name, run_gate, suite=suite.name, path=suite.path, role="gate",
                          label=f"gate {gate.text}", data={"gate": gate, "judged": judged}))
    return units


def run_gate(session, unit: Unit) -> None:
    from ..reporting.gates import judge
    gate = unit.data["gate"]
    records, missing = session.wait_for(unit.data["judged"])
    ok, lines = judge(gate, records)
    if missing:
        ok = False
        lines.append(f"FAIL {len(missing)} judged case(s) have no record (not run in this session and not in "
                     f"{session.options.results}, or still running after the gate timeout)")
    if not ok:   # say why the judged runs that did not pass did not (an error, a dead worker)
        lines += [f"  {r.case_id}: {r.status}: {(r.message or '').splitlines()[0] if r.message else ''}"
                  for r in records if r.status != "passed"]
    unit.properties.append((outcomes.GATE, "\n".join(lines)))
    if not ok:
        raise outcomes.Failed(f"gate failed: {gate.text}\n" + "\n".join(lines))
