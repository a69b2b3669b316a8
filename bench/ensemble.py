"""Seed ensembles (issue 32): E seeds of one case as one batched model vs the same E seeds run solo,
side by side in one process, same total work (every member trains and evaluates exactly what its
solo run does; the records are checked equal), median of interleaved repeats.

    python bench/ensemble.py                          # mlp and cnn, 1 and 2 threads, 5 seeds, 3 repeats
    python bench/ensemble.py --backbones mlp --threads 1 --repeats 5 --method joint
    python bench/ensemble.py --backbones mlp --hidden 32     # a narrow MLP: per-step overhead dominates

Workloads: the quickstart suite (sklearn digits 8x8, 5 tasks x 2 classes, 5 epochs, batch 32, class-IL)
with its MLP, and the same scenario with the small conv net of the STF paper (``cnn``: two conv blocks
32 and 64 wide with BatchNorm, global pooling). Times are wall seconds of whole runs (setup, training,
evaluation: what a session spends), of the training part alone (the records' train_seconds; for an
ensemble, its whole training time), and the process's CPU seconds for the whole runs (steadier than wall
time on a loaded machine). The machine may be shared: say so next to any figure. Under load, two torch
threads on a busy 2-core CPU make every small op wait for a descheduled thread (OpenMP): solo runs,
with 5x the ops, suffer that 5x as often, so the 2-thread ratio measures the load as much as the method.

Measured (issue 32, a shared 2-core CPU, load average 2-3, finetune, 3 repeats): solo / ensemble wall
0.95 (MLP, 1 thread), 0.53 (MLP, 2 threads), 0.82 (cnn, 1 thread), 0.53 (cnn, 2 threads); --hidden 32:
1.63 (training alone 1.97). The quickstart MLP's solo step is already arithmetic (in isolation 1.7 ms for
five members' steps solo, 1.8 ms batched: GEMMs of 32x64x256 and 32x256x256 per member), so there is no
per-step overhead to amortise on a CPU; the narrow MLP has some. The cnn's batched path is vmap over
convolutions and BatchNorm, slower per FLOP than the solo kernels. A GPU, where a small model's step is
kernel-launch bound, is where the ensemble should pay; this machine has none.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import numpy as np
import torch


def cases(method: str, backbone: str, seeds: int, epochs: int | None, hidden: int | None = None):
    from clharness.engine.runner import Case, resolve_hparams
    from clharness.engine.suites import load_suite
    from clharness.kinds import install
    from clharness.plugins import Harness
    harness = Harness()
    install(harness.kinds)
    suite = load_suite(harness.suites["quickstart"])
    options = {"hidden": hidden} if hidden and backbone == "mlp" else {}
    spec = dataclasses.replace(suite.scenarios[0], backbone=backbone, backbone_options=options,
                               **({"epochs": epochs} if epochs else {}))
    hp = resolve_hparams(harness.methods[method], suite.hparams.get(method, {}))
    return harness, [Case(suite.name, spec, method, s, hp) for s in range(seeds)]


def solo(harness, batch):
    from clharness.engine.runner import run_case
    t, c0 = time.perf_counter(), time.process_time()
    records = [run_case(c, harness, torch.device("cpu")) for c in batch]
    return time.perf_counter() - t, time.process_time() - c0, sum(r.train_seconds for r in records), records


def ensemble(harness, batch):
    from clharness.engine.ensemble import run_ensemble
    t, c0 = time.perf_counter(), time.process_time()
    records = run_ensemble(batch, harness, torch.device("cpu"))
    return time.perf_counter() - t, time.process_time() - c0, sum(r.train_seconds for r in records), records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", default="finetune")
    ap.add_argument("--backbones", nargs="+", default=["mlp", "cnn"])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=None, help="override the suite's epochs (default 5)")
    ap.add_argument("--hidden", type=int, default=None, help="the MLP's width (default 256)")
    args = ap.parse_args()
    from clharness.engine.runner import set_cpu_threads
    print(f"{args.method}, E = {args.seeds} seeds, median of {args.repeats} interleaved repeats (wall seconds)")
    print(f"{'backbone':8} {'threads':>7} {'solo':>8} {'ensemble':>9} {'ratio':>6}   "
          f"{'train solo':>10} {'train ens':>9} {'ratio':>6}   {'cpu solo':>8} {'cpu ens':>7} {'ratio':>6}  equal")
    for backbone in args.backbones:
        harness, batch = cases(args.method, backbone, args.seeds, args.epochs, args.hidden)
        for threads in args.threads:
            set_cpu_threads(threads)
            torch.set_num_threads(threads)
            solo(harness, batch[:1])   # warm up: imports, data, kernels
            ensemble(harness, batch[:2])
            s_wall, e_wall, s_train, e_train, s_cpu, e_cpu, equal = [], [], [], [], [], [], True
            for _ in range(args.repeats):
                w, c, t, a = solo(harness, batch)
                s_wall.append(w), s_cpu.append(c), s_train.append(t)
                w, c, t, b = ensemble(harness, batch)
                e_wall.append(w), e_cpu.append(c), e_train.append(t)
                equal &= all(np.allclose(x.acc_matrix, y.acc_matrix, atol=1e-4, rtol=0) for x, y in zip(a, b))
            sw, ew = statistics.median(s_wall), statistics.median(e_wall)
            st, et = statistics.median(s_train), statistics.median(e_train)
            sc, ec = statistics.median(s_cpu), statistics.median(e_cpu)
            print(f"{backbone:8} {threads:>7} {sw:8.2f} {ew:9.2f} {sw / ew:6.2f}   {st:10.2f} {et:9.2f} "
                  f"{st / et:6.2f}   {sc:8.2f} {ec:7.2f} {sc / ec:6.2f}  {equal}")
    set_cpu_threads(1)


if __name__ == "__main__":
    main()
