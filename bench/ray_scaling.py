"""Ray scaling of the gtep-digits tuning phase (issue 18): serially in this process, then through Ray
with 1 and 2 workers, in one run.

    python bench/ray_scaling.py [--full] [--repeats 3] [--methods er,finetune] [--json FILE]

Prints, per mode, the wall-clock of all tuning runs (median over repeats), the speedup over the serial
run, the parallel efficiency (speedup / workers), and the Ray dispatch overhead per task: (Ray with one
worker - serial) / runs, and the round trip of an empty task (medians over repeats). The cases go
through the session's own path (``RayRunner.submit``/``result``: resources, the dataset splits from the
object store). ``--json FILE`` writes the same figures, with the load averages, for the lead's
tables. Every mode uses one torch thread per run
(a Ray worker with 1 CPU gets OMP_NUM_THREADS=1), so the comparison is run for run. Worker start-up
(importing torch) is paid before the clock starts, as a long session pays it once. The load average
(os.getloadavg) is printed next to the figures: on a shared machine they mean little without it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import ray
import torch

from clharness.engine import ray_backend
from clharness.plugins import Harness
from clharness.engine.runner import run_case


class _Cases:
    """A pytest plugin that keeps the cases of the collected tuning items (nothing runs)."""
    def __init__(self):
        self.cases = []

    def pytest_collection_finish(self, session):
        keys = {}   # scenarios tuning on the same D^HT share their runs (one per key, as in a session)
        for item in session.items:
            if "-tune-" in item.name and hasattr(item, "case"):
                keys.setdefault(item.case_key, item.case)
        self.cases = list(keys.values())


def tuning_cases(quick: bool, methods: list[str] | None):
    """Every tuning-phase case of gtep-digits (R configurations x S trials per method and D^HT),
    as the suite's own collection makes them."""
    import pytest
    keep = _Cases()
    args = ["--clh-suite", "gtep-digits", "--collect-only", "-q", "-p", "no:cacheprovider",
            *(["--clh-quick"] if quick else []), *[a for m in methods or [] for a in ("--clh-method", m)]]
    pytest.main(args, plugins=[keep])
    return keep.cases


def serial(cases, harness, outcomes: list) -> float:
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    outcomes[:] = [outcome(run_case(case, harness, torch.device("cpu"))) for case in cases]
    return time.perf_counter() - t0


def outcome(record) -> tuple:
    """What must match between the modes (a Ray run that errs quickly would look fast)."""
    return record.status, json.dumps(record.acc_matrix)   # as text: a diverged run's NaN equals itself


@ray.remote(num_cpus=1)
def _noop(x):
    return x


def through_ray(cases, workers: int, repeats: int, harness, outcomes: list) -> tuple[list[float], list[float]]:
    """Wall-clock of the cases as Ray tasks on ``workers`` CPUs (submitted together, collected in
    order, as a session does), and the empty-task round trip (ms), per repeat."""
    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        runner = ray_backend.RayRunner(ray_backend.Shipment(), "cpu", None, False, 1, 0, {}, harness.datasets)
        for i in range(workers):   # workers started, torch and the harness imported, splits fetched
            runner.submit(f"warm-{i}", cases[i % len(cases)])
        for i in range(workers):
            runner.result(f"warm-{i}", cases[i % len(cases)])
        times, roundtrips = [], []
        for r in range(repeats):
            t0 = time.perf_counter()
            for i, case in enumerate(cases):
                runner.submit(f"{r}-{i}", case)
            outcomes[:] = [outcome(runner.result(f"{r}-{i}", case)) for i, case in enumerate(cases)]
            times.append(time.perf_counter() - t0)
            n = 200
            t0 = time.perf_counter()
            ray.get([_noop.remote(i) for i in range(n)])
            roundtrips.append((time.perf_counter() - t0) / n * 1000)
        return times, roundtrips
    finally:
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="the suite's full budgets (default: its [quick] ones)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--methods", default="", help="comma-separated subset of the suite's methods")
    parser.add_argument("--json", metavar="FILE", help="also write the figures to FILE as JSON")
    args = parser.parse_args()
    harness = Harness()
    cases = tuning_cases(not args.full, [m for m in args.methods.split(",") if m] or None)
    load_before = os.getloadavg()
    print(f"gtep-digits tuning phase: {len(cases)} runs; cores {os.cpu_count()}; load before "
          f"{load_before[0]:.1f}")
    run_case(cases[0], harness, torch.device("cpu"))   # warm: datasets and kernels, as the workers are warmed
    serial_out, ray1_out, ray2_out = [], [], []
    serial_times = [serial(cases, harness, serial_out) for _ in range(args.repeats)]
    t1, rt1 = through_ray(cases, 1, args.repeats, harness, ray1_out)
    t2, rt2 = through_ray(cases, 2, args.repeats, harness, ray2_out)
    if not serial_out == ray1_out == ray2_out:
        raise SystemExit("the Ray runs' statuses or accuracy matrices differ from the serial runs': the timings "
                         "compare different work")
    statuses = sorted({status for status, _ in serial_out})
    t_serial, m1, m2 = (statistics.median(t) for t in (serial_times, t1, t2))
    overhead_ms = (m1 - t_serial) / len(cases) * 1000
    figures = {
        "runs": len(cases), "statuses": statuses, "identical_results": True, "repeats": args.repeats, "cores": os.cpu_count(), "full": args.full,
        "wall_s": {"serial": t_serial, "ray_1_worker": m1, "ray_2_workers": m2},
        "wall_s_repeats": {"serial": serial_times, "ray_1_worker": t1, "ray_2_workers": t2},
        "speedup": {"ray_1_worker": t_serial / m1, "ray_2_workers": t_serial / m2},
        "efficiency": {"ray_1_worker": t_serial / m1, "ray_2_workers": t_serial / m2 / 2,
                       "ray_2_vs_1_workers": m1 / m2 / 2},
        "dispatch_overhead_ms_per_task": overhead_ms,
        "empty_task_roundtrip_ms": {"ray_1_worker": statistics.median(rt1), "ray_2_workers": statistics.median(rt2)},
        "load_average_before": list(load_before), "load_average_after": list(os.getloadavg()),
    }
    print(f"statuses and accuracy matrices identical in the three modes (statuses: {', '.join(statuses)})")
    print(f"{'mode':<14}{'wall s':>10}{'speedup':>10}{'efficiency':>12}")
    print(f"{'serial':<14}{t_serial:>10.2f}{1.0:>10.2f}{1.0:>12.2f}")
    for name, t, w in (("ray 1 worker", m1, 1), ("ray 2 workers", m2, 2)):
        print(f"{name:<14}{t:>10.2f}{t_serial / t:>10.2f}{t_serial / t / w:>12.2f}")
    print(f"ray 2 vs ray 1 workers: efficiency {m1 / m2 / 2:.2f}")
    print(f"dispatch overhead per task: {overhead_ms:.1f} ms (ray 1 worker - serial); empty-task round trip "
          f"{figures['empty_task_roundtrip_ms']['ray_1_worker']:.2f} ms (1 worker), "
          f"{figures['empty_task_roundtrip_ms']['ray_2_workers']:.2f} ms (2 workers)")
    print(f"load average after: {os.getloadavg()[0]:.1f} (1 min)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(figures, fh, indent=2)
        print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
