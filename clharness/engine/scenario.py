"""What the runner runs: a Scenario (a sequence of tasks of one seed) and ``build_scenario``, which asks
the spec's kind (``clharness.kinds``) to build it. The kinds themselves live in ``clharness.benchmarks``."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..kinds import ScenarioError, kind_module
from ..method import Experience, Setting
from .suites import ScenarioSpec


@dataclass
class Task:
    classes: tuple[int, ...]         # global ids (positions in the class order)
    train: object                    # TensorData / StreamData: handed to the method
    test: object                     # kept by the runner, never handed to the method
    val: object | None = None        # carved from train when the scenario asks for it


@dataclass
class Scenario:
    spec: ScenarioSpec
    seed: int
    setting: Setting
    tasks: list[Task]
    class_names: list[str]           # class_names[g] = name of global id g
    input_shape: tuple[int, int, int]
    dataset: str                     # identity of the dataset (name and options)
    extra: dict = field(default_factory=dict)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def experience(self, t: int) -> Experience:
        """What the method may see of task t: its train data and classes, the id only in task-IL."""
        task = self.tasks[t]
        return Experience(data=task.train, classes=task.classes,
                          task_id=t if self.setting is Setting.TASK_IL else None,
                          batch_size=self.spec.batch_size, seed=self.seed * 1000 + t)


def build_scenario(spec: ScenarioSpec, datasets, seed: int, device: torch.device,
                   data_root: Path | None = None, download: bool = False):
    """Build ``spec`` for one seed; ``datasets`` is the dataset registry. Kinds whose scenario is
    made of several datasets receive the registry itself (``build(spec, datasets, ...)``)."""
    module = kind_module(spec.kind)
    if getattr(module, "MULTI_DATASET", False):
        return module.build(spec, datasets, seed, device, data_root, download)
    source_cls = datasets[spec.dataset]
    source = source_cls(**spec.dataset_options)
    source.name = spec.dataset
    return module.build(spec, source, seed, device, data_root, download)
