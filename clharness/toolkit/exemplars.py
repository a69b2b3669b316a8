"""Herded exemplar memories and the rehearsal loop of the class-incremental learners that train a
network from scratch with a fixed exemplar budget (iCaRL, BiC, WA, PODNet; PyCIL models/base.py).

- ``herding``: iCaRL's exemplar selection (Rebuffi et al. 2017, Algorithm 4);
- ``ExemplarMemory``: ``memory_size`` exemplars split evenly over the classes seen so far
  (m = K / t, Algorithm 2), each class's list kept in herding order so that reducing it keeps
  its first m (Algorithm 5);
- ``rehearsal_batches``: epochs over the task's data and the exemplars, by default one shuffled
  loader over their union at the configured batch size (PyCIL's ``appendent``), so an epoch takes
  ceil((N + M) / B) optimizer steps (``rehearsal_steps``; ``RehearsalLabels`` gives learning-rate
  schedules that count);
- ``ExemplarLearner``: a ``SupervisedMethod`` that trains on the new task's data together with the
  memory (Algorithm 3's training set), keeps the previous model for distillation, rebuilds the
  memory and the class means of its exemplars after each task (Algorithm 2), and offers the
  nearest-mean-of-exemplars classifier (Algorithm 1).
"""
from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F

from ..hparams import Choice
from ..method import Context, Experience, MethodError
from .training import NEG, SupervisedMethod, TaskLabels, Trainer, optimizer_space


def herding(features: torch.Tensor, m: int) -> torch.Tensor:
    """Indices of ``m`` rows of ``features`` chosen by herding (iCaRL Algorithm 4): with phi the
    L2-normalised features and mu their mean, p_k = argmin_x || mu - (phi(x) + sum_{j<k} phi(p_j)) / k ||
    over the rows not chosen yet. The first k indices are the best k-subset found greedily, which
    is why reducing a class to its first m exemplars (Algorithm 5) keeps a good subset."""
    if features.dim() != 2:
        raise ValueError(f"herding needs a (N, D) feature matrix, got shape {tuple(features.shape)}")
    phi = F.normalize(features.detach().float(), dim=1)
    mu = phi.mean(0)
    m = min(int(m), len(phi))
    chosen: list[int] = []
    running = torch.zeros_like(mu)
    taken = torch.zeros(len(phi), dtype=torch.bool, device=phi.device)
    for k in range(1, m + 1):
        dist = (mu - (running + phi) / k).norm(dim=1).masked_fill(taken, math.inf)
        i = int(dist.argmin())
        chosen.append(i)
        taken[i] = True
        running += phi[i]
    return torch.tensor(chosen, dtype=torch.long, device=features.device)


