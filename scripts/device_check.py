"""One prepared accelerator check (issue 41 item 5): every step the harness promises on a GPU, in one
command, with a JSON file and a Markdown summary.

    python scripts/device_check.py --out DIR                    # CUDA, at most ~8 minutes on one H100
    python scripts/device_check.py --out DIR --device cpu --quick   # the same code, tiny, on a CPU (CI)

Steps (``--only NAME,...`` runs a subset; ``--list`` names them):

* ``suite:<name>``: every family's quick suite (quickstart, stf-digits, m2i-mini, gtep-digits, cldyb-mini,
  domain-digits) through ``clharness.run(quick=True, seeds=1)``: ok when every record passed. ``--quick``
  runs finetune only.
* ``peak_memory``: the records of those suites have their memory columns: ``peak_rss_mb`` > 0,
  ``peak_cuda_mb`` > 0 on CUDA (0 on CPU), the three memory parts sum to ``memory_mb``.
* ``er_overhead``: ``bench/er_overhead.py``'s digits-mlp workload on the device (harness / plain ratio;
  ``--quick``: one epoch a task).
* ``ensemble``: E seeds of the quickstart as one batched model (``engine.ensemble.run_ensemble``) against
  the same E seeds solo, E = 5 and 10 on ResNet-32, each with and without bf16 autocast: wall ratio
  solo / ensemble and the largest accuracy difference of a member from its solo run (equal: <= 1e-4).
  ``--quick``: E = 2 on the quickstart MLP.
* ``vit_throughput``: ViT-B/16 forward passes with random weights, plain and through the frozen-feature
  cache (``bench/feature_cache.py``), images per second. ``--quick``: ViT-Tiny on 32x32 inputs.
* ``bf16_quickstart``: the quickstart's methods (one seed) in fp32 and under bf16 autocast: the final
  accuracy difference per method (a report, not a pass/fail bound: bf16 moves results).
* ``deterministic``: ``torch.use_deterministic_algorithms(True)`` (``CUBLAS_WORKSPACE_CONFIG`` set before CUDA
  starts): the same case twice, accuracy matrices bit-identical.
* ``ray_packing``: four quickstart runs serially and as Ray tasks with ``--gpus-per-run 0.25`` (one GPU
  for four; on a CPU, one CPU each): wall ratio serial / Ray. Skipped, with the reason, without ray.

bf16 autocast: ``torch.autocast(device, bfloat16, cache_enabled=False)`` around the run, in the calling
thread and every thread it starts (an ensemble's members are threads; autocast state is per thread);
without ``cache_enabled=False`` a region spanning many optimizer steps keeps using stale bf16 weights.

Isolation: every step is caught (one failing step never stops the others) and has a time limit
(``--step-limit``, seconds; per step below); the JSON says ok / failed / skipped per step with its error and
seconds. With ``--isolate`` (the default on CUDA) each step runs in its own process, so a crash or a
poisoned CUDA context stays in its step and a hung step is killed at its limit; in-process steps are
stopped by SIGALRM (Python code only). A step that would start after ``--budget`` seconds is skipped.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAMILY_SUITES = ("quickstart", "stf-digits", "m2i-mini", "gtep-digits", "cldyb-mini", "domain-digits")
# per-step time limits in seconds for a full run on one GPU (--quick: QUICK_LIMIT each), in the order the
# steps run; sized by the units each quick suite expands to (seeds 1: quickstart 8, stf-digits 12, m2i-mini 6,
# gtep-digits 72, cldyb-mini 16, domain-digits 12), not yet measured on a GPU. They sum to more than the
# 480 s budget (--budget): a step that would start after it is skipped, so Ray packing, last, goes first.
SUITE_LIMITS = {"quickstart": 40, "stf-digits": 40, "m2i-mini": 40, "gtep-digits": 90, "cldyb-mini": 60,
                "domain-digits": 40}
LIMITS = {**{f"suite:{s}": SUITE_LIMITS[s] for s in FAMILY_SUITES}, "peak_memory": 10, "ensemble": 90,
          "vit_throughput": 30, "bf16_quickstart": 25, "deterministic": 25, "er_overhead": 40, "ray_packing": 60}
QUICK_LIMIT = 60
STEPS = tuple(LIMITS)


class StepTimeout(Exception):
    pass


class Skip(Exception):
    """A step that cannot run here; its message says why."""


@dataclasses.dataclass
class Check:
    """What the steps share: the device, the size, the output folder."""
    device: str
    quick: bool
    out: Path
    limit: float = 0.0   # the running step's time limit (seconds); its subprocesses share it

    @property
    def store(self) -> Path:
        return self.out / "suites.sqlite"

    def torch_device(self):
        import torch
        return torch.device(self.device)


# ------------------------------------------------------------------------------------------- helpers
def _bench(name: str):
    """A module of bench/ (not a package), imported by path."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _sync(device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def autocast_everywhere(device, enabled: bool):
    """bf16 autocast in this thread and in every thread started inside (autocast is per thread). Without
    its weight-cast cache: one autocast region around a whole run would otherwise reuse the first bf16
    copy of every weight after the optimizer moved it (the model would never change)."""
    import torch
    if not enabled:
        yield
        return
    original = threading.Thread.run

    def run(self):
        with torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=False):
            original(self)

    threading.Thread.run = run
    try:
        with torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=False):
            yield
    finally:
        threading.Thread.run = original


