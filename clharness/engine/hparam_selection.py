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
runs (``runner.Case``, minus the suite, like ``gtep.tune_case.TuneCase``, plus the number of tasks
and "scored on validation"): a rerun reuses every stored one (resume after kill), the same scenario in
two suites shares them, and under pytest-xdist the full-run item waits for them
(``ClhSession.wait_for``) wherever they run; of several selected items holding one key only the first
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

import pytest

from ..hparams import Choice, HParamError, Param, check_space, choice_from_values, sample
from ..pytest_plugin import CaseItem, _run_clh_case, make_item, run_stored_case, session_key
from .runner import Case, build_scenario, case_key, resolve_hparams
from .scenario import ScenarioError, Task
from .suites import SuiteError

KEY = "select_hparams"
OPTION_TYPES = {"tasks": int, "metric": str, "configurations": int, "search": dict}
DEFAULTS = {"tasks": 3, "metric": "aa", "configurations": 0, "search": {}}
EXAMPLE = 'select_hparams = { tasks = 3, metric = "aa", search = { "*" = { lr = [0.01, 0.1] } } }'


# ----------------------------------------------------------------------------- the suite key
def options(value: Mapping[str, Any] | None) -> dict[str, Any]:
    """The key's table with its defaults filled in."""
    return {**DEFAULTS, **(value or {})}


def check_option(value: Any, kind: str, setting: str = "class-incremental", validation: float = 0.0,
                 tasks: int | None = None) -> dict[str, Any]:
    """Load-time check of ``select_hparams``; raises ValueError naming the key, the value and the fix."""
    if not isinstance(value, dict):
        raise ValueError(f"{KEY} = {value!r} must be a table, e.g. {EXAMPLE}")
    unknown = [k for k in value if k not in OPTION_TYPES]
    if unknown:
        raise ValueError(f"{KEY}: unknown key(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(OPTION_TYPES)}")
    for key, typ in OPTION_TYPES.items():
        if key in value and (isinstance(value[key], bool) or not isinstance(value[key], typ)):
            raise ValueError(f"{KEY}.{key} = {value[key]!r} must be of type {typ.__name__}")
    o = options(value)
    from ..metrics import METRIC_INFO
    if o["metric"] not in METRIC_INFO:
        raise ValueError(f"{KEY}.metric = {o['metric']!r}; allowed: {', '.join(METRIC_INFO)}")
    if o["tasks"] < 1 or o["configurations"] < 0:
        raise ValueError(f"{KEY}: tasks = {o['tasks']} must be >= 1 and configurations = {o['configurations']} >= 0 "
                         "(0: the full grid of the search sets)")
    if tasks is not None and o["tasks"] > tasks:
        raise ValueError(f"{KEY}.tasks = {o['tasks']} exceeds the scenario's {tasks} tasks; select on fewer tasks")
    for owner, table in o["search"].items():
        if not isinstance(table, dict) or not all(isinstance(v, list) and v for v in table.values()):
            raise ValueError(f"{KEY}.search.{owner} = {table!r} must be a table of non-empty lists, "
                             "e.g. { lr = [0.01, 0.1] }")
    if setting == "online":
        raise ValueError(f"{KEY} selects on the first tasks of a task sequence; setting = \"online\" has no tasks")
    if kind != "cldyb" and not 0 < validation < 1:   # CLDyB requires it of its own (kind.check)
        raise ValueError(f"{KEY} scores on the first tasks' validation splits: set validation to a fraction in "
                         "(0, 1), e.g. validation = 0.2")
    from ..kinds import kind_module
    module = kind_module(kind)
    if hasattr(module, "collect") and not getattr(module, "SELECTS_HPARAMS", False):
        raise ValueError(f"{KEY}: kind {kind!r} makes its own items and does not apply {KEY}"
                         + (" (GTEP tunes in its own phase: use its configurations and search keys)" if kind == "gtep"
                            else " (its module would declare SELECTS_HPARAMS = True)"))
    return o


# ----------------------------------------------------------------------------- search spaces
def search_space(method_cls, search: Mapping[str, Mapping[str, list]]) -> dict[str, Param] | None:
    """The method's space: the suite's sets (``search.<method>``, and ``search."*"`` for the parameters
    it declares), else its ``tuning_space``, else None (nothing to select). Raises HParamError."""
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
    GTEP's TuneCase does) and names the cut, so it never collides with a full run."""
    first_tasks: int = 3

    def definition(self, method_cls, versions):
        out = super().definition(method_cls, versions)
        del out["suite"]
        out["selection"] = {"first_tasks": self.first_tasks, "scored_on": "validation"}
        return out

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
    space = search_space(method_cls, o["search"])
    if space is None:
        return None
    base = suite.hparams.get(method_cls.name, {})
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


