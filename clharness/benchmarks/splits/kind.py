"""Class- and task-incremental splits of one dataset.

Classes are ordered by the seed (or kept in dataset order), relabelled by their position in
that order (global ids 0..C-1, so task t owns a contiguous id range), and cut into tasks:
N equal tasks, or a first task of F classes followed by tasks of K classes.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ...toolkit import augment
from ...data import DatasetSource, load_split
from ...data.subsets import normalization, on_device, per_class_index, relabel
from ...method import Setting
from ...kinds import Scenario, ScenarioError, Task
from ...scenario_spec import ScenarioSpec


def task_sizes(spec: ScenarioSpec, num_classes: int) -> list[int]:
    """Classes per task, from ``tasks`` or ``first_task``/``increment``."""
    if spec.tasks is not None:
        if num_classes % spec.tasks:
            raise ScenarioError(f"scenario {spec.name!r}: {num_classes} classes do not split into "
                                f"{spec.tasks} equal tasks; use first_task/increment or num_classes")
        return [num_classes // spec.tasks] * spec.tasks
    first = spec.first_task or spec.increment
    rest = num_classes - first
    if rest < 0 or rest % spec.increment:
        raise ScenarioError(f"scenario {spec.name!r}: {num_classes} classes cannot be split as a first task of "
                            f"{first} then tasks of {spec.increment}")
    return [first] + [spec.increment] * (rest // spec.increment)


def build(spec: ScenarioSpec, source: DatasetSource, seed: int, device: torch.device,
          data_root: Path | None = None, download: bool = False) -> Scenario:
    train_ds = load_split(source, data_root, True, download)
    test_ds = load_split(source, data_root, False, download)
    present = sorted(set(train_ds.labels.unique().tolist()))
    if len(present) < 2:
        raise ScenarioError(f"scenario {spec.name!r}: dataset {source.name!r} has {len(present)} class(es) "
                            "in its train split; a continual-learning split needs at least 2")
    rng = np.random.default_rng(seed)
    order = rng.permutation(present) if spec.class_order == "seed" else np.array(present)
    if spec.num_classes is not None:
        if spec.num_classes > len(order):
            raise ScenarioError(f"scenario {spec.name!r}: num_classes = {spec.num_classes} but dataset "
                                f"{source.name!r} has {len(order)}")
        order = order[:spec.num_classes]
    sizes = task_sizes(spec, len(order))
    mapping = np.full(max(len(train_ds.classes), int(order.max()) + 1), -1)
    mapping[order] = np.arange(len(order))

    # One normalisation for all tasks and splits: the scenario's ``normalize`` (its train split's
    # statistics by default; the pretrained-model suites name their reference code's choice).
    mean, std = normalization(spec, train_ds)
    image_size = tuple(spec.image_size) if spec.image_size else None
    # the recipe rides on every split: its test-time view (if any) everywhere, its random training
    # views only where a method asks an Experience (train data); the runner never asks for them
    wrap = on_device(device, mean, std, image_size, spec.channels, augment.get(spec.augment))
    data_rng = np.random.default_rng([seed, 1])   # subsampling and validation draws, stable per seed

    tasks, start = [], 0
    for size in sizes:
        classes = order[start:start + size]
        train_parts, val_parts = [], []
        for idx in per_class_index(train_ds.labels, classes, spec.max_train_per_class, data_rng):
            n_val = int(round(len(idx) * spec.validation))
            perm = data_rng.permutation(idx)
            val_parts.append(np.sort(perm[:n_val]))
            train_parts.append(np.sort(perm[n_val:]))
        test_idx = per_class_index(test_ds.labels, classes, spec.max_test_per_class, data_rng)
        for c, part in zip(classes, test_idx):
            if len(part) == 0:
                raise ScenarioError(f"scenario {spec.name!r}: class {train_ds.classes[c]!r} of dataset "
                                    f"{source.name!r} has no test images")
        train = relabel(train_ds, np.concatenate(train_parts), mapping)
        test = relabel(test_ds, np.concatenate(test_idx), mapping)
        val = relabel(train_ds, np.concatenate(val_parts), mapping) if spec.validation else None
        tasks.append(Task(tuple(range(start, start + size)), wrap(train), wrap(test), val and wrap(val)))
        start += size

    shape = tasks[0].train.input_shape
    return Scenario(spec, seed, spec.setting_enum, tasks, [train_ds.classes[c] for c in order], shape,
                    source.identity())