def _quickstart_cases(backbone: str, seeds: int, method: str = "finetune", epochs: int | None = None,
                      options: dict | None = None):
    """The quickstart's scenario with ``backbone``: (harness, cases of seeds 0..seeds-1)."""
    from clharness.engine.runner import Case, resolve_hparams
    from clharness.engine.suites import load_suite
    from clharness.kinds import install
    from clharness.plugins import Harness
    harness = Harness()
    install(harness.kinds)
    suite = load_suite(harness.suites["quickstart"])
    spec = dataclasses.replace(suite.scenarios[0], backbone=backbone, backbone_options=dict(options or {}),
                               **({"epochs": epochs} if epochs else {}))
    hp = resolve_hparams(harness.methods[method], suite.hparams.get(method, {}))
    return harness, [Case(suite.name, spec, method, s, hp) for s in range(seeds)]


def _max_diff(a, b) -> float:
    import numpy as np
    if any(x.status != y.status for x, y in zip(a, b)):
        return math.inf
    return max(float(np.nanmax(np.abs(np.array(x.acc_matrix, dtype=float) - np.array(y.acc_matrix, dtype=float))))
               for x, y in zip(a, b))


# --------------------------------------------------------------------------------------------- steps
def step_suite(check: Check, name: str) -> dict:
    import clharness
    records = clharness.run(name, quick=True, seeds=1, device=check.device, results=str(check.store), fresh=True,
                            **({"methods": ["finetune"]} if check.quick else {}))
    statuses = {}
    for r in records:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    bad = [f"{r.case_id}: {r.status} {r.message.splitlines()[0] if r.message else ''}" for r in records
           if r.status not in ("passed", "not-applicable")]
    failed_units = [f"{u.name}: {u.message.splitlines()[0] if u.message else ''}" for u in records.units
                    if u.outcome == "failed"]
    result = {"records": len(records), "statuses": statuses, "not_passed": bad[:10], "failed_units": failed_units[:10]}
    if not records:
        raise AssertionError(f"suite {name} made no record")
    if bad:
        raise AssertionError(f"{len(bad)} of {len(records)} records did not pass: {bad[0]}")
    return result


