"""Seed ensembles (issue 32): E seeds of one case as one batched model vs the same E seeds run solo,
side by side in one process, same total work (every member trains and evaluates exactly what its
solo run does; the records are checked equal), median of interleaved repeats.

    python bench/ensemble.py                          # mlp and cnn, 1 and 2 threads, 5 seeds, 3 repeats
    python bench/ensemble.py --backbones mlp --threads 1 --repeats 5 --method joint
    python bench/ensemble.py --backbones mlp --hidden 32     # a narrow MLP: per-step overhead dominates
    python bench/ensemble.py --gtep --repeats 3       # the gtep-digits tuning phase, end to end (below)

Workloads: the quickstart suite (sklearn digits 8x8, 5 tasks x 2 classes, 5 epochs, batch 32, class-IL)
with its MLP, and the same scenario with the small conv net of the STF paper (``cnn``: two conv blocks
32 and 64 wide with BatchNorm, global pooling). Times are wall seconds of whole runs (setup, training,
evaluation: what a session spends), of the training part alone (the records' train_seconds; for an
ensemble, its whole training time), and the process's CPU seconds for the whole runs (steadier than wall
time on a loaded machine). The machine may be shared: say so next to any figure. Under load, two torch
threads on a busy 2-core CPU make every small op wait for a descheduled thread (OpenMP): solo runs,
with 5x the ops, suffer that 5x as often, so the 2-thread ratio measures the load as much as the method.

The ``equal`` column: whether every member's accuracy matrix is its solo run's within 1e-4, and the largest
difference (since issue 38 item 3 it must be 0: the tests hold members to their solo runs bit for bit); the
line after each backbone gives the solo run against itself, at 1 and at 2 threads.

Measured after issue 38 item 3 (vmap removed: the MLP's step hand-batched with one baddbmm per Linear on a CPU
at one thread, the cnn's members each running their own forward; a shared 2-core AMD EPYC CPU at load average
15-17 from other sessions, so the times say little; finetune, E = 3, one repeat):

    backbone threads     solo  ensemble  ratio   train solo train ens  ratio   cpu solo cpu ens  ratio  equal
    mlp            1    10.23      4.42   2.31         9.03      3.73   2.42       1.58    0.71   2.23  yes (0)
    mlp            2   138.67      8.85  15.67       130.58      7.48  17.47      29.91    1.40  21.32  yes (0)
    cnn            1    50.20     45.00   1.12        44.95     39.19   1.15       7.66    5.91   1.30  yes (0)
    (--backbones cnn --threads 2 --seeds 2 --epochs 1, load 13.6 -> 11.8:)
    cnn            2    93.06      1.53  60.93        75.29      1.09  68.79      25.70    1.50  17.08  yes (0)

Before it, the same command gave ``cnn 1 ... no (0.00917)`` (load 1.3-2.8): vmap's batched convolution and
BatchNorm sum in another order than the solo kernels, and the members drifted.

Measured (issue 32 round 3, per-member trainers; a shared 2-core AMD EPYC CPU, no GPU, torch 2.14 CPU build,
finetune, E = 5, median of 3 interleaved repeats, wall seconds; two runs: load average 1.4 rising to 4.0
(another session's pytest -n 2) during the first, 1.2 to 2.2 during the second, 2 threads first):

    backbone threads     solo  ensemble  ratio   train solo train ens  ratio   cpu solo cpu ens  ratio  equal
    mlp            1     0.67      0.85   0.79         0.54      0.68   0.80       0.44    0.51   0.86  yes (0)
    mlp            2    12.36      0.70  17.61        11.73      0.53  22.11      12.22    0.59  20.69  yes (0)
    cnn            1     5.62      7.03   0.80         4.91      5.98   0.82       3.70    4.46   0.83  yes (0)
    cnn            2    56.32      9.23   6.10        51.01      8.55   5.96      44.34    6.14   7.23  no (0.00935)
    second run (load 1.2-2.2):
    mlp            2    14.10      0.76  18.62        13.47      0.62  21.81      14.48    0.72  20.12  yes (0)
    mlp            1     0.48      0.52   0.94         0.40      0.44   0.92       0.44    0.51   0.86  yes (0)
    cnn            2     6.19      5.60   1.11         5.69      5.01   1.13       9.49    6.04   1.57  no (0.00935)
    cnn            1     3.61      4.45   0.81         3.15      3.96   0.80       3.60    4.39   0.82  yes (0)
    solo at 1 vs 2 threads, max |diff|: mlp 0, cnn 0.00935 (both runs)

At 1 thread the ensemble is 0.8-0.94 of solo speed (its stacking, meta copies and thread hand-overs cost more
than the batched step saves on a CPU whose MLP step is GEMM arithmetic already). At 2 threads the solo runs
collapse (the MLP's 5 solo runs take 12-14 s against 0.5-0.7 s at 1 thread, CPU seconds about wall; our
reading: each of their many small ops waits for the other OpenMP thread, which the other sessions' processes
deschedule on the 2 cores, and the ensemble, with a fifth of the ops, waits a fifth as often), so the 2-thread ratios (1.1-18) measure the machine's load, not the method: compare at 1 thread. The
cnn members at 2 threads differ from their solo runs by up to 0.0094 because the solo cnn run itself moves by
exactly that much between 1 and 2 threads (the intra-op reductions sum in another order: rounding-level
chaos, measured, above; an audit measured up to ~0.056 on another occasion); the MLP members and every
1-thread member equal their solo runs exactly (max |diff| 0). Earlier figures (before per-member trainers,
load 2-3): 0.95 / 0.53 (MLP, 1 / 2 threads), 0.82 / 0.53 (cnn); --hidden 32: 1.63 (training alone 1.97).
(Those figures are from before issue 38 item 3, when the cnn's batched path was vmap over convolutions and
BatchNorm, slower per FLOP than the solo kernels and not equal to them; the cnn's members now run their own
forward, at solo cost.) A GPU, where a small model's step is kernel-launch bound, is where a batched step would
pay; this machine has none, and on a GPU every step now runs each member's own forward (none is shown exact there).

The GTEP tuning phase (``--gtep``): every tuning run of suites/gtep-digits.toml (6 methods x R = 6
configurations x S = 2 trials = 72 runs; its two scenarios share one tuning phase), its units run as a
pytest session runs them (Session.execute in order, a fresh results store each time, so the second
scenario's units reuse the first's records), solo, with --clh-ensemble (seeds: a configuration's S trials
are one ensemble, E = 2) and with --clh-ensemble=hparams (also configurations that differ only in float
hyperparameters). Table 4's sets give every configuration a learning-rate schedule (steplr or cosine):
each member steps its own trainer (engine.ensemble._train_task), so as shipped every run is batched. The
variant "constant lr" holds ``scheduler = "constant"`` (``fixed``): seeds ensembles then take the shared
stacked optimizer; hparams ensembles whose members' lr or weight decay differ take the members' own.

Measured (issue 32 round 2: per-member trainers and hparams ensembles; a shared 2-core AMD EPYC CPU, no
GPU, load average 4.5 before, 3.7 after, from other sessions, 1 thread, median of 3 interleaved repeats,
wall seconds of the 72 units; "size": mean members per ensemble):

    suite        mode     runs batched  size   solo    ens  ratio   train solo train ens  ratio   cpu solo cpu ens  ratio  equal (1e-4)
    as shipped   seeds      72      72   2.0   5.64   8.40   0.67         4.76      4.83   0.99       5.33    5.99   0.89  72/72
    as shipped   hparams    72      72   2.1   5.64   7.61   0.74         4.76      4.52   1.05       5.33    6.03   0.88  72/72
    constant lr  seeds      72      72   2.0   5.04   6.43   0.78         4.10      4.29   0.96       4.82    6.05   0.80  68/72
    constant lr  hparams    72      72   2.6   5.04   6.51   0.77         4.10      4.21   0.97       4.82    6.06   0.79  68/72

(a single repeat at load 3.1, beside a mutation run of this session: 0.80 / 0.79 / 0.78 / 0.77 wall,
1.10 / 1.10 / 0.96 / 1.03 training, 0.89 / 0.93 / 0.83 / 0.86 CPU.) Every tuning run is now batched (before
per-member trainers, as shipped batched none), and no ensemble is faster here. Training takes about the
solo runs' time (0.96-1.05): with E = 2 (2.1-2.6 under hparams) and an 8x8 MLP whose step is GEMM arithmetic
on a CPU, there is no per-step overhead to amortise. The ensembles spend 0.6-1.2 s more CPU outside the
batched steps (per task: stacking the members, a meta copy of the model, each member's trainer, the
members' thread hand-overs), and the wall ratio is below the CPU ratio because on a loaded 2-core machine
each hand-over waits for a descheduled thread. hparams ensembles are barely larger than seeds ones: table
4's configurations differ in ints and strings (epochs 1-4, batch size 16-64, steplr's milestone count, the
scheduler kind), which never group; only configurations that drew the same of those do. The 4 records
past 1e-4 are joint at lr 0.1 for 4 epochs, chaotic runs (an earlier measurement: solo, c3's two trials
move by 0.5 and 0.19 with 2 threads instead of 1, by 0.67 and 0.19 with lr x (1 + 1e-6)). The per-member
path against the shared optimizer (quickstart finetune, 5 seeds, same CPU, load 3.4, 3 repeats): solo /
ensemble training 0.96 constant (shared), 0.90 steplr (own trainers), 0.93 own lr (own trainers): the
``torch.stack`` of the members' parameters and E optimizer steps cost ~5% here.
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


# ------------------------------------------------------------------ the GTEP tuning phase, end to end
GTEP_VARIANTS = {
    "as shipped": {},                              # table 4's sets: every configuration has an LR schedule
    "constant lr": {"scheduler": '"constant"'},   # the same suite with the schedule held fixed: batchable
}


def gtep_suite(folder, variant: str):
    """suites/gtep-digits.toml, with ``variant``'s parameters added to its ``fixed`` table."""
    from pathlib import Path

    import clharness
    text = (Path(clharness.__file__).parent.parent / "suites" / "gtep-digits.toml").read_text()
    extra = "".join(f", {k} = {v}" for k, v in GTEP_VARIANTS[variant].items())
    old = "fixed = { momentum = 0.9 }"
    assert old in text, "suites/gtep-digits.toml changed: update bench/ensemble.py"
    path = Path(folder) / f"gtep-digits-{len(extra)}.toml"
    path.write_text(text.replace(old, "fixed = { momentum = 0.9" + extra + " }"))
    return path


