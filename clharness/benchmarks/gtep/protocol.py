"""GTEP, the generalizable two-phase evaluation protocol ("Hyperparameters in continual learning:
a reality check", Sec. 3.2, Algorithms 1-3), as pytest items of the ``gtep`` scenario kind.

Phase 1 (Alg. 2): per method, R configurations drawn from its search space (configuration k from a
``random.Random`` seeded by (suite, scenario, method, k)), each run on S trials of D^HT (a fresh
model, the class order shuffled by the trial's seed) and scored on D^HT's validation split. One
item per run: ``<suite>::<scenario>[<method>-tune-c<k>-t<s>]``. Phase 2 (Alg. 3): one item per
trial, ``[<method>-eval-t<s>]``, that waits for the method's tuning records (the session's ``wait_for``,
so it works across pytest-xdist workers), selects H* (Alg. 1 SelectBestHyperparameter: the highest
harmonic mean of final Acc and AvgAcc, averaged over the trials) and runs it on D^E.

Every run is a ``runner.Case`` whose content hash keys the results store, so an interrupted tuning
phase resumes where it stopped and methods never share or redo each other's runs. Records carry the
phase in their scenario name (``<scenario>:tune-c<k>`` / ``<scenario>:eval``), so the store and
``clharness report`` can be queried per configuration; ``summarize`` rebuilds the protocol's
outputs (tuning vs evaluation score, gap, H*, spread, diverged trials, cost, Kendall tau) from them.
"""
from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any, Mapping

from ...hparams import HParamError
from ...kinds import Unit
from ...outcomes import SHARED_WITH, ExpectedFailure, Failed
from ...scenario_spec import SuiteError, spec_definition
from .phases import PAPER
from .search import BUDGET, MethodSpace, draw, method_space
from .selection import DEFAULT_SELECTION, select_best
from .presets import check_preset_scope, preset_applies, session_presets


def tuning_id(spec) -> str:
    """The identity of a scenario's tuning phase (Alg. 2): D^HT, its classes, the task
    configuration and every common key that defines a tuning run (backbone, budgets, validation,
    augmentation, ...), hashed without the scenario's name and its D^E. The paper tunes once per
    D^HT and applies H* to every D^E (Sec. 4.1: "we perform experiments on the class-IL scenarios
    generated from both the CIFAR-50-1 and ImageNet-50-1 datasets" in the tuning phase, then high
    and low similarity D^E): scenarios with the same id share their tuning runs (same record keys,
    in one suite or across suites). Readable: ``<dataset>[<start>-<stop>]-<task config>-<hash>``."""
    from ...results import run_key
    base = spec_definition(phase_spec(spec, "tune", {}, 0))
    base.pop("name")
    o = spec.options
    where = f"[{o['tune_classes'][0]}-{o['tune_classes'][1]}]" if o["tune_classes"] else ""
    return f"{o['tune_dataset']}{where}-{o['task_config']}-{run_key(base)[:10]}"


# ----------------------------------------------------------------------------- cases
def phase_spec(spec, phase: str, config: Mapping[str, Any], k: int | None = None, tuning: str | None = None,
               paper: str | None = None):
    """The ScenarioSpec of one phase run: the phase's dataset and classes, the configuration's
    budgets, and for the evaluation phase the scenario's ``eval_spec`` (D^E's backbone, input size,
    augmentation: the paper's architecture for that dataset); only what defines the run stays in
    its options (R, S and search sets do not, so changing them keeps the stored runs). A tuning run is named by its tuning id
    (``<tuning>:tune-c<k>``), an evaluation run by its scenario and the tuning it took H* from
    (``<scenario>:eval@<tuning>``); the paper's configuration ``paper`` on D^HT is
    ``<tuning>:tune@paper-<paper>``."""
    o = spec.options
    side = "tune" if phase == "tune" else "eval"
    name = (f"{tuning or spec.name}:tune@{PAPER}{paper}" if phase == "tune" and paper
            else f"{tuning or spec.name}:tune-c{k}" if phase == "tune"
            else f"{spec.name}:eval@{tuning}" if tuning else f"{spec.name}:eval")
    own = copy.deepcopy(dict(o.get("eval_spec", {}))) if side == "eval" else {}   # D^E's architecture and input
    return replace(spec, name=name, **own,
                   dataset=o[f"{side}_dataset"], dataset_options=dict(o[f"{side}_dataset_options"]),
                   epochs=config.get("epochs", spec.epochs), batch_size=config.get("batch_size", spec.batch_size),
                   options={"phase": phase, "classes": list(o[f"{side}_classes"]), "task_config": o["task_config"],
                            "split_seed": o["split_seed"]})


