"""RanPAC (McDonnell et al. 2023, "RanPAC: random projections and pre-trained models for continual
learning"). Frozen pretrained features f(x) (d) go through a frozen random projection
h = ReLU(f W), W ∈ R^{d×M} with N(0, 1) entries (sec. 4.2, M = 10000); the class-incremental
classifier is the closed-form ridge regression on one-hot targets over every sample seen so far,
kept as running sums G = Σ h hᵀ and C = Σ h yᵀ (eq. 3-4): W_o = (G + λI)⁻¹ C, logits = h W_o.
λ is chosen per task from 10^-8 ... 10^13 by ridge regression on 80% of the task's training
features and the MSE on the held-out 20% (the authors' ``optimise_ridge_parameter``).

Optional first-session adaptation (sec. 4.3, phase 1): ``first_session_epochs`` > 0 fine-tunes
the backbone with a linear head on the first task (SGD, ``first_session_lr``) before freezing it;
the paper adapts with PETL modules, here the whole backbone is tuned (off by default)."""
import copy

import numpy as np
import torch
import torch.nn.functional as F

import clharness as clh
from clharness.feature_cache import FrozenFeatures
from clharness.training import NEG, TaskLabels, Trainer, make_optimizer

RIDGES = 10.0 ** np.arange(-8, 14)   # the authors' search range


class RanPAC(clh.Method):
    name = "ranpac"
    hparams = {
        "projection_dim": clh.Int(0, 100000, default=10000),   # M; 0 = no projection (ridge on f)
        "holdout": clh.Float(0.05, 0.5, default=0.2),           # share of the task's data to pick λ
        "first_session_epochs": clh.Int(0, 100, default=0),
        "first_session_lr": clh.Float(1e-5, 1.0, default=0.01, log=True),
    }

    def __init__(self, context, **hparams):
        super().__init__(context, **hparams)
        self.frozen = FrozenFeatures(context.make_backbone(), amp=context.amp)
        self.labels = TaskLabels(context)
        d, m = self.frozen.out_dim, self.hp["projection_dim"]
        gen = torch.Generator().manual_seed(context.seed)
        # W: frozen Gaussian random projection (sec. 4.2); stored, counted in the memory report
        self.projection = torch.randn(d, m, generator=gen).to(context.device) if m else None
        width = m or d
        self.gram = torch.zeros(width, width, dtype=torch.float64, device=context.device)        # G
        self.corr = torch.zeros(width, context.num_classes, dtype=torch.float64, device=context.device)  # C
        self.head = torch.zeros(width, context.num_classes, device=context.device)              # W_o
        self.ridge = None
        self.seen = torch.zeros(context.num_classes, dtype=torch.bool, device=context.device)

    @torch.no_grad()
    def features(self, x):
        """h(x) = ReLU(f(x) W), the features the ridge classifier reads."""
        f = self.frozen(x)
        return F.relu(f @ self.projection) if self.projection is not None else f

    def learn(self, experience):
        if not self.labels.tasks and self.hp["first_session_epochs"] > 0:
            self._adapt(experience)
        self.labels.add(experience)
        self.seen[list(experience.classes)] = True
        hs, ys = [], []
        for x, y in experience.batches(shuffle=False, augment=False):   # statistics of test-view images (PILOT mode='test')
            hs.append(self.features(x).double())
            ys.append(y)
        h, y = torch.cat(hs), torch.cat(ys)
        onehot = F.one_hot(y, self.context.num_classes).double()
        self.gram += h.T @ h
        self.corr += h.T @ onehot
        self.ridge = self.choose_ridge(h, onehot)
        self.head = self.solve(self.ridge).float()

    def solve(self, ridge: float) -> torch.Tensor:
        """W_o = (G + λI)⁻¹ C (eq. 4)."""
        eye = torch.eye(self.gram.shape[0], dtype=self.gram.dtype, device=self.gram.device)
        return torch.linalg.solve(self.gram + ridge * eye, self.corr)

    def choose_ridge(self, h: torch.Tensor, onehot: torch.Tensor) -> float:
        """λ with the lowest held-out MSE of a ridge fit on the rest of this task's features."""
        n = len(h)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(self.context.seed + len(self.labels.tasks)))
        n_val = max(1, int(round(self.hp["holdout"] * n)))
        if n - n_val < 1:
            return 1.0
        val, fit = perm[:n_val].to(h.device), perm[n_val:].to(h.device)
        # one thin SVD H_fit = U S Vᵀ gives every ridge solution at once:
        # (HᵀH + λI)⁻¹ HᵀY = V diag(s / (s² + λ)) Uᵀ Y
        u, sv, vh = torch.linalg.svd(h[fit], full_matrices=False)
        uty = u.T @ onehot[fit]                                             # (k, classes)
        ridges = torch.as_tensor(RIDGES, dtype=h.dtype, device=h.device)
        shrink = sv[None] / (sv[None] ** 2 + ridges[:, None])               # (R, k)
        pred = (h[val] @ vh.T)[None] @ (shrink[:, :, None] * uty[None])     # (R, n_val, classes)
        losses = (pred - onehot[val][None]).pow(2).mean((1, 2)).cpu().numpy()
        return float(RIDGES[int(np.argmin(losses))])

    def _adapt(self, experience):
        """Phase 1: tune backbone + linear head on the first task with cross-entropy, then freeze."""
        # adapt a private copy: clones share the frozen backbone, which must stay untouched
        backbone = copy.deepcopy(self.frozen.backbone).requires_grad_(True).train()
        head = torch.nn.Linear(self.frozen.out_dim, self.context.num_classes).to(self.context.device)
        opt = make_optimizer(list(backbone.parameters()) + list(head.parameters()), "sgd",
                             self.hp["first_session_lr"], momentum=0.9)
        trainer = Trainer(self.name, opt, self.context)
        mask = torch.full((self.context.num_classes,), NEG, device=self.context.device)
        mask[list(experience.classes)] = 0
        for x, y in experience.batches(epochs=self.hp["first_session_epochs"]):
            trainer.step(lambda x, y: F.cross_entropy(head(backbone(x)) + mask, y), x, y)
        trainer.check()
        self.frozen = FrozenFeatures(backbone, amp=self.context.amp)   # a new cache: the old features belong to the old weights

    @torch.no_grad()
    def predict(self, x, task_id=None):
        return (self.features(x) @ self.head).masked_fill(~self.seen, NEG)