def step_peak_memory(check: Check) -> dict:
    from clharness import results
    if not check.store.exists():
        raise Skip("no suite step stored records (run the suite:* steps first)")
    store = results.open(check.store)
    try:
        passed = [r for r in store.records() if r.status == "passed"]
    finally:
        store.close()
    # the runner's records (it measures memory: record.memory is filled); a family's own jobs (CLDyB's
    # sequence search) make records without a method and are not judged
    records = [r for r in passed if r.memory]
    if not records:
        raise Skip("the suite steps stored no passed run of a method")
    cuda = check.device.startswith("cuda")
    problems = []
    for r in records:
        parts = r.memory_model_mb + r.memory_buffer_mb + r.memory_other_mb
        if not r.peak_rss_mb > 0:
            problems.append(f"{r.case_id}: peak_rss_mb = {r.peak_rss_mb}")
        if cuda and not r.peak_cuda_mb > 0:
            problems.append(f"{r.case_id}: peak_cuda_mb = {r.peak_cuda_mb} on CUDA")
        if not cuda and r.peak_cuda_mb != 0:
            problems.append(f"{r.case_id}: peak_cuda_mb = {r.peak_cuda_mb} on a CPU run")
        if not math.isclose(parts, r.memory_mb, rel_tol=1e-9, abs_tol=1e-12):
            problems.append(f"{r.case_id}: model + buffer + other = {parts} != memory_mb = {r.memory_mb}")
    if problems:
        raise AssertionError(f"{len(problems)} record(s) lack memory columns: {problems[0]}")
    return {"records": len(records), "not_method_runs": len(passed) - len(records),
            "max_peak_cuda_mb": max(r.peak_cuda_mb for r in records),
            "max_peak_rss_mb": max(r.peak_rss_mb for r in records),
            "max_memory_buffer_mb": max(r.memory_buffer_mb for r in records)}


def step_er_overhead(check: Check) -> dict:
    """bench/er_overhead.py's digits-mlp workload (its plain_er and harness_er, interleaved as its main
    does); --quick: one epoch a task instead of five."""
    import gc

    import clharness as clh
    bench = _bench("er_overhead")
    device = check.torch_device()
    spec = bench.WORKLOADS["digits-mlp"]
    if check.quick:
        spec = dataclasses.replace(spec, epochs=1)
    harness = clh.Harness()
    hp = {name: p.default for name, p in harness.methods["er"].hparams.items()}
    bench.plain_er(spec, harness, 0, device, hp), bench.harness_er(spec, harness, 0, device)   # warm-up
    plain, wrapped, acc_p, acc_h = [], [], [], []
    for rep in range(1 if check.quick else 3):   # alternating order, as the bench does
        for side in ("plain", "harness") if rep % 2 == 0 else ("harness", "plain"):
            gc.collect()
            if side == "plain":
                seconds, acc = bench.plain_er(spec, harness, rep, device, hp)
                plain.append(seconds), acc_p.append(acc)
            else:
                seconds, acc, _ = bench.harness_er(spec, harness, rep, device)
                wrapped.append(seconds), acc_h.append(acc)
    p, h = statistics.median(plain), statistics.median(wrapped)
    return {"workload": "digits-mlp", "epochs": spec.epochs, "repeats": len(plain), "plain_s": round(p, 3),
            "harness_s": round(h, 3), "ratio": round(h / p, 3), "plain_final_acc": round(statistics.mean(acc_p), 4),
            "harness_final_acc": round(statistics.mean(acc_h), 4)}


def step_ensemble(check: Check) -> dict:
    from clharness.engine.ensemble import run_ensemble
    from clharness.engine.runner import run_case
    device = check.torch_device()
    sizes, backbone = ((2,), "mlp") if check.quick else ((5, 10), "resnet32")
    options = {"hidden": 16, "layers": 1} if check.quick else {}
    rows, unequal = [], []
    for E in sizes:
        harness, cases = _quickstart_cases(backbone, E, epochs=1, options=options)
        run_case(cases[0], harness, device)   # warm-up: data, kernels, allocator
        for bf16 in (False, True):
            with autocast_everywhere(device, bf16):
                _sync(device)
                t = time.perf_counter()
                solo = [run_case(c, harness, device) for c in cases]
                _sync(device)
                t_solo = time.perf_counter() - t
                t = time.perf_counter()
                batched = run_ensemble(cases, harness, device)
                _sync(device)
                t_ens = time.perf_counter() - t
            diff = _max_diff(solo, batched)
            row = {"E": E, "backbone": backbone, "bf16": bf16, "solo_s": round(t_solo, 3),
                   "ensemble_s": round(t_ens, 3), "ratio": round(t_solo / t_ens, 3), "max_diff": diff,
                   "equal": diff <= 1e-4, "passed": sum(r.status == "passed" for r in batched)}
            rows.append(row)
            if not bf16 and not row["equal"]:
                unequal.append(row)
            if row["passed"] != E:
                raise AssertionError(f"E = {E} (bf16 {bf16}): {E - row['passed']} member(s) did not pass: "
                                     f"{[r.message for r in batched if r.status != 'passed'][:1]}")
    # members equal their solo runs in fp32 (tests/test_ensemble.py); under bf16 the batched matmuls
    # round differently, so a difference there is reported, not failed
    if unequal:
        raise AssertionError(f"fp32 ensemble members differ from their solo runs: {unequal[0]}")
    return {"rows": rows}


