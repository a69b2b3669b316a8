"""GMED, gradient-based memory editing (Jin et al. 2021, "Gradient-based editing of memory
examples for online task-free continual learning"): experience replay that, before replaying a
memory minibatch, edits its examples to be more "interfered": with theta' the parameters after a
virtual SGD step on the incoming minibatch, each memory example moves by gradient ascent on

    d(x_m) + beta * l(f_theta(x_m), y_m),   d(x_m) = l(f_theta'(x_m), y_m) - l(f_theta(x_m), y_m)

(the loss increase d of eq. 2 plus ``reg_strength`` beta times the memory example's own loss: the
editing objective, eq. 3, as the authors' code computes it, INK-USC/GMED ``ocl/ver_approx.py``
``edit_mem_interfere``: ``total_grad = grad_delta - reg_strength * grad_reg`` with
``grad_reg = -grad l``, i.e. + beta grad l), with stride
alpha * (1 - edit_decay)^(times edited); the edited examples are written back to the memory and
replayed with the incoming minibatch. Memory: reservoir sampling."""
import torch
import torch.nn.functional as F

import clharness as clh
from clharness.toolkit.buffers import ClassBalancedBuffer, ReservoirBuffer
from clharness.toolkit.training import OPTIMIZER_SPACE, Trainer
from clharness_methods.er import ER
from clharness_methods.mir import forward_with, virtual_step


class _TracksWrites:
    """A buffer that remembers which slots its last ``add`` overwrote."""
    written: list = []

    def _write(self, x, y, writes):
        self.written = list(writes)
        super()._write(x, y, writes)


class TrackedReservoir(_TracksWrites, ReservoirBuffer):
    pass


class TrackedClassBalanced(_TracksWrites, ClassBalancedBuffer):
    pass


class GMED(ER):
    name = "gmed"
    version = "2"   # 2: the edit ascends d + beta*loss (the authors' sign), not d - beta*loss
    settings = frozenset({clh.Setting.CLASS_IL, clh.Setting.TASK_IL, clh.Setting.ONLINE})
    hparams = {**OPTIMIZER_SPACE, "buffer": clh.Choice(["reservoir", "class-balanced"]),
               "edit_stride": clh.Float(1e-3, 100.0, default=1.0, log=True),     # alpha
               "reg_strength": clh.Float(0.0, 10.0, default=0.01),              # beta
               "edit_decay": clh.Float(0.0, 1.0, default=0.0)}                   # stride decay per edit

    def __init__(self, context, **hparams):
        super().__init__(context, **hparams)
        kind = TrackedClassBalanced if self.hp["buffer"] == "class-balanced" else TrackedReservoir
        self.buffer = kind(context.memory_size, seed=context.seed)
        self.edits = torch.zeros(context.memory_size)      # times each memory slot was edited

    def edit(self, x, y, mx, my, ages):
        """One gradient-ascent step on d(x_m) + beta l(x_m); returns the edited memory examples."""
        current = dict(self.model.named_parameters())
        virtual = virtual_step(self.model, self.cross_entropy(forward_with(self.model, current, x), y),
                               self.hp["lr"])
        mx = mx.detach().clone().requires_grad_(True)
        before = self.cross_entropy(forward_with(self.model, {k: v.detach() for k, v in current.items()}, mx), my)
        after = self.cross_entropy(forward_with(self.model, virtual, mx), my)
        grad, = torch.autograd.grad(after - before + self.hp["reg_strength"] * before, mx)
        stride = self.hp["edit_stride"] * (1 - self.hp["edit_decay"]) ** ages
        return (mx + stride.to(mx.dtype).view(-1, *[1] * (mx.dim() - 1)) * grad).detach()

    def gmed_loss(self, x, y):
        if len(self.buffer):
            idx = torch.randperm(len(self.buffer), generator=self.gen)[:len(y)]
            slots = idx.to(self.buffer.x.device)
            mx, my = self.buffer.x[slots], self.buffer.y[slots]
            mx = self.edit(x, y, mx, my, self.edits[idx].to(mx.device))
            self.buffer.x[slots] = mx.to(self.buffer.x.dtype)       # the edits persist in memory
            self.edits[idx] += 1
            x, y = torch.cat([x, mx]), torch.cat([y, my])
        return self.cross_entropy(self.model(x), y)

    def step(self, x, y):
        self.trainer = getattr(self, "trainer", None) or Trainer.for_method(self)
        self.model.train()
        self.trainer.step(self.gmed_loss, x, y)

    def observe(self, batch):
        self.step(batch.x, batch.y)
        self.trainer.check()
        self._store(batch.x, batch.y)

    def learn(self, experience):
        self.labels.add(experience)
        for x, y in experience.batches(epochs=self.context.epochs):
            self.step(x, y)
        self.trainer.check()
        for x, y in experience.batches(augment=False):   # the memory keeps raw views
            self._store(x, y)

    def _store(self, x, y):
        """Offer to the memory; slots that receive a new example start unedited."""
        self.buffer.written = []
        self.buffer.add(x, y)
        self.edits[self.buffer.written] = 0
