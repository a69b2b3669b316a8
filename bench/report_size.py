"""Size and render time of the HTML report (issue 19 part 1, "Size and rendering").

    python bench/report_size.py            # the ~114-run five-family store, then 10,000 records
    python bench/report_size.py --repeats 3

Records are synthetic (no training): accuracy matrices of the families' task counts and the metrics
each family stores (STF info_retention; CLDyB robustness and look-ahead/clustering timings; GTEP
tuning configurations and evaluation trials), so the page has every section and figure a real
store of these suites would give. Prints the page size (bytes, and how much of it is inline
images) and the median build_html time, figures drawn serially and by one process per CPU.
"""
from __future__ import annotations

import argparse
import os
import random
import re
import statistics
import time

import numpy as np

from clharness.metrics import all_metrics
from clharness.reporting.report import build_html
from clharness.results import RunRecord, run_key
from clharness.reporting.scorecard import default_columns


def matrix(T: int, skill: float, rng: random.Random) -> list[list[float]]:
    R = np.full((T, T), np.nan)
    for i in range(T):
        for j in range(i + 1):
            R[i, j] = max(0.0, min(1.0, 0.95 - skill * (i - j) / T + rng.gauss(0, 0.02)))
    return R.tolist()


def make(suite, scenario, method, seed, T, rng, extra=None, hparams=None):
    R = matrix(T, {"er": 0.3, "ewc": 0.6, "finetune": 0.9}.get(method, 0.5), rng)
    sizes = [100] * T
    rec = RunRecord(suite=suite, scenario=scenario, method=method, seed=seed, setting="class-incremental",
                    status="passed", acc_matrix=R, task_sizes=sizes,
                    metrics={**all_metrics(np.array(R), sizes), **(extra or {})}, hparams=hparams or {},
                    train_seconds=rng.uniform(1, 5), memory_mb=rng.uniform(1, 50))
    rec.key = run_key({"s": suite, "sc": scenario, "m": method, "seed": seed})
    return rec


def five_families(rng: random.Random) -> list[RunRecord]:
    methods = ["er", "ewc", "finetune"]
    out = [make("quickstart", sc, m, s, 5, rng) for sc in ("ci", "ti") for m in methods for s in range(3)]
    out += [make("stf-digits", "stream", m, s, 10, rng, {"info_retention": rng.random()})
            for m in [*methods, "lwf"] for s in range(3)]
    out += [make("m2i-mini", sc, m, s, 5, rng) for sc in ("m2i", "i2m") for m in methods for s in range(3)]
    from clharness.benchmarks.gtep.selection import select_best
    for m in methods:
        tuning = {k: [make("gtep-digits", f"t:tune-c{k}", m, s, 5, rng, hparams={"lr": 10 ** -k}) for s in range(2)]
                  for k in range(5)}
        best, _ = select_best(tuning)   # the evaluation trials run the selected H*, as the protocol does
        out += [r for rs in tuning.values() for r in rs]
        out += [make("gtep-digits", "g:eval@t", m, s, 5, rng, hparams={"lr": 10 ** -best}) for s in range(2)]
    out += [make("cldyb-mini", sc, m, s, 5, rng, {"robustness": rng.random(), "lookahead_seconds": 3.0,
                                                    "clustering_seconds": 1.0})
            for sc in ("cc", "random", "heldout") for m in methods for s in range(3)]
    return out


def many(rng: random.Random, n: int) -> list[RunRecord]:
    methods = [f"m{i}" for i in range(10)]
    seeds = n // (2 * 5 * len(methods))
    return [make(f"suite{a}", f"sc{b}", m, s, 10, rng) for a in range(2) for b in range(5) for m in methods
            for s in range(seeds)]


def measure(name: str, records: list[RunRecord], repeats: int) -> None:
    """Serial and parallel figure drawing (``workers`` 1 vs one per CPU) interleaved, same page."""
    times, par, page = [], [], ""
    for _ in range(repeats):
        t0 = time.perf_counter()
        page = build_html(records, default_columns(records))
        times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        build_html(records, default_columns(records), workers=None)
        par.append(time.perf_counter() - t0)
    images = sum(len(m) for m in re.findall(r"data:image/[^'\"]+", page))
    svgs = sum(len(m) for m in re.findall(r"<svg.*?</svg>", page, flags=re.S))
    print(f"{name}: {len(records)} records, page {len(page.encode()) / 1e6:.2f} MB "
          f"(inline PNG {images / 1e6:.2f} MB, inline SVG {svgs / 1e3:.1f} kB), "
          f"build_html median {statistics.median(times):.1f} s serial, {statistics.median(par):.1f} s with one "
          f"figure process per CPU ({os.cpu_count()}), over {repeats}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--records", type=int, default=10_000)
    args = parser.parse_args()
    rng = random.Random(0)
    measure("five families", five_families(rng), args.repeats)
    measure("many", many(rng, args.records), args.repeats)


if __name__ == "__main__":
    main()
