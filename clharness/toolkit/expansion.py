"""Building blocks of the expansion-based class-incremental methods (DER, FOSTER, MEMO), as PyCIL
(G-U-N/PyCIL, ``utils/inc_net.py``) structures them:

- ``BranchNet``: feature extractors ("branches") whose features are concatenated, a linear head over
  the concatenation, and an optional shared trunk under every branch (MEMO's generalised blocks);
  branches live in an ``nn.ModuleList`` so ``memory_report`` counts each one (CLDyB B.4) and
  ``snapshot``/``clone`` copy them;
- ``update_memory``: PyCIL's herded exemplar memory (``clharness.toolkit.exemplars``) after each task;
- ``align_weights``: weight aligning of the new classes' head rows (Zhao et al. 2020, eq. 9-10),
  which PyCIL applies after every incremental task of DER and MEMO;
- ``phase_trainer``: the optimiser of a training phase with its own epoch budget;
- ``method_rng``: the global RNG seeded from the method's own generator while it learns.
"""
from __future__ import annotations

import contextlib
import copy
from typing import Iterator, Sequence

import torch
from torch import nn

from .exemplars import ExemplarMemory
from ..method import Experience, Method
from .training import NEG, Trainer


@contextlib.contextmanager
def method_rng(generator: torch.Generator, device: torch.device) -> Iterator[None]:
    """Run a block on torch's global RNG seeded from ``generator`` (a method attribute), restoring
    the global state afterwards: modules created while learning (new branches, heads) and random
    draws then come from the method's own state, so ``snapshot``/``restore`` replay them exactly."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator)))
        yield


def simple_linear(in_dim: int, out_dim: int) -> nn.Linear:
    """PyCIL's ``SimpleLinear``: Kaiming-uniform weights (linear gain), zero bias."""
    layer = nn.Linear(in_dim, out_dim)
    nn.init.kaiming_uniform_(layer.weight, nonlinearity="linear")
    nn.init.zeros_(layer.bias)
    return layer


class BranchNet(nn.Module):
    """``head([branch_1(z), ..., branch_k(z)])`` with ``z = trunk(x)`` (identity without a trunk).
    The head maps the concatenated features to all ``num_classes`` global ids."""

    def __init__(self, num_classes: int, trunk: nn.Module | None = None):
        super().__init__()
        self.num_classes = num_classes
        self.trunk = trunk if trunk is not None else nn.Identity()
        self.branches = nn.ModuleList()
        self.dims: list[int] = []
        self.head: nn.Linear | None = None

    @property
    def out_dim(self) -> int:
        return sum(self.dims)

    def add_branch(self, branch: nn.Module, dim: int) -> None:
        """Append a branch and grow the head: the old head's weights are copied onto the old
        features' columns (PyCIL ``update_fc``); the new columns and any new rows start fresh."""
        self.branches.append(branch)
        self.dims.append(int(dim))
        head = simple_linear(self.out_dim, self.num_classes).to(next(branch.parameters()).device)
        if self.head is not None:
            with torch.no_grad():
                head.weight[:, :self.head.in_features] = self.head.weight
                head.bias.copy_(self.head.bias)
        self.head = head

    def branch_features(self, x: torch.Tensor) -> list[torch.Tensor]:
        z = self.trunk(x)
        return [b(z).flatten(1) for b in self.branches]

    def newest_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.branches[-1](self.trunk(x)).flatten(1)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat(self.branch_features(x), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))

    def freeze_old(self) -> None:
        """Old branches: no gradients, and eval mode (frozen BatchNorm statistics) while training."""
        for branch in self.branches[:-1]:
            branch.requires_grad_(False)

    def train(self, mode: bool = True) -> "BranchNet":
        super().train(mode)
        for branch in self.branches:
            if not any(p.requires_grad for p in branch.parameters()):
                branch.eval()      # PyCIL: frozen convnets stay in eval mode during training
        if not any(p.requires_grad for p in self.trunk.parameters()):
            self.trunk.eval()
        return self


