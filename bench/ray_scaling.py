"""Ray scaling of the gtep-digits tuning phase (issue 18): serially in this process, then through Ray
with 1 and 2 workers, in one run.

    python bench/ray_scaling.py [--full] [--repeats 3] [--methods er,finetune]

Prints, per mode, the wall-clock of all tuning runs (median over repeats), the speedup over the serial
run, the parallel efficiency (speedup / workers), and the Ray dispatch overhead per task: (Ray with one
worker - serial) / runs, and the round trip of an empty task. Every mode uses one torch thread per run
(a Ray worker with 1 CPU gets OMP_NUM_THREADS=1), so the comparison is run for run. Worker start-up
(importing torch) is paid before the clock starts, as a long session pays it once. The load average
(os.getloadavg) is printed next to the figures: on a shared machine they mean little without it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import ray
import torch

from clharness import ray_backend
from clharness.plugins import Harness
from clharness.runner import run_case


class _Cases:
    """A pytest plugin that keeps the cases of the collected tuning items (nothing runs)."""
    def __init__(self):
        self.cases = []

    def pytest_collection_finish(self, session):
        self.cases = [i.case for i in session.items if "-tune-" in i.name and hasattr(i, "case")]


def tuning_cases(quick: bool, methods: list[str] | None):
    """Every tuning-phase case of gtep-digits (R configurations x S trials per method and scenario),
    as the suite's own collection makes them."""
    import pytest
    keep = _Cases()
    args = ["--clh-suite", "gtep-digits", "--collect-only", "-q", "-p", "no:cacheprovider",
            *(["--clh-quick"] if quick else []), *[a for m in methods or [] for a in ("--clh-method", m)]]
    pytest.main(args, plugins=[keep])
    return keep.cases


def serial(cases, harness) -> float:
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    for case in cases:
        run_case(case, harness, torch.device("cpu"))
    return time.perf_counter() - t0


@ray.remote(num_cpus=1)
def _noop(x):
    return x


def through_ray(cases, workers: int, repeats: int) -> tuple[list[float], float]:
    """Wall-clock of the cases as Ray tasks on ``workers`` CPUs, and the empty-task round trip (ms)."""
    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        sources = ray.put({})
        warm = [ray_backend._remote_case.options(num_cpus=1).remote(cases[i % len(cases)], (), "cpu", None, False,
                                                                    (), sources) for i in range(workers)]
        ray.get(warm)   # workers started, torch and the harness imported
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            refs = [ray_backend._remote_case.options(num_cpus=1).remote(case, (), "cpu", None, False, (), sources)
                    for case in cases]
            ray.get(refs)
            times.append(time.perf_counter() - t0)
        n = 200
        t0 = time.perf_counter()
        ray.get([_noop.remote(i) for i in range(n)])
        roundtrip = (time.perf_counter() - t0) / n * 1000
        return times, roundtrip
    finally:
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="the suite's full budgets (default: its [quick] ones)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--methods", default="", help="comma-separated subset of the suite's methods")
    args = parser.parse_args()
    harness = Harness()
    cases = tuning_cases(not args.full, [m for m in args.methods.split(",") if m] or None)
    print(f"gtep-digits tuning phase: {len(cases)} runs; cores {os.cpu_count()}; load before "
          f"{os.getloadavg()[0]:.1f}")
    run_case(cases[0], harness, torch.device("cpu"))   # warm: datasets and kernels, as the workers are warmed
    t_serial = statistics.median(serial(cases, harness) for _ in range(args.repeats))
    t1, rt1 = through_ray(cases, 1, args.repeats)
    t2, rt2 = through_ray(cases, 2, args.repeats)
    m1, m2 = statistics.median(t1), statistics.median(t2)
    print(f"{'mode':<14}{'wall s':>10}{'speedup':>10}{'efficiency':>12}")
    print(f"{'serial':<14}{t_serial:>10.2f}{1.0:>10.2f}{1.0:>12.2f}")
    for name, t, w in (("ray 1 worker", m1, 1), ("ray 2 workers", m2, 2)):
        print(f"{name:<14}{t:>10.2f}{t_serial / t:>10.2f}{t_serial / t / w:>12.2f}")
    print(f"ray 2 vs ray 1 workers: efficiency {m1 / m2 / 2:.2f}")
    print(f"dispatch overhead per task: {(m1 - t_serial) / len(cases) * 1000:.1f} ms (ray 1 worker - serial); "
          f"empty-task round trip {rt1:.2f} ms (1 worker), {rt2:.2f} ms (2 workers)")
    print(f"load average after: {os.getloadavg()[0]:.1f} (1 min)")


if __name__ == "__main__":
    main()