class ExemplarMemory:
    """Exemplars per class, in herding order, within a total budget of ``capacity`` images."""

    def __init__(self, capacity: int):
        if capacity < 0:
            raise ValueError(f"exemplar memory capacity must be >= 0, got {capacity}")
        self.capacity = int(capacity)
        self.x: dict[int, torch.Tensor] = {}   # class -> its exemplars (normalised inputs)

    def __len__(self) -> int:
        return sum(len(v) for v in self.x.values())

    def per_class(self, num_classes: int) -> int:
        """m = K / t (iCaRL Algorithm 2; PyCIL ``memory_size // total_classes``)."""
        return self.capacity // max(num_classes, 1)

    def reduce(self, m: int) -> None:
        """Keep each class's first ``m`` exemplars (Algorithm 5)."""
        self.x = {c: v[:m] for c, v in self.x.items()}

    def add_class(self, c: int, x: torch.Tensor, features: torch.Tensor, m: int) -> None:
        """Choose ``m`` exemplars of class ``c`` from its samples ``x`` by herding on ``features``."""
        self.x[c] = x[herding(features, m)].detach().clone()

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All exemplars and their labels, classes in insertion order."""
        if not self.x:
            return torch.empty(0), torch.empty(0, dtype=torch.long)
        xs = list(self.x.values())
        ys = [torch.full((len(v),), c, dtype=torch.long, device=v.device) for c, v in self.x.items()]
        return torch.cat(xs), torch.cat(ys)

    def exemplar_images(self) -> tuple[int, int]:
        return len(self), sum(v.numel() for v in self.x.values())

    def __repr__(self) -> str:
        return f"ExemplarMemory(capacity={self.capacity}, size={len(self)}, classes={len(self.x)})"


REHEARSAL_MODES = ("joint", "balanced")


def rehearsal_steps(n_task: int, n_memory: int, batch_size: int, mode: str = "joint") -> int:
    """Optimizer steps in one epoch of ``rehearsal_batches``: ceil((N + M) / B) for ``joint`` (one
    loader over the union, PyCIL), ceil(N / B) for ``balanced`` (the task's batches, each joined by
    a share of the memory)."""
    if mode == "joint":
        return math.ceil((n_task + n_memory) / batch_size)
    if mode == "balanced":
        return math.ceil(n_task / batch_size)
    raise ValueError(f"unknown rehearsal mode {mode!r}; choose one of {REHEARSAL_MODES}")


def rehearsal_batches(experience: Experience, memory_x: torch.Tensor, memory_y: torch.Tensor,
                      epochs: int, generator: torch.Generator, mode: str = "joint"):
    """``epochs`` passes over the union of the task's N samples and the M exemplars (Algorithm 3's
    training set, PyCIL's ``appendent``), in one of two ways:

    - ``joint`` (default; PyCIL and the authors' code: one shuffled DataLoader over new data and
      exemplars at the configured batch size B): every epoch is a fresh uniform shuffle of the N + M
      samples cut into ceil((N + M) / B) batches of B (the last one shorter). The shuffle is drawn as
      a uniform choice of the N positions that hold task samples (``generator``), the task's
      samples in the order of its own shuffled stream (``experience.batches``, augmented there) and
      the exemplars in a fresh permutation (``generator``): together a uniform permutation of the union;
    - ``balanced``: the task's ceil(N / B) batches, each joined by the next ceil(M / batches per
      epoch) exemplars of a fresh permutation, so every exemplar is seen once per epoch in fewer,
      larger batches.

    Without exemplars both are the task's own batches. Exemplars pass through
    ``experience.augment`` when the experience has one (the task's batches arrive augmented)."""
    if mode not in REHEARSAL_MODES:
        raise ValueError(f"unknown rehearsal mode {mode!r}; choose one of {REHEARSAL_MODES}")
    if not len(memory_y):
        for x, y in experience.batches(epochs=epochs):
            yield x, y
        return
    if mode == "balanced":
        yield from _balanced_batches(experience, memory_x, memory_y, epochs, generator)
    else:
        yield from _joint_batches(experience, memory_x, memory_y, epochs, generator)


def _joint_batches(experience, memory_x, memory_y, epochs, generator):
    n, m, bs = len(experience), len(memory_y), experience.batch_size
    augment = getattr(experience, "augment", None)
    stream = iter(experience.batches(epochs=epochs))
    queue_x, queue_y = [], []          # task samples pulled from the stream, not used yet
    queued = 0

    def take(k):                       # the next k task samples of the stream, in its order
        nonlocal queued, queue_x, queue_y
        while queued < k:
            x, y = next(stream)
            queue_x.append(x)
            queue_y.append(y)
            queued += len(y)
        x, y = torch.cat(queue_x), torch.cat(queue_y)
        queue_x, queue_y, queued = [x[k:]], [y[k:]], queued - k
        return x[:k], y[:k]

    for _ in range(epochs):
        is_task = torch.randperm(n + m, generator=generator) < n     # which union positions hold task samples
        order = torch.randperm(m, generator=generator).to(memory_y.device)
        used = 0
        for start in range(0, n + m, bs):
            where = is_task[start:start + bs]
            k = int(where.sum())
            tx, ty = take(k)
            idx = order[used:used + len(where) - k]
            used += len(idx)
            mx = memory_x[idx]
            mx = augment(mx) if callable(augment) else mx
            where = where.to(ty.device)
            x = torch.empty((len(where), *tx.shape[1:]), dtype=tx.dtype, device=tx.device)
            y = torch.empty(len(where), dtype=ty.dtype, device=ty.device)
            x[where], y[where] = tx, ty
            x[~where], y[~where] = mx.to(device=tx.device, dtype=tx.dtype), memory_y[idx].to(ty.device)
            yield x, y


def _balanced_batches(experience, memory_x, memory_y, epochs, generator):
    per_epoch = math.ceil(len(experience) / experience.batch_size)
    share = math.ceil(len(memory_y) / per_epoch)
    augment = getattr(experience, "augment", None)
    order = None
    for i, (x, y) in enumerate(experience.batches(epochs=epochs)):
        step = i % per_epoch
        if step == 0:
            order = torch.randperm(len(memory_y), generator=generator).to(memory_y.device)
        idx = order[step * share:(step + 1) * share]
        if len(idx):
            mx = memory_x[idx]
            mx = augment(mx) if callable(augment) else mx
            x, y = torch.cat([x, mx.to(x.dtype)]), torch.cat([y, memory_y[idx]])
        yield x, y


class RehearsalLabels(TaskLabels):
    """``TaskLabels`` whose ``epoch_steps`` (what per-epoch learning-rate schedules count) is the
    step count of ``rehearsal_batches`` over the task and ``memory`` (read when the task is added,
    i.e. the exemplars of the previous tasks) in ``mode``."""

    def __init__(self, context: Context, memory: ExemplarMemory, mode: str = "joint"):
        super().__init__(context)
        rehearsal_steps(0, 0, 1, mode)            # validates the mode
        self.memory, self.mode = memory, mode

    def add(self, experience: Experience) -> None:
        super().add(experience)
        self.epoch_steps = rehearsal_steps(len(experience), len(self.memory), experience.batch_size, self.mode)


def rehearsal_space(default: str = "joint") -> dict:
    """The ``rehearsal`` hyperparameter of the methods that train through ``rehearsal_batches``."""
    return {"rehearsal": Choice(list(REHEARSAL_MODES), default=default)}


def tensor_batches(x: torch.Tensor, y: torch.Tensor, batch_size: int, epochs: int,
                   generator: torch.Generator, augment=None):
    """``epochs`` shuffled passes over in-memory ``(x, y)`` (a training set a method assembled
    itself, e.g. BiC's stage-1 split), each batch through ``augment`` when given."""
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=generator).to(y.device)
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            bx = x[idx]
            yield (augment(bx) if callable(augment) else bx), y[idx]