def make_case(session, suite, spec, method_cls, base_hparams, space: MethodSpace, config, phase, trial, k=None,
                tuning: str | None = None, paper: str | None = None):
    """One phase run, made by ``session`` (a ``kinds.FamilySession``). A tuning run is a shared case: its
    key leaves out the suite, so the same D^HT tuning in two suites is one stored run."""
    args = {**space.fixed, **config}
    hparams = session.resolve_hparams(method_cls, base_hparams,
                                      {a: v for a, v in args.items() if a in method_cls.hparams})
    budgets = {a: v for a, v in args.items() if a in BUDGET}
    if phase == "tune" and tuning:
        return session.case(suite.name, phase_spec(spec, phase, budgets, k, tuning, paper), method_cls.name, trial,
                            hparams, shared=True)
    return session.case(suite.name, phase_spec(spec, phase, budgets, k, tuning), method_cls.name, trial, hparams)


# ----------------------------------------------------------------------------- units
def collect(session, suite, spec, methods, seeds) -> list:
    """The kind's units: per method, R x S tuning runs, then S evaluation units. Every search
    space is checked here, before any training; a bad one fails the suite's expansion. With the
    preset ``gtep:<name>`` (``--clh-preset``) also S units ``[<method>-paper-eval-t<s>]`` per method the
    preset holds: the paper's own configuration (appendix A, paper_configs.py) on D^E, recorded as
    ``<scenario>:eval@paper-<name>`` (a row of its own in the GTEP table, beside the tuned H*), and
    S units ``[<method>-paper-tune-t<s>]``: the same configuration on D^HT, scored on its validation
    split like a tuning run (``<tuning id>:tune@paper-<name>``; the "Original" bars of Fig. 4 and
    7(a), Tables 7 and 14), shown as that row's tuning-phase score.
    Parameters the preset names that the method does not take are not applied (``unmapped`` in
    paper_configs.json lists the paper's keys with no counterpart here)."""
    o = spec.options
    R, S = o["configurations"], o["trials"]
    tuning = tuning_id(spec)
    presets = session_presets(session.options.presets)
    for name, _ in presets:
        check_preset_scope(name, suite)
    units = []
    for method in methods:
        method_cls = session.harness.methods[method]
        try:
            space = method_space(method_cls, o)
            base = suite.hparams.get(method, {})
            configs = [draw(space.space, tuning, method, k) for k in range(R)]
            cases = [[make_case(session, suite, spec, method_cls, base, space, configs[k], "tune", s, k, tuning)
                      for s in range(S)] for k in range(R)]
        except HParamError as exc:
            raise SuiteError(f"{suite.path}: scenario {spec.name!r}: {exc}") from None
        tune_keys = {}
        for k in range(R):
            for s in range(S):
                unit = session.case_unit(suite, f"{spec.name}[{method}-tune-c{k}-t{s}]", cases[k][s],
                                         run=_run_tune, amend=phase_amend(cases[k][s]), shared=True)
                tune_keys.setdefault(k, []).append(unit.key)
                units.append(unit)
        for s in range(S):
            units.append(Unit(f"{spec.name}[{method}-eval-t{s}]", _run_eval, suite=suite.name, path=suite.path,
                              role="eval", data={"suite": suite, "spec": spec, "method": method, "trial": s,
                                                 "space": space, "configs": configs, "tune_keys": tune_keys,
                                                 "tuning": tuning}))
        for name, table in presets:
            if method not in table or not preset_applies(name, spec):
                continue
            try:
                paper = [make_case(session, suite, spec, method_cls, base, space, table[method], "eval", s,
                                   tuning=f"{PAPER}{name}") for s in range(S)]
                on_dht = [make_case(session, suite, spec, method_cls, base, space, table[method], "tune", s, tuning=tuning,
                                    paper=name) for s in range(S)]
            except HParamError as exc:
                raise SuiteError(f"{suite.path}: scenario {spec.name!r}: --clh-preset gtep:{name}: {exc}") from None
            for s in range(S):   # the paper's H* on D^E (Alg. 3 with the appendix's configuration)
                units.append(session.case_unit(suite, f"{spec.name}[{method}-paper-eval-t{s}]", paper[s],
                                               run=_run_expecting_divergence, amend=phase_amend(paper[s])))
            # ... and on D^HT, scored on its validation split as the tuning runs are ("Original" of Fig. 4 / 7(a),
            # Tables 7 and 14); shared by the scenarios of one tuning phase, as the tuning runs are
            for s in range(S):
                units.append(session.case_unit(suite, f"{spec.name}[{method}-paper-tune-t{s}]", on_dht[s],
                                               run=_run_tune, amend=phase_amend(on_dht[s]), shared=True))
    return units