def gtep_phase(path, ensemble, store, quick: bool = False):
    """Every tuning unit of the suite at ``path`` (all methods, configurations and trials; units of the
    two scenarios that share one tuning phase are trained once), run as a pytest session runs them
    (Session.execute, in order, through a fresh results store); ``ensemble``: False (solo), "seeds" or
    "hparams" (--clh-ensemble[=hparams]). Returns wall and CPU seconds of the units (not the suite's
    expansion) and key -> record."""
    from clharness import outcomes
    from clharness.engine.plan import expand
    from clharness.engine.session import Options, Session
    session = Session(Options(results=store, device="cpu", ensemble=ensemble, quick=quick), warn=lambda _: None)
    try:
        units = [u for u in expand(session, path) if "-tune-c" in u.name]
        session.schedule(units)
        t, c0 = time.perf_counter(), time.process_time()
        for unit in units:
            try:
                session.execute(unit)
            except outcomes.Outcome:   # a diverged trial is a record too (NaN in selection)
                pass
        wall, cpu = time.perf_counter() - t, time.process_time() - c0
        from clharness.results import RunRecord
        records = {}
        for unit in units:
            for name, value in unit.properties:
                if name == outcomes.RECORD:
                    record = RunRecord.from_json(value)
                    records[record.key] = record
        return wall, cpu, records
    finally:
        session.close()


