"""Harness overhead: the reference `er` run through clharness vs the same ER as a plain,
hand-written PyTorch loop, side by side in one process, same data, budgets and evaluation.

    python bench/er_overhead.py               # both workloads, 5 interleaved repeats
    python bench/er_overhead.py --repeats 3 --workloads digits-mlp --device cuda
    python bench/er_overhead.py --augment cifar   # both sides augment every training batch alike
    python bench/er_overhead.py --processes 7     # 7 fresh interpreters: median and range of their ratios
    python bench/er_overhead.py --threads 1       # steadiest on a small shared CPU
    python bench/er_overhead.py --workloads fmnist-mlp --repeats 3   # real size: Fashion-MNIST, 60,000 images
    /work/venv-parity/bin/python bench/er_overhead.py --workloads fmnist-mlp --avalanche --rss
        # also Avalanche 0.6's wall time on the same er and ewc runs, and a session's peak resident memory

Real size (issue 40): ``fmnist-mlp`` is split Fashion-MNIST's class-incremental scenario at full size
(60,000 train / 10,000 test images from the data root or Debian's dataset-fashion-mnist; MLP 2x400,
batch 128, memory 1,000, one epoch a task). ``--avalanche`` times Avalanche's Naive + class-balanced
ReplayPlugin and its EWC (mode "separate", minibatch Fisher, lambda halved: its penalty has no 1/2)
against our er and ewc (ewc_mode "separate", ewc_fisher "minibatch") on the same normalised tensors,
initial weights, optimizer and budgets, both evaluating every task after every task; Avalanche's clock
starts at its benchmark built from the already normalised float tensors (its best case). ``--rss``
runs one split-fmnist case in a fresh interpreter and compares its peak resident memory above the
interpreter with torch and clharness imported against the bytes the run must hold: the uint8 images,
the model and the memory buffer.

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

At real size (issue 40, fmnist-mlp, one thread, profiled under load): the model's forward/backward is ~2/3 of
our er run; the data path was the largest harness cost: shuffled uint8 batches gathered with images[idx]
(advanced indexing, ~100x slower than index_select on uint8 NCHW) and the normalisation as a broadcast
addcmul over uint8 (not vectorised: 0.58 ms a batch of 128; with contiguous float operands 0.06 ms, the
same fused multiply-add bit for bit); both replaced (clharness/data/base.py). Left: ER's class-balanced
placement row by row in Python after each task (~5%, exact RNG draws kept), the per-task uint8 copies of
build_scenario (~1.5%), and, since issue 41, the run's FLOP meter (a Python dispatch mode on every op:
median CPU time of 2, load 1.3-2.7: our er 3.53 -> 4.50 s with it, Avalanche 8.62 s, ratio 2.44 without it
and 1.92 with it; ewc 7.55 -> 9.43 s, Avalanche 11.70 s, ratio 1.55 / 1.24).
ewc spends most of its extra time in its penalty, sum over finished tasks of F_t (theta - theta*_t)^2 and
its backward (Avalanche computes the same terms), and the minibatch Fisher (the same work on both sides).
Peak memory: the baseline of ``--rss`` is the interpreter after a tiny run of the same case (libtorch's
kernels paged in); above it the full uint8 splits held by the loader cache (52 MB) and, until issue 40 item 4,
each task's uint8 copy (55 MB) -- a copy, not a view, because a view's storage would hand a method every later
task's and the validation images (tests/test_no_test_data_leak.py checks storage) -- then model, optimizer,
batches. Now a task on the CPU holds no copy: its TensorData keeps its row indices and a key to the loaded
split (data.base.SplitRows, a module-level table as the cache is) and gathers each batch from it, so nothing a
method reaches shares storage with the split; ``images``, asked for, is still a copy of its rows. One fresh
interpreter, load 2.6: 126.3 -> 74.4 MB above the baseline, 2.30x -> 1.35x of the 54.9 MB needed, the same final
accuracy (0.7742). The cache stays, so a later case reads no file again; an epoch's batches gather from the
60,000-row split instead of the task's 12,000 rows: 9.7 -> 11.2 ms a task's epoch of shuffled batches of 128
(min of 7, load 1.5), noise beside a 4-5 s run.

Issue 40 item 4, the FLOP meter's share (load 1.3-3, one thread, in-process A/B of CPU time): of an er run's
39,000 aten ops under the meter, ~7,000 ran in the data layer's batches and normalisation and the buffer's
placement and sampling, which count nothing; they now run with the meter stepped aside
(``toolkit.metering.uncounted``, as the optimizer step already was; ``PAUSES = "check"`` proves a region counts
nothing, tests/test_flops_pauses.py runs real cases so), 31,800 left, and a plain op's dispatch skips
``OpOverload.__call__``'s Python frame (per op ~4.5 us over the bare op, a forward-only mode's floor). What is
left is the model's forward and backward (~41 ops a step, 19,300 in all: ``t``, ``detach``, ``mm``, the
activations' backward) and the runner's accuracy bookkeeping (evaluate_views, ~3,800, runner.py); in a step
bench (MLP at batch 256, SGD) the meter still adds 0.76 ms to 5.0 ms, and er's in-process A/B medians were
4.54 s (before) / 4.61 s (after) / 3.53 s (no meter) at load 1.5-1.8, i.e. within the noise: the pauses help
little on er. ewc (separate, minibatch Fisher): 124,000 ops before, 55,000 after: its separate penalty is one
autograd node (methods/ewc.py ``_SeparatePenalty``, autograd's arithmetic and accumulation order bit for bit,
tests/test_ewc_fused_penalty.py) whose forward and backward run uncounted, and the Fisher sums run uncounted;
without any meter the fused penalty alone is 8.11 -> 7.48 s CPU (median of 2, load 3). The penalty itself
(sub, square, product and sum over T finished tasks' 478,000 weights each step, and its backward) is ~40% of
ewc's time and the same work as Avalanche's EWC.
EWC's backward then computes (2 g F) * d, the same real product as autograd's (g F) * (2 d), with 2 g F kept per
Fisher tensor: one pass a weight and task instead of three (ewc without meter 7.24 -> 6.46 s CPU, load 0.9).
After all of it (load 0.8-1.0, ``--workloads fmnist-mlp --avalanche --rss --threads 1 --repeats 3``):
harness/plain 1.01 (3.68 / 3.72 s), Avalanche/clharness er 1.71 (6.44 / 3.77 s), ewc 1.44 (11.66 / 8.11 s),
RSS 1.36x (1.34-1.41; 74.6 MB above the baseline); the idle figures before were 1.02, 1.45, 1.14 and 2.27x. What
is left of the meter (~0.5-1 s of er's run: without it ~3.0-3.5 s) is its ~4.5 us an op on ops that must be
seen -- the model's forward and backward -- and on some that need not: the runner's accuracy bookkeeping
(evaluate_views, _checked_logits: ~3,800 ops a run) and the trainer's loss guard, cross-entropy forward and
optimizer profiling marks (toolkit/training.py: ~3,700), which could run uncounted too (not this bench's files).

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
    # real size: split Fashion-MNIST class-incremental, 60,000 images (suites/split-fmnist.toml, 1 epoch)
    "fmnist-mlp": ScenarioSpec(name="fmnist-mlp", dataset="fashion-mnist", tasks=5, epochs=1, batch_size=128,
                               memory_size=1000, backbone="mlp", backbone_options={"hidden": 400, "layers": 2}),
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


# ------------------------------------------------------------------------- Avalanche on the same runs
AVALANCHE_HP = {"er": {"optimizer": "sgd", "lr": 0.1, "momentum": 0.0, "buffer": "class-balanced"},
                # Adam (ewc's default): SGD at lr 0.1 diverges under the penalty on Fashion-MNIST
                "ewc": {"optimizer": "adam", "lr": 0.001, "ewc_lambda": 200.0, "ewc_mode": "separate",
                        "ewc_fisher": "minibatch"}}


def _scenario_tensors(spec, harness, seed, device):
    """The built scenario's tasks as float tensors (what Avalanche's tensors_benchmark takes) and its
    global class ids per task: the same images, order and normalisation as the harness side."""
    scenario = build_scenario(spec, harness.datasets, seed, device)

    def whole(data):
        xs, ys = zip(*data.batches(4096))
        return torch.cat(xs), torch.cat(ys)
    return [whole(t.train) for t in scenario.tasks], [whole(t.test) for t in scenario.tasks], scenario


def harness_method(spec, harness, seed, device, method) -> float:
    t0, c0 = time.perf_counter(), time.process_time()
    record = run_case(Case("bench", spec, method, seed, dict(AVALANCHE_HP[method])), harness, device)
    assert record.status == "passed", record.message
    return time.perf_counter() - t0, record.metrics["final_acc"], time.process_time() - c0


def avalanche_method(spec, harness, seed, device, method, prepared) -> float:
    """Avalanche 0.6's strategy for ``method`` on the prepared tensors: train each experience, then
    evaluate the whole test stream (the harness's accuracy matrix row), as run_case does."""
    from avalanche.benchmarks.scenarios.deprecated.generators import tensors_benchmark
    from avalanche.training import plugins as avl_plugins, storage_policy, supervised as avl
    from avalanche.training.plugins import EvaluationPlugin
    from avalanche.evaluation.metrics import accuracy_metrics
    train, test, scenario = prepared
    t0, c0 = time.perf_counter(), time.process_time()
    bench = tensors_benchmark(train_tensors=train, test_tensors=test, task_labels=[0] * len(train))
    seed_everything(seed)
    backbone = harness.backbones[spec.backbone](tuple(train[0][0].shape[1:]), **spec.backbone_options)
    model = clh.Classifier(backbone, len(scenario.class_names)).to(device)
    hp = AVALANCHE_HP[method]
    optimizer = torch.optim.Adam(model.parameters(), lr=hp["lr"]) if hp["optimizer"] == "adam" else \
        torch.optim.SGD(model.parameters(), lr=hp["lr"], momentum=hp["momentum"])
    common = dict(train_mb_size=spec.batch_size, train_epochs=spec.epochs, eval_mb_size=spec.eval_batch_size,
                  device=device, evaluator=EvaluationPlugin(accuracy_metrics(experience=True, stream=True),
                                                            loggers=[]))
    if method == "er":
        replay = avl_plugins.ReplayPlugin(mem_size=spec.memory_size,
                                          storage_policy=storage_policy.ClassBalancedBuffer(spec.memory_size))
        strategy = avl.Naive(model, optimizer, torch.nn.CrossEntropyLoss(), plugins=[replay], **common)
    else:   # Avalanche's penalty is lambda * sum F (theta - theta*)^2: half of ours at the same lambda
        strategy = avl.EWC(model, optimizer, torch.nn.CrossEntropyLoss(), ewc_lambda=hp["ewc_lambda"] / 2,
                           mode="separate", **common)
    for experience in bench.train_stream:
        strategy.train(experience, num_workers=0)
        results = strategy.eval(bench.test_stream, num_workers=0)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0, float(results["Top1_Acc_Stream/eval_phase/test_stream/Task000"]),
            time.process_time() - c0)


