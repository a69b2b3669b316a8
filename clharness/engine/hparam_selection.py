"""Hyperparameters selected on the validation splits of a sequence's first tasks, then fixed for the
whole sequence: the suite key ``select_hparams`` (any kind whose runs are task sequences).

CLDyB appendix B.3: "the hyper-parameters of each CL method are selected on the validation sets of
the first three tasks following Chaudhry et al. (2018)". Chaudhry et al. 2018 ("Efficient lifelong
learning with A-GEM", sec. 2 "learning protocol" and sec. 5) split the stream into a cross-validation
stream D^CV of the first T^CV = 3 tasks, used only to search hyperparameters (several passes
allowed), and the learning stream, run once with the chosen values. Here::

    [[scenario]]
    select_hparams = { tasks = 3, metric = "aa", configurations = 0, search = { "*" = { lr = [0.01, 0.1] } } }

per method with a search space and per seed, every candidate configuration c_k is one **selection
run** (``<scenario>:select-c<k>``): a fresh method learns the first ``tasks`` tasks of the seed's
sequence (the same classes, train data and validation hold-out as the full run) and is scored on those
tasks' VALIDATION splits, which stand in for their test splits (test data is never built into a
selection run's scenario, see ``first_tasks_on_validation``). The winner is the candidate with the
best ``metric`` of the final row of that validation matrix (default ``aa``: the per-task mean, A-GEM's
A_T and CLDyB's Final AA); **ties go to the lowest k** (candidate order below); a candidate whose run
diverged or failed scores NaN and cannot win; if none finished, the full run fails with a message.
The full sequence then runs once with the winner, as the scenario's ordinary case
``<scenario>[<method>-seedN]``; its record's ``selection`` field says which candidate was chosen, from
how many, on which tasks and metric, every candidate's score and the selection runs' record keys.

Search space of a method: the suite's sets ``search.<method>`` and ``search."*"`` (lists of values;
``"*"`` applies to the methods that declare the parameter), else the method's ``tuning_space``; a
method with neither runs with its suite hyperparameters, unselected. Candidates: the full grid of the
sets in declaration order (``configurations = 0``, the default; A-GEM's grid search), conditional
parameters only where active; or ``configurations = R`` random draws (``hparams.sample``, seeded by
scenario, method and k, never global state), needed when the space has ranges rather than sets.

Selection runs are ordinary records in the results store, keyed by content hash like GTEP's tuning
runs (``runner.Case``, minus the suite, like ``engine.shared_case.SharedCase``, plus the number of tasks
and "scored on validation"): a rerun reuses every stored one (resume after kill), the same scenario in
two suites shares them, and under pytest-xdist the full-run item waits for them
(``Session.wait_for``) wherever they run; of several selected items holding one key only the first
in collection order trains it. CLDyB scenarios (kind ``cldyb``) select per searched sequence: the
selection runs and the full replay wait for the sequence's search.

Deliberate differences from Chaudhry et al. 2018 / CLDyB B.3:
- The full run is the whole sequence, the first ``tasks`` tasks included (CLDyB's reading, "then fixes
  the choice for the full sequence"); A-GEM reports on the remaining T - T^CV tasks only.
- Selection is per seed, on that seed's own first tasks (its class order, its CLDyB sequence); A-GEM
  cross-validates once.
- Selection runs use the scenario's own budget (epochs, batch size); A-GEM's protocol allows several
  passes on D^CV while the learning stream is single-pass.
- The score is the final row of the validation accuracy matrix (``metric``, default the per-task mean
  ``aa``); A-GEM reports its metrics on test data after the search and does not name the CV score.
- A CLDyB search itself runs with the suite's hyperparameters (the sequence must exist before its first
  tasks can select anything); the selected values apply to the replay of the searched sequence.
- The full run trains on each task's train split minus the validation hold-out (the same split the
  selection scored on), so the scenario must set ``validation`` > 0.
- A selection run's model is built for the whole sequence's classes (the same head as the full run's),
  only its first tasks are learned and scored; A-GEM's cross-validation stream is a stream of its own.
- No ``--clh-ray``-specific handling was tested: selection runs are ordinary cases there, the full run
  is submitted when its item has chosen.
"""
from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass, replace
from typing import Any, Mapping

from ..hparams import Choice, HParamError, Param, check_space, choice_from_values, sample, settle_conditions
from .runner import Case, build_scenario, case_key, resolve_hparams
from .scenario import ScenarioError, Task
from .suites import SuiteError

from .select_hparams_key import DEFAULTS, EXAMPLE, KEY, OPTION_TYPES, check_option, options  # noqa: F401