def first_task_schedule(context: Context) -> dict | None:
    """The suite's fixed first-task schedule (PyCIL's init_epoch/init_lr/init_milestones/...), if any."""
    spec = getattr(context, "first_task_train", None)
    if spec is None:
        return None
    missing = {"epochs", "lr"} - set(spec)
    if missing:
        raise MethodError(f"first_task_train is missing {sorted(missing)}; give epochs, lr, milestones, "
                          "lr_decay and weight_decay")
    return dict(spec)


class ExemplarLearner(SupervisedMethod):
    """Backbone + linear head over the global classes, trained on each task's data plus a herded
    exemplar memory; logits of classes not seen yet are excluded from the loss (PyCIL grows its head
    per task) and from predictions (a very low finite value). Subclasses write ``loss`` and may
    extend ``after_training`` (run before the memory is rebuilt)."""
    def __init__(self, context: Context, **hparams):
        super().__init__(context, **hparams)
        self.memory = ExemplarMemory(context.memory_size)
        self.labels = RehearsalLabels(context, self.memory, self.hp.get("rehearsal", "joint"))
        self.old_model = None
        self.known: list[int] = []   # classes seen before the current task ("old")
        self.seen_mask = torch.zeros(context.num_classes, dtype=torch.bool, device=context.device)
        self.class_means = None      # (num_classes, D) normalised exemplar means, for NME
        self.gen = torch.Generator().manual_seed(context.seed)

    # --- training -----------------------------------------------------------------------------
    def restrict(self, logits: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        """Logits over the classes seen so far (and, task-incremental, the sample's own task)."""
        logits = logits.masked_fill(~self.seen_mask, NEG)
        return logits if y is None else self.labels.mask(logits, y)

    def task_trainer(self, params=None, first: bool | None = None) -> tuple[Trainer, int]:
        """The optimizer for this task and its number of epochs: on the first task, the suite's
        fixed first-task training when it gives one (GTEP Table 3: init epochs, lr and weight decay;
        the configuration's scheduler kind, over the init epochs, with the init milestones and decay
        "only applied when 'StepLR' is selected"), the method's own optimizer hyperparameters
        otherwise."""
        first = (len(self.labels.tasks) == 1) if first is None else first
        spec = first_task_schedule(self.context) if first else None
        if spec is None:
            return Trainer.for_method(self, params), self.context.epochs
        hp = self.hp
        overrides = {"lr": spec["lr"], "scheduler": "constant"}
        if "weight_decay" in spec:
            overrides["weight_decay"] = spec["weight_decay"]
        trainer = Trainer.for_method(self, params, **overrides)
        kind, epochs = hp.get("scheduler", "constant"), int(spec["epochs"])
        if kind != "constant" and self.labels.epoch_steps:
            trainer.schedule(kind, epochs, self.labels.epoch_steps, lr_decay=spec.get("lr_decay", 0.1),
                             marks=sorted(spec.get("milestones", ())))
        return trainer, epochs

    def train_batches(self, experience: Experience, epochs: int):
        mx, my = self.memory.tensors()
        return rehearsal_batches(experience, mx, my, epochs, self.gen, self.hp.get("rehearsal", "joint"))

    def learn(self, experience: Experience) -> None:
        self.known = list(self.labels.seen)
        self.labels.add(experience)
        self.seen_mask[list(experience.classes)] = True
        trainer, epochs = self.task_trainer()
        self.fit(self.train_batches(experience, epochs), self.loss, trainer=trainer)
        self.after_training(experience)
        self.update_memory(experience)
        self.old_model = copy.deepcopy(self.model).eval().requires_grad_(False)

    def after_training(self, experience: Experience) -> None:
        """Hook between training and the memory update (WA aligns, BiC corrects the bias)."""

    def loss(self, x, y):
        return F.cross_entropy(self.restrict(self.model(x), y), y)

    # --- memory and class means (iCaRL Algorithms 2, 4, 5) --------------------------------------
    @torch.no_grad()
    def embed(self, x: torch.Tensor, batch: int = 512) -> torch.Tensor:
        return torch.cat([self.features(x[i:i + batch]) for i in range(0, len(x), batch)])

    def update_memory(self, experience: Experience) -> None:
        m = self.memory.per_class(len(self.labels.seen))
        self.memory.reduce(m)
        x, y = experience.tensors()
        for c in experience.classes:
            xc = x[y == c]
            if len(xc):
                self.memory.add_class(c, xc, self.embed(xc), m)
        self.update_class_means()

    @torch.no_grad()
    def update_class_means(self) -> None:
        """mu_y = mean of the normalised features of class y's exemplars, renormalised (Algorithm 1;
        PyCIL recomputes every class's mean with the current network after each task)."""
        means = None
        for c, xc in self.memory.x.items():
            if not len(xc):
                continue
            mean = F.normalize(self.embed(xc), dim=1).mean(0)
            if means is None:
                means = torch.zeros(self.context.num_classes, len(mean), device=mean.device)
            means[c] = F.normalize(mean, dim=0)
        self.class_means = means

    # --- prediction ---------------------------------------------------------------------------
    @torch.no_grad()
    def nme_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Nearest-mean-of-exemplars (Algorithm 1): y* = argmin_y ||phi(x) - mu_y||, as the logit
        -||phi(x) - mu_y||^2 of normalised features; classes without exemplars get a very low logit."""
        if self.class_means is None and not self.labels.seen:   # before the first task: no class has exemplars
            return torch.full((len(x), self.context.num_classes), NEG, device=x.device)
        if self.class_means is None:
            raise MethodError(f"method {self.name!r}: the nearest-mean classifier needs exemplars; "
                              "give the suite a memory_size > 0 or use classifier='cnn'")
        logits = -torch.cdist(F.normalize(self.features(x), dim=1), self.class_means).pow(2)
        has = torch.zeros_like(self.seen_mask)
        has[[c for c, v in self.memory.x.items() if len(v)]] = True
        return logits.masked_fill(~has, NEG)

    @torch.no_grad()
    def predict(self, x: torch.Tensor, task_id: int | None = None) -> torch.Tensor:
        if self.hp.get("classifier") == "nme":
            return self.nme_logits(x)
        return self.restrict(super().predict(x, task_id))


def incremental_space(**kw) -> dict:
    """PyCIL's optimizer for these methods: SGD with momentum 0.9, weight decay 2e-4, lr 0.1; and
    how the exemplars join the task's data (``rehearsal``, see ``rehearsal_batches``)."""
    return {**optimizer_space(**{"lr": 0.1, "momentum": 0.9, "weight_decay": 2e-4, **kw}), **rehearsal_space()}


def kd_loss(logits: torch.Tensor, old_logits: torch.Tensor, T: float) -> torch.Tensor:
    """Knowledge distillation (Hinton et al. 2015) as iCaRL/BiC/WA use it in PyCIL:
    -sum_k softmax(old/T)_k log softmax(new/T)_k, averaged over the batch."""
    target = F.softmax(old_logits.float() / T, dim=1)
    return -(target * F.log_softmax(logits.float() / T, dim=1)).sum(1).mean()