def avalanche_rows(spec, harness, device, repeats):
    prepared = _scenario_tensors(spec, harness, 0, device)
    rows = []
    for method in ("er", "ewc"):
        harness_method(spec, harness, 0, device, method), avalanche_method(spec, harness, 0, device, method, prepared)
        ours, theirs, acc_o, acc_a, cpu_o, cpu_a = [], [], [], [], [], []
        for rep in range(repeats):   # interleaved, alternating order
            for side in ((0, 1) if rep % 2 == 0 else (1, 0)):
                gc.collect()
                if side == 0:
                    seconds, acc, cpu = harness_method(spec, harness, 0, device, method)
                    ours.append(seconds)
                    acc_o.append(acc)
                    cpu_o.append(cpu)
                else:
                    seconds, acc, cpu = avalanche_method(spec, harness, 0, device, method, prepared)
                    theirs.append(seconds)
                    acc_a.append(acc)
                    cpu_a.append(cpu)
        o, a = statistics.median(ours), statistics.median(theirs)
        # CPU time (this process, all threads) moves less than wall time on a loaded machine
        co, ca = statistics.median(cpu_o), statistics.median(cpu_a)
        rows.append({"workload": spec.name, "method": method, "clharness_s": o, "avalanche_s": a, "ratio": a / o,
                     "clharness_cpu_s": co, "avalanche_cpu_s": ca, "cpu_ratio": ca / co,
                     "clharness_final_acc": statistics.mean(acc_o), "avalanche_final_acc": statistics.mean(acc_a)})
    return rows


