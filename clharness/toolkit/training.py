"""The training-loop building blocks of the reference methods (and of any author who wants them).

- ``make_optimizer`` and ``OPTIMIZER_SPACE``: the optimizer hyperparameters every method declares;
- ``Trainer``: one optimisation step (forward+loss under autocast, backward, step) with AMP
  (``torch.autocast`` float16 + ``GradScaler``) when the context allows it on CUDA, plain fp32
  otherwise, and a guard that turns a non-finite loss into ``clharness.Diverged`` (a MethodError);
- ``TaskLabels``: which logits compete for each label (all of them in class-incremental
  settings, the label's own task's classes in task-incremental ones);
- ``SupervisedMethod``: a Method with a backbone+linear classifier, a ``fit`` loop, and
  eval-mode ``predict``/``features``, so a reference method only writes its loss.

This is the hot path: the step does no more than a hand-written PyTorch loop, except a
finiteness check that costs no device synchronisation (checked every ``check_every`` steps on
CUDA, immediately on CPU where reading a scalar is free).
"""
from __future__ import annotations

import bisect
import contextlib
import math
from typing import Callable, Iterable

import torch
import torch.nn.functional as F

from ..hparams import Choice, Float, Int, milestones
from ..method import Context, Diverged, Experience, Method, Setting


def optimizer_space(lr: float = 0.1, optimizer: str = "sgd", momentum: float = 0.0,
                    weight_decay: float = 0.0) -> dict:
    """The optimizer hyperparameters every reference method declares, with its own defaults."""
    return {
        "optimizer": Choice(["sgd", "adam", "adamw"], default=optimizer),
        "lr": Float(1e-4, 1.0, default=lr, log=True),
        "momentum": Float(0.0, 0.99, default=momentum, when={"optimizer": ["sgd"]}),
        "weight_decay": Float(0.0, 1e-2, default=weight_decay),
        # Learning-rate schedule within each task, stepped per epoch (GTEP tunes it; constant keeps
        # the plain loop). StepLR's milestones follow the GTEP paper's rule (hparams.milestones).
        "scheduler": Choice(["constant", "steplr", "cosine"], default="constant"),
        "num_milestones": Int(1, 9, default=2, when={"scheduler": ["steplr"]}),
        "lr_decay": Float(0.0, 1.0, default=0.1, when={"scheduler": ["steplr"]}),
    }


OPTIMIZER_SPACE = optimizer_space()


