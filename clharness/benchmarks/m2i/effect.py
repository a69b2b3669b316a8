"""The curriculum effect of M2I / I2M (Faber et al. 2024, sec. 4.3, RQ2): per method and metric, the
M2I value minus the I2M value, with a confidence interval over seeds.

Runs are paired by seed (same method, setting and hyperparameters; same images, since the curriculum
draws each dataset's subset from the seed and the task name only), so the interval is the Student-t
interval of the per-seed differences (``metrics.mean_ci``). A record's direction is read from its
class order: M2I runs start with MNIST's classes, I2M runs with Tiny ImageNet's. Scenarios are
matched by their suite and scenario names with "m2i"/"i2m" blanked out (``m2i::ci`` with ``i2m::ci``,
``m2i-mini::ci-m2i`` with ``m2i-mini::ci-i2m``).

    clharness curriculum-effect RESULTS.sqlite [--metric acc --metric bwt] [--suite m2i-mini]
    python -m clharness.benchmarks.m2i.effect RESULTS.sqlite ...   (the same)
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections import defaultdict
from typing import Iterable, Sequence

from ...metrics import mean_ci
from ...results import RunRecord
from .names import CURRICULA, SHARED_SEP

# The paper's ACC (eq. 1), BWT (eq. 2) and FWT (eq. 3), and beside eq. 2 the BWT of the authors'
# analysis code (metrics.bwt_authors), named as theirs (issue 30 item 10).
DEFAULT_METRICS = ("acc", "bwt", "bwt_authors", "fwt")


def direction(record: RunRecord) -> str | None:
    """"m2i", "i2m" or None (not a curriculum run in either standard order)."""
    names = record.class_order[::10]
    if names and SHARED_SEP in names[0]:   # the authors' shared head: output 0 names class 0 of every task
        names = names[0].split(SHARED_SEP)
    order = [name.split("/", 1)[0] for name in names]
    for key, tasks in CURRICULA.items():
        if tuple(order) == tasks:
            return key
    return None


def _pair_key(record: RunRecord) -> tuple:
    blank = lambda s: re.sub(r"m2i|i2m", "*", s)   # noqa: E731
    return (blank(record.suite), blank(record.scenario), record.method, str(record.setting),
            json.dumps(record.hparams, sort_keys=True))


def curriculum_effect(records: Iterable[RunRecord], metrics: Sequence[str] = DEFAULT_METRICS,
                      confidence: float = 0.95) -> list[dict]:
    """One row per (paired scenario, method, metric): m2i and i2m mean and CI half-width over seeds,
    the effect (mean of per-seed M2I - I2M) with its CI half-width, and the number of paired seeds.
    Only passed runs count; a seed present in one direction only is left out of the effect."""
    runs: dict[tuple, dict[str, dict[int, RunRecord]]] = defaultdict(lambda: {"m2i": {}, "i2m": {}})
    for r in records:
        d = direction(r)
        if d is not None and r.status == "passed":
            runs[_pair_key(r)][d][r.seed] = r
    rows = []
    for key, by_dir in sorted(runs.items()):
        seeds = sorted(set(by_dir["m2i"]) & set(by_dir["i2m"]))
        if not seeds:
            continue
        suite, scenario, method, setting, _ = key
        for metric in metrics:
            fwd = [by_dir["m2i"][s].metrics.get(metric, math.nan) for s in seeds]
            bwd = [by_dir["i2m"][s].metrics.get(metric, math.nan) for s in seeds]
            m2i, m2i_ci = mean_ci(fwd, confidence)
            i2m, i2m_ci = mean_ci(bwd, confidence)
            effect, effect_ci = mean_ci([a - b for a, b in zip(fwd, bwd)], confidence)
            rows.append({"suite": suite, "scenario": scenario, "setting": setting, "method": method,
                         "metric": metric, "m2i": m2i, "m2i_ci": m2i_ci, "i2m": i2m, "i2m_ci": i2m_ci,
                         "effect": effect, "effect_ci": effect_ci, "seeds": len(seeds)})
    return rows


def render(rows: Sequence[dict], fmt: str = "github") -> str:
    from tabulate import tabulate
    table = [[r["suite"], r["scenario"], r["method"], r["metric"], f"{r['m2i']:.3f} ± {r['m2i_ci']:.3f}",
              f"{r['i2m']:.3f} ± {r['i2m_ci']:.3f}", f"{r['effect']:+.3f} ± {r['effect_ci']:.3f}", r["seeds"]]
             for r in rows]
    return tabulate(table, headers=["suite", "scenario", "method", "metric", "M2I", "I2M", "M2I - I2M", "seeds"],
                    tablefmt=fmt)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", help="the SQLite results store (--clh-results)")
    parser.add_argument("--metric", action="append", help=f"metric key (repeatable; default {', '.join(DEFAULT_METRICS)})")
    parser.add_argument("--suite", action="append", default=[], help="only these suites (repeatable)")


def add_commands(subparsers) -> dict:
    """The M2I family's ``clharness curriculum-effect`` (the kind's ``cli`` module, clharness.kinds)."""
    add_arguments(subparsers.add_parser("curriculum-effect", help="M2I minus I2M per method, with a CI over seeds",
                                        description="M2I minus I2M per method, with a CI over seeds"))
    return {"curriculum-effect": run}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clharness.benchmarks.m2i.effect",
                                     description="M2I minus I2M per method, with a CI over seeds")
    add_arguments(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    from ...results import NoRecords, read_records
    try:
        records = read_records(args.results, args.suite)
    except NoRecords as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = curriculum_effect(records, args.metric or DEFAULT_METRICS)
    if not rows:
        print(f"error: {args.results} holds no passed M2I runs with a matching I2M run of the same seed",
              file=sys.stderr)
        return 2
    print(render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
