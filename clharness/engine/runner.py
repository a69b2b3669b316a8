"""Run one method through one scenario for one seed: train, evaluate, time, measure memory.

The runner, not the method, guards the protocol: a method gets each task's train data
once, in order; test data and future tasks stay here; task ids only in task-incremental
settings. After every task it fills one row of the accuracy matrix R[i][j] (accuracy on
task j's test data after learning task i), future tasks included.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import platform
import random
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from .. import __version__, metrics
from ..toolkit.backbones import WeightsMissing, pretrained_weights, weights_identity, weights_key
from .. import kinds
from ..hparams import resolve
from ..method import Context, Diverged, Method, MethodError, Setting
from ..results import RunRecord
from . import flops, keys, peak_memory
from .scenario import Scenario, build_scenario
from .code_identity import code_digest, git_commit
from .contract_check import dry_predict
from ..state_guard import never_trains
from .suites import ScenarioSpec, spec_definition


# torch's intra-op threads for every run of this process: one rule for serial, pytest-xdist and Ray
# (--clh-cpus-per-run, default 1), so a result never depends on how its session was scheduled. A CPU
# float sum is split by thread, so a chaotic method's result moves with the count: a count other than
# 1 enters the record key.
_CPU_THREADS = 1


def set_cpu_threads(n: int) -> None:
    global _CPU_THREADS
    if int(n) < 1:
        raise ValueError(f"--clh-cpus-per-run {n}: give a positive number of CPU threads per run")
    _CPU_THREADS = int(n)


def cpu_threads() -> int:
    return _CPU_THREADS


# the device type of this process's runs: CUDA kernels sum in other orders than the CPU's, so a run's
# numbers depend on it and a type other than "cpu" enters the record key (Session sets it from
# --clh-device; a Ray worker from the device it runs on)
_DEVICE = {"name": "auto"}


def set_device(name) -> None:
    if _DEVICE.get("name") != str(name):
        _DEVICE.clear()
        _DEVICE["name"] = str(name)


def device_type() -> str:
    if "type" not in _DEVICE:
        name = _DEVICE["name"]
        _DEVICE["type"] = ("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" \
            else torch.device(name).type
    return _DEVICE["type"]


OOM_HINT = ("Hint: out of memory. Lower batch_size (and eval_batch_size) in the suite, run with --clh-quick, "
            "or run fewer pytest-xdist workers per GPU (-n)")


@dataclass(frozen=True)
class Case:
    """One parametrised run: what the test id ``suite::scenario[method-seedN]`` stands for."""
    suite: str
    scenario: ScenarioSpec
    method: str
    seed: int
    hparams: dict[str, Any] = field(default_factory=dict)   # resolved against the method's space
    KEY_OMITS = ()   # definition fields a kind of case leaves out of its key (runs several suites share)

    @property
    def id(self) -> str:
        return f"{self.suite}::{self.scenario.name}[{self.method}-seed{self.seed}]"

    def definition(self, method_cls: type[Method], versions: dict[str, str]) -> dict[str, Any]:
        """Everything that defines the run's outcome; its hash is the record key (engine.keys)."""
        return keys.case_definition(self, method_cls, versions=versions,
                                    code=code_digest(method_cls, _kind_file(self.scenario.kind)),
                                    cpu_threads=_CPU_THREADS, device_type=device_type(),
                                    weights=weights_key(self.scenario.backbone, self.scenario.backbone_options))

    def key_extra(self) -> dict[str, Any]:
        """Fields a kind of case adds to its definition (declared in engine.keys.FIELDS)."""
        return {}

    def build_scenario(self, datasets, device: torch.device, data_root: Path | None = None, download: bool = False):
        """The scenario this case runs (hparam_selection.SelectionCase cuts it to its first tasks)."""
        return build_scenario(self.scenario, datasets, self.seed, device, data_root, download)


def case_key(case: Case, method_cls: type[Method]) -> str:
    """The record key: a content hash of the case's definition (library versions and the digest of
    the code that runs it included, engine.code_identity)."""
    return keys.record_key(case.definition(method_cls, versions()))