# ----------------------------------------------------------------------------- search spaces
def search_space(method_cls, search: Mapping[str, Mapping[str, list]],
                 fixed: Mapping[str, Any] | None = None) -> dict[str, Param] | None:
    """The method's space: the suite's sets (``search.<method>``, and ``search."*"`` for the parameters
    it declares), else its ``tuning_space``, else None (nothing to select). A ``tuning_space`` parameter
    conditional on a parent the space does not search is kept where ``fixed`` (the run's values of the
    others: the suite's, else the defaults) activates it, and dropped elsewhere. Raises HParamError."""
    name, declared = method_cls.name, method_cls.hparams
    owner = f"{KEY} search space of method {name!r}"
    own = dict(search.get(name, {}))
    for key in own:
        if key not in declared:
            raise HParamError(f"{owner}: search.{name}.{key}: {name!r} has no hyperparameter {key!r}; "
                              f"declared: {sorted(declared)}")
    sets = {**{k: v for k, v in search.get("*", {}).items() if k in declared}, **own}
    if sets:   # a condition on a parent that is not searched is left to resolve() (the suite's value decides)
        space = {k: choice_from_values(owner, k, v, when={p: a for p, a in declared[k].when.items() if p in sets})
                 for k, v in sets.items()}
    elif getattr(method_cls, "tuning_space", None):
        space = dict(method_cls.tuning_space)
        if fixed is not None:
            space = settle_conditions(space, fixed)
    else:
        return None
    for key in space:   # a conditional parameter whose parent is not searched is active as the default is
        if key not in declared:
            raise HParamError(f"{owner}: {key!r} is not a declared hyperparameter of {name!r}")
    check_space(owner, space)
    for key, param in space.items():
        for value in getattr(param, "values", ()):
            declared[key].check(key, value)
    return space


def candidates(space: Mapping[str, Param], configurations: int, seed_text: str) -> list[dict[str, Any]]:
    """The configurations to try: the grid of ``space``'s sets in declaration order (first parameter
    slowest), conditional parameters only where active (``configurations = 0``), or R random draws
    seeded by ``seed_text`` and k."""
    if configurations:
        return [sample(space, random.Random(f"select/{seed_text}/{k}")) for k in range(configurations)]
    ranges = [n for n, p in space.items() if not isinstance(p, Choice)]
    if ranges:
        raise HParamError(f"{KEY}: {', '.join(ranges)} is a range, not a set of values, so it has no grid; give "
                          f"search sets (search.<method>.{ranges[0]} = [...]) or configurations = R random draws")
    grid = []
    for values in itertools.product(*(p.values for p in space.values())):
        config = dict(zip(space, values))
        active = {k: v for k, v in config.items()
                  if all(config[parent] in allowed for parent, allowed in space[k].when.items())}
        if active not in grid:   # an inactive parameter's values give the same configuration
            grid.append(active)
    return grid


# ----------------------------------------------------------------------------- runs
@dataclass(frozen=True)
class SelectionCase(Case):
    """One selection run: the scenario cut to its first ``first_tasks`` tasks, scored on their
    validation splits. Its key leaves out the suite (the same scenario in two suites shares it, as
    SharedCase does for GTEP's tuning runs) and names the cut, so it never collides with a full run."""
    first_tasks: int = 3
    KEY_OMITS = ("suite",)

    def key_extra(self):
        return {"selection": {"first_tasks": self.first_tasks, "scored_on": "validation"}}

    def build_scenario(self, datasets, device, data_root=None, download=False):
        built = build_scenario(self.scenario, datasets, self.seed, device, data_root, download)
        return first_tasks_on_validation(built, self.first_tasks)


def first_tasks_on_validation(scenario, tasks: int):
    """The scenario's first ``tasks`` tasks with their validation splits as the data the runner scores
    on; their test splits and every later task are dropped, so no test image enters the run. The class
    set (and the model's head) stays that of the full sequence."""
    name = scenario.spec.name
    seq = getattr(scenario, "tasks", None)
    if seq is None or getattr(scenario, "protocol", None) is not None:
        raise ScenarioError(f"scenario {name!r}: {KEY} needs a task sequence; this kind's scenario is a stream")
    if tasks > len(seq):
        raise ScenarioError(f"scenario {name!r}: {KEY}.tasks = {tasks} but the sequence has {len(seq)} tasks")
    for t, task in enumerate(seq[:tasks]):
        if task.val is None or len(task.val) == 0:
            raise ScenarioError(f"scenario {name!r}: task {t} has no validation data to select on; set "
                                "validation = 0.2 (or raise max_train_per_class)")
    scenario.tasks = [Task(t.classes, t.train, t.val, None) for t in seq[:tasks]]
    scenario.extra["selection"] = {"first_tasks": tasks, "scored_on": "validation"}
    return scenario


@dataclass
class Plan:
    """Per method and seed: the candidates, their selection cases and the full case to run."""
    full: Any                      # runner.Case: the full sequence, hparams to be replaced by the choice
    base: dict                     # the suite's [hparams.<method>] overrides
    configs: list[dict]
    cases: list                    # SelectionCase per candidate
    tasks: int
    metric: str


