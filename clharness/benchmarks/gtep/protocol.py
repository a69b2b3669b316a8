"""GTEP, the generalizable two-phase evaluation protocol ("Hyperparameters in continual learning:
a reality check", Sec. 3.2, Algorithms 1-3), as pytest items of the ``gtep`` scenario kind.

Phase 1 (Alg. 2): per method, R configurations drawn from its search space (configuration k from a
``random.Random`` seeded by (suite, scenario, method, k)), each run on S trials of D^HT (a fresh
model, the class order shuffled by the trial's seed) and scored on D^HT's validation split. One
item per run: ``<suite>::<scenario>[<method>-tune-c<k>-t<s>]``. Phase 2 (Alg. 3): one item per
trial, ``[<method>-eval-t<s>]``, that waits for the method's tuning records (``ClhSession.wait_for``,
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
import math
import random
import re
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping

import numpy as np

from ...hparams import (GENERAL, GENERAL_TABLES, HParamError, Param, check_space, choice_from_values, general_space,
                        settle_conditions)
from ...results import RunRecord

BUDGET = ("epochs", "batch_size")   # general parameters that are scenario budgets, not method arguments
HELD_AT_DEFAULT = ("momentum",)     # optimizer details the paper does not search (SGD momentum 0.9 fixed)
# ``<tuning id>:tune-c<k>`` and ``<scenario>:eval@<tuning id>`` (records before one tuning phase per
# D^HT: ``<scenario>:tune-c<k>`` and ``<scenario>:eval``, their tuning id being the scenario's name)
PAPER = "paper-"   # ``<scenario>:eval@paper-<preset>``: the paper's configuration (--clh-preset gtep:<preset>)
# on D^E, and ``<tuning id>:tune@paper-<preset>`` the same configuration on D^HT (Fig. 7(a), Tables 7/14)
PHASE = re.compile(r"^(?P<scenario>.+):(?:tune-c(?P<k>\d+)|tune@(?P<ptune>paper-[^:]+)|eval(?:@(?P<tuning>[^:]+))?)$")


# ----------------------------------------------------------------------------- search spaces
@dataclass(frozen=True)
class MethodSpace:
    """What GTEP searches for one method, and what it could not."""
    space: dict[str, Param]
    fixed: dict[str, Any]            # held-fixed values this method takes
    own: tuple[str, ...]             # its method-specific parameters (empty: general only)
    not_tunable: tuple[str, ...]     # general parameters the method does not accept
    paper: bool = False              # its space is the paper's (Table 4/5, spaces.py)


def method_space(method_cls, options: Mapping[str, Any]) -> MethodSpace:
    """The method's GTEP space: the general sets (``general`` table, the paper's column for the
    method (Table 5's prompt-based sets), ``search."*"`` and ``search.<method>`` overrides)
    restricted to what the method accepts, plus its own: the suite's ``search.<method>`` sets when
    they name method-specific parameters, else the paper's Table 4/5 sets for the methods it covers
    (spaces.py; suite option ``spaces = "method"`` skips them), else its
    ``tuning_space`` when it declares one, else
    its declared ``hparams`` beyond the general ones. ``fixed`` values leave the space. Errors
    (unknown names, empty sets, a conditional parameter without its parent) raise HParamError."""
    from .spaces import SPACES, paper_space
    name = method_cls.name
    owner = f"gtep search space of method {name!r}"
    search = options.get("search", {})
    table = options.get("general", "table4")
    reading = options.get("spaces", "paper")
    if reading not in SPACES:
        raise HParamError(f"{owner}: spaces = {reading!r}; allowed: {', '.join(SPACES)}")
    paper = paper_space(table, name) if reading == "paper" else None
    column = paper[1] if paper else {}
    overrides = {**column, **search.get("*", {}), **search.get(name, {})}
    general = general_space(GENERAL_TABLES[table], **{k: v for k, v in overrides.items() if k in GENERAL})
    accepted = set(BUDGET) | set(method_cls.hparams)
    not_tunable = tuple(k for k in general if k not in accepted)
    space = {k: p for k, p in general.items() if k in accepted}
    declared = getattr(method_cls, "tuning_space", None)
    if paper is not None:   # the paper's Table 4/5 sets (spaces.py), whatever the method declares
        declared = {k: choice_from_values(owner, k, v) for k, v in paper[0].items()}
    if any(k not in GENERAL for k in search.get(name, {})):
        declared = {}   # the suite's sets for its own parameters are the method's whole own space
    elif declared is None:
        declared = {k: p for k, p in method_cls.hparams.items() if k not in GENERAL and k not in HELD_AT_DEFAULT}
    own = dict(declared)
    for key, values in search.get(name, {}).items():
        if key in GENERAL:
            continue
        if key not in method_cls.hparams:
            raise HParamError(f"{owner}: search.{name}.{key}: {name!r} has no hyperparameter {key!r}; "
                              f"declared: {sorted(method_cls.hparams)}")
        own[key] = choice_from_values(owner, key, values, when=getattr(method_cls.hparams[key], "when", None))
    for key in own:
        if key not in method_cls.hparams:
            raise HParamError(f"{owner}: tuning_space names {key!r}, which {name!r} does not declare in hparams "
                              f"(declared: {sorted(method_cls.hparams)})")
    space.update(own)
    # a parameter conditional on one this space does not search: settled by the run's value
    space = settle_conditions(space, {**{k: p.default for k, p in method_cls.hparams.items()}, **options.get("fixed", {})})
    fixed = {}
    for key, value in options.get("fixed", {}).items():
        if key in accepted:
            fixed[key] = method_cls.hparams[key].check(key, value) if key in method_cls.hparams else value
            space.pop(key, None)
    # a conditional parameter whose parent is held fixed stays only if the fixed value enables it
    for key in [k for k, p in space.items() if any(parent in fixed for parent in p.when)]:
        if not all(fixed.get(parent, None) in allowed for parent, allowed in space[key].when.items() if parent in fixed):
            space.pop(key)
        else:
            space[key] = copy.copy(space[key])   # the method's own Param objects are shared: never mutate them
            object.__setattr__(space[key], "when", {p: v for p, v in space[key].when.items() if p not in fixed})
    check_space(owner, space)
    for key, param in space.items():   # every value the space can draw must be one the method accepts
        for value in getattr(param, "values", ()):
            if key in method_cls.hparams:
                method_cls.hparams[key].check(key, value)
    return MethodSpace(space, fixed, tuple(own), not_tunable, paper is not None)


def draw(space: Mapping[str, Param], tuning: str, method: str, k: int) -> dict[str, Any]:
    """Configuration k of a method (Alg. 2 lines 3-5): seeded by the tuning phase's identity
    (``tuning_id``: D^HT and everything that defines its runs, never the scenario or suite name),
    the method and k; never global state. Scenarios that tune on the same D^HT draw the same set."""
    from ...hparams import sample
    return sample(space, random.Random(f"gtep/{tuning}/{method}/{k}"))


def tuning_id(spec) -> str:
    """The identity of a scenario's tuning phase (Alg. 2): D^HT, its classes, the task
    configuration and every common key that defines a tuning run (backbone, budgets, validation,
    augmentation, ...), hashed without the scenario's name and its D^E. The paper tunes once per
    D^HT and applies H* to every D^E (Sec. 4.1: "we perform experiments on the class-IL scenarios
    generated from both the CIFAR-50-1 and ImageNet-50-1 datasets" in the tuning phase, then high
    and low similarity D^E): scenarios with the same id share their tuning runs (same record keys,
    in one suite or across suites). Readable: ``<dataset>[<start>-<stop>]-<task config>-<hash>``."""
    from ...results import run_key
    from ...engine.suites import spec_definition
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


def make_case(suite, spec, method_cls, base_hparams, space: MethodSpace, config, phase, trial, k=None,
              tuning: str | None = None, paper: str | None = None):
    """One phase run. A tuning run is a ``TuneCase``: its key leaves out the suite, so the same
    D^HT tuning in two suites is one stored run."""
    from ...engine.runner import Case, resolve_hparams
    args = {**space.fixed, **config}
    hparams = resolve_hparams(method_cls, base_hparams, {a: v for a, v in args.items() if a in method_cls.hparams})
    budgets = {a: v for a, v in args.items() if a in BUDGET}
    if phase == "tune" and tuning:
        from .tune_case import TuneCase
        return TuneCase(suite.name, phase_spec(spec, phase, budgets, k, tuning, paper), method_cls.name, trial, hparams)
    return Case(suite.name, phase_spec(spec, phase, budgets, k, tuning), method_cls.name, trial, hparams)


# ----------------------------------------------------------------------------- selection
def hmean_score(record: RunRecord) -> float:
    """P_s of one trial: harmonic mean of final Acc and AvgAcc (Sec. 4.1); NaN when it did not pass."""
    from ...metrics import harmonic_mean
    if record.status != "passed":
        return math.nan
    return harmonic_mean(record.metrics.get("final_acc", math.nan), record.metrics.get("avg_inc_acc", math.nan))


# Alg. 1's criterion read two ways. The paper's default is what Alg. 2 writes out: each trial s
# scores P_s^HT (line 9), and a configuration's score is their mean,
#     "P_r^HT <- 1/S sum_{s=1}^S P_s^HT"            (Alg. 2, line 10),
# with the per-trial performance being the selection metric of Sec. 4.1: "The hyperparameters that
# yield the highest harmonic mean of Acc and AvgAcc are selected during the hyperparameter tuning
# phase". Hence "mean-of-hmeans". The other reading, "hmean-of-means", takes Acc and AvgAcc averaged
# over the S trials first and their harmonic mean after (the harmonic mean of the reported
# "Acc / AvgAcc" means of Tables 7-8); it can pick a different configuration.
SELECTION_RULES = ("mean-of-hmeans", "hmean-of-means")
DEFAULT_SELECTION = "mean-of-hmeans"


def config_score(records: list[RunRecord], rule: str = DEFAULT_SELECTION) -> float:
    """P_r^HT of one configuration from its S tuning trials under ``rule`` (see SELECTION_RULES):
    "mean-of-hmeans" = mean_s H(Acc_s, AvgAcc_s) (Alg. 2 line 10, the default); "hmean-of-means"
    = H(mean_s Acc_s, mean_s AvgAcc_s). NaN when a trial did not pass or there are no trials."""
    from ...metrics import harmonic_mean
    if rule not in SELECTION_RULES:
        raise ValueError(f"selection = {rule!r}; allowed: {', '.join(SELECTION_RULES)}")
    if not records:
        return math.nan
    if rule == "mean-of-hmeans":
        return float(np.mean([hmean_score(r) for r in records]))
    if any(r.status != "passed" for r in records):
        return math.nan
    acc = float(np.mean([r.metrics.get("final_acc", math.nan) for r in records]))
    avg = float(np.mean([r.metrics.get("avg_inc_acc", math.nan) for r in records]))
    return harmonic_mean(acc, avg)


def select_best(tuning: Mapping[int, list[RunRecord]], rule: str = DEFAULT_SELECTION
                ) -> tuple[int | None, dict[int, float]]:
    """Alg. 1 SelectBestHyperparameter: the configuration with the highest P_r (``config_score``
    under ``rule``) wins (ties: the lowest k). A configuration with a diverged or failed trial has
    P_r = NaN and cannot win; if every one has, there is no H* (the paper's BEEF NaN)."""
    scores = {k: config_score(recs, rule) for k, recs in sorted(tuning.items())}
    finite = {k: v for k, v in scores.items() if not math.isnan(v)}
    if not finite:
        return None, scores
    best = max(finite.values())
    return min(k for k, v in finite.items() if v == best), scores


# ----------------------------------------------------------------------------- outputs
def split_scenario(name: str) -> tuple[str, str, int | None] | None:
    """``tuning:tune-c3`` -> (tuning, "tune", 3); ``scenario:eval@tuning`` (or ``scenario:eval``)
    -> (scenario, "eval", None); ``tuning:tune@paper-P`` -> ("tuning [paper H* P]", "tune", None)
    (a tuning-phase run: reports fold it into the GTEP section)."""
    m = PHASE.match(name)
    if not m:
        return None
    if m["tuning"] and m["tuning"].startswith(PAPER):   # the paper's H*: a scenario of its own in every table
        return f"{m['scenario']} [paper H* {m['tuning'][len(PAPER):]}]", "eval", None
    if m["ptune"]:   # the paper's H* on D^HT: its tuning-phase score, beside the D^E one in the same row
        return f"{m['scenario']} [paper H* {m['ptune'][len(PAPER):]}]", "tune", None
    return m["scenario"], "tune" if m["k"] is not None else "eval", None if m["k"] is None else int(m["k"])


def tuning_of(name: str) -> str | None:
    """The tuning id an evaluation record took its H* from (None for records named before
    tuning phases were shared: their tuning records carry the scenario's own name)."""
    m = PHASE.match(name)
    return m["tuning"] if m else None


def is_gtep(record: RunRecord) -> bool:
    return split_scenario(record.scenario) is not None


def summarize(records: Iterable[RunRecord], spaces: Mapping[str, MethodSpace] | None = None):
    """Per (suite, scenario, method): the tuning-phase score of H* on D^HT (what the conventional
    protocol reports), the evaluation-phase score P^E on D^E (mean ± 95% CI over trials), the gap
    (overestimation), H*, the spread over evaluation trials, diverged/failed trials, parameters and
    training time. Scores are final Acc; the selection criterion (harmonic mean) is shown too.
    ``spaces`` (method -> its MethodSpace) marks methods tuned over the general parameters only
    and general parameters a method does not accept."""
    import pandas as pd

    from ...metrics import mean_ci
    tunes: dict[tuple, dict] = {}     # (tuning id, method) -> {k: {trial: record}}, from any suite
    old_tunes: dict[tuple, dict] = {}   # (suite, scenario, method) -> the same, for unshared records
    groups: dict[tuple, dict] = {}
    paper_tunes: dict[tuple, list] = {}   # (tuning id, "paper-<preset>", method) -> the preset's D^HT runs
    for r in records:
        parsed = split_scenario(r.scenario)
        if parsed is None:
            continue
        scenario, phase, k = parsed
        m = PHASE.match(r.scenario)
        if m["ptune"]:
            paper_tunes.setdefault((m["scenario"], m["ptune"], r.method), []).append(r)
        elif phase == "tune":
            for table, key in ((tunes, (scenario, r.method)), (old_tunes, (r.suite, scenario, r.method))):
                table.setdefault(key, {}).setdefault(k, {})[r.seed] = r
        else:
            g = groups.setdefault((r.suite, scenario, r.method), {"eval": [], "tuning": tuning_of(r.scenario),
                                                                  "base": PHASE.match(r.scenario)["scenario"]})
            g["eval"].append(r)
    # the paper's D^HT runs join the row of its D^E runs (found through the scenario's tuning id), else a row of their own
    tuning_ids = {(suite, g["base"]): g["tuning"] for (suite, _, _), g in groups.items()
                  if g["tuning"] and not g["tuning"].startswith(PAPER)}
    for (suite, _, method), g in groups.items():
        if g["tuning"] and g["tuning"].startswith(PAPER):
            g["paper_tune"] = paper_tunes.pop((tuning_ids.get((suite, g["base"])), g["tuning"], method), [])
    for (tid, preset, method), recs in paper_tunes.items():
        groups[(recs[0].suite, f"{tid} [paper H* {preset[len(PAPER):]}]", method)] = {
            "eval": [], "tuning": preset, "base": tid, "paper_tune": recs}
    used = {(g["tuning"] or sc, m) for (_, sc, m), g in groups.items()}
    for (tuning, method), table in tunes.items():   # tuning without evaluation records (yet): its own row
        if (tuning, method) not in used:
            suite = next(iter(next(iter(table.values())).values())).suite
            groups[(suite, tuning, method)] = {"eval": [], "tuning": tuning}
    rows = []
    for (suite, scenario, method), g in groups.items():
        found = tunes.get((g["tuning"], method)) if g["tuning"] else old_tunes.get((suite, scenario, method))
        tuning = {k: list(v.values()) for k, v in sorted((found or {}).items())}
        paper = bool(g["tuning"] and g["tuning"].startswith(PAPER))
        rule, best, scores, other_rule, other_best = _selections(tuning, g["eval"])
        chosen = tuning.get(best, [])
        if paper:   # the paper's configuration: its D^HT runs are its tuning-phase score
            chosen = sorted(g.get("paper_tune", []), key=lambda r: r.seed)
            scores = {None: config_score(chosen, rule) if chosen else math.nan}
        evals = [r for r in g["eval"] if best is None or _same_config(r, chosen)]
        acc = lambda recs: [r.metrics.get("final_acc", math.nan) if r.status == "passed" else math.nan for r in recs]  # noqa: E731
        tune_acc, tune_ci = mean_ci(acc(chosen))
        eval_acc, eval_ci = mean_ci(acc(evals))
        eval_h = [hmean_score(r) for r in evals]
        all_tune = [r for recs in tuning.values() for r in recs] + (chosen if paper else [])
        passed_eval = [r for r in evals if r.status == "passed"]
        rows.append({
            "suite": suite, "scenario": scenario, "method": method, "tuning": g["tuning"] or scenario,
            "configs": len(tuning), "tune_runs": len(all_tune), "eval_trials": len(evals),
            "tune_acc": tune_acc, "tune_acc_ci": tune_ci,
            "tune_hmean": scores.get(best, math.nan) if best is not None or paper else math.nan,
            "eval_acc": eval_acc, "eval_acc_ci": eval_ci,
            "eval_hmean": float(np.nanmean(eval_h)) if any(not math.isnan(v) for v in eval_h) else math.nan,
            "gap": tune_acc - eval_acc,
            "eval_std": float(np.std(acc(passed_eval), ddof=1)) if len(passed_eval) > 1 else math.nan,
            "tune_diverged": sum(r.status != "passed" for r in all_tune),
            "eval_diverged": sum(r.status != "passed" for r in evals),
            "config": best, "hparams": _config_text(g["eval"][0] if paper and g["eval"] else chosen[0] if chosen else None),
            "paper": paper,
            "selection": rule, "other_selection": other_rule, "other_config": other_best,
            "other_hparams": _config_text(tuning[other_best][0] if other_best in tuning else None),
            "readings_differ": other_best != best,
            "parameters": int(np.mean([r.parameters for r in passed_eval])) if passed_eval else 0,
            "eval_train_s": float(np.mean([r.train_seconds for r in passed_eval])) if passed_eval else math.nan,
            "total_s": sum(r.train_seconds + r.eval_seconds for r in [*all_tune, *g["eval"]]),
            "general_only": bool(spaces is not None and method in spaces and not spaces[method].own
                                 and not spaces[method].paper),
            "not_tunable": ", ".join(spaces[method].not_tunable) if spaces and method in spaces else "",
        })
    frame = pd.DataFrame(rows)
    if not frame.empty:
        frame["eval_rank"] = frame.groupby(["suite", "scenario"])["eval_acc"].rank(ascending=False, method="min")
        frame["tune_rank"] = frame.groupby(["suite", "scenario"])["tune_acc"].rank(ascending=False, method="min")
        frame = frame.sort_values(["suite", "scenario", "eval_rank", "method"], kind="stable").reset_index(drop=True)
    return frame


def _selections(tuning, evals):
    """Both readings of Alg. 1 on one method's tuning records: (rule used, its H*, its scores,
    the other rule, its H*). The rule used is the one whose H* the evaluation records ran (a
    record does not name its suite's ``selection``); the default when both or neither match."""
    picks = {rule: select_best(tuning, rule) for rule in SELECTION_RULES}
    ran = [rule for rule, (best, _) in picks.items()
           if best is not None and evals and all(_same_config(r, tuning[best]) for r in evals)]
    rule = ran[0] if len(ran) == 1 else DEFAULT_SELECTION
    other = next(r for r in SELECTION_RULES if r != rule)
    return rule, picks[rule][0], picks[rule][1], other, picks[other][0]


def _same_config(record: RunRecord, chosen: list[RunRecord]) -> bool:
    return not chosen or record.hparams == chosen[0].hparams


def _config_text(record: RunRecord | None) -> str:
    if record is None:
        return "-"
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in record.hparams.items())


def ranking_change(frame) -> dict[tuple[str, str], dict[str, float]]:
    """Kendall tau (and Spearman rho) between the tuning-phase and evaluation-phase scores of the
    methods of each scenario: 1 = the conventional protocol ranks them as GTEP does."""
    from ...metrics import rank_correlation
    out = {}
    for (suite, scenario), group in frame.groupby(["suite", "scenario"], sort=False):
        ok = group.dropna(subset=["tune_acc", "eval_acc"])
        out[(suite, scenario)] = (rank_correlation(ok.tune_acc, ok.eval_acc) if len(ok) >= 2
                                  else {"spearman": math.nan, "spearman_p": math.nan, "kendall": math.nan, "kendall_p": math.nan})
    return out


def render(frame, fmt: str = "github") -> str:
    """The GTEP section: methods ranked by the evaluation phase, with the ranking change."""
    from tabulate import tabulate
    if frame.empty:
        return "(no GTEP runs)"
    lines = []
    taus = ranking_change(frame)
    for (suite, scenario), group in frame.groupby(["suite", "scenario"], sort=False):
        table = []
        for _, r in group.iterrows():
            notes = []
            if r.general_only:
                notes.append("general parameters only (no declared space)")
            if r.not_tunable:
                notes.append(f"does not take general parameter(s) {r.not_tunable}")
            if _missing(r.config) and not r.paper:
                notes.append("no configuration finished every tuning trial (NaN)")
            if r.readings_differ:
                notes.append(f"{r.other_selection} would choose "
                             f"{'none (NaN)' if _missing(r.other_config) else f'c{int(r.other_config)}: {r.other_hparams}'}")
            table.append([int(r.eval_rank) if not math.isnan(r.eval_rank) else "-", r.method,
                          _pm(r.tune_acc, r.tune_acc_ci), _pm(r.eval_acc, r.eval_acc_ci), _num(r.gap, signed=True),
                          _num(r.tune_hmean), _num(r.eval_hmean), _num(r.eval_std),
                          f"{r.tune_diverged}/{r.tune_runs}", f"{r.eval_diverged}/{r.eval_trials}",
                          int(r.tune_rank) if not math.isnan(r.tune_rank) else "-",
                          f"{r.parameters:,}", _num(r.eval_train_s, 2), _num(r.total_s, 1),
                          f"paper: {r.hparams}" if r.paper else "-" if _missing(r.config)
                          else f"c{int(r.config)}: {r.hparams}", "; ".join(notes)])
        tau = taus[(suite, scenario)]["kendall"]
        tuned = group.tuning.iloc[0]
        where = f"[H* tuned on {tuned}]  " if tuned != scenario and not tuned.startswith(PAPER) else ""
        lines.append(f"{suite}::{scenario}  {where}(Kendall tau, tuning vs evaluation ranking: "
                     f"{'-' if math.isnan(tau) else f'{tau:.3f}'}; "
                     f"{'ranking unchanged' if math.isclose(tau, 1.0) else 'ranking changes' if not math.isnan(tau) else 'fewer than 2 methods'})")
        lines.append(tabulate(table, headers=["rank", "method", "tune acc (D^HT val)", "eval acc P^E (D^E)", "gap",
                                              "tune H", "eval H", "eval std", "tune NaN", "eval NaN", "tune rank",
                                              "params", "eval train s", "protocol s", "chosen H*", "notes"],
                              tablefmt=fmt, disable_numparse=True))
    return "\n\n".join(lines)


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _num(v, digits: int = 3, signed: bool = False) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:+.{digits}f}" if signed else f"{v:.{digits}f}"