def base_key(case: Case, method_cls: type[Method]) -> str:
    """The key without the code digest: the same case whatever the code (``--clh-reuse-stale`` looks a
    record up by it; the family guard test pins it)."""
    return keys.base_key_of(case.definition(method_cls, versions()))


def _kind_file(kind: str) -> str | None:
    from .suites import kind_module
    try:
        return kind_module(kind).__file__
    except Exception:   # an unknown kind fails the suite's check elsewhere, with its own message
        return None


@functools.lru_cache(maxsize=1)
def versions() -> dict[str, str]:
    import torchvision
    return {"clharness": __version__, "torch": torch.__version__, "torchvision": torchvision.__version__,
            "numpy": np.__version__, "python": platform.python_version()}


def pick_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"--clh-device {name} asked for CUDA, but torch sees no CUDA device; "
                           "use --clh-device auto or cpu")
    return device


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)   # seeds every CUDA device too


@contextlib.contextmanager
def isolated_rng(device: torch.device | None = None):
    """Evaluation that leaves training's random streams as it found them (Python, NumPy, torch CPU and
    the device's): a result never depends on how often a protocol evaluates."""
    py, np_state = random.getstate(), np.random.get_state()
    devices = [device] if device is not None and device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            random.setstate(py)
            np.random.set_state(np_state)


def resolve_hparams(method_cls: type[Method], *overrides: dict[str, Any]) -> dict[str, Any]:
    merged = {k: v for table in overrides for k, v in table.items()}
    return resolve(f"method {method_cls.name!r}", method_cls.hparams, merged)


def run_case(case: Case, harness, device: torch.device, data_root: Path | None = None,
             download: bool = False, on_task: Callable[[int, int], None] | None = None,
             keep: Callable[[Method, Context], None] | None = None) -> RunRecord:
    """Run ``case`` and return its record; exceptions become statuses, never escape
    (except KeyboardInterrupt, so an interrupted session stops). ``keep(method, context)`` gets the
    trained method of a run that passed (``--clh-save-models``)."""
    method_cls = harness.methods[case.method]
    set_device(device)   # the key says the device type the run ran on (engine.keys)
    torch.set_num_threads(_CPU_THREADS)
    record = RunRecord(suite=case.suite, scenario=case.scenario.name, method=case.method, seed=case.seed,
                       setting=case.scenario.setting, hparams=dict(case.hparams), device=str(device),
                       cpu_threads=torch.get_num_threads(),
                       method_version=method_cls.version, versions=dict(versions()),
                       key=case_key(case, method_cls), base_key=base_key(case, method_cls),
                       code_digest=code_digest(method_cls, _kind_file(case.scenario.kind)),
                       git_commit=git_commit(method_cls), started_at=time.time())
    try:
        if case.scenario.setting_enum not in set(method_cls.settings):
            record.status = "not-applicable"
            record.message = (f"method {case.method!r} supports {sorted(str(s) for s in method_cls.settings)}, "
                              f"not {case.scenario.setting}")
            return record
        seed_everything(case.seed)
        try:
            scenario = case.build_scenario(harness.datasets, device, data_root, download)
        except Exception as exc:   # data problems are the harness's errors, not the method's
            record.status, record.message = "error", f"{type(exc).__name__}: {exc}"
            return record
        record.dataset = scenario.dataset
        record.weights = weights_identity(case.scenario.backbone, case.scenario.backbone_options)
        record.class_order = scenario.class_names
        _train_and_evaluate(case, method_cls, scenario, harness, device, record, on_task, keep)
    finally:
        record.finished_at = time.time()
    return record