def step_vit_throughput(check: Check) -> dict:
    bench = _bench("feature_cache")
    if check.quick:
        argv = ["--model", "vit_tiny_patch16_224", "--size", "32", "--images", "16", "--batch", "16", "--passes", "2"]
    else:
        argv = ["--model", "vit_base_patch16_224", "--size", "224", "--images", "512", "--batch", "128",
                "--passes", "3"]
    with contextlib.redirect_stdout(open(os.devnull, "w")):
        r = bench.main([*argv, "--device", check.device])
    images = r["images"] * r["passes"]
    if not r["identical"]:
        raise AssertionError("the cached features differ from the plain ones")
    return {"model": r["model"], "images_per_s_plain": round(images / r["plain_s"], 1),
            "images_per_s_cached": round(images / r["cached_s"], 1), "speedup": r["speedup"],
            "per_pass_plain_s": r["per_pass_plain_s"], "identical": r["identical"]}


def step_bf16_quickstart(check: Check) -> dict:
    from clharness.engine.runner import run_case
    device = check.torch_device()
    methods = ("finetune", "er") if check.quick else ("finetune", "er", "ewc", "lwf", "ncm", "joint")
    rows = []
    for method in methods:
        if check.quick:   # a narrow MLP, one epoch a task
            harness, (case,) = _quickstart_cases("mlp", 1, method, epochs=1, options={"hidden": 16, "layers": 1})
        else:             # the quickstart exactly as its suite defines it
            harness, (case,) = _quickstart_cases_default(method)
        fp32 = run_case(case, harness, device)
        with autocast_everywhere(device, True):
            bf16 = run_case(case, harness, device)
        if fp32.status != "passed" or bf16.status != "passed":
            raise AssertionError(f"{method}: fp32 {fp32.status}, bf16 {bf16.status}: {fp32.message or bf16.message}")
        a, b = fp32.metrics["final_acc"], bf16.metrics["final_acc"]
        rows.append({"method": method, "fp32_final_acc": round(a, 4), "bf16_final_acc": round(b, 4),
                     "difference": round(b - a, 4)})
    return {"rows": rows, "max_abs_difference": max(abs(r["difference"]) for r in rows)}


def _quickstart_cases_default(method: str):
    """The quickstart's case for ``method`` exactly as the suite defines it (its backbone and budgets)."""
    from clharness.engine.runner import Case, resolve_hparams
    from clharness.engine.suites import load_suite
    from clharness.kinds import install
    from clharness.plugins import Harness
    harness = Harness()
    install(harness.kinds)
    suite = load_suite(harness.suites["quickstart"])
    hp = resolve_hparams(harness.methods[method], suite.hparams.get(method, {}))
    return harness, [Case(suite.name, suite.scenarios[0], method, 0, hp)]


def step_deterministic(check: Check) -> dict:
    import torch
    from clharness.engine.runner import run_case
    device = check.torch_device()
    backbone, options = ("mlp", {"hidden": 16, "layers": 1}) if check.quick else ("resnet32", {})
    harness, (case,) = _quickstart_cases(backbone, 1, "er", epochs=1, options=options)
    previous = torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    try:
        a, b = run_case(case, harness, device), run_case(case, harness, device)
    finally:
        torch.use_deterministic_algorithms(previous[0])
        torch.backends.cudnn.benchmark = previous[1]
    if a.status != "passed" or b.status != "passed":
        raise AssertionError(f"deterministic runs: {a.status}, {b.status}: {a.message or b.message}")
    same = a.acc_matrix == b.acc_matrix and a.metrics == b.metrics
    if not same:
        raise AssertionError(f"two deterministic runs differ by up to {_max_diff([a], [b])}")
    return {"backbone": backbone, "method": "er", "bit_identical": True, "final_acc": a.metrics["final_acc"]}


