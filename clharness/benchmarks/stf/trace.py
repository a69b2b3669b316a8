"""What an STF run keeps of its stream for the family's report (``RunRecord.extra``, small):

- ``train_loss``: the mean training loss per window of the stream, ``LOSS_WINDOWS`` (200) equal
  windows of its minibatches (fewer when the stream has fewer steps): figure 5 of the STF paper
  plots ER's loss along the stream. Every method's loss is recorded, read from ``Trainer.step``
  (``clharness.toolkit.training.listen_to_losses``): the loss the method minimises at that step (ER: the
  cross-entropy over the stream batch and its replay batch). A window in which the method took no
  step (GDumb trains only when it is evaluated) holds NaN.
- ``info_retention`` and ``eval_at``: the information retention at each evaluation point and the
  fraction of the stream observed there (the run's ``info_retention`` metric is their mean).
- ``stream``: the stream's description (class counts, stream kind, mu_sigma, tasks, seed, and a
  digest of its label sequence), from which ``rebuild_stream`` regenerates the run's own label
  sequence for figures 2 and 4 with the same code that built it: C + 6 numbers instead of the
  stream's n labels.
"""
from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np
import torch

from . import streams

LOSS_WINDOWS = 200   # as many windows as figure 2's chunks; at most this many floats per run


def stream_order(labels: np.ndarray, stream: str, mu_sigma: float | None, tasks: int | None, seed,
                 num_classes: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """The permutation of a scenario's train labels (classes 0..C-1) into its stream: "stf" by
    Algorithms 1-2 (returns the class means and standard deviations too), "disjoint" by ``tasks``
    class-disjoint tasks in class-id order (ValueError naming the problem)."""
    if stream == "stf":
        return streams.stf_order(labels, mu_sigma, seed, num_classes)
    return streams.disjoint_order(labels, tasks, seed, class_order=np.arange(num_classes)), None, None


def digest(stream_labels: np.ndarray) -> str:
    """A short SHA-1 of the label sequence: the report checks a rebuilt stream against it."""
    return hashlib.sha1(np.asarray(stream_labels, dtype=np.int64).tobytes()).hexdigest()[:16]


def describe_stream(stream_labels: np.ndarray, stream: str, mu_sigma: float | None, tasks: int | None,
                    seed: list[int], stream_batch: int, num_classes: int) -> dict[str, Any]:
    counts = np.bincount(np.asarray(stream_labels), minlength=num_classes)
    return {"stream": stream, "class_counts": counts.tolist(), "mu_sigma": mu_sigma if stream == "stf" else None,
            "tasks": tasks, "seed": list(seed), "stream_batch": stream_batch, "digest": digest(stream_labels)}


def rebuild_stream(description: dict[str, Any]) -> np.ndarray:
    """The run's stream labels, regenerated from its description (the scenario's train labels are
    ``class_counts`` instances of each class in class order, as ``build`` lays them out). ValueError
    when the digest does not match (a stream built by another version of the generator)."""
    counts = np.asarray(description["class_counts"], dtype=np.int64)
    labels = np.repeat(np.arange(len(counts)), counts)
    perm = stream_order(labels, description["stream"], description["mu_sigma"], description["tasks"],
                        description["seed"], len(counts))[0]
    out = labels[perm]
    if digest(out) != description["digest"]:
        raise ValueError("the recorded stream cannot be rebuilt: its digest differs (recorded by another "
                         "version of the STF generator); rerun the case to redraw it")
    return out


class LossWindows:
    """Listener of ``Trainer.step`` losses: their mean per window of the stream's ``steps`` minibatches.
    ``at(step)`` (1-based) sets the window the following losses belong to. Sums stay on the loss's
    device (no synchronisation per step on CUDA); ``means()`` reads them once at the end."""

    def __init__(self, steps: int, windows: int = LOSS_WINDOWS):
        if steps < 1 or windows < 1:
            raise ValueError(f"steps = {steps} and windows = {windows} must be >= 1")
        self.steps, self.windows = steps, min(windows, steps)
        self.sums: list = [0.0] * self.windows
        self.counts = [0] * self.windows
        self.window = 0

    def at(self, step: int) -> None:
        self.window = (min(max(step, 1), self.steps) - 1) * self.windows // self.steps

    def __call__(self, loss: torch.Tensor) -> None:
        value = loss.item() if loss.device.type == "cpu" else loss.float()   # CPU: read already (the guard)
        self.sums[self.window] = self.sums[self.window] + value
        self.counts[self.window] += 1

    def means(self) -> list[float]:
        return [float(s) / n if n else math.nan for s, n in zip(self.sums, self.counts)]