def make_context(case: Case, scenario, harness, device: torch.device) -> Context:
    """What the method is told about this run (never test data, task ids only in task-IL).

    Everything in it is copied out of the scenario as plain values: the backbone factory is a
    partial over the registered backbone, the input shape and the suite's options, never a
    closure (a method can read a closure's cells, and the scenario holds every test split)."""
    spec = case.scenario
    input_shape = tuple(int(d) for d in scenario.input_shape)
    return Context(
        setting=scenario.setting, num_classes=scenario.num_classes, input_shape=input_shape,
        device=device, seed=case.seed, epochs=spec.epochs, batch_size=spec.batch_size,
        memory_size=spec.memory_size, amp=spec.amp and device.type == "cuda",
        first_task_train=copy.deepcopy(spec.first_task_train), memory_encoder=spec.memory_encoder,
        pretrained_encoder=pretrained_weights(spec.backbone, spec.backbone_options),
        backbone_factory=functools.partial(harness.backbones[spec.backbone], input_shape,
                                           **copy.deepcopy(spec.backbone_options)),
        task_classes=tuple(tuple(t.classes) for t in scenario.tasks) if scenario.setting is Setting.TASK_IL else ())


def _train_and_evaluate(case, method_cls, scenario, harness, device, record, on_task, keep=None):
    """Build the method and run the scenario's protocol on it: ``scenario.protocol`` where the
    kind defines one (online streams), else the task-by-task protocol below. A protocol fills
    ``record`` as it goes (so a failure keeps what was measured) and keeps ``record.failed_task``
    at the step it is on; the runner turns exceptions into statuses and measures memory."""
    try:   # a setup error (an unknown backbone, bad backbone options) is a record, not a raw traceback
        context = make_context(case, scenario, harness, device)
    except Exception as exc:
        record.status, record.message = "error", f"setting up the case failed: {type(exc).__name__}: {exc}"
        record.failed_task = None
        return
    protocol = getattr(scenario, "protocol", None) or task_protocol
    peak_memory.reset(device)   # process-wide peaks: this run's own from here (engine/peak_memory.py)
    method, record.failed_task = None, -1
    meter = flops.RunMeter()   # what the method computes, construction included (engine.flops)
    try:
        with meter:
            method = method_cls(context, **case.hparams)
            with flops.evaluating():   # one prediction: evaluation work, not training
                dry_predict(method, scenario, device, isolated_rng)   # the contract, before anything trains
            with _live_losses(harness, record):
                protocol(method, scenario, device, record, on_task)
        record.status = "passed"
    except Diverged as exc:
        record.status, record.message = "diverged", f"{case.method} diverged at task {record.failed_task}: {exc}"
    except WeightsMissing as exc:   # this machine lacks the suite's weights: a setup error, not the method's
        record.status, record.message = "error", f"{type(exc).__name__}: {exc}"
    except Exception as exc:
        where = f"task {record.failed_task}" if record.failed_task >= 0 else \
            "construction" if method is None else "the check before training"
        record.status = "failed"
        record.message = f"method {case.method!r} failed at {where}: {type(exc).__name__}: {exc}"
        if isinstance(exc, (MemoryError, torch.cuda.OutOfMemoryError)):
            record.message += "\n" + OOM_HINT
        if not isinstance(exc, MethodError):
            record.message += "\n" + "".join(traceback.format_exception(exc)[-6:])
    record.failed_task = None if record.status == "passed" else max(record.failed_task, 0)
    meter.stamp(record)
    if keep is not None and record.status == "passed":
        keep(method, context)
    if method is not None:
        report = method.memory_report()
        record.memory = dataclasses.asdict(report)
        record.memory_mb, record.parameters = report.mb, report.parameters
        record.memory_model_mb, record.memory_buffer_mb = report.model_mb, report.buffer_mb
        record.memory_other_mb = report.other_mb
    record.peak_rss_mb, record.peak_cuda_mb = peak_memory.read(device)