def step_ray_packing(check: Check) -> dict:
    if importlib.util.find_spec("ray") is None:
        raise Skip("ray is not installed (pip install 'clharness[ray]')")
    common = ["run", "--suite", "quickstart", "--quick", "--seeds", "4", "--method", "finetune", "--device", check.device,
              "--fresh"]
    launcher = "import sys; from clharness.cli import main; sys.exit(main(sys.argv[1:]))"
    limit = check.limit / 2   # each side half of the step's limit

    def timed(*extra):
        t = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", launcher, *common, *extra], capture_output=True, text=True,
                              cwd=check.out, timeout=limit)
        if done.returncode:
            raise RuntimeError(f"clharness {' '.join(extra)} exited {done.returncode}: "
                               f"{(done.stdout + done.stderr)[-1500:]}")
        return time.perf_counter() - t

    serial = timed("--results", str(check.out / "ray_serial.sqlite"))
    packing = ["--gpus-per-run", "0.25"] if check.device.startswith("cuda") else []
    ray = timed("--results", str(check.out / "ray.sqlite"), "--ray", "local", *packing)
    return {"runs": 4, "gpus_per_run": 0.25 if packing else 0, "serial_s": round(serial, 2), "ray_s": round(ray, 2),
            "ratio_serial_over_ray": round(serial / ray, 3),
            "note": "each side is a fresh `clharness run` (imports and, for Ray, starting the runtime included)"}


def run_step(check: Check, name: str):
    if name.startswith("suite:"):
        return step_suite(check, name.partition(":")[2])
    return globals()[f"step_{name}"](check)


# -------------------------------------------------------------------------------------------- driver
@contextlib.contextmanager
def _alarm(seconds: float):
    """StepTimeout in the main thread after ``seconds`` (Python code only; --isolate kills anything)."""
    if not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def fire(signum, frame):
        raise StepTimeout(f"the step ran past its limit of {seconds:.0f} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def in_process(check: Check, name: str, limit: float) -> dict:
    t = time.perf_counter()
    entry = {"step": name, "limit_s": limit}
    check = dataclasses.replace(check, limit=limit)
    try:
        with _alarm(limit):
            entry["result"] = run_step(check, name)
        entry["status"] = "ok"
    except Skip as exc:
        entry["status"], entry["reason"] = "skipped", str(exc)
    except StepTimeout as exc:
        entry["status"], entry["error"] = "failed", str(exc)
    except BaseException as exc:   # noqa: BLE001 - one step's failure is its entry, never the whole check's
        if isinstance(exc, KeyboardInterrupt):
            raise
        entry["status"], entry["error"] = "failed", f"{type(exc).__name__}: {exc}"
        entry["traceback"] = "".join(traceback.format_exception(exc)[-4:])
    entry["seconds"] = round(time.perf_counter() - t, 2)
    return entry


def isolated(check: Check, name: str, limit: float) -> dict:
    """The step in a fresh process (``--step``), killed at ``limit``."""
    t = time.perf_counter()
    result = check.out / f".step-{name.replace(':', '-')}.json"
    result.unlink(missing_ok=True)
    command = [sys.executable, __file__, "--out", str(check.out), "--device", check.device, "--step", name,
               "--step-limit", str(limit), *(["--quick"] if check.quick else [])]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=limit + 30)
    except subprocess.TimeoutExpired:
        return {"step": name, "limit_s": limit, "status": "failed", "seconds": round(time.perf_counter() - t, 2),
                "error": f"the step's process ran past its limit of {limit:.0f} s and was killed"}
    if not result.exists():
        return {"step": name, "limit_s": limit, "status": "failed", "seconds": round(time.perf_counter() - t, 2),
                "error": f"the step's process exited {done.returncode} without a result: {done.stderr[-1500:]}"}
    return json.loads(result.read_text())


