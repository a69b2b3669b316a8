"""What counting FLOPs costs (issue 41 item 1): the quickstart suite (``clharness run``'s default) with
every run under ``engine.flops.RunMeter`` (as the runner always does) vs the same runs with a meter that
counts nothing, interleaved in one process, wall time of ``clharness.run`` (session, store and all).

    python bench/flops_overhead.py                 # 5 interleaved pairs, seed 0, the suite's full budget
    python bench/flops_overhead.py --repeats 3 --quick --threads 1

Prints per pair the two walls and their ratio (counted / uncounted), then the median ratio and the load
(``os.getloadavg``) before and after: on a shared CPU single walls vary, so read the median of pairs.

Measured on a 2-core CPU shared with other jobs (load average 14-16), ``--threads 1``, full budget, 3 pairs:
torch's ``FlopCounterMode`` as is (per-module bookkeeping): 3.2x (quick budget); the lean mode: 1.99x; the lean
mode with each (op, shapes) count cached: 1.45x (pairs 1.47, 1.45, 1.21; medians 10.6 s uncounted, 15.5 s
counted); ``--quick --repeats 5`` at load 5.8: 1.43x (1.23 s -> 1.78 s). What is left is the cost of any Python dispatch mode on the quickstart's tiny steps (an MLP on
32 digits a batch: a mode that only forwards each op costs the same in a micro-benchmark), so the ratio
falls as the ops grow (convolutions, ViTs, GPUs); it is the price of an exact count of what any method's
own loop computes.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import clharness as clh
from clharness.engine import flops


class _Uncounted:
    """A meter that counts nothing: the runner's code path without FlopCounterMode."""
    train_flops = eval_flops = 0
    incomplete = ""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def one_run(counted: bool, args, folder: Path, i: int) -> float:
    saved = flops.RunMeter
    if not counted:
        flops.RunMeter = _Uncounted
    try:
        t0 = time.perf_counter()
        records = clh.run("quickstart", seeds=args.seeds, quick=args.quick, fresh=True,
                          results=str(folder / f"{'on' if counted else 'off'}-{i}.sqlite"))
        wall = time.perf_counter() - t0
    finally:
        flops.RunMeter = saved
    bad = [r.case_id for r in records if r.status != "passed"]
    if bad:
        raise SystemExit(f"runs that did not pass: {bad}")
    if counted and any(r.train_gflops is None or r.train_gflops <= 0 for r in records):
        raise SystemExit("a counted run recorded no training FLOPs")
    return wall


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="the suite's [quick] budgets")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    args = ap.parse_args(argv)
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    pairs = []
    with tempfile.TemporaryDirectory() as tmp:
        one_run(True, args, Path(tmp), -1)   # warm-up: imports, data, first-call costs
        for i in range(args.repeats):
            # alternate which side goes first, so a drift in load hits both alike
            order = (True, False) if i % 2 == 0 else (False, True)
            walls = {c: one_run(c, args, Path(tmp), i) for c in order}
            pairs.append((walls[True], walls[False]))
            print(f"pair {i}: counted {walls[True]:.2f} s, uncounted {walls[False]:.2f} s, "
                  f"ratio {walls[True] / walls[False]:.3f}", flush=True)
    ratios = [a / b for a, b in pairs]
    out = {"repeats": args.repeats, "seeds": args.seeds, "quick": args.quick,
           "median_ratio": statistics.median(ratios), "ratios": ratios,
           "median_counted_s": statistics.median(a for a, _ in pairs),
           "median_uncounted_s": statistics.median(b for _, b in pairs),
           "load_before": load_before, "load_after": os.getloadavg()}
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
