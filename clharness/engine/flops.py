"""Machine-independent compute cost of a run (issue 41 item 1, first part).

FLOPs are counted with ``torch.utils.flop_counter.FlopCounterMode``, which sees aten ops with a
registered formula only (mm/addmm/bmm/convolution and their backward): elementwise ops, optimizer
updates, a QP (GEM), herding or an EMA update are NOT counted. The count is a count of ops on
shapes, so it is the same under any thread count, executor or device.

Counting every step under the mode is slow, so a run counts each distinct step *shape* once and
multiplies by how often that shape occurred (``StepLedger``); this is exact because the formula
depends on shapes only.
"""
from __future__ import annotations

from collections import Counter
from typing import Callable, Hashable

import torch
from torch.utils.flop_counter import FlopCounterMode


def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs of the aten ops that ``fn()`` runs, forward and (if it calls backward) backward."""
    with FlopCounterMode(display=False) as mode:
        fn()
    return int(mode.get_total_flops())


def train_step_flops(model: torch.nn.Module, loss_fn: Callable, x: torch.Tensor,
                     y: torch.Tensor) -> int:
    """FLOPs of one forward + backward of ``loss_fn(model(x), y)``; gradients are left cleared."""

    def step():
        loss_fn(model(x), y).backward()

    try:
        return count_flops(step)
    finally:
        model.zero_grad(set_to_none=True)


def eval_step_flops(model: torch.nn.Module, x: torch.Tensor) -> int:
    """FLOPs of one forward of ``model(x)`` without gradients."""
    with torch.no_grad():
        return count_flops(lambda: model(x))


class StepLedger:
    """Counts each distinct step shape once and multiplies by its occurrences.

    ``record(shape_key, measure)`` is called on every step; ``measure()`` (which returns the FLOPs
    of one such step) runs only the first time a key is seen.
    """

    def __init__(self) -> None:
        self._per_step: dict[Hashable, int] = {}
        self._occurrences: Counter = Counter()

    def record(self, shape_key: Hashable, measure: Callable[[], int]) -> None:
        if shape_key not in self._per_step:
            self._per_step[shape_key] = int(measure())
        self._occurrences[shape_key] += 1

    @property
    def total_flops(self) -> int:
        return sum(self._per_step[k] * n for k, n in self._occurrences.items())

    @property
    def gflops(self) -> float:
        return self.total_flops / 1e9
