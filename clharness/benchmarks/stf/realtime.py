"""Real-time streams (issue 41 item 4): the STF option ``realtime = true``, Ghunaim et al., "Real-Time
Evaluation in Online Continual Learning: A New Hope" (CVPR 2023).

The stream does not wait for a slow learner. Time is counted in FLOPs, so the result does not depend
on the machine: one stream batch arrives per *baseline step*, and a method's training step on a batch
takes (its FLOPs / the baseline step's FLOPs) batch intervals; the batches that arrive while it trains
pass by unseen. Evaluation is unchanged (information retention over every instance the stream has
delivered, seen or not; the final test accuracy).

The baseline (``realtime_baseline``) is a fixed step, never another method of the session, so a record
does not depend on which methods run beside it:

* ``"finetune"`` (default): one plain SGD step, cross-entropy forward and backward of the run's own
  classifier (``context.backbone_factory()`` plus the linear head) on the stream batch: finetune's step.
* ``"er"``: the same step on the stream batch and an equal-size replay batch (2 x stream_batch): the
  paper's baseline, ER, whose relative complexity is 1 (ER has complexity 2 under ``"finetune"``).

The baseline step is counted once, on a copy built under a forked RNG (the run's draws do not move).
Each training step of the method is counted as it runs (``count_flops`` around ``observe``), so a cost
that changes along the stream (ER's first step, before its memory holds anything, costs what
finetune's does) moves the clock as it happens. FLOPs are those ``FlopCounterMode`` counts (matmul and
convolution, forward and backward), as in engine/flops.py.

Which batches a method trains on: batch i arrives at time i; a learner free at time t trains on the
batch that arrived last, floor(t), and is free again at max(t, i) + cost. For a constant relative cost
C >= 1 it trains on batches floor(j * C), j = 0, 1, 2, ...: every k-th batch for an integer C = k, and a
fraction 1/C of the batches otherwise. This is neither ceil(C) nor round(C): it is the authors' schedule
(Yasir-Ghunaim/RealtimeOCL, training/supervised/delay.py: delay = C - 1, LwF's C = 4/3 trains 3 batches
of every 4 (0, 1, 2), MIR's C = 2.5 trains 2 of every 5 (0, 2)). A step cheaper than the baseline cannot
run ahead of the stream: the learner waits for the next batch (every batch is trained on). Times are
exact fractions of integer FLOP counts, so no float rounding decides a batch.
"""
from __future__ import annotations

import math
from fractions import Fraction

import torch
import torch.nn.functional as F

from torch.utils._python_dispatch import _disable_current_modes
from torch.utils.flop_counter import FlopCounterMode

from ...method import Classifier

BASELINES = ("finetune", "er")


def count_flops(fn) -> int:
    """FLOPs of what ``fn()`` runs, as ``engine.flops.count_flops`` counts them (a family does not import
    the engine)."""
    with FlopCounterMode(display=False) as mode:
        fn()
    return int(mode.get_total_flops())


def baseline_step_flops(context, x: torch.Tensor, y: torch.Tensor, baseline: str) -> int:
    """FLOPs of the baseline step on a stream batch ``(x, y)`` (see the module docstring)."""
    if baseline not in BASELINES:
        raise ValueError(f"realtime_baseline = {baseline!r}; allowed: {', '.join(BASELINES)}")
    if baseline == "er":
        x, y = torch.cat([x, x]), torch.cat([y, y])
    # the protocol's own measuring, not the method's work: hidden from any counter around the run (the
    # runner's FLOP meter, engine/flops.RunMeter, would book it as training)
    with _disable_current_modes(), torch.random.fork_rng(devices=[]):   # the copy's init draws from the CPU RNG
        model = Classifier(context.backbone_factory(), context.num_classes)
        x, y = x.detach().cpu(), y.detach().cpu()
        return count_flops(lambda: F.cross_entropy(model(x), y).backward())


class RealTimeStream:
    """The stream's clock: ``offer(method, batch, i)`` for every batch i in order, which trains the
    method on it (returns True) or lets it pass unseen (False)."""

    def __init__(self, baseline: str):
        self.baseline = baseline
        self.baseline_flops = 0
        self.free_at = Fraction(0)      # when the learner finishes its current step, in batch intervals
        self.trained: list[int] = []    # the batches it trained on
        self.flops = 0                  # what its steps cost, summed
        self.offered = 0

    def takes(self, i: int) -> bool:
        """Whether batch ``i`` (arriving at time i) is the one the learner trains on next."""
        return math.floor(self.free_at) <= i

    def offer(self, method, batch, i: int) -> bool:
        self.offered += 1
        if not self.baseline_flops:
            self.baseline_flops = baseline_step_flops(method.context, batch.x, batch.y, self.baseline)
            if self.baseline_flops <= 0:
                raise ValueError(f"the {self.baseline} baseline step counts no FLOPs (no matmul or convolution "
                                 "in the backbone): realtime = true cannot time this stream; drop the option")
        if not self.takes(i):
            return False
        cost = count_flops(lambda: method.observe(batch))
        self.free_at = max(self.free_at, Fraction(i)) + Fraction(cost, self.baseline_flops)
        self.trained.append(i)
        self.flops += cost
        return True

    def summary(self) -> dict:
        """What the record keeps (``record.extra["realtime"]``)."""
        return {"baseline": self.baseline, "baseline_gflops": self.baseline_flops / 1e9,
                "batches": self.offered, "trained": len(self.trained),
                "mean_complexity": (self.flops / len(self.trained) / self.baseline_flops) if self.trained else 0.0}