GTEP_MODES = ("seeds", "hparams")   # the ensembles measured against solo


def gtep_main(repeats: int) -> None:
    import os
    import tempfile
    print(f"gtep-digits tuning phase (6 methods x R = 6 configurations x S = 2 trials, the two scenarios share it), "
          f"CPU, 1 thread, median of {repeats} interleaved repeats (wall seconds); load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'suite':12} {'mode':8} {'runs':>4} {'batched':>7} {'size':>5} {'solo':>6} {'ens':>6} {'ratio':>6}   "
          f"{'train solo':>10} {'train ens':>9} {'ratio':>6}   {'cpu solo':>8} {'cpu ens':>7} {'ratio':>6}  equal (1e-4)")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        n = 0
        for variant in GTEP_VARIANTS:
            path = gtep_suite(folder, variant)
            for mode in (False, *GTEP_MODES):   # warm up: imports, data, kernels
                n += 1
                gtep_phase(path, mode, f"{folder}/{n}.sqlite", quick=True)
            wall, cpu, train, equal, last = ({m: [] for m in (False, *GTEP_MODES)} for _ in range(5))
            for _ in range(repeats):   # interleaved: solo, seeds, hparams, solo, ...
                for mode in wall:
                    n += 1
                    w, c, recs = gtep_phase(path, mode, f"{folder}/{n}.sqlite")
                    wall[mode].append(w), cpu[mode].append(c)
                    train[mode].append(sum(r.train_seconds for r in recs.values()))
                    last[mode] = recs
                solo = last[False]
                for mode in GTEP_MODES:
                    b = last[mode]
                    assert solo.keys() == b.keys()
                    equal[mode].append(sum(solo[k].status == b[k].status and np.allclose(
                        np.array(solo[k].acc_matrix, dtype=float), np.array(b[k].acc_matrix, dtype=float),
                        atol=1e-4, rtol=0, equal_nan=True) for k in solo))
            med = {m: (statistics.median(wall[m]), statistics.median(train[m]), statistics.median(cpu[m])) for m in wall}
            for mode in GTEP_MODES:
                b = last[mode]
                sizes = [int(r.extra["executor"].split(":")[1]) for r in b.values() if "executor" in r.extra]
                size = f"{statistics.mean(sizes):5.1f}" if sizes else f"{'-':>5}"
                (sw, st, sc), (ew, et, ec) = med[False], med[mode]
                print(f"{variant:12} {mode:8} {len(b):>4} {len(sizes):>7} {size} {sw:6.2f} {ew:6.2f} {sw / ew:6.2f}   "
                      f"{st:10.2f} {et:9.2f} {st / et:6.2f}   {sc:8.2f} {ec:7.2f} {sc / ec:6.2f}  "
                      f"{'/'.join(map(str, sorted(set(equal[mode]))))}/{len(b)}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def _max_diff(a, b) -> float:
    """The largest difference between two lists of records' accuracy matrices (inf where a status differs)."""
    if any(x.status != y.status for x, y in zip(a, b)):
        return float("inf")
    return max(float(np.abs(np.array(x.acc_matrix, dtype=float) - np.array(y.acc_matrix, dtype=float)).max())
               for x, y in zip(a, b))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", default="finetune")
    ap.add_argument("--backbones", nargs="+", default=["mlp", "cnn"])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=None, help="override the suite's epochs (default 5)")
    ap.add_argument("--hidden", type=int, default=None, help="the MLP's width (default 256)")
    ap.add_argument("--gtep", action="store_true", help="the gtep-digits tuning phase end to end, solo vs --clh-ensemble")
    args = ap.parse_args()
    if args.gtep:
        gtep_main(args.repeats)
        return
    from clharness.engine.runner import set_cpu_threads
    import os
    print(f"{args.method}, E = {args.seeds} seeds, median of {args.repeats} interleaved repeats (wall seconds); "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'backbone':8} {'threads':>7} {'solo':>8} {'ensemble':>9} {'ratio':>6}   "
          f"{'train solo':>10} {'train ens':>9} {'ratio':>6}   {'cpu solo':>8} {'cpu ens':>7} {'ratio':>6}  "
          f"equal (1e-4; max |diff|)")
    for backbone in args.backbones:
        harness, batch = cases(args.method, backbone, args.seeds, args.epochs, args.hidden)
        solo_by_threads = {}
        for threads in args.threads:
            set_cpu_threads(threads)
            torch.set_num_threads(threads)
            solo(harness, batch[:1])   # warm up: imports, data, kernels
            ensemble(harness, batch[:2])
            s_wall, e_wall, s_train, e_train, s_cpu, e_cpu, diff = [], [], [], [], [], [], 0.0
            for _ in range(args.repeats):
                w, c, t, a = solo(harness, batch)
                s_wall.append(w), s_cpu.append(c), s_train.append(t)
                w, c, t, b = ensemble(harness, batch)
                e_wall.append(w), e_cpu.append(c), e_train.append(t)
                diff = max(diff, _max_diff(a, b))
                solo_by_threads[threads] = a
            sw, ew = statistics.median(s_wall), statistics.median(e_wall)
            st, et = statistics.median(s_train), statistics.median(e_train)
            sc, ec = statistics.median(s_cpu), statistics.median(e_cpu)
            print(f"{backbone:8} {threads:>7} {sw:8.2f} {ew:9.2f} {sw / ew:6.2f}   {st:10.2f} {et:9.2f} "
                  f"{st / et:6.2f}   {sc:8.2f} {ec:7.2f} {sc / ec:6.2f}  {'yes' if diff <= 1e-4 else 'no'} ({diff:.3g})")
        if len(solo_by_threads) > 1:   # the floor a member can be held to: its solo run against itself
            (t0, a), *others = solo_by_threads.items()
            for t1, b in others:
                print(f"{backbone:8} solo at {t0} vs {t1} threads: max |diff| {_max_diff(a, b):.3g}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    set_cpu_threads(1)


if __name__ == "__main__":
    main()
