"""GTEP scenarios ("Hyperparameters in continual learning: a reality check", Sec. 3.2, Table 1-2):
the tuning dataset D^HT and the evaluation dataset D^E, generated with the same configuration.

A side (D^HT or D^E) is a dataset and a range of its classes: the dataset's classes are put in a
fixed order (a permutation drawn from ``split_seed``, the same for every trial and phase) and
``classes = [start, stop]`` takes a slice of it. Two slices of one dataset are disjoint when their
ranges are (CIFAR-50-1 = cifar100 [0, 50], CIFAR-50-2 = [50, 100]: high similarity); different
datasets give low similarity (CIFAR-50-1 -> ImageNet-50-2). Each trial then shuffles the class
order inside the slice by its seed (Alg. 2 line 8, Alg. 3 line 3: F(Shuffle(D))) and cuts it into
tasks by ``task_config``: "N-equal" (10 or 20 tasks) or "N-half" (half the classes first, then
N-1 equal tasks: the paper's 6 tasks). Splitting is the ``split`` family's ``build`` (through clharness.kinds.family).

The tuning phase scores on D^HT's validation split (``validation`` of each class's train data,
held out), never on its test split; the evaluation phase trains on all of D^E's train split and
scores on its test split. The protocol itself (items, selection, outputs) is protocol.py.
"""
from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import torch

from ...data import DatasetSource, load_split
from ...kinds import ScenarioError, family
from . import protocol as gtep
from . import phases, selection, summary

MULTI_DATASET = True   # build() gets the dataset registry: the two phases use different datasets

OPTIONS = {
    "tune_dataset": (str, ""),                 # D^HT: a registered dataset name
    "tune_dataset_options": (dict, {}),
    "tune_classes": (list, []),                # [start, stop) of the fixed class order; [] = all classes
    "eval_dataset": (str, ""),                 # D^E
    "eval_dataset_options": (dict, {}),
    "eval_classes": (list, []),
    "eval_spec": (dict, {}),                   # D^E's own architecture and input (EVAL_SPEC_KEYS), e.g. ResNet-18
                                               # at 224x224 for an ImageNet D^E of a CIFAR D^HT (sec. 5)
    "task_config": (str, "10-equal"),          # "10-equal", "20-equal", "6-half" (half, then 5 equal)
    "split_seed": (int, 0),                    # the fixed class order the slices are cut from
    "configurations": (int, 30),               # R: random configurations per method (Alg. 2)
    "trials": (int, 5),                        # S: trials (class orders) per configuration and phase
    "general": (str, "table4"),                # general search sets: "table4" (ResNet) or "table5" (ViT)
    "search": (dict, {}),                      # {"*" | method: {param: [values]}}: search sets
    "fixed": (dict, {}),                       # {param: value}: held fixed, not searched
    "spaces": (str, "paper"),                  # "paper": Tables 4-5's sets for the methods they cover
                                               # (spaces.py); "method": each method's declared space
    "selection": (str, "mean-of-hmeans"),      # Alg. 1's criterion: "mean-of-hmeans" (Alg. 2 line 10) or
                                               # "hmean-of-means" (protocol.SELECTION_RULES)
}
# what the evaluation phase may set apart from the tuning phase: the paper trains "ResNet-32 and
# ResNet-18 ... for the CIFAR and ImageNet datasets, respectively" (sec. 5), whichever phase they are
EVAL_SPEC_KEYS = ("backbone", "backbone_options", "image_size", "augment", "normalize", "channels")
TASK_CONFIG = re.compile(r"^(\d+)-(equal|half)$")