def seen_logits(logits: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
    """Logits over all global ids with the classes not seen yet at ``NEG`` (finite): PyCIL's head
    only has outputs for the classes seen so far."""
    mask = torch.ones(logits.shape[1], dtype=torch.bool, device=logits.device)
    mask[seen] = False
    return logits.masked_fill(mask, NEG)


@torch.no_grad()
def update_memory(method: Method, memory: ExemplarMemory, experience: Experience, seen: int) -> None:
    """PyCIL ``build_rehearsal_memory`` (``fixed_memory: false``): every class keeps
    ``memory_size // seen`` exemplars, old classes their first ones, new classes chosen by herding
    on the current network's features (``method.features``)."""
    m = memory.per_class(seen)
    memory.reduce(m)
    x, y = experience.tensors()
    for c in experience.classes:
        xc = x[y == c]
        if len(xc):
            feats = torch.cat([method.features(xc[i:i + 512]) for i in range(0, len(xc), 512)])
            memory.add_class(c, xc, feats, m)


def align_weights(head: nn.Linear, old: Sequence[int], new: Sequence[int], value: float = 1.0) -> float:
    """Weight aligning (WA, Zhao et al. 2020, eq. 9-10), as PyCIL's ``weight_align``: scale the new
    classes' rows by gamma = mean ||w_old|| / mean ||w_new|| (times FOSTER's ``value^(old/new)``).
    Returns gamma."""
    if not old or not new:
        return 1.0
    with torch.no_grad():
        w = head.weight
        gamma = w[list(old)].norm(dim=1).mean() / w[list(new)].norm(dim=1).mean()
        gamma = gamma * value ** (len(old) / len(new))
        w[list(new)] *= gamma
    return float(gamma)


def phase_trainer(method: Method, params, epochs: int, **overrides) -> Trainer:
    """``Trainer.for_method`` for a training phase with its own epoch budget (FOSTER's compression):
    the method's scheduler (``hp["scheduler"]``) spans ``epochs`` epochs of the current task."""
    hp = {**method.hp, **overrides}
    trainer = Trainer.for_method(method, params, **{**overrides, "scheduler": "constant"})
    steps = getattr(getattr(method, "labels", None), "epoch_steps", 0)
    if hp.get("scheduler", "constant") != "constant" and steps:
        trainer.schedule(hp["scheduler"], epochs, steps, hp.get("num_milestones", 2), hp.get("lr_decay", 0.1))
    return trainer


def clone_module(module: nn.Module) -> nn.Module:
    """A trainable deep copy (PyCIL initialises a new branch from the previous one's state)."""
    return copy.deepcopy(module).requires_grad_(True)


def sequential_stages(backbone: nn.Module) -> list[nn.Module]:
    """The backbone as an ordered list of stages: its children in registration order, with every
    ``nn.Sequential`` opened recursively (other modules, e.g. residual blocks, stay whole). Valid
    only for backbones whose forward applies their children in that order (mlp, cnn, resnet32,
    resnet18-reduced, wide-vgg9); ``split_backbone`` checks it on a probe input."""
    stages: list[nn.Module] = []

    def walk(module: nn.Module) -> None:
        for child in module.children():
            if isinstance(child, nn.Sequential):
                walk(child)
            else:
                stages.append(child)

    walk(backbone)
    return stages


def split_backbone(backbone: nn.Module, specialised_share: float,
                   input_shape) -> tuple[nn.Sequential, nn.Sequential]:
    """(shallow, deep): the backbone cut into consecutive stages, the deep part being the shortest
    suffix of ``sequential_stages`` holding at least ``specialised_share`` of the parameters (and at
    least one parameterised stage). Raises when the stages do not recompose the backbone's forward."""
    stages = sequential_stages(backbone)
    device = next(backbone.parameters()).device
    probe = torch.randn(2, *input_shape, device=device)
    was_training = backbone.training
    backbone.eval()
    with torch.no_grad():
        expected, out = backbone(probe), probe
        try:
            for stage in stages:
                out = stage(out)
        except RuntimeError:       # shapes that do not chain: not a sequential forward
            out = None
    backbone.train(was_training)
    if out is None or out.shape != expected.shape or not torch.allclose(out, expected, atol=1e-5):
        raise ValueError(f"cannot split {type(backbone).__name__} into shallow and deep blocks: its forward is "
                         "not its child modules applied in order; use a sequential backbone (mlp, cnn, resnet32, "
                         "resnet18-reduced, wide-vgg9)")
    sizes = [sum(p.numel() for p in s.parameters()) for s in stages]
    total, cut = sum(sizes), len(stages)
    while cut > 0 and (sum(sizes[cut:]) < specialised_share * total or not any(sizes[cut:])):
        cut -= 1
    return nn.Sequential(*stages[:cut]), nn.Sequential(*stages[cut:])
