"""Methods of tests/test_evaluation_guard.py (a helper module, not a test file): one that keeps the rule
"evaluation never changes the method", ones that break it, and ones whose predict breaks the contract."""
import random

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import clharness as clh


class Net(nn.Module):
    """Digits (1 x 8 x 8) -> 10 logits: one hidden layer with BatchNorm, then ``fc``."""

    def __init__(self, classes: int):
        super().__init__()
        self.hidden = nn.Linear(64, 16)
        self.bn = nn.BatchNorm1d(16)
        self.fc = nn.Linear(16, classes)

    def forward(self, x):
        return self.fc(F.relu(self.bn(self.hidden(x.flatten(1)))))


class Plain(clh.Method):
    """Trains with SGD in train mode, predicts in eval mode: a method that keeps the rule."""
    name = "guard-plain"
    learned = 0

    def __init__(self, context, **hp):
        super().__init__(context, **hp)
        self.model = Net(context.num_classes)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)

    def learn(self, experience):
        type(self).learned += 1
        self.model.train()
        for x, y in experience.batches(epochs=1):
            self.opt.zero_grad()
            F.cross_entropy(self.model(x), y).backward()
            self.opt.step()
        self.opt.zero_grad(set_to_none=False)   # gradients stay allocated (zeros): no change at evaluation

    def predict(self, x, task_id=None):
        self.model.eval()
        return self.model(x)


class EntropyMin(Plain):
    """Test-time adaptation: one SGD step minimising the entropy of its predictions on the batch it is
    asked about, once it has learned something (before that, it predicts plainly)."""
    name = "guard-entropy"

    def predict(self, x, task_id=None):
        if type(self).learned:
            with torch.enable_grad():
                self.model.eval()
                p = F.softmax(self.model(x), 1)
                entropy = -(p * p.clamp_min(1e-12).log()).sum(1).mean()
                self.opt.zero_grad()
                entropy.backward()
                self.opt.step()
        return super().predict(x, task_id)


class EntropyMinAlways(EntropyMin):
    name = "guard-entropy-always"

    def predict(self, x, task_id=None):
        type(self).learned = max(type(self).learned, 1)   # adapts from its very first call
        return super().predict(x, task_id)


class TrainModeBN(Plain):
    """Forgets to switch to eval mode: every prediction moves BatchNorm's running statistics."""
    name = "guard-bn"

    def __init__(self, context, **hp):
        super().__init__(context, **hp)
        self.model.eval()            # eval mode until it trains, so the check before training passes

    def predict(self, x, task_id=None):
        return self.model(x)


class WrongShape(Plain):
    name = "guard-shape"

    def predict(self, x, task_id=None):
        return super().predict(x, task_id)[:, :3]


class IntLogits(Plain):
    name = "guard-int"

    def predict(self, x, task_id=None):
        return super().predict(x, task_id).round().long()


class InfLogits(Plain):
    name = "guard-inf"

    def predict(self, x, task_id=None):
        out = super().predict(x, task_id).clone()
        out[0, 0] = float("inf")
        return out


class Drawer(Plain):
    """Draws from every global random stream in predict, and leaves its model in eval mode."""
    name = "guard-drawer"

    def predict(self, x, task_id=None):
        torch.rand(3), random.random(), np.random.rand()
        return super().predict(x, task_id)


class DefaultPredict(Plain):
    """Leaves its model in train mode after learning and predicts with the contract's default predict."""
    name = "guard-default"
    predict = clh.Method.predict


class Memory:
    """A plain object holding tensors, as a replay buffer does."""

    def __init__(self, x):
        self.x = x


METHODS = (Plain, EntropyMin, EntropyMinAlways, TrainModeBN, WrongShape, IntLogits, InfLogits, Drawer,
           DefaultPredict)


@clh.hookimpl
def clharness_add_methods(registry):
    for cls in METHODS:
        registry.add(cls)