def task_protocol(method: Method, scenario: Scenario, device: torch.device, record: RunRecord,
                  on_task: Callable[[int, int], None] | None = None) -> None:
    """Offline tasks in order; after each, one row of R on every task's test data. A class-incremental
    run is also scored task-incrementally from the same predictions (its logits masked to each task's
    classes), with top-5 where there are 100 classes or more and the task x task confusion blocks."""
    T = len(scenario.tasks)
    R = np.full((T, T), np.nan)
    views = scenario.setting is Setting.CLASS_IL
    R_til, R_top5 = np.full((T, T), np.nan), np.full((T, T), np.nan)
    record.task_sizes = [len(t.test) for t in scenario.tasks]
    record.acc_matrix = R.tolist()
    every = scenario.spec.eval_every
    curve = None
    if every:
        from .continual_eval import ContinualEval
        curve = ContinualEval(method, scenario, device, every, scenario.spec.eval_samples, record.seed, accuracy,
                              isolated_rng)
    for task in range(T):
        record.failed_task = task
        experience = scenario.experience(task)
        experience.on_step = _step_hooks(curve.hook(task) if curve is not None else None,
                                         getattr(on_task, "step", None), _expected_steps(scenario, task, experience))
        if curve is not None:
            spent = curve.seconds
        t0 = time.perf_counter()
        method.learn(experience)
        method.consolidate()
        _sync(device)
        t1 = time.perf_counter()
        if curve is not None:
            t1 -= curve.seconds - spent          # scoring the curve is not training
            record.eval_seconds += curve.seconds - spent
            curve.score(task, boundary=True)
            record.extra["continual"] = curve.result()
        if views:
            rows = evaluate_views(method, scenario, device, task)
            R[task], R_til[task], R_top5[task] = rows["class_il"], rows["task_il"], rows["top5"]
            record.confusion.append(rows["confusion"])
        else:
            R[task] = evaluate(method, scenario, device, task)
        record.train_seconds += t1 - t0
        record.eval_seconds += time.perf_counter() - t1
        record.acc_matrix = R.tolist()
        if on_task:
            on_task(task, T)
    record.metrics = metrics.all_metrics(R, weights=record.task_sizes)
    if curve is not None:
        record.metrics.update(curve.metrics())
    record.metrics["final_old_acc"], record.metrics["final_new_acc"] = metrics.old_new_accuracy(R, record.task_sizes)
    if views:
        record.acc_matrix_task_il = R_til.tolist()
        record.metrics["final_acc_task_il"] = metrics.final_accuracy(R_til, record.task_sizes)
        record.metrics["recency_bias"] = metrics.recency_bias(record.confusion[-1])
        if scenario.num_classes >= 100:
            record.top5_matrix = R_top5.tolist()
            record.metrics["final_top5"] = metrics.final_accuracy(R_top5, record.task_sizes)


@contextlib.contextmanager
def _live_losses(harness, record):
    """Every Trainer step's loss to the plugins implementing ``clharness_training_loss`` (the loggers),
    while the run trains; nothing is read when none does."""
    wants = getattr(harness, "wants_training_loss", False)
    if not wants:
        yield
        return
    from ..toolkit.training import listen_to_losses
    step = [0]

    def listener(loss):
        step[0] += 1
        harness.training_loss(record, step[0], float(loss))
    with listen_to_losses(listener):
        yield


