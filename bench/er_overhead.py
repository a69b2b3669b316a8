"""Harness overhead: the reference `er` run through clharness vs the same ER as a plain,
hand-written PyTorch loop, side by side in one process, same data, budgets and evaluation.

    python bench/er_overhead.py               # both workloads, 5 interleaved repeats
    python bench/er_overhead.py --repeats 3 --workloads digits-mlp --device cuda
    python bench/er_overhead.py --augment cifar   # both sides augment every training batch alike
    python bench/er_overhead.py --processes 7     # 7 fresh interpreters: median and range of their ratios
    python bench/er_overhead.py --threads 1       # steadiest on a small shared CPU

Both sides train task by task (SGD + momentum, batch of current data + an equal-size replay
batch from a class-balanced memory filled after each task) and fill the full accuracy matrix
after every task. The harness side is `clharness.engine.runner.run_case` end to end (scenario built
from uint8 tensors, batches normalised on the fly, protocol checks, metrics, memory report).

Where the harness's extra time went on digits (profiled, issue 14): per-batch uint8->float
normalisation and advanced indexing in TensorData.batches, the class-balanced buffer's placement
(largest class recomputed per row) and replay sampling. Now splits small enough keep one
normalised copy, placement caches the largest class between evictions, and sampling uses
index_select; each is bit-identical to before (same RNG draws, same elementwise ops). With a
recipe, ER drew the fresh and the replayed views in two recipe calls per step (the plain loop one):
it now augments the joint batch once (in-process A/B, 1 torch thread, CPU time, median of 20:
digits ratio 1.144 -> 1.002-1.069 over three runs).

Where the rest went (digits, one thread, median of 21 in-process pairs, two processes): setup before
the first task 3.3 -> 7.1 ms (building the split scenario with its per-class indices, the method and
the digest of its shared backbone), evaluation 15.9 -> 19.0 ms (predict's model.eval() on every batch,
now skipped when nothing is in training mode; the finiteness check), training +5-7 ms (class-balanced
placement row by row, about 2.7 ms; Batch objects and the step's checks) of 250-290 ms runs. With two
threads on a shared 2-core CPU single runs of either side vary by up to 1.7x from one run to the next,
so one process's median ratio does too: --processes and --threads 1 give figures that repeat.
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F

import clharness as clh
from clharness.data import load_split
from clharness.engine.runner import Case, pick_device, run_case, seed_everything
from clharness.engine.scenario import build_scenario
from clharness.toolkit import augment
from clharness.engine.suites import ScenarioSpec, with_overrides

WORKLOADS = {
    # the quickstart: tiny steps, the worst case for per-step overhead
    "digits-mlp": ScenarioSpec(name="digits-mlp", dataset="digits", tasks=5, epochs=5, batch_size=32,
                               memory_size=200, backbone="mlp"),
    # 3x32x32 images and a conv net: where real benchmarks spend their time
    "synthetic-resnet": ScenarioSpec(name="synthetic-resnet", dataset="synthetic", tasks=5, epochs=1,
                                     batch_size=32, memory_size=200, backbone="resnet18-reduced",
                                     dataset_options={"image_size": 32, "channels": 3, "train_per_class": 100,
                                                      "test_per_class": 20, "noise": 0.2, "similarity": 0.3}),
}


def plain_er(spec: ScenarioSpec, harness, seed: int, device: torch.device, hp: dict) -> tuple[float, float]:
    """Hand-written ER: float tensors prepared once, a plain loop, a list-based class-balanced memory.
    Timed end to end like the harness side (data preparation and model construction included; the
    decoded dataset comes from the same in-process cache on both sides). With ``spec.augment`` every
    training batch (fresh and replayed samples) goes through the same batched recipe ops."""
    t0 = time.perf_counter()
    source = harness.datasets[spec.dataset](**spec.dataset_options)
    source.name = spec.dataset
    train, test = load_split(source, None, True), load_split(source, None, False)
    mean, std = train.channel_stats()
    mean, std = torch.tensor(mean).view(1, -1, 1, 1), torch.tensor(std).view(1, -1, 1, 1)

    def prep(ds):
        return ((ds.images.float() / 255 - mean) / std).to(device), ds.labels.to(device)

    (x_tr, y_tr), (x_te, y_te) = prep(train), prep(test)
    recipe = augment.get(spec.augment)
    frame = augment.Frame(-mean.to(device) / std.to(device), (1 - mean.to(device)) / std.to(device))
    aug_gen = torch.Generator(device=device).manual_seed(seed)
    order = np.random.default_rng(seed).permutation(len(train.classes))
    relabel = torch.empty(len(order), dtype=torch.long)
    relabel[torch.from_numpy(order)] = torch.arange(len(order))
    relabel = relabel.to(device)
    y_tr, y_te = relabel[y_tr], relabel[y_te]
    per = len(order) // spec.tasks

    seed_everything(seed)
    backbone = harness.backbones[spec.backbone](tuple(x_tr.shape[1:]), **spec.backbone_options)
    model = torch.nn.Sequential(backbone, torch.nn.Linear(backbone.out_dim, len(order))).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=hp["lr"], momentum=hp["momentum"], weight_decay=hp["weight_decay"])
    gen = torch.Generator().manual_seed(seed)
    mem_x = mem_y = None
    R = np.zeros((spec.tasks, spec.tasks))
    for t in range(spec.tasks):
        idx = ((y_tr >= t * per) & (y_tr < (t + 1) * per)).nonzero().squeeze(1)
        x, y = x_tr[idx], y_tr[idx]
        model.train()
        for _ in range(spec.epochs):
            perm = torch.randperm(len(y), generator=gen).to(device)
            for i in range(0, len(y), spec.batch_size):
                b = perm[i:i + spec.batch_size]
                bx, by = x[b], y[b]
                if mem_y is not None:
                    r = torch.randint(len(mem_y), (len(by),), generator=gen).to(device)
                    bx, by = torch.cat([bx, mem_x[r]]), torch.cat([by, mem_y[r]])
                if recipe is not None:
                    bx = recipe.train(bx, frame, tuple(bx.shape[2:]), aug_gen)
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(model(bx), by).backward()
                opt.step()
        # class-balanced memory: an equal share of slots per seen class, random exemplars
        seen = (t + 1) * per
        keep = []
        all_x = x if mem_x is None else torch.cat([mem_x, x])
        all_y = y if mem_y is None else torch.cat([mem_y, y])
        for c in range(seen):
            members = (all_y == c).nonzero().squeeze(1)
            keep.append(members[torch.randperm(len(members), generator=gen)[:spec.memory_size // seen].to(device)])
        keep = torch.cat(keep)
        mem_x, mem_y = all_x[keep], all_y[keep]
        model.eval()
        with torch.no_grad():
            for j in range(spec.tasks):
                m = (y_te >= j * per) & (y_te < (j + 1) * per)
                R[t, j] = (model(x_te[m]).argmax(1) == y_te[m]).float().mean().item()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0, float(R[-1].mean())


def harness_er(spec, harness, seed, device) -> tuple[float, float, float]:
    t0 = time.perf_counter()
    record = run_case(Case("bench", spec, "er", seed, {}), harness, device)
    assert record.status == "passed", record.message
    return time.perf_counter() - t0, record.metrics["final_acc"], record.train_seconds + record.eval_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--augment", default="none", choices=["none", "cifar"],
                        help="augmentation recipe on both sides (the plain loop uses the same batched ops)")
    parser.add_argument("--processes", type=int, default=1,
                        help="repeat the whole measurement in this many fresh interpreters and report the "
                             "median of their ratios (one process's figures move by a few percent with "
                             "allocator and thread placement, both sides alike)")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch CPU threads on both sides (0: torch's default). On a small shared CPU, one "
                             "thread gives the steadiest figures: the harness's extra work is Python, not kernels")
    args = parser.parse_args()
    if args.processes > 1:
        return across_processes(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    harness = clh.Harness()
    hp = {name: p.default for name, p in harness.methods["er"].hparams.items()}
    rows = []
    for name in args.workloads:
        spec = with_overrides(WORKLOADS[name], augment=args.augment)
        build_scenario(spec, harness.datasets, 0, device)   # warm the dataset cache for both sides
        plain_er(spec, harness, 0, device, hp), harness_er(spec, harness, 0, device)   # warm-up
        plain, wrapped, inner, acc_p, acc_h = [], [], [], [], []

        def time_plain(rep):
            gc.collect()   # neither side pays for the other's garbage (timeit's rule)
            seconds, acc = plain_er(spec, harness, rep, device, hp)
            plain.append(seconds)
            acc_p.append(acc)

        def time_harness(rep):
            gc.collect()
            seconds, acc, loop = harness_er(spec, harness, rep, device)
            wrapped.append(seconds)
            inner.append(loop)
            acc_h.append(acc)

        for rep in range(args.repeats):   # interleaved, in alternating order: drift hits both sides alike
            for side in ((time_plain, time_harness) if rep % 2 == 0 else (time_harness, time_plain)):
                side(rep)
        p, h, i = statistics.median(plain), statistics.median(wrapped), statistics.median(inner)
        rows.append({"workload": name, "device": str(device), "repeats": args.repeats, "augment": args.augment,
                     "threads": torch.get_num_threads(), "plain_s": p, "harness_s": h, "harness_train_eval_s": i, "ratio": h / p,
                     "overhead_pct": 100 * (h / p - 1), "plain_final_acc": statistics.mean(acc_p),
                     "harness_final_acc": statistics.mean(acc_h)})
    from tabulate import tabulate
    print(tabulate([[r["workload"], r["device"], f"{r['plain_s']:.3f}", f"{r['harness_s']:.3f}",
                     f"{r['ratio']:.3f}", f"{r['overhead_pct']:+.1f}%", f"{r['plain_final_acc']:.3f}",
                     f"{r['harness_final_acc']:.3f}"] for r in rows],
                   headers=["workload", "device", "plain s (median)", "clharness s (median)", "ratio",
                            "overhead", "plain final acc", "clharness final acc"], tablefmt="github"))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


def across_processes(args) -> None:
    """Run this script ``args.processes`` times, each a fresh interpreter with the same flags, and
    report per workload the median, min and max of their ratios (each itself a median of repeats)."""
    import subprocess
    import sys
    import tempfile
    from tabulate import tabulate

    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.processes):
            out = f"{tmp}/{k}.json"
            subprocess.run([sys.executable, __file__, "--repeats", str(args.repeats), "--device", args.device,
                            "--augment", args.augment, "--threads", str(args.threads), "--workloads", *args.workloads,
                            "--json", out],
                           check=True, stdout=subprocess.DEVNULL)
            with open(out) as fh:
                runs.append(json.load(fh))
    rows = []
    for w, name in enumerate(args.workloads):
        ratios = [run[w]["ratio"] for run in runs]
        rows.append({"workload": name, "device": runs[0][w]["device"], "augment": args.augment,
                     "threads": runs[0][w]["threads"],
                     "processes": args.processes, "repeats": args.repeats, "ratio": statistics.median(ratios),
                     "ratio_min": min(ratios), "ratio_max": max(ratios), "ratios": ratios})
    print(tabulate([[r["workload"], r["device"], r["augment"], r["threads"], r["processes"], f"{r['ratio']:.3f}",
                     f"{r['ratio_min']:.3f}-{r['ratio_max']:.3f}"] for r in rows],
                   headers=["workload", "device", "augment", "threads", "processes", "median ratio", "range"],
                   tablefmt="github"))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
