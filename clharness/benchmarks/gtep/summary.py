"""GTEP's outputs rebuilt from its records: per method the tuning vs evaluation score, the gap, H*, spread, diverged
trials, cost and the ranking change (Kendall tau), as a table and as the scorecard's GTEP section."""
from __future__ import annotations

import math
from typing import Iterable, Mapping

import numpy as np

from ...results import RunRecord
from .phases import PAPER, PHASE, is_gtep, split_scenario, tuning_of
from .search import MethodSpace, method_spaces
from .selection import DEFAULT_SELECTION, SELECTION_RULES, config_score, hmean_score, select_best

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
