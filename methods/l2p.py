"""L2P, Learning to Prompt (Wang et al., CVPR 2022). A frozen pretrained ViT; a pool of M prompts
P_i ∈ R^{Lp×D}, each with a learnable key k_i. The query q(x) is the frozen ViT's [CLS] feature
(cached: computed once per image); the N prompts whose keys have the highest cosine similarity
with q(x) are prepended to the patch tokens (sec. 4.1-4.2), the classifier reads the average of
the outputs at the prompt positions. Training minimises the surrogate loss (eq. 5)
    L = CE(g(f_avg(x_p)), y) + λ Σ_{selected i} γ(q(x), k_i),   γ = 1 - cosine,
with the logits of classes outside the current task masked (the authors' train mask). Defaults
are the paper's: M = 10, Lp = 5, N = 5, λ = 0.1 (authors' code), Adam, constant lr 0.03 per 256
images: as the PyTorch port (JH-LEE-KR/l2p-pytorch) does, the lr is scaled by batch_size / 256
(``scale_lr``; 0.03 x 16 / 256 = 0.001875 at the port's batch size 16), and gradients are clipped
to norm 1.0 (``clip_grad``, the port's --clip-grad). Each prompt token enters the ViT with the
[CLS] token's position embedding added, as in the code (its pos_embed gives the N·Lp prompt slots
the pretrained [CLS] entry).

Prompt selection (``prompt_selection``): "per_sample" (default, the paper's eq. 3: each image's own
top-N keys) or "batchwise", the official code's ``batchwise_prompt`` (on in its CIFAR-100 config):
the N prompts chosen most often over the batch are used for every image of the batch, in training
and at test time. Evaluated on batches of one task's test images, the batch votes for its task's
prompts, which leaks the task identity and reports higher accuracy than the paper's rule; offered
so the published figure can be reproduced and compared."""
import torch
import torch.nn.functional as F
from torch import nn

import clharness as clh
from clharness.toolkit.feature_cache import FrozenFeatures
from clharness.toolkit.training import NEG, TaskLabels, Trainer, optimizer_space
from clharness.toolkit.vit_prompts import batchwise_vote, embed, forward_blocks, insert_prompts, prompt_position, vit_of


class PromptPool(nn.Module):
    """M prompts of length Lp and their keys, uniform(-1, 1) initialised as in the authors' code."""

    def __init__(self, size: int, length: int, dim: int, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.prompts = nn.Parameter(torch.empty(size, length, dim).uniform_(-1, 1, generator=gen))
        self.keys = nn.Parameter(torch.empty(size, dim).uniform_(-1, 1, generator=gen))

    def select(self, query: torch.Tensor, top_n: int, batchwise: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Indices (B, N) of the N keys most cosine-similar to each query (or, ``batchwise``, the N
        chosen most often over the batch, for every query), and those keys' similarities."""
        sim = F.normalize(query, dim=1) @ F.normalize(self.keys, dim=1).T
        idx = sim.topk(top_n, dim=1).indices
        if batchwise:
            idx = batchwise_vote(idx, len(self.keys))
        return idx, sim.gather(1, idx)


class L2P(clh.Method):
    name = "l2p"
    version = "3"   # prompts get the [CLS] position embedding, as the code; batchwise selection offered
    paper = ("Zifeng Wang, Zizhao Zhang, Chen-Yu Lee, Han Zhang, Ruoxi Sun, Xiaoqi Ren, Guolong Su, Vincent "
             "Perot, Jennifer Dy, Tomas Pfister, Learning to Prompt for Continual Learning, CVPR 2022")
    reference = "JH-LEE-KR/l2p-pytorch: vision_transformer.py, prompt.py (port of google-research/l2p)"
    deviations = ("prompt_selection='batchwise': the code's batch-wise prompt vote (leaks the batch's task at "
                  "test time); a tie in the vote goes to the lowest prompt id (a stable sort of the counts), where "
                  "l2p-pytorch prompt.py:79 takes torch.topk of the counts, whose order among equal counts is "
                  "unspecified",)
    hparams = {**optimizer_space(lr=0.03, optimizer="adam"),
               "scale_lr": clh.Choice([True, False], default=True),       # lr x batch_size / 256
               "clip_grad": clh.Float(0.0, 100.0, default=1.0),            # 0 = no clipping
               "pool_size": clh.Int(1, 100, default=10),
               "prompt_length": clh.Int(1, 50, default=5),
               "top_n": clh.Int(1, 100, default=5),
               "pull_lambda": clh.Float(0.0, 10.0, default=0.1),
               "prompt_selection": clh.Choice(["per_sample", "batchwise"], default="per_sample")}

    def __init__(self, context, **hparams):
        super().__init__(context, **hparams)
        if self.hp["top_n"] > self.hp["pool_size"]:
            raise clh.HParamError(f"method 'l2p': top_n={self.hp['top_n']} prompts cannot be chosen from a pool of "
                                  f"pool_size={self.hp['pool_size']}; lower top_n or raise pool_size")
        self.frozen = FrozenFeatures(context.make_backbone(), amp=context.amp)
        dim = vit_of(self.frozen, self.name).embed_dim
        self.pool = PromptPool(self.hp["pool_size"], self.hp["prompt_length"], dim, context.seed).to(context.device)
        self.head = nn.Linear(dim, context.num_classes).to(context.device)
        self.labels = TaskLabels(context)
        self.seen = torch.zeros(context.num_classes, dtype=torch.bool, device=context.device)

    def represent(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """f_avg(x_p): mean output at the prompt positions; and the selected keys' similarities."""
        vit = vit_of(self.frozen, self.name)
        idx, sim = self.pool.select(self.frozen(x), self.hp["top_n"], self.hp["prompt_selection"] == "batchwise")
        prompts = self.pool.prompts[idx].flatten(1, 2) + prompt_position(vit)   # (B, N*Lp, D)
        out = forward_blocks(vit, insert_prompts(embed(vit, x), prompts))
        return out[:, 1:1 + prompts.shape[1]].mean(1), sim

    def loss(self, x, y):
        rep, sim = self.represent(x)
        ce = F.cross_entropy(self.labels.mask_current(self.head(rep)), y)
        # eq. 5: λ Σ γ(q(x), k_si), γ = 1 - cosine, summed over the N selected keys, mean over the batch
        return ce + self.hp["pull_lambda"] * (1 - sim).sum(1).mean()

    def learn(self, experience):
        self.labels.add(experience)
        self.seen[list(experience.classes)] = True
        params = list(self.pool.parameters()) + list(self.head.parameters())
        trainer = Trainer.for_method(self, params)      # a fresh optimizer per task, as the authors do
        for x, y in experience.batches(epochs=self.context.epochs):
            trainer.step(self.loss, x, y)
        trainer.check()

    @torch.no_grad()
    def features(self, x):
        with torch.autocast("cuda", dtype=torch.float16, enabled=self.context.amp and x.is_cuda):
            return self.represent(x)[0].float()

    @torch.no_grad()
    def predict(self, x, task_id=None):
        return self.head(self.features(x)).masked_fill(~self.seen, NEG)