def _expected_steps(scenario, task: int, experience) -> int:
    """Iterations a standard loop takes on ``task`` (epochs x minibatches): the progress line's total."""
    spec = scenario.spec
    epochs = spec.first_task_train["epochs"] if task == 0 and spec.first_task_train else spec.epochs
    return epochs * -(-len(experience) // max(experience.batch_size, 1))


def _step_hooks(curve_hook, progress_step, expected: int):
    """One ``Experience.on_step`` for continual evaluation and the progress line (None: neither)."""
    if curve_hook is None and progress_step is None:
        return None
    count = [0]

    def on_step():
        count[0] += 1
        if curve_hook is not None:
            curve_hook()
        if progress_step is not None:
            progress_step(count[0], expected)
    return on_step


@torch.no_grad()
def evaluate(method: Method, scenario: Scenario, device: torch.device, after: int) -> np.ndarray:
    """One row of R: accuracy on every task's test data (future tasks too, for FWT)."""
    task_il = scenario.setting is Setting.TASK_IL
    row = np.empty(len(scenario.tasks))
    for j, task in enumerate(scenario.tasks):
        row[j] = accuracy(method, task.test, task.classes if task_il else None, scenario.num_classes, device,
                          f"task {after}", j if task_il else None, scenario.spec.eval_batch_size, f"task {j}'s test data")
    return row


@never_trains
@torch.no_grad()
def evaluate_views(method: Method, scenario: Scenario, device: torch.device, after: int) -> dict:
    """A class-incremental row of R and, from the same logits (``predict`` is called once per batch):
    the task-incremental row (logits masked to task j's classes), the top-5 row, and the confusion
    blocks (row j: task j's test samples, column k: how many were predicted as one of task k's classes;
    a class of no task counts in none)."""
    tasks, C = scenario.tasks, scenario.num_classes
    owner = torch.full((C,), -1, dtype=torch.long, device=device)
    for k, task in enumerate(tasks):
        owner[torch.tensor(task.classes, device=device)] = k
    T = len(tasks)
    out = {"class_il": np.empty(T), "task_il": np.empty(T), "top5": np.empty(T), "confusion": []}
    for j, task in enumerate(tasks):
        classes = torch.tensor(task.classes, device=device)
        hits = torch.zeros(3, dtype=torch.long, device=device)
        blocks = torch.zeros(T, dtype=torch.long, device=device)
        for x, y in task.test.batches(scenario.spec.eval_batch_size):
            logits = _checked_logits(method, x, None, C, f"task {after}", f"task {j}'s test data")
            pred = logits.argmax(1)
            hits[0] += (pred == y).sum()
            hits[1] += (classes[logits.index_select(1, classes).argmax(1)] == y).sum()
            hits[2] += (logits.topk(min(5, C), 1).indices == y[:, None]).any(1).sum()
            seen = owner[pred]
            blocks += torch.bincount(seen[seen >= 0], minlength=T)
        n = max(len(task.test), 1)
        out["class_il"][j], out["task_il"][j], out["top5"][j] = (hits.double() / n).tolist()
        out["confusion"].append(blocks.tolist())
    return out


def _checked_logits(method, x, task_id, num_classes, after, what):
    with flops.evaluating():   # every prediction the protocols score goes through here
        logits = method.predict(x, task_id=task_id)
    if not isinstance(logits, torch.Tensor) or logits.shape != (len(x), num_classes):
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise MethodError(f"predict() returned {shape} after {after}; expected logits of shape "
                          f"({len(x)}, {num_classes}) over the global class ids")
    if not torch.isfinite(logits).all():
        raise Diverged(f"predict() returned non-finite logits on {what} after {after}")
    return logits


@never_trains   # evaluation never changes the method (clharness.state_guard)
@torch.no_grad()
def accuracy(method: Method, data, classes, num_classes: int, device: torch.device, after,
             task_id: int | None = None, batch_size: int = 512, what: str = "test data") -> float:
    """Accuracy of ``method.predict`` on ``data``; with ``classes`` (task-incremental) only those
    logits compete. A wrong logits shape or a non-finite logit fails the case."""
    if classes is not None:
        classes = torch.tensor(classes, device=device)
    correct = torch.zeros((), dtype=torch.long, device=device)
    for x, y in data.batches(batch_size):
        logits = _checked_logits(method, x, task_id, num_classes, after, what)
        pred = classes[logits.index_select(1, classes).argmax(1)] if classes is not None else logits.argmax(1)
        correct += (pred == y).sum()
    return correct.item() / max(len(data), 1)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _EngineScoring:
    """The contract's ``kinds.Scoring``: what families' own protocols score with (STF's stream)."""
    accuracy = staticmethod(accuracy)
    isolated_rng = staticmethod(isolated_rng)
    sync = staticmethod(_sync)


kinds.install_scoring(_EngineScoring())