def make_optimizer(params: Iterable, name: str = "sgd", lr: float = 0.1, momentum: float = 0.0,
                   weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """SGD (with momentum), Adam or AdamW over the parameters that require gradients."""
    params = [p for p in params if p.requires_grad]
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {name!r}; choose sgd, adam or adamw")


_loss_listeners: list[Callable[[torch.Tensor], None]] = []   # see listen_to_losses


@contextlib.contextmanager
def listen_to_losses(listener: Callable[[torch.Tensor], None]):
    """Within the block, ``listener(loss)`` receives the detached loss of every ``Trainer.step`` of
    this process (the STF protocol records the loss along the stream, its fig. 5). A listener only
    reads the loss: training is unchanged."""
    _loss_listeners.append(listener)
    try:
        yield listener
    finally:
        _loss_listeners.remove(listener)


class Trainer:
    """Runs optimisation steps for one method: ``trainer.step(loss_fn, *args)`` calls
    ``loss_fn(*args)`` under autocast when AMP is on, then backward and the optimizer step."""

    def __init__(self, method_name: str, optimizer: torch.optim.Optimizer, context: Context,
                 check_every: int = 50):
        self.name, self.optimizer = method_name, optimizer
        self.amp = bool(context.amp) and context.device.type == "cuda"
        self.device_type = context.device.type
        self.scaler = torch.amp.GradScaler("cuda") if self.amp else None
        self.check_every = check_every
        self.steps = 0
        self._loss_sum = None      # CUDA: running sum of losses, non-finite once any loss was
        self.scheduler, self.epoch_steps = None, 0   # see schedule()
        self.clip_grad = 0.0   # > 0: gradients clipped to this total norm before each step

    @classmethod
    def for_method(cls, method: Method, params: Iterable | None = None, **overrides) -> "Trainer":
        """A trainer with the optimizer named by the method's hyperparameters (``overrides`` win).
        On the method's first task with a suite ``first_task_train`` (GTEP Table 3), its lr, weight
        decay, epochs, StepLR milestones and decay replace the configuration's (momentum, optimizer
        and scheduler kind stay the configuration's; "milestones only applied when StepLR").
        A method's ``scale_lr`` hyperparameter (true) multiplies lr by batch_size / 256, the linear
        scaling rule of timm-based code (L2P, DualPrompt); ``clip_grad`` > 0 clips gradient norms."""
        first = first_task_train(method)
        if first:
            overrides = {"lr": first["lr"], "weight_decay": first["weight_decay"], **overrides}
        hp = {**method.hp, **overrides}
        params = method.model.parameters() if params is None else params
        lr = hp["lr"] * (method.context.batch_size / 256 if hp.get("scale_lr", False) else 1)
        opt = make_optimizer(params, hp.get("optimizer", "sgd"), lr, hp.get("momentum", 0.0),
                             hp.get("weight_decay", 0.0))
        trainer = cls(method.name, opt, method.context)
        trainer.clip_grad = hp.get("clip_grad", 0.0)
        epoch_steps = getattr(getattr(method, "labels", None), "epoch_steps", 0)
        if hp.get("scheduler", "constant") != "constant" and epoch_steps:
            if first:
                trainer.schedule(hp["scheduler"], first["epochs"], epoch_steps, lr_decay=first["lr_decay"],
                                 marks=first["milestones"])
            else:
                trainer.schedule(hp["scheduler"], method.context.epochs, epoch_steps,
                                 hp.get("num_milestones", 2), hp.get("lr_decay", 0.1))
        return trainer

    def schedule(self, kind: str, epochs: int, epoch_steps: int, num_milestones: int = 2,
                 lr_decay: float = 0.1, marks: list[int] | None = None) -> None:
        """Per-epoch learning-rate schedule over ``epochs`` epochs of ``epoch_steps`` steps:
        ``steplr``: lr * lr_decay^(milestones passed), milestones ``marks`` or by the GTEP rule;
        ``cosine``: lr * (1 + cos(pi e / epochs)) / 2 (CosineAnnealingLR, eta_min 0)."""
        if kind == "steplr":
            marks = list(marks) if marks is not None else milestones(epochs, num_milestones)
            factor = lambda e: lr_decay ** bisect.bisect_right(marks, e)   # noqa: E731
        elif kind == "cosine":
            factor = lambda e: 0.5 * (1 + math.cos(math.pi * min(e, epochs) / max(epochs, 1)))   # noqa: E731
        else:
            raise ValueError(f"unknown scheduler {kind!r}; choose constant, steplr or cosine")
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, factor)
        self.epoch_steps = epoch_steps

    def step(self, loss_fn: Callable[..., torch.Tensor], *args) -> torch.Tensor:
        """One step on ``loss_fn(*args)``; returns the (detached) loss."""
        opt = self.optimizer
        if self.amp:
            with torch.autocast("cuda", dtype=torch.float16):
                loss = loss_fn(*args)
            self._guard(loss)
            opt.zero_grad(set_to_none=True)
            self.scaler.scale(loss).backward()
            if self.clip_grad > 0:
                self.scaler.unscale_(opt)   # clip the true gradients
                self._clip()
            self.scaler.step(opt)
            self.scaler.update()
        else:
            loss = loss_fn(*args)
            self._guard(loss)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if self.clip_grad > 0:
                self._clip()
            opt.step()
        self.steps += 1
        if self.scheduler is not None and self.steps % self.epoch_steps == 0:
            self.scheduler.step()   # an epoch ended
        loss = loss.detach()
        for listener in _loss_listeners:
            listener(loss)
        return loss

    def _clip(self) -> None:
        params = [p for group in self.optimizer.param_groups for p in group["params"] if p.grad is not None]
        torch.nn.utils.clip_grad_norm_(params, self.clip_grad)

    def step_taken(self) -> bool:
        """Whether the last ``step`` moved the weights. Always without AMP. With AMP, GradScaler
        unscales the gradients in place inside ``scaler.step`` and skips the optimizer step when any
        of them is inf/NaN (then lowers the scale), so ``p.grad`` now holds the unscaled gradients
        and the step was taken iff they are all finite. Costs one device sync; call it only when
        needed (SI's path integral)."""
        if not self.amp:
            return True
        grads = [p.grad for group in self.optimizer.param_groups for p in group["params"] if p.grad is not None]
        return bool(torch.stack([torch.isfinite(g).all() for g in grads]).all()) if grads else True

    def _guard(self, loss: torch.Tensor) -> None:
        if self.device_type == "cpu":
            value = loss.item()   # free on CPU, and cheaper than an isfinite kernel
            if not math.isfinite(value):
                self._fail(value)
            return
        loss = loss.detach().float()
        self._loss_sum = loss if self._loss_sum is None else self._loss_sum + loss
        if (self.steps + 1) % self.check_every == 0:
            self.check()

    def check(self) -> None:
        """Raise now if any loss so far was non-finite (call after the last step)."""
        if self._loss_sum is not None and not torch.isfinite(self._loss_sum).item():
            self._fail(self._loss_sum.item())

    def _fail(self, value: float) -> None:
        raise Diverged(f"method {self.name!r}: non-finite loss ({value}) at or before training step "
                       f"{self.steps + 1}; try a lower learning rate")


