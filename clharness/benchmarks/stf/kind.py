"""Scenario kind "stf": a dataset's train split as one online stream (simulated task-free, or the
conventional disjoint-task stream of the same data for comparison) and the online protocol.

Protocol (section 4.1 of the STF paper): the stream is cut into minibatches of ``stream_batch``
(10); the method sees one at a time through ``observe(batch)``, never task ids or boundaries.
Information retention (Cai et al. 2021: accuracy on the stream instances observed so far) is, as the
paper's Table 1 reports it, "averaged over the entire stream": with ``retention = "exact"`` (the
default) the method is scored after every minibatch on every instance observed so far, and
``info_retention`` is the mean of those accuracies over all steps (streaming: one running sum, the
model as it is at that step). ``eval_points`` evenly spaced steps of it are kept in the record for the
retention curve (and report progress). ``retention = "sampled"`` is the cheaper estimate of earlier
versions (and an option, not the paper's definition): only at the ``eval_points`` steps, on a seeded
sample of ``retention_samples`` past observations (0: all), averaged over those points. The exact
metric costs one evaluation per step over a growing prefix (about steps x n / 2 predictions; GDumb-like
methods also consolidate, i.e. retrain, before every one). After the whole stream ``final_acc`` is the
test-set accuracy.

Suite keys of this kind (flat in [[scenario]]): ``stream`` ("stf" | "disjoint"), ``mu_sigma``
(in (0, 0.5]; default sqrt(1/12)/tasks, appendix D), ``mu_sigma_scale`` (figure 3: 0.5/1/2/4),
``stream_batch``, ``eval_points``, ``retention``, ``retention_samples``, ``cpu_threads``, ``realtime`` and
``realtime_baseline`` (Ghunaim et al. 2023: a slow learner trains on fewer batches; realtime.py). ``tasks``
is the equivalent number of tasks for mu_sigma and the task count of the disjoint stream.
The permutations themselves (Algorithms 1-2, torch-free) live in ``streams.py`` beside this module.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from . import realtime, streams, trace
from ...data import DatasetSource, load_split
from ...method import Batch, Setting
from ...toolkit.training import listen_to_losses
from ...scenario_spec import ScenarioSpec, SuiteError
from ...kinds import ScenarioError, scoring
from ...data.subsets import normalization, on_device, per_class_index, relabel

OPTIONS = {
    "stream": (str, "stf"),                   # "stf": Algorithms 1-2; "disjoint": conventional tasks
    "mu_sigma": ((int, float), None),         # average class standard deviation; None: from tasks
    "mu_sigma_scale": ((int, float), 1.0),    # the difficulty knob of figure 3
    "stream_batch": (int, 10),                # section 4.1: stream batch size 10
    "eval_points": (int, 10),                 # points of the retention curve kept (and "sampled"'s points)
    "retention": (str, "exact"),              # "exact": every step, all past observations (the paper)
    "retention_samples": (int, 1000),         # "sampled": past observations scored per point (0: all)
    "cpu_threads": (int, 0),                  # torch threads while a CPU run streams; 0: torch's default
    "realtime": (bool, False),                # the stream does not wait for a slow learner (realtime.py)
    "realtime_baseline": (str, "finetune"),   # the step one batch interval lasts: "finetune" or "er"
}
STREAMS = ("stf", "disjoint")
RETENTIONS = ("exact", "sampled")
# added after records were stored: left out of keys at this value (the sampled estimate they hold)
LATER_OPTIONS = {"retention": "sampled", "realtime": False, "realtime_baseline": "finetune"}
# --clh-preset stf:<name> -> seeds. Table 1: "All entries are 95%-confidence intervals over 20 runs"
# (the scorecard's and the STF table's intervals are two-sided Student-t, metrics.mean_ci).
PRESETS = {"table1": 20}


def preset_seeds(presets: list[str], suite) -> int | None:
    """``--clh-preset stf:table1``: 20 seeds for a suite with stf scenarios (the paper's run count;
    the suites keep fewer by default, and their [quick] budgets per run stay as they are)."""
    names = [text.partition(":")[2] for text in presets if text.partition(":")[0] == "stf"]
    unknown = [n for n in names if n not in PRESETS]
    if unknown:
        raise SuiteError(f"--clh-preset stf:{unknown[0]}: no such STF preset; available: "
                         + ", ".join(f"stf:{n}" for n in PRESETS))
    if not names or not any(spec.kind == "stf" for spec in suite.scenarios):
        return None
    return max(PRESETS[n] for n in names)


def mu_sigma(spec: ScenarioSpec) -> float:
    """The scenario's average standard deviation: set directly, or sqrt(1/12)/T (appendix D), times
    the scale of figure 3."""
    opts = spec.options
    scale = opts["mu_sigma_scale"]
    if opts["mu_sigma"] is not None:
        return streams.check_mu_sigma(streams.check_mu_sigma(opts["mu_sigma"]) * scale)
    return streams.mu_sigma_for_tasks(spec.tasks, scale)


def check(spec: ScenarioSpec) -> None:
    opts = spec.options
    if spec.setting != Setting.ONLINE.value:
        raise ValueError(f"setting = {spec.setting!r}; an stf scenario is an online stream: use "
                         f"setting = \"online\"")
    unused = [k for k in ("first_task", "increment") if getattr(spec, k) is not None] + \
        (["validation"] if spec.validation else [])
    if unused:
        raise ValueError(f"{', '.join(unused)} do(es) not apply to an stf stream; use tasks = T (equivalent "
                         "tasks for mu_sigma and the disjoint stream's task count) and drop these keys")
    if spec.augment != "none":   # STF section 4: "We have not used any data augmentation"
        raise ValueError(f"augment = {spec.augment!r}: an stf stream trains without augmentation (the STF paper, "
                         "section 4, uses none); remove the augment key or set augment = \"none\"")
    if opts["stream"] not in STREAMS:
        raise ValueError(f"stream = {opts['stream']!r}; allowed values: {', '.join(STREAMS)}")
    if opts["mu_sigma"] is None and spec.tasks is None:
        raise ValueError("give mu_sigma = <value in (0, 0.5]> or tasks = T (mu_sigma = sqrt(1/12)/T, appendix D)")
    if opts["stream"] == "disjoint" and spec.tasks is None:
        raise ValueError("stream = \"disjoint\" needs tasks = T (the number of class-disjoint tasks)")
    if not opts["mu_sigma_scale"] > 0:
        raise ValueError(f"mu_sigma_scale = {opts['mu_sigma_scale']!r} must be > 0 (figure 3 uses 0.5, 1, 2, 4)")
    mu_sigma(spec)   # raises naming the value and the range (0, 0.5]
    for key in ("stream_batch", "eval_points"):
        if opts[key] < 1:
            raise ValueError(f"{key} = {opts[key]} must be >= 1")
    if opts["cpu_threads"] < 0:
        raise ValueError(f"cpu_threads = {opts['cpu_threads']} must be >= 0 (0: leave torch's thread count)")
    if opts["retention"] not in RETENTIONS:
        raise ValueError(f"retention = {opts['retention']!r}; allowed: 'exact' (every step, every past "
                         "observation: the paper's Av. IR) or 'sampled' (eval_points x retention_samples)")
    if opts["retention_samples"] < 0:
        raise ValueError(f"retention_samples = {opts['retention_samples']} must be >= 0 (0: every past observation)")
    if opts["realtime_baseline"] not in realtime.BASELINES:
        raise ValueError(f"realtime_baseline = {opts['realtime_baseline']!r}; allowed: "
                         f"{', '.join(map(repr, realtime.BASELINES))} (the step one stream batch interval lasts)")


@dataclass
class StreamScenario:
    spec: ScenarioSpec
    seed: int
    stream: object                   # TensorData/StreamData of the train split in stream order
    stream_labels: np.ndarray        # its labels (global ids), in stream order
    test: object                     # test split, kept by the runner side
    class_names: list[str]
    input_shape: tuple[int, int, int]
    dataset: str
    class_mu: np.ndarray | None = None       # Algorithm 1's means and standard deviations (stf streams)
    class_sigma: np.ndarray | None = None
    past: object = None                      # callable: n observed -> data of a sample of them
    description: dict | None = None          # trace.describe_stream: the report rebuilds the stream from it
    setting: Setting = Setting.ONLINE
    tasks: list = field(default_factory=list)   # no tasks: the method never sees any

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def eval_steps(self) -> list[int]:
        """Steps (minibatches observed) after which the method is scored on past observations."""
        steps = math.ceil(len(self.stream_labels) / self.spec.options["stream_batch"])
        points = min(self.spec.options["eval_points"], steps)
        return sorted({math.ceil(steps * k / points) for k in range(1, points + 1)})

    def protocol(self, method, scenario, device, record, on_task=None) -> None:
        threads = self.spec.options["cpu_threads"]
        if device.type != "cpu" or not threads:
            return online_protocol(method, self, device, record, on_task)
        # Ten-sample steps of small models: extra intra-op threads only wait on each other (and on
        # every other process of a shared CPU), so suites of small models ask for one.
        old = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            online_protocol(method, self, device, record, on_task)
        finally:
            torch.set_num_threads(old)


def online_protocol(method, scenario: StreamScenario, device: torch.device, record, on_task=None) -> None:
    """The stream in minibatches through ``observe``; information retention at the evaluation points,
    test accuracy at the end. ``record.failed_task`` is the stream step (minibatch) being processed.
    ``record.extra`` keeps the stream's description, the retention at each point and the mean
    training loss per window of the stream (trace.py; figures 2, 4 and 5 of the report section)."""
    accuracy = scoring().accuracy   # the engine's evaluation path, handed through the contract
    points = scenario.eval_steps()
    retention: list[float] = []
    record.metrics = {}
    record.extra = {"stream": scenario.description, "info_retention": retention,
                    "eval_at": [p / points[-1] for p in points]}
    losses = trace.LossWindows(points[-1])   # fig. 5: the training loss along the stream
    with listen_to_losses(losses):
        _stream(method, scenario, device, record, on_task, points, retention, losses)
    record.extra["train_loss"] = losses.means()
    t1 = time.perf_counter()
    record.metrics["final_acc"] = accuracy(method, scenario.test, None, scenario.num_classes, device,
                                           "the whole stream", None, scenario.spec.eval_batch_size, "test data")
    record.eval_seconds += time.perf_counter() - t1
    record.task_sizes = [len(scenario.test)]
    record.acc_matrix = []


def _stream(method, scenario: StreamScenario, device, record, on_task, points, retention, losses) -> None:
    """Observe the stream, scoring information retention at ``points``; ``losses`` learns each step."""
    score = scoring()   # the engine's evaluation path, handed through the contract
    accuracy, isolated_rng, _sync = score.accuracy, score.isolated_rng, score.sync
    opts, eval_bs = scenario.spec.options, scenario.spec.eval_batch_size
    exact = opts["retention"] == "exact"
    kept = set(points)
    total, scored = 0.0, 0                     # exact: running sum of the per-step retention
    batches = iter(scenario.stream.batches(opts["stream_batch"]))
    clock = realtime.RealTimeStream(opts["realtime_baseline"]) if opts["realtime"] else None
    t0 = time.perf_counter()
    for step in range(1, points[-1] + 1):
        record.failed_task = step - 1
        x, y = next(batches)
        losses.at(step)
        batch = Batch(_own_storage(x), _own_storage(y), None)
        if clock is None:
            method.observe(batch)
        else:   # realtime: the batch passes by unseen while the learner is still busy
            clock.offer(method, batch, step - 1)
        if exact or step in kept:
            with isolated_rng(device):   # how often retention is scored never moves the training's draws
                method.consolidate()
                _sync(device)
                t1 = time.perf_counter()
                record.train_seconds += t1 - t0
                seen = min(step * opts["stream_batch"], len(scenario.stream_labels))
                past = StreamPrefix(scenario.stream, seen) if exact else scenario.past(seen)
                value = accuracy(method, past, None, scenario.num_classes, device, f"stream step {step}", None,
                                 eval_bs, "past observations")
            if exact:
                total, scored = total + value, scored + 1
                record.metrics["info_retention"] = total / scored
            if step in kept:
                retention.append(value)
                if not exact:
                    record.metrics["info_retention"] = float(np.mean(retention))
                if on_task:   # progress in the stream's own unit: instances seen of the stream's length
                    on_task(seen - 1, len(scenario.stream_labels), "instances")
            t0 = time.perf_counter()
            record.eval_seconds += t0 - t1
    method.consolidate()
    _sync(device)
    record.train_seconds += time.perf_counter() - t0
    if clock is not None:
        record.extra["realtime"] = clock.summary()


class StreamPrefix:
    """The first ``n`` instances of the stream (in stream order), batched from the stream's own data:
    no copy per evaluation step."""

    def __init__(self, stream, n: int):
        self.stream, self.n = stream, n

    def __len__(self) -> int:
        return self.n

    def batches(self, batch_size: int):
        left = self.n
        for x, y in self.stream.batches(batch_size):
            if left <= 0:
                return
            if len(y) > left:
                x, y = x[:left], y[:left]
            left -= len(y)
            yield x, y


def _own_storage(t: torch.Tensor) -> torch.Tensor:
    """``t``, copied when it is a view into a larger storage: a minibatch sliced from the stream
    would otherwise reach every later instance (and its label) through ``untyped_storage()``."""
    return t.clone() if t.untyped_storage().nbytes() > t.numel() * t.element_size() else t


def build(spec: ScenarioSpec, source: DatasetSource, seed: int, device: torch.device,
          data_root: Path | None = None, download: bool = False) -> StreamScenario:
    train_ds = load_split(source, data_root, True, download)
    test_ds = load_split(source, data_root, False, download)
    counts = np.bincount(train_ds.labels.numpy(), minlength=len(train_ds.classes))
    if len(counts) < 2:
        raise ScenarioError(f"scenario {spec.name!r}: dataset {source.name!r} has {len(counts)} class; "
                            "a stream needs at least 2 classes")
    empty = np.flatnonzero(counts == 0)
    if len(empty):
        raise ScenarioError(f"scenario {spec.name!r}: class {train_ds.classes[empty[0]]!r} of dataset "
                            f"{source.name!r} has no train instances; a stream needs every class non-empty "
                            "(drop it with num_classes or fix the dataset)")
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(counts)) if spec.class_order == "seed" else np.arange(len(counts))
    if spec.num_classes is not None:
        if not 2 <= spec.num_classes <= len(order):
            raise ScenarioError(f"scenario {spec.name!r}: num_classes = {spec.num_classes}; dataset "
                                f"{source.name!r} has {len(order)} classes and a stream needs at least 2")
        order = order[:spec.num_classes]
    mapping = np.full(len(counts), -1)
    mapping[order] = np.arange(len(order))

    data_rng = np.random.default_rng([seed, 1])
    train_idx = np.concatenate(per_class_index(train_ds.labels, order, spec.max_train_per_class, data_rng))
    test_parts = per_class_index(test_ds.labels, order, spec.max_test_per_class, data_rng)
    for c, part in zip(order, test_parts):
        if len(part) == 0:
            raise ScenarioError(f"scenario {spec.name!r}: class {train_ds.classes[c]!r} of dataset "
                                f"{source.name!r} has no test images")
    labels = mapping[train_ds.labels.numpy()[train_idx]]
    if spec.options["stream_batch"] > len(labels):
        raise ScenarioError(f"scenario {spec.name!r}: stream_batch = {spec.options['stream_batch']} is larger "
                            f"than the stream ({len(labels)} instances); use 1 <= stream_batch <= {len(labels)}")
    stream_seed = [seed, 2]
    kind_of_stream = spec.options["stream"]
    spread = mu_sigma(spec) if kind_of_stream == "stf" else None
    try:
        perm, class_mu, class_sigma = trace.stream_order(labels, kind_of_stream, spread, spec.tasks, stream_seed,
                                                         len(order))
    except ValueError as exc:
        raise ScenarioError(f"scenario {spec.name!r}: {exc}") from None
    stream_idx = train_idx[perm]
    description = trace.describe_stream(labels[perm], kind_of_stream, spread, spec.tasks, stream_seed,
                                        spec.options["stream_batch"], len(order))

    mean, std = normalization(spec, train_ds)
    wrap = on_device(device, mean, std, tuple(spec.image_size) if spec.image_size else None, spec.channels)
    stream = wrap(relabel(train_ds, stream_idx, mapping))
    test = wrap(relabel(test_ds, np.concatenate(test_parts), mapping))
    past_rng = np.random.default_rng([seed, 3])
    limit = spec.options["retention_samples"]

    def past(n: int):
        """A seeded uniform sample (``retention_samples``) of the first n stream instances."""
        idx = np.arange(n) if not limit or n <= limit else np.sort(past_rng.choice(n, limit, replace=False))
        return wrap(relabel(train_ds, stream_idx[idx], mapping))

    return StreamScenario(spec, seed, stream, labels[perm], test, [train_ds.classes[c] for c in order],
                          stream.input_shape, source.identity(), class_mu, class_sigma, past, description)


def terminal_summary(clh, terminalreporter) -> None:
    """Table 1 of the session's STF runs at session end (report.py)."""
    from . import report
    report.terminal_summary(clh.records, terminalreporter)


def write_scorecard(path, records, harness) -> None:
    """Table 1 appended to a .md --clh-scorecard (report.py)."""
    from . import report
    report.write_scorecard(path, records)


def report_sections(records, fmt, harness) -> list[tuple[str, str]]:
    """``clharness report``: Table 1 of the STF paper per suite with STF runs (report.py)."""
    from . import report
    return report.text_sections(records, fmt)


def html_sections(records, harness, drawing) -> list[tuple[str, str]]:
    """The HTML report: Table 1, the runs' streams (figs. 2 and 4), information retention along the
    stream, ER's loss along the stream (fig. 5) (report.py)."""
    from . import report
    return report.html_sections(records, drawing)
