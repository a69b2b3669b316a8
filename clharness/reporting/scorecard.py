"""Scorecards: run records -> pandas tables (mean and 95% CI over seeds) -> text/files."""
from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Iterable, Sequence

import pandas as pd
from tabulate import tabulate

from ..metrics import mean_ci, rank_correlation
from ..results import RunRecord, configuration_fields, configuration_id, configuration_label

# The columns of the default scorecard: metric keys or record fields.
COLUMNS = ("final_acc", "avg_inc_acc", "forgetting", "bwt", "train_seconds", "train_gflops", "eval_gflops", "memory_mb")
HEADERS = {"final_acc": "final acc", "avg_inc_acc": "avg inc acc", "forgetting": "forgetting", "bwt": "BWT",
           "fwt": "FWT", "acc": "ACC", "info_retention": "info retention", "afm": "AFM", "ala": "ALA", "ar": "AR", "aa": "AA", "hmean": "H(acc, avg)",
           "train_seconds": "train s", "eval_seconds": "eval s", "memory_mb": "memory MB",
           "train_gflops": "train GFLOPs", "eval_gflops": "eval GFLOPs",
           "peak_cuda_mb": "peak CUDA MB", "peak_rss_mb": "peak RSS MB", "parameters": "params",
           "memory_model_mb": "model MB", "memory_buffer_mb": "buffer MB", "memory_other_mb": "other MB",
           "min_acc": "min-ACC", "wc_acc": "WC-ACC", "stability_gap": "stability gap", "gap_recovery": "gap recovery",
           "a_auc": "A_AUC", "final_acc_task_il": "final acc (task-IL)"}
# continual evaluation's metrics (eval_every; metrics.continual_metrics): shown by default where a run has them
CONTINUAL = ("min_acc", "wc_acc", "stability_gap", "gap_recovery", "a_auc")
KEYS = ["suite", "scenario", "method"]
# What every "mean ± x" cell means, with its n (printed under each table: a reader of a paper's table
# must not have to guess the test, the level or the sample size).
INTERVAL_NOTE = ("mean ± half-width of the 95% Student-t confidence interval over the n passed seeds of the row "
                 "(its seeds column): t_{0.975, n−1} · s / √n with the sample sd s, so t = 4.303 at n = 3 "
                 "(not the normal 1.96); a single seed has no interval.")
WELCH_NOTE = ("Is the best method of a scenario (highest seed-mean final accuracy) ahead of each other method? "
              "Welch's two-sided t-test (unequal variances, scipy.stats.ttest_ind(equal_var=False)) on the "
              "per-seed values, with both sample sizes n; with n = 3 seeds only large gaps reach p < 0.05.")


def default_columns(records: Iterable[RunRecord]) -> list[str]:
    """COLUMNS, plus the metrics a scenario kind adds of its own, in a fixed order: accuracy-like
    ones (STF's info_retention, ...) after the four accuracy columns, timings (``*_seconds``)
    after ``train_seconds``, each group sorted by name. A table then drops the ones its own
    records do not carry (:func:`carried`). Continual evaluation's metrics (CONTINUAL) follow the
    accuracy columns when any record has them."""
    from ..metrics import METRIC_INFO
    records = list(records)
    extra = sorted({k for r in records for k in r.metrics} - set(METRIC_INFO) - set(COLUMNS))
    timings = [k for k in extra if k.endswith("_seconds")]
    scores = [k for k in extra if k not in timings]
    continual = [k for k in CONTINUAL if any(k in r.metrics for r in records)]
    return [*COLUMNS[:4], *continual, *scores, COLUMNS[4], *timings, *COLUMNS[5:]]


def heading(column: str) -> str:
    """A column's table heading: HEADERS, else the key made readable (``lookahead_seconds`` ->
    ``look-ahead s``, ``info_retention`` -> ``info retention``)."""
    if column in HEADERS:
        return HEADERS[column]
    name = column[:-len("_seconds")] + " s" if column.endswith("_seconds") else column
    return name.replace("lookahead", "look-ahead").replace("_", " ")