# ----------------------------------------------------------------------------- pytest items
def items(node, suite, case, name: str, method_cls, after: str | None = None, make_plain=None):
    """The items of one full case with selection: a ``SelectionItem`` per candidate, then the
    ``SelectedItem`` named ``name`` that picks the winner and runs the full case. ``after`` is a
    record key both wait for first (a CLDyB search). Without a search space: ``make_plain()``."""
    try:
        chosen = plan(suite, case, method_cls)
    except HParamError as exc:
        raise SuiteError(f"{node.path}: scenario {case.scenario.name!r}: {exc}") from None
    if chosen is None:
        yield make_plain()
        return
    base, _, params = name.partition("[")
    keys = []
    for k, sel in enumerate(chosen.cases):
        item = make_item(SelectionItem, node, f"{base}[{params[:-1]}-select-c{k}]", _run_selection)
        item.case, item.case_key, item.after = sel, case_key(sel, method_cls), after
        item.search_key = after   # --clh-ray submits items without one at collection; these wait first
        keys.append(item.case_key)
        yield item
    item = make_item(SelectedItem, node, name, _run_selected)
    item.plan, item.keys, item.after, item.method_cls = chosen, keys, after, method_cls
    yield item


def collect(node, suite, spec, methods, seeds):
    """Items of a plain kind's scenario with ``select_hparams`` (pytest_plugin.SuiteFile.collect):
    per method, its selection runs for every seed, then the full runs."""
    clh = _session(node.config)
    for method in methods:
        method_cls = clh.harness.methods[method]
        try:
            hparams = resolve_hparams(method_cls, suite.hparams.get(method, {}))
        except ValueError as exc:
            raise SuiteError(f"{node.path}: [hparams.{method}]: {exc}") from None
        finals = []
        for seed in range(seeds):
            case, name = Case(suite.name, spec, method, seed, hparams), f"{spec.name}[{method}-seed{seed}]"

            def plain(case=case, name=name):
                item = make_item(CaseItem, node, name, _run_clh_case)
                item.case, item.case_key = case, case_key(case, method_cls)
                return item
            for item in items(node, suite, case, name, method_cls, make_plain=plain):
                if isinstance(item, SelectionItem):
                    yield item
                else:
                    finals.append(item)
        yield from finals


def _session(config):
    return config.stash[session_key]


class SelectionItem(CaseItem):
    """One candidate on the first tasks' validation splits (``<scenario>[<method>-seedN-select-cK]``)."""
    after: str | None = None
    search_key: str | None = None


class SelectedItem(pytest.Function):
    """The full sequence with the candidate its selection runs chose."""

    def reportinfo(self):
        return self.path, 0, f"{self.plan.full.suite}::{self.name}"


def _await(request, key: str, what: str) -> None:
    """Wait for the record of ``key`` (a CLDyB search, maybe on another xdist worker)."""
    clh = _session(request.config)
    if any(getattr(i, "case_key", None) == key for i in request.session.items):
        clh.selected.add(key)
    records, missing = clh.wait_for([key])
    if missing or records[0].status != "passed":
        why = records[0].message if records else "no record (not run in this session, not in the results store)"
        pytest.fail(f"{what}: the run it depends on ({key}) did not pass: {why}", pytrace=False)


def _owners(session) -> dict[str, str]:
    """Selection record key -> node id of the first selected item that trains it (as GTEP's tuning
    runs: two suites holding one scenario share its selection runs; the others wait for the record)."""
    owners = getattr(session, "_clh_selection_owners", None)
    if owners is None or owners[0] != len(session.items):
        table: dict[str, str] = {}
        for it in session.items:
            if isinstance(it, SelectionItem):
                table.setdefault(it.case_key, it.nodeid)
        owners = (len(session.items), table)
        session._clh_selection_owners = owners
    return owners[1]


def _run_selection(request) -> None:
    item = request.node
    if item.after:
        _await(request, item.after, item.name)
    owner = _owners(request.session).get(item.case_key)
    if owner is None or owner == item.nodeid:
        run_stored_case(request, item.case, divergence_expected=True)   # a diverged candidate scores NaN
        return
    records, missing = _session(request.config).wait_for([item.case_key])
    if missing:
        pytest.fail(f"shared selection run {item.case.scenario.name} has no record: {owner}, which trains it, "
                    "did not finish", pytrace=False)
    item.user_properties.append(("clh_shared_with", owner))


def _run_selected(request) -> None:
    item = request.node
    p: Plan = item.plan
    if item.after:
        _await(request, item.after, item.name)
    found, missing = _session(request.config).wait_for(item.keys)
    if missing:
        pytest.fail(f"{item.name}: {len(missing)} of {len(item.keys)} selection runs have no record (not run in "
                    f"this session and not in {request.config.getoption('clh_results')}); run its "
                    "'-select-c' items too", pytrace=False)
    by_key = {r.key: r for r in found}
    best, scores = choose([by_key.get(k) for k in item.keys], p.metric)
    if best is None:
        pytest.fail(f"{item.name}: every one of {len(p.configs)} candidate configurations diverged or failed on the "
                    f"first {p.tasks} tasks; no hyperparameters to run the sequence with", pytrace=False)
    case = replace(p.full, hparams=resolve_hparams(item.method_cls, p.base, p.configs[best]))
    note = {"first_tasks": p.tasks, "metric": p.metric, "scored_on": "validation", "candidates": len(p.configs),
            "chosen": best, "config": dict(p.configs[best]), "scores": scores, "keys": list(item.keys),
            "tie_rule": "lowest candidate index"}

    def amend(record):
        record.selection = note
    run_stored_case(request, case, amend)
