"""CODA-Prompt, COntinual Decomposed Attention-based prompting (Smith et al., CVPR 2023).

A frozen pretrained ViT prompted by prefix tuning on layers ``layers`` (default blocks 0-4, as
DualPrompt's E-prompts). Instead of picking prompts from a pool, each layer's prompt is a weighted
sum of M prompt components P_m ∈ R^{Lp×D}, each with a key K_m and an attention vector A_m ∈ R^D
(sec. 4.1-4.2):
    α_m = γ(q(x) ⊙ A_m, K_m),   γ = cosine similarity,          (the attended query, sec. 4.2)
    p   = Σ_m α_m P_m,                                           (the decomposed prompt, sec. 4.1)
where q(x) is the frozen ViT's [CLS] feature (cached: computed once per image). The first half of
p's Lp rows is the key prefix, the second half the value prefix of the layer's self-attention
(``vit_prompts.prefix_attention``). The pool grows with the tasks: task t adds M / T new
components, initialised by Gram-Schmidt orthogonal to every earlier one (the authors' code:
random normal vectors orthogonalised, then unit-normalised, separately for P, K and A); only the
new task's components learn, earlier ones are frozen. Loss: cross-entropy with the logits of
classes outside the current task masked, plus the orthogonality penalty
    μ (‖K Kᵀ − I‖² + ‖A Aᵀ − I‖² + ‖P Pᵀ − I‖²)   (mean of squares, per layer, as the code does),
off by default (μ = 0, PILOT's prompt_param [100, 8, 0]). The classifier is a linear head on the
prompted [CLS] output. Defaults are LAMDA-PILOT's: M = 100, Lp = 8, Adam, lr 1e-3, cosine schedule,
no weight decay.

Deliberate differences:
- the number of tasks T is not known to a class-incremental method here: ``num_tasks`` (default
  10, the papers' 10-task splits) sets M / T components per task (the task count of the context
  when the harness gives it, task-incremental runs); a longer sequence keeps adding M / T
  components per task, so the pool then exceeds M;
- cosine schedule 0.5 (1 + cos(π e / E)) per epoch (the shared Trainer's) instead of the code's
  cos(99 π e / (200 (E - 1)));
- new components are made orthogonal to the span of the (trained, no longer orthogonal) earlier
  ones through an orthonormal basis of that span; the code projects on each earlier row in turn,
  which is exact only while they are still orthogonal;
- ``prompt_length`` must be even (the code splits an odd length into unequal key/value halves)."""
import torch
import torch.nn.functional as F
from torch import nn

import clharness as clh
from clharness.toolkit.feature_cache import FrozenFeatures
from clharness.toolkit.training import NEG, TaskLabels, Trainer, optimizer_space
from clharness.toolkit.vit_adapters import layer_range
from clharness.toolkit.vit_prompts import embed, forward_blocks, vit_of


def gram_schmidt(old: torch.Tensor, n: int, gen: torch.Generator) -> torch.Tensor:
    """``n`` random unit rows orthogonal to the rows of ``old`` (k, d) and to each other."""
    d = old.shape[1]
    if old.shape[0] + n > d:
        raise clh.HParamError(f"method 'coda_prompt': {old.shape[0] + n} orthogonal prompt components do not fit "
                              f"in {d} dimensions; lower pool_size (or raise num_tasks)")
    # an orthonormal basis of the old rows' span (trained components are no longer orthogonal)
    basis = torch.linalg.qr(old.double().T).Q.T if len(old) else old.double()
    rows = []
    for v in torch.randn(n, d, generator=gen, dtype=torch.float64):
        for _ in range(2):   # twice: classical Gram-Schmidt loses orthogonality in floating point
            v = v - basis.T @ (basis @ v)
        v = v / v.norm()
        basis = torch.cat([basis, v[None]])
        rows.append(v)
    return torch.stack(rows).float()