# ------------------------------------------------------------------------------- peak resident memory
RSS_CHILD = """
import json, resource, sys, torch
import clharness as clh
from clharness.engine.runner import Case, pick_device, run_case
from clharness.engine.suites import load_suite, with_overrides
from clharness.data import load_split
torch.set_num_threads({threads})
harness = clh.Harness()
def rss():   # current resident set, bytes
    return int(open('/proc/self/statm').read().split()[1]) * resource.getpagesize()
import_base = rss()
spec = {{s.name: s for s in load_suite(harness.suites['split-fmnist']).scenarios}}['ci-5x2']
spec = with_overrides(spec, epochs=1)
# the baseline: torch's kernels paged in by a tiny run of the same case (40 synthetic 28x28 images), so the
# figure above it is what the real data costs, not the first touch of libtorch's backward and optimizer code
tiny = with_overrides(spec, dataset='synthetic', dataset_options={{'train_per_class': 2, 'test_per_class': 2,
                                                                   'image_size': 28}})
warm = run_case(Case('split-fmnist', tiny, 'er', 0, {{}}), harness, pick_device('cpu'))
assert warm.status == 'passed', warm.message
base = rss()
record = run_case(Case('split-fmnist', spec, 'er', 0, {{}}), harness, pick_device('cpu'))
assert record.status == 'passed', record.message
source = harness.datasets['fashion-mnist']()
source.name = 'fashion-mnist'
images = sum(load_split(source, None, train).images.numel() for train in (True, False))
params = sum(p.numel() for p in harness.backbones['mlp']((1, 28, 28), hidden=400, layers=2).parameters()) + 401 * 10
# VmHWM: this address space's peak. Not ru_maxrss: Linux keeps it across fork and execve, so a child of a large
# parent (this bench after its Avalanche rows: 1.3 GB) reported the parent's peak (the 1,512 MiB of issue 40)
peak = next(int(line.split()[1]) for line in open('/proc/self/status') if line.startswith('VmHWM:')) * 1024
json.dump({{"base": base, "peak": peak, "import_base": import_base, "images": images, "model": 4 * params, "buffer": spec.memory_size * 784,
           "final_acc": record.metrics["final_acc"]}}, sys.stdout)
"""


