"""`clharness compare A B`: two scorecards side by side, and a regression verdict.

A and B are each a scorecard JSON (``--clh-scorecard x.json``) or a results store (SQLite). Rows
are matched on (suite, scenario, method); for every metric given with ``--max-drop METRIC=DROP``
(default ``final_acc=0.02``) B's seed mean may be worse than A's by at most DROP, where "worse"
follows the metric (lower is better for forgetting, AFM, seconds, megabytes). Like
pytest-benchmark's ``compare --fail``: exit 1 on a regression, 0 otherwise, 2 on unusable input.
Rows or metrics present on one side only are reported, never fatal.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from tabulate import tabulate

from .gates import higher_is_better
from .report import ReportError, load_records
from .scorecard import COLUMNS, HEADERS, summarize

KEY = ("suite", "scenario", "method")


@dataclass
class Comparison:
    rows: list[list]                                     # the side-by-side table
    headers: list[str]
    regressions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def render(self, fmt: str = "github") -> str:
        lines = [tabulate(self.rows, headers=self.headers, tablefmt=fmt, disable_numparse=True)]
        lines += [f"note: {n}" for n in self.notes]
        lines += [f"REGRESSION {r}" for r in self.regressions]
        lines.append(f"{len(self.regressions)} regression(s)" if self.regressions else "no regression")
        return "\n".join(lines)


def load_summary(path: str | Path, columns=COLUMNS) -> dict[tuple[str, str, str], dict]:
    """(suite, scenario, method) -> summary row (metric means, ``<metric>_ci``, seeds)."""
    path = Path(path)
    if not path.exists():
        raise ReportError(f"{path} does not exist")
    if path.suffix == ".json":
        try:
            rows = json.loads(path.read_text())["summary"]
            return {tuple(r[k] for k in KEY): r for r in rows}
        except (ValueError, KeyError, TypeError) as exc:
            raise ReportError(f"{path} is not a clharness scorecard JSON ({type(exc).__name__}: {exc}); "
                              "write one with --clh-scorecard FILE.json") from None
    records = load_records(path)   # checks that it is a results store
    metrics = sorted({*columns, *(k for r in records for k in r.metrics)})
    return {tuple(r[k] for k in KEY): r.to_dict() for _, r in summarize(records, metrics).iterrows()}


def compare(a: dict, b: dict, drops: dict[str, float], columns=COLUMNS) -> Comparison:
    """Side by side on ``columns`` plus the drop-checked metrics; regressions per ``drops``."""
    metrics = list(dict.fromkeys([*drops, *columns]))
    headers = ["scenario", "method", *(f"{HEADERS.get(m, m)} A → B" for m in metrics)]
    out = Comparison([], headers)
    for key in [k for k in a if k not in b]:
        out.notes.append(f"{'::'.join(key[:2])}[{key[2]}] only in A (not compared)")
    for key in [k for k in b if k not in a]:
        out.notes.append(f"{'::'.join(key[:2])}[{key[2]}] only in B (not compared)")
    missing = {m for m in drops if not any(_value(r, m) is not None for r in [*a.values(), *b.values()])}
    out.notes += [f"metric {m!r} is in neither scorecard (not judged)" for m in sorted(missing)]
    for key in [k for k in a if k in b]:
        ra, rb = a[key], b[key]
        cells = [f"{key[0]}::{key[1]}", key[2]]
        for m in metrics:
            va, vb = _value(ra, m), _value(rb, m)
            cells.append(_cell(va, vb, m))
            if m in drops and m not in missing:
                if va is None or vb is None:
                    out.notes.append(f"{key[1]}/{key[2]}: {m} missing on the {'A' if va is None else 'B'} side")
                    continue
                worse = (va - vb) if higher_is_better(m) else (vb - va)
                if worse > drops[m] + 1e-12:
                    out.regressions.append(f"{key[1]}/{key[2]}: {m} {va:.4f} -> {vb:.4f}, worse by "
                                           f"{worse:.4f} > allowed drop {drops[m]}")
        out.rows.append(cells)
    return out


def parse_drops(items: list[str]) -> dict[str, float]:
    drops = {}
    for item in items or ["final_acc=0.02"]:
        metric, _, value = item.partition("=")
        try:
            drops[metric.strip()] = float(value)
        except ValueError:
            raise ReportError(f"max drop {item!r}: write METRIC=VALUE, e.g. final_acc=0.02") from None
    return drops


def _value(row: dict, metric: str) -> float | None:
    v = row.get(metric)
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def _cell(va, vb, metric) -> str:
    if va is None and vb is None:
        return "-"
    fa, fb = ("-" if v is None else f"{v:.3f}" for v in (va, vb))
    if va is None or vb is None:
        return f"{fa} → {fb}"
    delta = vb - va
    if abs(delta) < 5e-4:
        return f"{fa} → {fb} (=)"
    better = delta > 0 if higher_is_better(metric) else delta < 0
    return f"{fa} → {fb} ({delta:+.3f} {'▲' if better else '▼'})"