def check(spec) -> None:
    """Load-time checks (before any item is made): both datasets named, class ranges well formed
    and disjoint on the same dataset, a validation split for the tuning phase."""
    from ...hparams import GENERAL_TABLES
    o = spec.options
    for side in ("tune", "eval"):
        if not o[f"{side}_dataset"]:
            raise ValueError(f"{side}_dataset is missing; name the {'tuning (D^HT)' if side == 'tune' else 'evaluation (D^E)'}"
                             " dataset, e.g. {side}_dataset = \"cifar100\"".replace("{side}", side))
        _range(o[f"{side}_classes"], f"{side}_classes")
    if _same_dataset(o):
        a, b = _range(o["tune_classes"], "tune_classes"), _range(o["eval_classes"], "eval_classes")
        if a is None or b is None or max(a[0], b[0]) < min(a[1], b[1]):
            raise ValueError(f"tune_classes = {o['tune_classes']} and eval_classes = {o['eval_classes']} overlap on "
                             f"dataset {o['tune_dataset']!r}: the phases need disjoint classes (e.g. [0, 50] and [50, 100])")
    match = TASK_CONFIG.match(o["task_config"])
    if not match or int(match.group(1)) < (2 if match.group(2) == "half" else 1):
        raise ValueError(f"task_config = {o['task_config']!r}; write \"N-equal\" (N equal tasks, e.g. \"10-equal\") or "
                         "\"N-half\" (half the classes first, then N-1 equal tasks, e.g. \"6-half\")")
    for key in ("configurations", "trials"):
        if o[key] < 1:
            raise ValueError(f"{key} = {o[key]} must be at least 1")
    if o["selection"] not in selection.SELECTION_RULES:
        raise ValueError(f"selection = {o['selection']!r}; allowed: {', '.join(selection.SELECTION_RULES)} "
                         "(mean over trials of each trial's harmonic mean, or harmonic mean of the trial means)")
    from .spaces import SPACES
    unknown = sorted(set(o["eval_spec"]) - set(EVAL_SPEC_KEYS))
    if unknown:
        raise ValueError(f"eval_spec names {', '.join(unknown)}; it may set {', '.join(EVAL_SPEC_KEYS)} "
                         "(D^E's architecture and input; everything else is the tuning phase's)")
    if o["spaces"] not in SPACES:
        raise ValueError(f"spaces = {o['spaces']!r}; allowed: {', '.join(SPACES)} (the paper's Tables 4-5 or "
                         "each method's declared space)")
    if o["general"] not in GENERAL_TABLES:
        raise ValueError(f"general = {o['general']!r}; allowed: {', '.join(GENERAL_TABLES)}")
    if not 0 < spec.validation < 1:
        raise ValueError(f"validation = {spec.validation}: the tuning phase scores on D^HT's validation split; "
                         "set validation to a fraction in (0, 1), e.g. 0.1")
    for owner, table in o["search"].items():
        if not isinstance(table, dict):
            raise ValueError(f"search.{owner} = {table!r} must be a table of search sets, e.g. {{ lr = [0.05, 0.1] }}")
        for name, values in table.items():
            if not isinstance(values, list) or not values:
                raise ValueError(f"search.{owner}.{name} = {values!r} must be a non-empty list of values; "
                                 f"to hold {name} at one value use fixed = {{ {name} = ... }}")


def _same_dataset(o) -> bool:
    return (o["tune_dataset"], o["tune_dataset_options"]) == (o["eval_dataset"], o["eval_dataset_options"])


def _range(value, key) -> tuple[int, int] | None:
    if value == []:
        return None
    if (len(value) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            or not 0 <= value[0] < value[1]):
        raise ValueError(f"{key} = {value!r} must be [start, stop] with 0 <= start < stop (a range of the "
                         "dataset's fixed class order), or [] for all classes")
    return value[0], value[1]


def phase_side(spec) -> str:
    phase = spec.options.get("phase")
    if phase not in ("tune", "eval"):
        raise ScenarioError(f"scenario {spec.name!r}: a gtep scenario is built per phase by clharness.benchmarks.gtep.protocol "
                            "(its items), not as a plain case")
    return phase


def fixed_order(labels: torch.Tensor, split_seed: int) -> np.ndarray:
    """The dataset's class ids in the fixed order the slices are cut from (same in every trial)."""
    present = np.array(sorted(set(labels.unique().tolist())))
    return np.random.default_rng([split_seed, 6]).permutation(present)


def class_slice(source: DatasetSource, data_root, download, classes: list, split_seed: int) -> np.ndarray:
    """Original class ids of ``classes = [start, stop]`` of ``source``'s fixed order (sorted)."""
    order = fixed_order(load_split(source, data_root, True, download).labels, split_seed)
    if not classes:
        return np.sort(order)
    if classes[1] > len(order):
        raise ScenarioError(f"classes {classes} of dataset {source.name!r}: it has only {len(order)} classes")
    return np.sort(order[classes[0]:classes[1]])


class ClassSlice(DatasetSource):
    """A dataset restricted to some of its classes, relabelled 0..K-1 (in original id order)."""
    needs_root = False
    defaults = {"base": None, "base_options": (), "ids": (), "label": ""}

    def __init__(self, **options):
        super().__init__(**options)
        self.name = self.options["label"]

    def identity(self) -> str:
        return self.options["label"]

    def load(self, root, train, download=False):
        base_cls, base_name = self.options["base"]
        base = base_cls(**dict(self.options["base_options"]))
        base.name = base_name
        data = load_split(base, root, train, download)
        ids = np.array(self.options["ids"])
        mapping = np.full(max(int(data.labels.max()) + 1, int(ids.max()) + 1), -1)
        mapping[ids] = np.arange(len(ids))
        keep = torch.from_numpy(np.flatnonzero(mapping[data.labels.numpy()] >= 0))
        sub = data.subset(keep)
        sub.labels = torch.from_numpy(mapping[sub.labels.numpy()]).long()
        sub.classes = [data.classes[i] for i in ids]
        return sub