def session_rss(threads: int) -> dict:
    """One split-fmnist case (ci-5x2, er, one epoch a task, full data) in a fresh interpreter."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", RSS_CHILD.format(threads=threads or torch.get_num_threads())],
                         check=True, capture_output=True, text=True)
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    figures["needed"] = figures["images"] + figures["model"] + figures["buffer"]
    figures["above_base"] = figures["peak"] - figures["base"]
    figures["ratio"] = figures["above_base"] / figures["needed"]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--workloads", nargs="+", default=["digits-mlp", "synthetic-resnet"], choices=list(WORKLOADS))
    parser.add_argument("--avalanche", action="store_true",
                        help="also Avalanche 0.6 / clharness wall time on the same er and ewc runs (needs avalanche-lib)")
    parser.add_argument("--rss", action="store_true", help="also a split-fmnist case's peak resident memory")
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
    extra = {}
    if args.avalanche:
        extra["avalanche"] = []
        for name in args.workloads:
            extra["avalanche"] += avalanche_rows(with_overrides(WORKLOADS[name], augment=args.augment), harness,
                                                 device, args.repeats)
        print(tabulate([[r["workload"], r["method"], f"{r['clharness_s']:.2f}", f"{r['avalanche_s']:.2f}",
                         f"{r['ratio']:.2f}", f"{r['clharness_cpu_s']:.2f}", f"{r['avalanche_cpu_s']:.2f}",
                         f"{r['cpu_ratio']:.2f}", f"{r['clharness_final_acc']:.3f}", f"{r['avalanche_final_acc']:.3f}"]
                        for r in extra["avalanche"]],
                       headers=["workload", "method", "clharness s (median)", "avalanche 0.6 s (median)",
                                "avalanche / clharness", "clharness CPU s", "avalanche CPU s", "CPU ratio",
                                "clharness final acc", "avalanche final acc"],
                       tablefmt="github"))
    if args.rss:   # one fresh interpreter per repeat, the median run (by its ratio) reported
        runs = sorted((session_rss(args.threads) for _ in range(args.repeats)), key=lambda f: f["ratio"])
        r = extra["rss"] = {**runs[len(runs) // 2], "ratios": [f["ratio"] for f in runs]}
        mib = 2 ** 20
        print(tabulate([["split-fmnist ci-5x2 er", len(runs), f"{r['peak'] / mib:.0f}", f"{r['base'] / mib:.0f}",
                         f"{r['above_base'] / mib:.1f}", f"{r['images'] / mib:.1f}", f"{r['model'] / mib:.1f}",
                         f"{r['buffer'] / mib:.2f}", f"{r['ratio']:.2f}x",
                         "-".join(f"{x:.2f}" for x in (runs[0]["ratio"], runs[-1]["ratio"]))]],
                       headers=["session (1 epoch a task, 60,000 images)", "runs", "peak RSS MiB (median)",
                                "torch + clharness imported MiB", "above that MiB", "uint8 images MiB",
                                "model MiB", "buffer MiB", "above / needed", "range"], tablefmt="github"))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"rows": rows, **extra} if extra else rows, fh, indent=1)


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
