"""What every family's scenario builder does with a loaded dataset, in one public place (the families
import it; none reaches into another family's module): per-class subsets, relabelling to the global
class order, the input normalisation a scenario asks for, and the wrapper that puts a split on the
device (uint8 tensors in memory, or files streamed from disk)."""
from __future__ import annotations

import numpy as np
import torch

from ..kinds import ScenarioError
from .base import ArrayDataset, FileDataset, SplitRows, StreamData, TensorData


def per_class_index(labels: torch.Tensor, classes, limit: int | None, rng: np.random.Generator) -> list[np.ndarray]:
    """Indices of the given classes, at most ``limit`` per class (a seeded random subset)."""
    labels = labels.numpy()
    out = []
    for c in classes:
        idx = np.flatnonzero(labels == c)
        if limit is not None and len(idx) > limit:
            idx = np.sort(rng.choice(idx, limit, replace=False))
        out.append(idx)
    return out


def relabel(ds, index: np.ndarray, mapping: np.ndarray):
    """The rows ``index`` of ``ds`` with their labels mapped through ``mapping`` (dataset id -> global id)."""
    index = torch.from_numpy(index).long()
    # an in-memory split's rows are not copied here: TensorData on the CPU reads them from the loaded split
    sub = SplitRows(ds, index) if isinstance(ds, ArrayDataset) else ds.subset(index)
    sub.labels = torch.from_numpy(mapping[sub.labels.numpy()]).long()
    return sub


def normalization(spec, train_ds) -> tuple[list[float], list[float]]:
    """(mean, std) of a scenario's inputs: its ``normalize`` key, decided by
    clharness.toolkit.backbones.input_normalization (``train_ds``'s statistics for "dataset")."""
    from ..toolkit.backbones import input_normalization
    try:
        return input_normalization(spec.normalize, spec.backbone, spec.backbone_options, train_ds.channel_stats)
    except ValueError as exc:
        raise ScenarioError(f"scenario {spec.name!r}: {exc}") from None


def on_device(device, mean, std, image_size, channels, recipe=None):
    """``wrap(split)``: an in-memory split as TensorData (uint8 on ``device``, normalised per batch), a
    file-backed one as StreamData, both with the scenario's normalisation and augmentation recipe."""
    def wrap(ds: ArrayDataset | FileDataset):
        if isinstance(ds, FileDataset):
            if image_size:
                ds.image_size = image_size
            return StreamData(ds, mean, std, device, recipe=recipe)
        return TensorData(ds, mean, std, device, image_size=image_size, channels=channels, recipe=recipe)
    return wrap