def environment(check: Check) -> dict:
    import platform

    import torch
    env = {"device": check.device, "quick": check.quick, "torch": torch.__version__, "python": platform.python_version(),
           "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None}
    if check.device.startswith("cuda") and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(check.torch_device())
    return env


def summary_markdown(report: dict) -> str:
    env = report["environment"]
    lines = [f"# Device check: {env.get('gpu', env['device'])}{' (quick)' if env['quick'] else ''}", "",
             f"torch {env['torch']}, Python {env['python']}, load average at start "
             f"{' '.join(f'{x:.2f}' for x in env['load_average'] or ())}; {report['seconds']:.0f} s in all.", "",
             "| step | status | seconds | result |", "|---|---|---:|---|"]
    for e in report["steps"]:
        what = e.get("error") or e.get("reason") or _brief(e.get("result", {}))
        lines.append(f"| {e['step']} | {e['status']} | {e['seconds']:.1f} | {what.replace('|', '/')} |")
    counts = {s: sum(e["status"] == s for e in report["steps"]) for s in ("ok", "failed", "skipped")}
    lines += ["", f"{counts['ok']} ok, {counts['failed']} failed, {counts['skipped']} skipped."]
    return "\n".join(lines) + "\n"


def _brief(result: dict) -> str:
    if "rows" in result:
        rows = result["rows"]
        keys = [k for k in rows[0] if k not in ("backbone", "passed")] if rows else []
        return "; ".join(", ".join(f"{k} {row[k]}" for k in keys) for row in rows)
    return ", ".join(f"{k} {v}" for k, v in result.items() if not isinstance(v, (list, dict))) or \
        json.dumps(result)[:200]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for device_check.json, device_check.md and the stores")
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:K or cpu")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (the CI run on a CPU)")
    ap.add_argument("--only", default="", help="comma-separated steps (default: all; --list names them)")
    ap.add_argument("--list", action="store_true", help="name the steps and their limits, then exit")
    ap.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=None,
                    help="each step in its own process (default: on for CUDA, off on a CPU)")
    ap.add_argument("--step-limit", type=float, default=None, help="seconds per step (default: per step, see --list)")
    ap.add_argument("--budget", type=float, default=480, help="start no step after this many seconds (default 480)")
    ap.add_argument("--step", help=argparse.SUPPRESS)   # internal: one step, in an --isolate child process
    args = ap.parse_args(argv)
    if args.list:
        for name in STEPS:
            print(f"{name:24} {LIMITS[name]:>4} s")
        return 0
    if args.device.startswith("cuda"):   # before CUDA starts: deterministic cuBLAS needs it
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    check = Check(args.device, args.quick, out.resolve())

    def limit(name):
        return args.step_limit or (QUICK_LIMIT if args.quick else LIMITS[name])

    if args.step:   # the child of --isolate
        entry = in_process(check, args.step, limit(args.step))
        (out / f".step-{args.step.replace(':', '-')}.json").write_text(json.dumps(entry, default=str))
        return 0
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(STEPS)
    unknown = [n for n in names if n not in STEPS]
    if unknown:
        ap.error(f"unknown step(s) {', '.join(unknown)}; steps: {', '.join(STEPS)}")
    isolate = args.device.startswith("cuda") if args.isolate is None else args.isolate
    if check.store.exists():
        check.store.unlink()
    start = time.perf_counter()
    report = {"environment": environment(check), "steps": []}
    for name in names:
        spent = time.perf_counter() - start
        if spent > args.budget:
            entry = {"step": name, "status": "skipped", "seconds": 0.0,
                     "reason": f"out of time: {spent:.0f} s spent of the {args.budget:.0f} s budget"}
        else:
            entry = (isolated if isolate else in_process)(check, name, limit(name))
        report["steps"].append(entry)
        print(f"{name:24} {entry['status']:8} {entry['seconds']:7.1f} s  "
              f"{entry.get('error') or entry.get('reason') or ''}"[:300], flush=True)
    report["seconds"] = round(time.perf_counter() - start, 2)
    (out / "device_check.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "device_check.md").write_text(summary_markdown(report))
    print(f"wrote {out / 'device_check.json'} and {out / 'device_check.md'}")
    return 1 if any(e["status"] == "failed" for e in report["steps"]) else 0


if __name__ == "__main__":
    sys.exit(main())