def plan(suite, case, method_cls) -> Plan | None:
    """The selection of ``case`` (a full run whose spec has ``select_hparams``), or None when its
    method has no search space. Raises HParamError on a bad space."""
    o = options(case.scenario.select_hparams)
    base = suite.hparams.get(method_cls.name, {})
    space = search_space(method_cls, o["search"], {k: base.get(k, p.default) for k, p in method_cls.hparams.items()})
    if space is None:
        return None
    configs = candidates(space, o["configurations"], f"{case.scenario.name}/{method_cls.name}")
    cases = [SelectionCase(case.suite, replace(case.scenario, name=f"{case.scenario.name}:select-c{k}",
                                               select_hparams=None),
                           case.method, case.seed, resolve_hparams(method_cls, base, config), first_tasks=o["tasks"])
             for k, config in enumerate(configs)]
    return Plan(case, base, configs, cases, o["tasks"], o["metric"])


def choose(records: list, metric: str) -> tuple[int | None, list[float]]:
    """(winner k, score per k) from the selection records in candidate order: the best ``metric``
    (direction from metrics.HIGHER_IS_BETTER), ties to the lowest k; NaN (diverged, failed) never wins."""
    from ..metrics import HIGHER_IS_BETTER
    scores = [r.metrics.get(metric, math.nan) if r is not None and r.status == "passed" else math.nan
              for r in records]
    finite = [(s if HIGHER_IS_BETTER.get(metric, True) else -s, -k) for k, s in enumerate(scores) if not math.isnan(s)]
    return (-max(finite)[1] if finite else None), scores


# ----------------------------------------------------------------------------- units
def units(session, suite, case, name: str, method_cls, after: str | None = None, make_plain=None) -> list:
    """The units of one full case with selection: a selection unit per candidate, then the unit named
    ``name`` that picks the winner and runs the full case. ``after`` is a record key both wait for
    first (a CLDyB search). Without a search space: ``[make_plain()]``."""
    from .units import Unit
    try:
        chosen = plan(suite, case, method_cls)
    except HParamError as exc:
        raise SuiteError(f"{suite.path}: scenario {case.scenario.name!r}: {exc}") from None
    if chosen is None:
        return [make_plain()]
    base, _, params = name.partition("[")
    out, keys = [], []
    for k, sel in enumerate(chosen.cases):
        key = case_key(sel, method_cls)
        out.append(Unit(f"{base}[{params[:-1]}-select-c{k}]", _run_selection, suite=suite.name, path=suite.path,
                        case=sel, key=key, after=after, shared=True, role="selection"))
        keys.append(key)
    out.append(Unit(name, _run_selected, suite=suite.name, path=suite.path, after=after, role="selected",
                    label=f"{chosen.full.suite}::{name}", data={"plan": chosen, "keys": keys, "method_cls": method_cls}))
    return out


def collect(session, suite, spec, methods, seeds) -> list:
    """Units of a plain kind's scenario with ``select_hparams`` (engine.plan.expand): per method, its
    selection runs for every seed, then the full runs."""
    from .units import case_unit, suite_hparams
    out = []
    for method in methods:
        method_cls = session.harness.methods[method]
        hparams = suite_hparams(suite, method_cls)
        finals = []
        for seed in range(seeds):
            case, name = Case(suite.name, spec, method, seed, hparams), f"{spec.name}[{method}-seed{seed}]"
            for unit in units(session, suite, case, name, method_cls,
                              make_plain=lambda case=case, name=name: case_unit(suite, name, case, method_cls)):
                (out if unit.role == "selection" else finals).append(unit)
        out += finals
    return out


def _run_selection(session, unit) -> None:
    from .. import outcomes
    if unit.after:
        session.await_passed(unit.after, unit.name)
    owner = session.owner(unit.key)
    if owner is None or owner is unit:
        session.run_stored(unit, unit.case, divergence_expected=True)   # a diverged candidate scores NaN
        return
    records, missing = session.wait_for([unit.key])
    if missing:
        raise outcomes.Failed(f"shared selection run {unit.case.scenario.name} has no record: {owner.title}, "
                              "which trains it, did not finish")
    unit.properties.append((outcomes.SHARED_WITH, owner.title))


def _run_selected(session, unit) -> None:
    from .. import outcomes
    p: Plan = unit.data["plan"]
    keys = unit.data["keys"]
    if unit.after:
        session.await_passed(unit.after, unit.name)
    found, missing = session.wait_for(keys)
    if missing:
        raise outcomes.Failed(f"{unit.name}: {len(missing)} of {len(keys)} selection runs have no record (not run in "
                              f"this session and not in {session.options.results}); run its '-select-c' items too")
    by_key = {r.key: r for r in found}
    best, scores = choose([by_key.get(k) for k in keys], p.metric)
    if best is None:
        raise outcomes.Failed(f"{unit.name}: every one of {len(p.configs)} candidate configurations diverged or "
                              f"failed on the first {p.tasks} tasks; no hyperparameters to run the sequence with")
    case = replace(p.full, hparams=resolve_hparams(unit.data["method_cls"], p.base, p.configs[best]))
    note = {"first_tasks": p.tasks, "metric": p.metric, "scored_on": "validation", "candidates": len(p.configs),
            "chosen": best, "config": dict(p.configs[best]), "scores": scores, "keys": list(keys),
            "tie_rule": "lowest candidate index"}

    def amend(record):
        record.selection = note
    session.run_stored(unit, case, amend)
