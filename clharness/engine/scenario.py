"""``build_scenario``: the spec's family (``clharness.kinds``) builds the Scenario (a sequence of tasks of one
seed, defined in the family contract) that the runner runs. The families live in ``clharness.benchmarks``."""
from __future__ import annotations

from pathlib import Path

import torch

from ..kinds import Scenario, ScenarioError, Task, family   # noqa: F401  (Scenario, Task: the engine's names too)
from .suites import ScenarioSpec


def build_scenario(spec: ScenarioSpec, datasets, seed: int, device: torch.device,
                   data_root: Path | None = None, download: bool = False):
    """Build ``spec`` for one seed; ``datasets`` is the dataset registry. Kinds whose scenario is
    made of several datasets receive the registry itself (``build(spec, datasets, ...)``)."""
    fam = family(spec.kind)
    if fam.MULTI_DATASET:
        return fam.build(spec, datasets, seed, device, data_root, download)
    source_cls = datasets[spec.dataset]
    source = source_cls(**spec.dataset_options)
    source.name = spec.dataset
    return fam.build(spec, source, seed, device, data_root, download)