def carried(summary: pd.DataFrame, columns: Sequence[str]) -> list[str]:
    """The ``columns`` (in their order) that at least one row of ``summary`` has a value for: a
    table of one family's runs shows no other family's metrics."""
    return [c for c in columns if c in summary and summary[c].notna().any()]
# memory_mb's three parts and the two peaks are columns a table can ask for (--columns memory_buffer_mb,...)
MEMORY_FIELDS = ("memory_model_mb", "memory_buffer_mb", "memory_other_mb", "peak_rss_mb", "peak_cuda_mb")
# FLOPs (engine/flops.py): None where not counted (NaN in a frame): a row's mean is over its counted seeds
FLOP_FIELDS = ("train_gflops", "eval_gflops")
_FIELDS = ("train_seconds", "eval_seconds", *FLOP_FIELDS, "memory_mb", *MEMORY_FIELDS, "parameters")


def records_frame(records: Iterable[RunRecord]) -> pd.DataFrame:
    """One row per run: keys, seed, status and every metric and cost as columns."""
    rows = [{**{k: getattr(r, k) for k in (*KEYS, "seed", "status", "message")},
             **{f: math.nan if getattr(r, f) is None else getattr(r, f) for f in _FIELDS}, **r.metrics}
            for r in records]
    return pd.DataFrame(rows, columns=None if rows else [*KEYS, "seed", "status"])


def main_configurations(records: Iterable[RunRecord], current: dict | None = None) -> dict[tuple, str]:
    """Per (suite, scenario, method): the configuration id of its main row, the one the current code
    would run. ``current`` maps a case to the current code digest (front ends compute it with the
    engine); a configuration with that code comes first, then a full budget over a quick one, then the
    newest. Without ``current``, the newest full-budget configuration (a stale run may be newer: front
    ends pass ``current`` for that)."""
    best: dict[tuple, tuple] = {}
    for r in records:
        case = (r.suite, r.scenario, r.method)
        rank = (bool(current) and current.get(case) == r.code_digest, r.budget != "quick", r.finished_at)
        if case not in best or rank > best[case][0]:
            best[case] = (rank, configuration_id(r))
    return {case: cid for case, (_, cid) in best.items()}


def main_records(records: Iterable[RunRecord], current: dict | None = None) -> list[RunRecord]:
    """The records of each case's main configuration (:func:`main_configurations`): what a figure or a
    test between methods uses, so that no quick, stale or other-hyperparameter seed joins its samples."""
    records = list(records)
    main = main_configurations(records, current)
    return [r for r in records if configuration_id(r) == main[(r.suite, r.scenario, r.method)]]


def summarize(records: Iterable[RunRecord], columns: Sequence[str] = COLUMNS,
              confidence: float = 0.95, current: dict | None = None) -> pd.DataFrame:
    """Per (suite, scenario, method) and configuration (``results.configuration_id``: the record's key
    less the seed): mean and CI half-width of each column over passed seeds, the number of seeds that
    passed and the count of every other status. Records of different configurations are never pooled:
    each is a row, the case's main one (``main_configurations``) first, the others labelled by how they
    differ from it (``configuration`` column: "quick", "code 1a2b3c (stale)", "lr=0.1")."""
    records = list(records)
    main = main_configurations(records, current)
    by_row: dict[tuple, list[RunRecord]] = {}
    for r in records:
        by_row.setdefault((r.suite, r.scenario, r.method, configuration_id(r)), []).append(r)
    reference = {(r.suite, r.scenario, r.method): configuration_fields(r) for r in records
                 if configuration_id(r) == main[(r.suite, r.scenario, r.method)]}
    order = {case: i for i, case in enumerate(dict.fromkeys(k[:3] for k in by_row))}
    rows = sorted(by_row, key=lambda k: (order[k[:3]], main[k[:3]] != k[3]))   # stable: first-seen otherwise
    out = []
    for row_key in rows:
        group, case = by_row[row_key], row_key[:3]
        ok = [r for r in group if r.status == "passed"]
        fields = configuration_fields(group[0])
        row = dict(zip(KEYS, case), configuration=configuration_label(
            group[0], reference[case], (current or {}).get(case)), seeds=len(ok),
            config_id=row_key[3], main=row_key[3] == main[case], budget=fields["budget"],
            code_digest=fields["code_digest"], hparams=json.dumps(fields["hparams"], sort_keys=True, default=str))
        ok_frame = records_frame(ok)
        for col in columns:
            values = ok_frame[col].tolist() if col in ok_frame else []
            row[col], row[f"{col}_ci"] = mean_ci(values, confidence) if values else (math.nan, math.nan)
        for status in ("failed", "diverged", "error", "not-applicable"):
            row[status] = sum(r.status == status for r in group)
        out.append(row)
    return pd.DataFrame(out)


