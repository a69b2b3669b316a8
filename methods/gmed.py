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
replayed with the incoming minibatch. The training loss is the reference's (``ocl/ver_approx.py``
``observe``): the incoming minibatch's mean cross-entropy plus the replayed minibatch's mean
cross-entropy, a sum of two means (not one mean over the concatenated batch, which halves it).
Memory: reservoir sampling; each incoming batch (raw views) is offered after its step, in offline
tasks too (the reference's ``observe``), so replay during a task already holds that task.

Defaults alpha = 0.1 and beta = 0.01: the authors' documented run command (INK-USC/GMED README:
``stride=0.1 # editing stride (alpha)``, ``reg=0.01 # reg strength (beta)``); the code's fallbacks
when a config sets none are 10 and 0.1."""
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
    version = "3"   # 2: the edit ascends d + beta*loss (the authors' sign), not d - beta*loss;
    # 3: loss = mean CE(incoming) + mean CE(replayed), alpha default 0.1, memory offered after every
    # step in offline tasks too (issue 28)
    paper = ("Jin, Sadhu, Du & Ren, Gradient-based Editing of Memory Examples for Online Task-free "
             "Continual Learning, NeurIPS 2021")
    reference = "INK-USC/GMED: ocl/ver_approx.py"
    deviations = (
        "the virtual step theta' is a plain SGD step with the method's lr (the reference steps its "
        "optimizer without updating its state: the same for SGD without momentum)",
    )
    settings = frozenset({clh.Setting.CLASS_IL, clh.Setting.TASK_IL, clh.Setting.ONLINE})
    hparams = {**OPTIMIZER_SPACE, "buffer": clh.Choice(["reservoir", "class-balanced"]),
               "edit_stride": clh.Float(1e-3, 100.0, default=0.1, log=True),     # alpha
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

    def gmed_loss(self, x, y, view=None):
        if view is not None:          # the suite's augmentation: a training view of the raw incoming batch
            x = view(x)
        if len(self.buffer):
            idx = torch.randperm(len(self.buffer), generator=self.gen)[:len(y)]
            slots = idx.to(self.buffer.x.device)
            mx, my = self.buffer.x[slots], self.buffer.y[slots]
            mx = self.edit(x, y, mx, my, self.edits[idx].to(mx.device))
            self.buffer.x[slots] = mx.to(self.buffer.x.dtype)       # the edits persist in memory
            self.edits[idx] += 1
            # the reference: loss_tmp[:B].mean() + loss_tmp[B:].mean() over one forward of [x; x_m]
            logits = self.model(torch.cat([x, mx]))
            return self.cross_entropy(logits[:len(y)], y) + self.cross_entropy(logits[len(y):], my)
        return self.cross_entropy(self.model(x), y)

    def step(self, x, y, view=None):
        self.trainer = getattr(self, "trainer", None) or Trainer.for_method(self)
        self.model.train()
        self.trainer.step(self.gmed_loss, x, y, view)

    def observe(self, batch):
        self.step(batch.x, batch.y)
        self.trainer.check()
        self._store(batch.x, batch.y)

    def learn(self, experience):
        self.labels.add(experience)
        view = experience.augment if experience.augmenting else None
        for x, y in experience.batches(epochs=self.context.epochs, augment=False):   # raw views
            self.step(x, y, view)
            self._store(x, y)   # each incoming batch after its step, as the reference's observe()
        self.trainer.check()

    def _store(self, x, y):
        """Offer to the memory; slots that receive a new example start unedited."""
        self.buffer.written = []
        self.buffer.add(x, y)
        self.edits[self.buffer.written] = 0