def _hashable(value):
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return value


def task_split(config: str, num_classes: int, name: str) -> dict:
    """``task_config`` as split keys: N equal tasks, or half the classes then N-1 equal tasks."""
    n, kind = TASK_CONFIG.match(config).groups()
    n = int(n)
    if kind == "equal":
        if num_classes % n:
            raise ScenarioError(f"scenario {name!r}: {num_classes} classes do not split into {n} equal tasks")
        return {"tasks": n, "first_task": None, "increment": None}
    first = num_classes // 2
    if (num_classes - first) % (n - 1):
        raise ScenarioError(f"scenario {name!r}: {num_classes} classes do not split as {first} first, then "
                            f"{n - 1} equal tasks")
    return {"tasks": None, "first_task": first, "increment": (num_classes - first) // (n - 1)}


def build(spec, datasets, seed: int, device: torch.device, data_root=None, download: bool = False):
    """One trial of one phase: the phase's dataset slice, classes shuffled by ``seed``, cut into
    the configured tasks; the tuning phase's tasks carry their validation split as test data."""
    phase = phase_side(spec)
    o = spec.options
    base = datasets[spec.dataset](**spec.dataset_options)
    base.name = spec.dataset
    ids = class_slice(base, data_root, download, o["classes"], o["split_seed"])
    where = f"[{o['classes'][0]}:{o['classes'][1]}]" if o["classes"] else ""
    source = ClassSlice(base=(type(base), spec.dataset), base_options=_hashable(spec.dataset_options),
                        ids=tuple(int(i) for i in ids), label=f"{base.identity()}{where}")
    split_spec = replace(spec, kind="split", class_order="seed", num_classes=None,
                         validation=spec.validation if phase == "tune" else 0.0,
                         **task_split(o["task_config"], len(ids), spec.name))
    # the split family builds it, reached through the contract as the engine reaches it
    scenario = family(split_spec.kind).build(split_spec, source, seed, device, data_root, download)
    if phase == "tune":   # Alg. 2 line 9: P^HT is measured on D^HT_val, never on its test split
        for task in scenario.tasks:
            if task.val is None or len(task.val) == 0:
                raise ScenarioError(f"scenario {spec.name!r}: classes {task.classes} have no validation images; "
                                    "raise validation or max_train_per_class")
            task.test, task.val = task.val, None
    scenario.extra["phase"] = phase
    return scenario


def collect(node, suite, spec, methods, seeds):
    """Tuning and evaluation items (protocol.py); S is the scenario's ``trials``, not --clh-seeds."""
    yield from gtep.collect(node, suite, spec, methods, seeds)


def terminal_summary(clh, terminalreporter) -> None:
    """The GTEP section at session end: tuning vs evaluation phase per method."""
    text = summary.section(clh.records, clh.harness)
    if text:
        terminalreporter.section("clharness GTEP: tuning phase (D^HT) vs evaluation phase (D^E), ranked by P^E")
        terminalreporter.write_line(text)


def write_scorecard(path, records, harness) -> None:
    """The GTEP section of a --clh-scorecard file."""
    summary.write_section(path, records, harness)


split_scenario = phases.split_scenario   # GTEP names its runs X:tune-cK / X:eval (scorecard pairs by X)


def report_sections(records, fmt, harness) -> list[tuple[str, str]]:
    """``clharness report``: the tuning-vs-evaluation table when the records hold GTEP runs."""
    if not any(map(phases.is_gtep, records)):
        return []
    text = summary.section(records, harness(), fmt=fmt)
    return [("GTEP: tuning phase (D^HT) vs evaluation phase (D^E), ranked by P^E", text)] if text else []


def html_sections(records, harness, drawing) -> list[tuple[str, str]]:
    """The HTML report: one row per method, Kendall tau, the tuned-vs-evaluated slope plot, and the
    per-configuration records collapsed (report_html)."""
    if not any(map(phases.is_gtep, records)):
        return []
    from . import report_html
    text = report_html.section(records, drawing, harness())
    return [(report_html.TITLE, text)] if text else []