def first_task_train(method: Method):
    """The suite's fixed first-task training (``Context.first_task_train``: epochs, lr, milestones,
    lr_decay, weight_decay) while ``method`` learns its first task, else None. GTEP (appendix A.1,
    Table 3) trains every method's first task with it and the sampled configuration from task 2."""
    first = getattr(method.context, "first_task_train", None)
    labels = getattr(method, "labels", None)
    return first if first and labels is not None and len(labels.tasks) == 1 else None


def anchored_penalty(model: torch.nn.Module, weights: dict[str, torch.Tensor],
                     anchor: dict[str, torch.Tensor]) -> torch.Tensor | float:
    """sum_i w_i (theta_i - theta*_i)^2 over the named parameters in ``weights``: the quadratic
    penalty of EWC (w = Fisher), SI (w = Omega) and MAS (w = Omega), each with its own scale."""
    params = dict(model.named_parameters())
    return sum((w * (params[k] - anchor[k]).pow(2)).sum() for k, w in weights.items())


def eval_mode(model: torch.nn.Module) -> torch.nn.Module:
    """``model.eval()``, skipped when no module of it is in training mode: the runner predicts
    batch by batch, and ``eval()`` walks and re-sets every module each time (a tenth of a small
    model's evaluation time). A module that overrides ``train`` to stay in training mode keeps
    being asked, as before."""
    if any(m.training for m in model.modules()):
        model.eval()
    return model


NEG = -1e4   # logit of a class that must not win (finite: the runner rejects non-finite logits)


class TaskLabels:
    """Which classes compete in the loss of each sample. Class-incremental: all of them.
    Task-incremental: the classes of the sample's own task (from ``context.task_classes`` or
    from the experiences seen), so replayed samples of old tasks are masked to their task."""

    def __init__(self, context: Context):
        self.task_il = context.setting is Setting.TASK_IL
        self.group = torch.full((context.num_classes,), -1, dtype=torch.long, device=context.device)
        for t, classes in enumerate(context.task_classes):
            self.group[list(classes)] = t
        self.seen: list[int] = []                  # classes of the experiences so far, in order
        self.tasks: list[tuple[int, ...]] = []     # their class tuples
        self.current = torch.zeros(context.num_classes, dtype=torch.bool, device=context.device)
        self.epoch_steps = 0   # steps in one epoch of the latest experience

    def add(self, experience: Experience) -> None:
        classes = tuple(experience.classes)
        self.tasks.append(classes)
        self.seen += [c for c in classes if c not in self.seen]
        self.current = torch.zeros_like(self.current)
        self.current[list(classes)] = True
        self.epoch_steps = math.ceil(len(experience) / experience.batch_size)   # for LR schedules
        if self.task_il and (self.group[list(classes)] < 0).any():
            self.group[list(classes)] = int(self.group.max()) + 1

    def mask(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``logits`` with the classes outside each sample's task set to a very low value."""
        if not self.task_il:
            return logits
        g = self.group[y]
        return logits.masked_fill(g[:, None] != self.group[None, :], NEG)

    def mask_current(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` with every class outside the current experience set to a very low value."""
        return logits.masked_fill(~self.current, NEG)


class SupervisedMethod(Method):
    """A backbone + linear head over the global classes, trained with ``fit``. Subclasses set
    ``name``, extend ``hparams`` (``{**OPTIMIZER_SPACE, ...}``) and write ``learn``/``loss``."""
    hparams = OPTIMIZER_SPACE

    def __init__(self, context: Context, **hparams):
        super().__init__(context, **hparams)
        self.model = context.make_classifier()
        self.labels = TaskLabels(context)

    def cross_entropy(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.labels.mask(logits, y), y)

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.cross_entropy(self.model(x), y)

    def fit(self, batches: Iterable, loss_fn: Callable | None = None, params: Iterable | None = None,
            trainer: Trainer | None = None) -> Trainer:
        """Train ``self.model`` on ``(x, y)`` batches with ``loss_fn(x, y)`` (default ``self.loss``)."""
        trainer = trainer or Trainer.for_method(self, params)
        loss_fn = loss_fn or self.loss
        self.model.train()
        for x, y in batches:
            trainer.step(loss_fn, x, y)
        trainer.check()
        return trainer

    def task_epochs(self) -> int:
        """Epochs for the task being learned: the suite's first-task budget on the first task
        (``first_task_train``), else ``context.epochs``."""
        first = first_task_train(self)
        return first["epochs"] if first else self.context.epochs

    def learn(self, experience: Experience) -> None:
        self.labels.add(experience)
        self.fit(experience.batches(epochs=self.task_epochs()))

    @torch.no_grad()
    def predict(self, x: torch.Tensor, task_id: int | None = None) -> torch.Tensor:
        eval_mode(self.model)
        with torch.autocast("cuda", dtype=torch.float16, enabled=self.context.amp and x.is_cuda):
            return self.model(x).float()

    @torch.no_grad()
    def features(self, x: torch.Tensor) -> torch.Tensor:
        eval_mode(self.model)
        with torch.autocast("cuda", dtype=torch.float16, enabled=self.context.amp and x.is_cuda):
            return self.model.features(x).float()
