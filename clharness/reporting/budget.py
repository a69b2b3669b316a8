"""Equal-budget views (issue 41 item 3): methods compared at equal training compute.

Per (suite, scenario), each method is one point: the seed means, over its passed runs of the case's main
configuration, of training GFLOPs (x, engine/flops.py) and final accuracy (y).

* **Pareto front**: the methods no other method beats on both axes at once, i.e. none reaches at least
  their accuracy with at most their training FLOPs and is strictly better on one of the two. Only such a
  method is worth its compute; every other one is dominated by a method named beside it.
* **Accuracy per training GFLOP** (``clharness report --per-gflop``): final accuracy / training GFLOPs,
  the ranking's key. A ratio favours a method that is cheap and learns little, so the table also marks the
  front and names each method's dominators: read the ratio within the front (Prabhu et al., CVPR 2023,
  compare methods at one budget; a ratio is the one-number summary of accuracy bought per unit of compute).

A method whose training FLOPs were not counted (records made before they were, an incomplete count) or are 0
has no point: it is listed with the reason, never placed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from ..results import RunRecord

ACCURACY = "final_acc"


@dataclass
class Point:
    method: str
    gflops: float                 # seed mean of train_gflops (NaN: not counted)
    accuracy: float               # seed mean of final_acc (NaN: none)
    seeds: int
    dominated_by: list[str] = field(default_factory=list)

    @property
    def placed(self) -> bool:
        return not math.isnan(self.gflops) and not math.isnan(self.accuracy) and self.gflops > 0

    @property
    def pareto(self) -> bool:
        return self.placed and not self.dominated_by

    @property
    def per_gflop(self) -> float:
        return self.accuracy / self.gflops if self.placed else math.nan

    @property
    def why_not_placed(self) -> str:
        if math.isnan(self.gflops):
            return "training FLOPs not counted"
        if math.isnan(self.accuracy):
            return f"no {ACCURACY}"
        return "no training FLOPs (0)"


def dominates(a: Point, b: Point) -> bool:
    """``a`` is at least as accurate with at most the training FLOPs, and strictly better on one axis."""
    return (a.gflops <= b.gflops and a.accuracy >= b.accuracy
            and (a.gflops < b.gflops or a.accuracy > b.accuracy))


def points(records: Iterable[RunRecord]) -> list[Point]:
    """One point per method of the records (one case's main configuration), in first-seen order."""
    by_method: dict[str, list[RunRecord]] = {}
    for r in records:
        if r.status == "passed":
            by_method.setdefault(r.method, []).append(r)
    out = []
    for method, rs in by_method.items():
        flops = [r.train_gflops for r in rs]
        acc = [r.metrics.get(ACCURACY) for r in rs]
        # a mean over the seeds only when every seed was counted: never a partial sum passed off as the cost
        gflops = math.nan if any(v is None for v in flops) else sum(flops) / len(flops)
        acc = [a for a in acc if a is not None and not math.isnan(a)]
        out.append(Point(method, gflops, sum(acc) / len(acc) if acc else math.nan, len(rs)))
    return front(out)


def front(pts: Sequence[Point]) -> list[Point]:
    """``pts`` with each placed point's dominators filled in (its ``pareto`` is then whether it has none)."""
    placed = [p for p in pts if p.placed]
    for p in placed:
        p.dominated_by = [q.method for q in placed if q is not p and dominates(q, p)]
    return list(pts)


def by_case(records: Iterable[RunRecord]) -> dict[tuple[str, str], list[Point]]:
    """(suite, scenario) -> its points; ``records`` should be the cases' main records
    (``scorecard.main_records``), so no quick or stale seed joins a mean."""
    cases: dict[tuple[str, str], list[RunRecord]] = {}
    for r in records:
        cases.setdefault((r.suite, r.scenario), []).append(r)
    return {case: points(rs) for case, rs in cases.items()}


def ranking(pts: Sequence[Point]) -> list[Point]:
    """The placed points by accuracy per training GFLOP, best first (ties: higher accuracy, then name);
    the unplaced after them, by name."""
    placed = sorted((p for p in pts if p.placed), key=lambda p: (-p.per_gflop, -p.accuracy, p.method))
    return placed + sorted((p for p in pts if not p.placed), key=lambda p: p.method)


def render_ranking(cases: dict[tuple[str, str], list[Point]], fmt: str = "pipe") -> str:
    """One table per case: rank, method, training GFLOPs, final accuracy, accuracy per GFLOP, front."""
    from tabulate import tabulate
    parts = []
    for (suite, scenario), pts in cases.items():
        rows = []
        for i, p in enumerate(ranking(pts), 1):
            if p.placed:
                mark = "yes" if p.pareto else f"no (dominated by {', '.join(p.dominated_by)})"
                rows.append([i, p.method, f"{p.gflops:.4g}", f"{p.accuracy:.3f}", f"{p.per_gflop:.4g}", mark])
            else:
                rows.append(["-", p.method, "-", "-" if math.isnan(p.accuracy) else f"{p.accuracy:.3f}", "-",
                             p.why_not_placed])
        parts.append(f"{suite}::{scenario}\n" + tabulate(
            rows, headers=["rank", "method", "train GFLOPs", "final acc", "acc per GFLOP", "Pareto front"],
            tablefmt=fmt, disable_numparse=True))
    return "\n\n".join(parts) + (
        "\n\n(Ranked by final accuracy per training GFLOP, seed means; the Pareto front: no other method reaches "
        "at least the accuracy with at most the training FLOPs. A ratio favours a method that is cheap and "
        "learns little: compare ratios within the front.)" if parts else "(no runs)")