def rank_agreement(summary: pd.DataFrame, metric: str = "final_acc", min_methods: int = 3) -> pd.DataFrame:
    """Do two scenarios rank the methods alike? For every pair of scenarios of a suite that share
    at least ``min_methods`` methods with a seed mean of ``metric``: Spearman's rho and Kendall's
    tau (with p-values) between the two rankings (CLDyB Table 1 compares rankings this way).
    A GTEP scenario enters with its evaluation phase (``X:eval`` as ``X``); its tuning configurations
    (``X:tune-cK``) are not scenarios, and tuning vs evaluation is the GTEP section's Kendall tau;
    neither are ``select_hparams``' selection runs (``X:select-cK``, clharness.engine.hparam_selection)."""
    from ..kinds import split_scenario
    rows = []
    if summary.empty or metric not in summary:
        return pd.DataFrame(rows)
    if "main" in summary:   # a case's other configurations are not another ranking
        summary = summary[summary.main.astype(bool)]
    for suite, group in summary.groupby("suite", sort=False):
        scores = {}
        for sc, g in group.groupby("scenario", sort=False):
            phase = split_scenario(sc)
            if phase is not None and phase[1] == "tune" or ":select-c" in sc:   # hparam_selection's runs
                continue
            scores[phase[0] if phase else sc] = dict(zip(g.method, g[metric]))
        names = list(scores)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                common = [m for m in scores[a] if m in scores[b]
                          and not math.isnan(scores[a][m]) and not math.isnan(scores[b][m])]
                if len(common) < min_methods:
                    continue
                corr = rank_correlation([scores[a][m] for m in common], [scores[b][m] for m in common])
                rows.append({"suite": suite, "scenario_a": a, "scenario_b": b, "metric": metric,
                             "methods": len(common), **corr})
    return pd.DataFrame(rows)


def render_agreement(agreement: pd.DataFrame, fmt: str = "github") -> str:
    table = [[r.suite, r.scenario_a, r.scenario_b, r.metric, r.methods,
              f"{r.spearman:.3f} (p={r.spearman_p:.3g}, n={r.methods})",
              f"{r.kendall:.3f} (p={r.kendall_p:.3g}, n={r.methods})"] for r in agreement.itertuples()]
    return tabulate(table, headers=["suite", "scenario A", "scenario B", "metric", "methods", "Spearman rho",
                                    "Kendall tau"], tablefmt=fmt, disable_numparse=True)


def pairwise_welch(records: Iterable[RunRecord], metric: str = "final_acc",
                   skip=lambda record: False, current: dict | None = None) -> pd.DataFrame:
    """Per (suite, scenario): the best method by seed mean of ``metric`` against every other, Welch's
    t-test on the passed seeds' values (scipy's ttest_ind, equal_var=False: the seeds of two methods
    need not share a variance). Rows with n < 2 on a side carry NaN t and p (no test). Each method's
    samples are the seeds of its main configuration only (:func:`main_records`; ``current`` as in
    :func:`summarize`): other configurations are other populations."""
    from scipy import stats
    values: dict = {}
    for r in main_records(records, current):
        v = r.metrics.get(metric)
        if r.status == "passed" and v is not None and not math.isnan(v) and not skip(r):
            values.setdefault((r.suite, r.scenario), {}).setdefault(r.method, []).append(float(v))
    rows = []
    for (suite, scenario), by_method in values.items():
        if len(by_method) < 2:
            continue
        best = max(sorted(by_method), key=lambda m: sum(by_method[m]) / len(by_method[m]))
        a = by_method[best]
        for method in sorted(set(by_method) - {best}):
            b = by_method[method]
            t, p = (math.nan, math.nan)
            if len(a) > 1 and len(b) > 1:
                with warnings.catch_warnings(action="ignore", category=RuntimeWarning):   # equal seeds: p NaN
                    test = stats.ttest_ind(a, b, equal_var=False)
                t, p = float(test.statistic), float(test.pvalue)
            rows.append({"suite": suite, "scenario": scenario, "metric": metric, "best": best, "method": method,
                         "diff": sum(a) / len(a) - sum(b) / len(b), "t": t, "p": p, "n_best": len(a), "n": len(b)})
    return pd.DataFrame(rows)


