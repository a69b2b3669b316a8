"""CLDyB's per-method summary (CC/IC/random/held-out Final AA, AR, ALA, robustness, memory): the
numbers the kind's session summary, scorecard and report sections share. Its own module so the
report (report_html) and the kind (kind) both read it without importing each other."""
from __future__ import annotations

import math

import numpy as np

USE_CASES = ("cc", "ic", "random", "heldout")
SEARCH_METHOD = "cldyb-search"          # the method field of search records (kept out of scorecards)


def _final_aa(record) -> float:
    """CLDyB's Final AA: the per-task mean of R's last row (metrics.average_accuracy), not the
    runner's sample-weighted ``final_acc``; recomputed from the matrix for records stored before
    ``aa`` existed."""
    from ...metrics import average_accuracy
    if "aa" in record.metrics:
        return record.metrics["aa"]
    return average_accuracy(record.acc_matrix) if record.acc_matrix else math.nan


def summary_rows(records) -> list[dict]:
    """Per (suite, scenario, method): CC AA/AR/ALA, robustness (mean final AA over IC sequences), memory,
    random and held-out final AA (means over seeds). AA is the per-task mean (CLDyB Sec. 5)."""
    from ...metrics import mean_ci
    table: dict = {}
    for r in records:
        base, _, use_case = r.scenario.rpartition("/")
        if use_case not in USE_CASES or r.status != "passed" or not base:
            continue
        table.setdefault((r.suite, base, r.method), {}).setdefault(use_case, []).append(r)
    rows = []
    for (suite, base, method), by_case in table.items():
        row = {"suite": suite, "scenario": base, "method": method}
        for use_case, recs in by_case.items():
            row[f"{use_case}_aa"] = mean_ci([_final_aa(x) for x in recs])
        cc = by_case.get("cc", [])
        for metric in ("ar", "ala"):
            row[f"cc_{metric}"] = mean_ci([x.metrics.get(metric, math.nan) for x in cc]) if cc else (math.nan, math.nan)
        row["robustness"] = row.get("ic_aa", (math.nan, math.nan))
        row["memory_mb"] = float(np.mean([x.memory_mb for x in cc])) if cc else math.nan
        rows.append(row)
    return rows