# A preset named for a D^HT and a task count (appendix A's sections) -> (tune_dataset, dataset path, tune_classes)
def _run_eval(session, unit) -> None:
    """Alg. 3 for one trial: waits for the method's tuning records, selects H*, runs it on D^E."""
    d = unit.data
    keys = [key for ks in d["tune_keys"].values() for key in ks]
    records, missing = session.wait_for(keys)
    by_key = {r.key: r for r in records}
    if missing:
        raise Failed(f"GTEP {d['method']}: {len(missing)} of {len(keys)} tuning runs have no record (not run in this "
                     f"session and not in {session.options.results}); run the '{d['method']}-tune' items first")
    best, scores = select_best({k: [by_key[key] for key in ks] for k, ks in d["tune_keys"].items()},
                               d["spec"].options.get("selection", DEFAULT_SELECTION))
    if best is None:
        raise Failed(f"GTEP {d['method']}: every configuration diverged or failed in a tuning trial; no H* "
                     f"(reported as NaN, as the paper reports BEEF)")
    method_cls = session.harness.methods[d["method"]]
    case = make_case(session, d["suite"], d["spec"], method_cls, d["suite"].hparams.get(d["method"], {}), d["space"],
                     d["configs"][best], "eval", d["trial"], tuning=d["tuning"])
    # A diverged evaluation run is a result the paper reports (NaN: BEEF's "NaN values for certain seeds"
    # in the evaluation phase, sec. 5 and appendix), counted and shown as such, not a session failure.
    session.run_stored(unit, case, phase_amend(case), divergence_expected=True)


def _run_expecting_divergence(session, unit) -> None:
    """An evaluation-phase run: divergence is reported as NaN, as the paper reports BEEF's."""
    session.run_stored(unit, unit.case, unit.amend, divergence_expected=True)


_run_expecting_divergence.trains_case = True   # it trains unit.case: --clh-ensemble may batch its trials


def _run_tune(session, unit) -> None:
    """A tuning run. Scenarios that share a D^HT yield the same tuning cases (so each one's units
    can be selected alone, by -k or --lf); of the scheduled units with one key only the first in
    order trains it, the others wait for its record (under pytest-xdist too: every worker
    collects the same items in the same order) and report it as shared. A diverged tuning trial is
    counted as NaN in selection (as the paper counts BEEF's), an expected outcome of random search."""
    owner = session.owner(unit.key)
    if owner is None or owner is unit:
        session.run_stored(unit, unit.case, unit.amend, divergence_expected=True)
        return
    records, missing = session.wait_for([unit.key])
    if missing:
        raise Failed(f"GTEP shared tuning run {unit.case.scenario.name} (trial {unit.case.seed}) has no record: "
                     f"{owner.title}, which trains it, did not finish")
    unit.properties.append((SHARED_WITH, owner.title))
    if records[0].status != "passed":
        raise ExpectedFailure(f"shared tuning run {owner.title}: {records[0].status} (counted in selection as NaN)")


# it trains unit.case (its owner does, engine.ensemble.ensembles knows owners): --clh-ensemble batches a
# configuration's trials (the same case but for the seed) as one ensemble
_run_tune.trains_case = True


def phase_amend(case):
    """The edit of a phase run's fresh record: its hparams also show the budgets its configuration set."""
    def budgets(record):
        record.hparams = {"epochs": case.scenario.epochs, "batch_size": case.scenario.batch_size, **record.hparams}
    return budgets