def render_pairwise(pairs: pd.DataFrame, fmt: str = "github") -> str:
    """One line per pair: the difference, Welch's t and p, and both n."""
    table = [[f"{r.suite}::{r.scenario}", f"{r.best} vs {r.method}", f"{r.diff:+.3f}",
              "no test (n < 2)" if math.isnan(r.p) else f"t = {r.t:.2f}, p = {r.p:.3g}", f"{r.n_best} vs {r.n}"]
             for r in pairs.itertuples()]
    return tabulate(table, headers=["scenario", "pair", f"Δ {heading(pairs.metric.iloc[0]) if len(pairs) else ''}",
                                    "Welch's t-test (two-sided)", "n (seeds)"], tablefmt=fmt, disable_numparse=True)


def render(summary: pd.DataFrame, columns: Sequence[str] = COLUMNS, fmt: str = "github") -> str:
    """The summary as text: ``mean ± ci`` cells, one row per method and scenario."""
    if summary.empty:
        return "(no runs)"
    columns = carried(summary, columns)
    labelled = "main" in summary and not summary.main.astype(bool).all()   # a case has several configurations
    table = []
    for _, row in summary.iterrows():
        cells = [f"{row.suite}::{row.scenario}", row.method, *([row.configuration] if labelled else []), row.seeds]
        cells += [_cell(row[c], row[f"{c}_ci"], c) for c in columns]
        problems = [f"{row[s]} {s}" for s in ("failed", "diverged", "error", "not-applicable") if row[s]]
        cells.append(", ".join(problems))
        table.append(cells)
    headers = ["scenario", "method", *(["configuration"] if labelled else []), "seeds", *map(heading, columns),
               "problems"]
    return tabulate(table, headers=headers, tablefmt=fmt, disable_numparse=True)


def _cell(mean: float, ci: float, column: str) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "-"
    digits = 2 if column in ("train_seconds", "eval_seconds", "memory_mb", *MEMORY_FIELDS) else 3
    if column == "parameters":
        return f"{int(mean):,}"
    return f"{mean:.{digits}f} ± {ci:.{digits}f}" if ci and not math.isnan(ci) else f"{mean:.{digits}f}"


def write(path: str | Path, records: Sequence[RunRecord], columns: Sequence[str] | None = None) -> Path:
    """Write the scorecard; the format follows the suffix: .md, .json or .csv."""
    path = Path(path)
    columns = columns or default_columns(records)
    summary = summarize(records, columns)
    if path.suffix in (".json", ".csv"):   # machine-readable: every metric the records carry (task-IL view, ...)
        from ..metrics import METRIC_INFO
        more = [m for m in METRIC_INFO if m not in columns and any(m in r.metrics for r in records)]
        summary = summarize(records, [*columns, *more]) if more else summary
    if path.suffix == ".md":
        text = render(summary, columns, "github") + f"\n\n{INTERVAL_NOTE}\n"
    elif path.suffix == ".csv":
        text = summary.to_csv(index=False)
    elif path.suffix == ".json":
        text = json.dumps({"columns": list(columns),
                           "summary": json.loads(summary.to_json(orient="records")),
                           "records": [json.loads(r.to_json()) for r in records]}, indent=1)
    else:
        raise ValueError(f"--clh-scorecard {path}: unknown suffix {path.suffix!r}; use .md, .json or .csv")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