def _pm(mean, ci) -> str:
    if mean is None or math.isnan(mean):
        return "NaN"
    return f"{mean:.3f} ± {ci:.3f}" if ci and not math.isnan(ci) else f"{mean:.3f}"


def method_spaces(harness, methods: Iterable[str], options=None) -> dict[str, MethodSpace]:
    """method -> its GTEP space (default options), for the scorecard's notes."""
    out = {}
    for m in methods:
        try:
            out[m] = method_space(harness.methods[m], options or {})
        except (LookupError, HParamError):
            continue
    return out


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
    from ...engine.suites import SuiteError
    from ...engine.units import Unit, case_unit
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
            cases = [[make_case(suite, spec, method_cls, base, space, configs[k], "tune", s, k, tuning)
                      for s in range(S)] for k in range(R)]
        except HParamError as exc:
            raise SuiteError(f"{suite.path}: scenario {spec.name!r}: {exc}") from None
        tune_keys = {}
        for k in range(R):
            for s in range(S):
                unit = case_unit(suite, f"{spec.name}[{method}-tune-c{k}-t{s}]", cases[k][s], method_cls,
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
                paper = [make_case(suite, spec, method_cls, base, space, table[method], "eval", s,
                                   tuning=f"{PAPER}{name}") for s in range(S)]
                on_dht = [make_case(suite, spec, method_cls, base, space, table[method], "tune", s, tuning=tuning,
                                    paper=name) for s in range(S)]
            except HParamError as exc:
                raise SuiteError(f"{suite.path}: scenario {spec.name!r}: --clh-preset gtep:{name}: {exc}") from None
            for s in range(S):   # the paper's H* on D^E (Alg. 3 with the appendix's configuration)
                units.append(case_unit(suite, f"{spec.name}[{method}-paper-eval-t{s}]", paper[s], method_cls,
                                       run=_run_expecting_divergence, amend=phase_amend(paper[s])))
            # ... and on D^HT, scored on its validation split as the tuning runs are ("Original" of Fig. 4 / 7(a),
            # Tables 7 and 14); shared by the scenarios of one tuning phase, as the tuning runs are
            for s in range(S):
                units.append(case_unit(suite, f"{spec.name}[{method}-paper-tune-t{s}]", on_dht[s], method_cls,
                                       run=_run_tune, amend=phase_amend(on_dht[s]), shared=True))
    return units


# A preset named for a D^HT and a task count (appendix A's sections) -> (tune_dataset, dataset path, tune_classes)
PRESET_DHT = {"cifar50-1": ("cifar100", None, [0, 50]), "imagenet50-1": ("imagefolder", "imagenet", [0, 50]),
              "imagenet100-1": ("imagefolder", "imagenet", [0, 100]), "cub100-1": ("cub200", None, [0, 100]),
              "cub200": ("cub200", None, None), "imagenet-r-1": ("imagenet-r", None, [0, 100]),
              "imagenet-r": ("imagenet-r", None, None)}
PRESET_NAME = re.compile(r"^(?P<dht>.+)-(?P<tasks>\d+)tasks$")
PAPER_DHT = {(dataset, path) for dataset, path, _ in PRESET_DHT.values()}   # the paper's D^HT datasets


def preset_applies(name: str, spec) -> bool:
    """Whether preset ``name`` configures scenario ``spec``: a preset named for a D^HT and a task count
    ("cub200-10tasks") configures the scenarios tuned on that D^HT (dataset and class range) with that
    many tasks; a preset named for neither ("pycil-original") configures every scenario, and so does any
    preset on a stand-in scenario (a D^HT the paper does not use: synthetic data, digits)."""
    match = PRESET_NAME.match(name)
    if match is None or match["dht"] not in PRESET_DHT:
        return True
    o = spec.options
    own = (o["tune_dataset"], o.get("tune_dataset_options", {}).get("path") if o["tune_dataset"] == "imagefolder" else None)
    if own not in PAPER_DHT:
        return True
    dataset, path, classes = PRESET_DHT[match["dht"]]
    tasks = int(o["task_config"].split("-")[0])
    return own == (dataset, path) and (o["tune_classes"] or None) == classes and tasks == int(match["tasks"])


def check_preset_scope(name: str, suite) -> None:
    """A preset that configures none of the suite's GTEP scenarios is a mistake, said before any training."""
    from ...engine.suites import SuiteError
    specs = [s for s in suite.scenarios if s.kind == "gtep"]
    if specs and not any(preset_applies(name, s) for s in specs):
        have = ", ".join(f"{s.name} ({s.options['tune_dataset']}{s.options['tune_classes'] or ''}, "
                         f"{s.options['task_config']})" for s in specs)
        raise SuiteError(f"{suite.path}: --clh-preset gtep:{name} is for another D^HT or task count than every "
                         f"scenario of suite {suite.name!r}: {have}; pick the preset of a scenario's D^HT and task count")


def session_presets(presets) -> list[tuple[str, dict]]:
    """The presets ``gtep:<name>`` -> [(name, {our method: the paper's configuration})]; other
    families' presets are theirs to read."""
    from ...engine.suites import SuiteError
    from .paper_configs import PresetError, preset
    out = []
    for text in presets or []:
        family, _, name = text.partition(":")
        if family != "gtep":
            continue
        try:
            out.append((name, preset(name)))
        except PresetError as exc:
            raise SuiteError(str(exc)) from None
    return out


def _run_eval(session, unit) -> None:
    """Alg. 3 for one trial: waits for the method's tuning records, selects H*, runs it on D^E."""
    from ...engine.outcomes import Failed
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
    case = make_case(d["suite"], d["spec"], method_cls, d["suite"].hparams.get(d["method"], {}), d["space"],
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
    from ...engine.outcomes import SHARED_WITH, ExpectedFailure, Failed
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


# ----------------------------------------------------------------------------- scorecard section
def section(records: Iterable[RunRecord], harness=None, fmt: str = "github") -> str | None:
    """The GTEP section of a scorecard, or None when ``records`` hold no GTEP runs."""
    records = [r for r in records if is_gtep(r)]
    if not records:
        return None
    spaces = method_spaces(harness, sorted({r.method for r in records})) if harness is not None else None
    return render(summarize(records, spaces), fmt)


def write_section(path, records: Iterable[RunRecord], harness=None) -> None:
    """Add the GTEP section to a written scorecard: appended to .md, a "gtep" key in .json, a
    sibling ``<name>.gtep.csv`` next to .csv."""
    import json
    from pathlib import Path
    path = Path(path)
    records = [r for r in records if is_gtep(r)]
    if not records:
        return
    spaces = method_spaces(harness, sorted({r.method for r in records})) if harness is not None else None
    frame = summarize(records, spaces)
    if path.suffix == ".md":
        with open(path, "a") as fh:
            fh.write("\n## GTEP: tuning phase (D^HT) vs evaluation phase (D^E)\n\n" + render(frame) + "\n")
    elif path.suffix == ".json":
        data = json.loads(path.read_text())
        data["gtep"] = json.loads(frame.to_json(orient="records"))
        data["gtep_ranking"] = [{"suite": s, "scenario": sc, **v} for (s, sc), v in ranking_change(frame).items()]
        path.write_text(json.dumps(data, indent=1))
    elif path.suffix == ".csv":
        frame.to_csv(path.with_name(path.stem + ".gtep.csv"), index=False)