class ComponentPool(nn.Module):
    """Per prompted layer: components P (M, Lp, D), keys K (M, D), attention vectors A (M, D)."""

    def __init__(self, layers: int, length: int, dim: int):
        super().__init__()
        self.P = nn.Parameter(torch.zeros(layers, 0, length, dim))
        self.K = nn.Parameter(torch.zeros(layers, 0, dim))
        self.A = nn.Parameter(torch.zeros(layers, 0, dim))

    def grow(self, n: int, gen: torch.Generator) -> None:
        """n new components per layer, Gram-Schmidt-orthogonal to the existing ones."""
        new = {}
        for key in ("P", "K", "A"):
            t = getattr(self, key).detach()
            flat = t.flatten(2)
            rows = torch.stack([gram_schmidt(flat[i].cpu(), n, gen) for i in range(len(t))])
            new[key] = nn.Parameter(torch.cat([t, rows.to(t.device).view(len(t), n, *t.shape[2:])], 1))
        self.P, self.K, self.A = new["P"], new["K"], new["A"]

    def weights(self, query: torch.Tensor, layer: int, frozen: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """α (B, M) = cos(q ⊙ A_m, K_m) and the components, the first ``frozen`` detached."""
        P, K, A = self.P[layer], self.K[layer], self.A[layer]
        if frozen:
            P, K, A = (torch.cat([t[:frozen].detach(), t[frozen:]]) for t in (P, K, A))
        alpha = F.cosine_similarity(query[:, None, :] * A[None], K[None], dim=2)
        return alpha, P

    def prompt(self, query: torch.Tensor, layer: int, frozen: int = 0) -> torch.Tensor:
        """p = Σ_m α_m P_m, (B, Lp, D)."""
        alpha, P = self.weights(query, layer, frozen)
        return torch.einsum("bm,mld->bld", alpha, P)


def ortho_penalty(t: torch.Tensor) -> torch.Tensor:
    """mean((T Tᵀ − I)²) of the rows of t (the authors' orthogonality loss)."""
    t = t.flatten(1)
    return (t @ t.T - torch.eye(len(t), device=t.device, dtype=t.dtype)).pow(2).mean()


class CodaPrompt(clh.Method):
    name = "coda_prompt"
    paper = "Smith et al., CODA-Prompt: COntinual Decomposed Attention-based Prompting, CVPR 2023"
    reference = "sun-hailong/LAMDA-PILOT: models/coda_prompt.py (GT-RIPL/CODA-Prompt: models/zoo.py)"
    deviations = (
        "num_tasks (default 10) sets the M / T components per task, since a class-incremental method is "
        "not told the task count",
        "cosine schedule 0.5 (1 + cos(pi e / E)) per epoch instead of the code's cos(99 pi e / (200 (E - 1)))",
        "new components are orthogonalised against an orthonormal basis of the earlier ones' span",
        "prompt_length must be even",
    )
    hparams = {**optimizer_space(lr=0.001, optimizer="adam"),
               "scheduler": clh.Choice(["constant", "steplr", "cosine"], default="cosine"),
               "pool_size": clh.Int(1, 10000, default=100),
               "prompt_length": clh.Int(2, 64, default=8),
               "ortho_mu": clh.Float(0.0, 10.0, default=0.0),
               "layers": clh.Choice(["0-4", "0-1", "0-0", "1-1", "0-2", "0-3", "0-5"], default="0-4"),
               "num_tasks": clh.Int(1, 1000, default=10)}
    # GTEP table 5: pool size, prompt length, orthogonality mu
    tuning_space = {"pool_size": clh.Choice([30, 50, 100, 200, 300]),
                    "prompt_length": clh.Choice([4, 8, 16, 24, 32]),
                    "ortho_mu": clh.Choice([0.2, 0.1, 0.01, 0.001, 0.0])}

    def __init__(self, context, **hparams):
        super().__init__(context, **hparams)
        if self.hp["prompt_length"] % 2:
            raise clh.HParamError(f"method 'coda_prompt': prompt_length={self.hp['prompt_length']} must be even "
                                  "(half key prefix, half value prefix)")
        tasks = len(context.task_classes) or self.hp["num_tasks"]
        self.per_task = self.hp["pool_size"] // tasks
        if self.per_task < 1:
            raise clh.HParamError(f"method 'coda_prompt': pool_size={self.hp['pool_size']} gives no component to each "
                                  f"of {tasks} tasks; raise pool_size to at least {tasks}")
        self.frozen = FrozenFeatures(context.make_backbone(), amp=context.amp)
        vit = vit_of(self.frozen, self.name)
        self.layers = layer_range(self.hp["layers"], len(vit.blocks), self.name)
        self.pool = ComponentPool(len(self.layers), self.hp["prompt_length"], vit.embed_dim).to(context.device)
        self.head = nn.Linear(vit.embed_dim, context.num_classes).to(context.device)
        self.gen = torch.Generator().manual_seed(context.seed)
        self.labels = TaskLabels(context)
        self.seen = torch.zeros(context.num_classes, dtype=torch.bool, device=context.device)

    def prefixes(self, query: torch.Tensor, frozen: int = 0) -> dict[int, torch.Tensor]:
        """Per prompted block: (B, 2, Lp/2, D), key half then value half of p."""
        half = self.hp["prompt_length"] // 2
        return {block: self.pool.prompt(query, i, frozen).unflatten(1, (2, half))
                for i, block in enumerate(self.layers)}

    def represent(self, x: torch.Tensor, frozen: int = 0) -> torch.Tensor:
        """The prompted [CLS] output."""
        vit = vit_of(self.frozen, self.name)
        out = forward_blocks(vit, embed(vit, x), self.prefixes(self.frozen(x), frozen))
        return vit.forward_head(out, pre_logits=True)

    def learn(self, experience):
        self.labels.add(experience)
        self.seen[list(experience.classes)] = True
        start = self.pool.K.shape[1]
        self.pool.grow(self.per_task, self.gen)
        mu = self.hp["ortho_mu"]

        def loss(x, y):
            ce = F.cross_entropy(self.labels.mask_current(self.head(self.represent(x, start))), y)
            if mu == 0:
                return ce
            P, K, A = (torch.cat([t[:, :start].detach(), t[:, start:]], 1)
                       for t in (self.pool.P, self.pool.K, self.pool.A))
            return ce + mu * sum(ortho_penalty(K[i]) + ortho_penalty(A[i]) + ortho_penalty(P[i])
                                 for i in range(len(self.layers)))

        old = [t.detach()[:, :start].clone() for t in (self.pool.P, self.pool.K, self.pool.A)]
        trainer = Trainer.for_method(self, [*self.pool.parameters(), *self.head.parameters()])
        for x, y in experience.batches(epochs=self.context.epochs):
            trainer.step(loss, x, y)
        trainer.check()
        with torch.no_grad():   # earlier components are frozen (weight decay must not move them either)
            for t, kept in zip((self.pool.P, self.pool.K, self.pool.A), old):
                t[:, :start] = kept

    @torch.no_grad()
    def features(self, x):
        with torch.autocast("cuda", dtype=torch.float16, enabled=self.context.amp and x.is_cuda):
            return self.represent(x).float()

    @torch.no_grad()
    def predict(self, x, task_id=None):
        if not self.pool.K.shape[1]:
            return torch.full((len(x), self.context.num_classes), NEG, device=x.device)
        return self.head(self.features(x)).masked_fill(~self.seen, NEG)
