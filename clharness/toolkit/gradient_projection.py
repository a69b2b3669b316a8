"""Gradient projection of the episodic-memory methods GEM (Lopez-Paz & Ranzato 2017) and A-GEM
(Chaudhry et al. 2019): per-task memories, flat gradients, and the two projection rules; and the
representation subspace that GPM/PGP project gradients out of (``FeatureSubspace``)."""
from __future__ import annotations

import abc

import numpy as np
import torch

from ..hparams import Int
from ..method import Diverged
from .training import SupervisedMethod, make_optimizer, optimizer_space


class TaskMemory:
    """``per_task`` random training samples of every finished task (normalised inputs, global labels)."""

    def __init__(self, per_task: int, seed: int = 0):
        self.per_task = per_task
        self.gen = torch.Generator().manual_seed(seed)
        self.tasks: list[tuple[torch.Tensor, torch.Tensor]] = []

    def add(self, experience) -> None:
        # the first shuffled batch of size per_task is a uniform random subset of the task (raw views)
        for batch in experience.batches(batch_size=self.per_task, shuffle=True, generator=self.gen, augment=False):
            self.tasks.append((batch.x.detach().clone(), batch.y.clone()))
            return

    def __len__(self) -> int:
        return len(self.tasks)

    def sample(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``min(n, stored)`` samples drawn uniformly from all tasks' memories (A-GEM's reference batch)."""
        x = torch.cat([t[0] for t in self.tasks])
        y = torch.cat([t[1] for t in self.tasks])
        if len(y) > n:
            idx = torch.randperm(len(y), generator=self.gen)[:n].to(y.device)
            x, y = x[idx], y[idx]
        return x, y

    def exemplar_images(self) -> tuple[int, int]:
        n = sum(len(t[1]) for t in self.tasks)
        per = int(np.prod(self.tasks[0][0].shape[1:])) if self.tasks else 0
        return n, n * per


class RingMemory(TaskMemory):
    """A-GEM's episodic memory as its authors' code writes it (facebookresearch/agem
    ``conv_split_cifar.py:430-438``): ``per_class`` slots per class, each trained batch written in as it
    is seen, a class's sample into its next slot in turn (a ring: the oldest is overwritten), so a task
    leaves the last ``per_class`` samples of each class it trained on. What a task wrote is read from
    the next task on (``add`` closes it, as the code's ``episodic_filled_counter`` grows after the task).
    Slots a class never filled are left out (the code keeps them as zero images with zero labels)."""

    def __init__(self, per_class: int, seed: int = 0):
        super().__init__(per_class, seed)
        self.slots: dict[int, torch.Tensor] = {}    # the current task's classes: (per_class, ...) inputs
        self.written: dict[int, int] = {}           # samples written per class so far

    def write(self, x: torch.Tensor, y: torch.Tensor) -> None:
        m = self.per_task
        for c in y.unique().tolist():
            rows = x[y == c]
            count = self.written.get(c, 0)
            if c not in self.slots:
                self.slots[c] = torch.zeros(m, *x.shape[1:], dtype=x.dtype, device=x.device)
            pos = (count + torch.arange(len(rows), device=x.device)) % m
            keep = slice(max(0, len(rows) - m), None)          # a batch longer than the ring: its last m
            self.slots[c][pos[keep]] = rows[keep].detach()
            self.written[c] = count + len(rows)

    def add(self, experience) -> None:
        if self.slots:
            classes = sorted(self.slots)
            xs = [self.slots[c][:min(self.written[c], self.per_task)] for c in classes]
            ys = [torch.full((len(x),), c, dtype=torch.long, device=x.device) for c, x in zip(classes, xs)]
            self.tasks.append((torch.cat(xs), torch.cat(ys)))
        self.slots, self.written = {}, {}


def flat_grad(params) -> torch.Tensor:
    """All parameters' gradients as one vector (zeros where a parameter got none)."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])


def set_flat_grad(params, vector: torch.Tensor) -> None:
    start = 0
    for p in params:
        n = p.numel()
        p.grad = vector[start:start + n].view_as(p).to(p.dtype).clone()
        start += n


def agem_project(g: torch.Tensor, g_ref: torch.Tensor) -> torch.Tensor:
    """A-GEM, Chaudhry et al. 2019, eq. 11: if g . g_ref < 0, g~ = g - (g . g_ref / g_ref . g_ref) g_ref,
    else g unchanged; the result never has a negative dot product with g_ref."""
    dot = torch.dot(g, g_ref)
    if dot >= 0:
        return g
    return g - dot / torch.dot(g_ref, g_ref).clamp_min(1e-12) * g_ref


def gem_project(g: torch.Tensor, G: torch.Tensor, margin: float = 0.5, eps: float = 1e-3) -> torch.Tensor:
    """GEM, Lopez-Paz & Ranzato 2017, eqs. 10-13: the closest vector to g with G z >= 0 (G: one memory
    gradient per past task, as rows), via the dual QP min_v 1/2 v'(G G')v + (G g)'v s.t. v >= margin
    (the "memory strength" margin and the eps ridge of the authors' code), then z = G'v + g.
    The dual is solved as a non-negative least-squares problem (scipy.optimize.nnls) after v = u + margin
    and a Cholesky factor P = L L' of P = G G' + eps I: 1/2 u'Pu + c'u = 1/2 ||L'u + L^-1 c||^2 + const."""
    if G.numel() == 0 or bool((G @ g >= 0).all()):
        return g
    Gd, gd = G.double().cpu().numpy(), g.double().cpu().numpy()
    t = Gd.shape[0]
    P = Gd @ Gd.T
    P = 0.5 * (P + P.T) + eps * np.eye(t)
    m = np.full(t, float(margin))
    c = P @ m + Gd @ gd
    L = np.linalg.cholesky(P)
    import scipy.linalg, scipy.optimize   # here: importing the method registry needs no scipy
    u, _ = scipy.optimize.nnls(L.T, -scipy.linalg.solve_triangular(L, c, lower=True))
    v = u + m
    return torch.from_numpy(Gd.T @ v + gd).to(g.dtype).to(g.device)


class GradientEpisodicMethod(SupervisedMethod, abc.ABC):
    """The training loop GEM and A-GEM share: per step, gradients on the episodic memory
    (``reference_gradients``), then the current gradient, ``project``-ed against them before the
    optimizer step. Runs in fp32: the projection reads unscaled gradients."""
    # why seeds cannot train as one batched model (engine.ensemble names it when these run solo)
    ensemble_obstacle = (
        "GEM and A-GEM project each step's gradient against reference gradients of the memory (a QP per step, "
        "or one dot product) between backward() and the optimizer step; the batched step has one loss per member "
        "and steps right after its backward, so a per-member rewrite of the gradient cannot be expressed")
    hparams = {**optimizer_space(lr=0.01, momentum=0.9), "patterns_per_task": Int(1, 10000, default=256)}
    writes_during_training = False   # True: each trained batch's raw view goes to ``memory.write`` (RingMemory)

    def __init__(self, context, **hparams):
        super().__init__(context, **hparams)
        self.memory = self.make_memory()

    def make_memory(self) -> TaskMemory:
        return TaskMemory(self.hp["patterns_per_task"], seed=self.context.seed)

    @abc.abstractmethod
    def memory_batches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The memory batches whose gradients constrain the step."""

    @abc.abstractmethod
    def project(self, g: torch.Tensor, references: torch.Tensor) -> torch.Tensor:
        """The gradient to step along, given the current one and the reference gradients (rows)."""

    def learn(self, experience):
        self.labels.add(experience)
        params = [p for p in self.model.parameters() if p.requires_grad]
        opt = make_optimizer(params, self.hp["optimizer"], self.hp["lr"], self.hp.get("momentum", 0.0),
                             self.hp["weight_decay"])
        self.model.train()
        raw = self.writes_during_training and experience.augmenting   # the memory keeps raw views
        for x, y in experience.batches(epochs=self.context.epochs, augment=not raw):
            seen = x
            if raw:
                x = experience.augment(x)
            references = []
            for mx, my in (self.memory_batches() if len(self.memory) else []):
                opt.zero_grad(set_to_none=True)
                self.cross_entropy(self.model(mx), my).backward()
                references.append(flat_grad(params))
            opt.zero_grad(set_to_none=True)
            loss = self.cross_entropy(self.model(x), y)
            if not torch.isfinite(loss):
                raise Diverged(f"method {self.name!r}: non-finite loss ({loss.item()}); try a lower learning rate")
            loss.backward()
            if references:
                set_flat_grad(params, self.project(flat_grad(params), torch.stack(references)))
            opt.step()
            if self.writes_during_training:
                self.memory.write(seen, y)
        self.memory.add(experience)


class FeatureSubspace:
    """The representation subspace of Gradient Projection Memory (Saha et al. 2021), as PGP
    (Qiao et al. 2024) keeps it for prompts and keys: an orthonormal basis U (D, r) of the span of
    the representations of earlier tasks, grown task by task until the share ``threshold`` of each
    task's representation energy (sum of squared singular values) lies in it. ``project(g)`` gives
    g − g U Uᵀ, the component of the rows of g orthogonal to the subspace."""

    def __init__(self, threshold: float):
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"FeatureSubspace: threshold={threshold} must be in (0, 1]")
        self.threshold = threshold
        self.basis: torch.Tensor | None = None

    def add(self, representation: torch.Tensor) -> None:
        """Grow the basis with the rows (n, D) of one task's representation matrix R: the top
        singular directions of R (first task) or of R with the current basis projected out, until
        the captured share of ||R||² reaches the threshold (GPM's criterion)."""
        R = representation.detach().double().reshape(-1, representation.shape[-1])
        gram = R.T @ R                                    # eigenvalues = squared singular values of R
        total = gram.trace()
        if total <= 0:
            return
        captured = torch.zeros((), dtype=gram.dtype, device=gram.device)
        if self.basis is not None:
            P = torch.eye(len(gram), dtype=gram.dtype, device=gram.device) - self.basis.double() @ self.basis.double().T
            gram = P @ gram @ P                           # what the basis does not yet hold
            captured = (total - gram.trace()) / total
        values, vectors = torch.linalg.eigh(gram)
        values, vectors = values.flip(0).clamp(min=0), vectors.flip(1)
        r = 0
        while captured < self.threshold and r < len(values) and values[r] > 0:
            captured = captured + values[r] / total
            r += 1
        if r == 0:
            return
        new = vectors[:, :r].to(representation.dtype)
        self.basis = new if self.basis is None else torch.cat([self.basis, new], 1)[:, :len(gram)]

    def project(self, grad: torch.Tensor) -> torch.Tensor:
        if self.basis is None:
            return grad
        U = self.basis.to(grad.dtype)
        return grad - (grad @ U) @ U.T
