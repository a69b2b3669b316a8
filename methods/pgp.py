"""PGP, Prompt Gradient Projection (Qiao et al., ICLR 2024), on top of L2P (methods/l2p.py).

L2P's prompts and keys are shared by every task, so learning a new task moves what old tasks
selected and read. PGP constrains their updates to the directions old tasks do not use (sec. 4,
the orthogonality condition on the prompt gradient): after each task, the representation subspace
of that task is added to a Gradient Projection Memory (Saha et al. 2021; ``FeatureSubspace``):
- for the prompts, the span of the task's patch embeddings (the tokens the prompts are prepended
  to; the code's ``act['rep']``), kept up to the energy threshold ε = 0.50;
- for the keys, the span of the task's queries (frozen [CLS] features), ε = 0.97.
From the second task on, the prompt memory also holds the prompt space: the rows of the prompt
pool as the task starts (the paper's SVD "on an element-wise sum space between input space and
prompt space", sec. 4; the code adds the PCA of the prompt parameters from the second task on), so
the task's updates also leave the old prompts' own directions alone.
Every gradient step of a later task replaces the prompt gradient g (rows in R^D) by g − g U Uᵀ and
the key gradient likewise with the key basis, so the update is orthogonal to the stored subspaces;
gradients are clipped to norm 1.0 first, as the code does. Everything else is L2P (Adam, constant
lr 0.03 per 256 images, M = 10, Lp = 5, N = 5, λ = 0.1, ``clip_grad`` 1.0), in fp32 (the
projection reads unscaled gradients).

``subspace``: "exact" (default, the paper's SVD): each representation matrix enters the memory
whole; "pca" (the code's): each is first reduced to its top principal components (centred, as
sklearn's PCA), 9 for the prompt memory's input and prompt parts and 5 for the keys
(``prompt_components``, ``key_components``), so a task adds at most that many directions and the
keys freeze much less than under the exact subspace.

Deliberate differences: the code applies its PCA with images as rows and then reads the 768 rows
as the 768 embedding dimensions (it only works because it keeps 768 images of a ViT-B); here the
principal components are taken in the embedding space (rank-k approximation of the centred
representation), which any width allows; the input and prompt parts are stacked (the sum space of
their spans) rather than added as two PCA score matrices; the energy criterion is on squared
singular values (GPM's; the code's update_memory squares twice); the task's representation is
added after the task (the frozen patch embeddings and queries do not change; the prompt rows are
those of the task's start, as in the code)."""
import torch

import clharness as clh
from clharness.toolkit.gradient_projection import FeatureSubspace
from clharness.toolkit.training import Trainer
from clharness.toolkit.vit_prompts import vit_of
from clharness_methods.l2p import L2P


def principal_part(R: torch.Tensor, k: int) -> torch.Tensor:
    """The rank-k approximation of the centred rows of R (n, D): their projection on the top k
    principal axes, U_k S_k V_kᵀ, whose row space is the span of the k components sklearn's PCA keeps."""
    R = R.double()
    U, S, Vh = torch.linalg.svd(R - R.mean(0), full_matrices=False)
    return (U[:, :k] * S[:k]) @ Vh[:k]


class PGP(L2P):
    name = "pgp"
    version = "2"   # the prompt space joins the prompt memory; the code's PCA subspaces offered; L2P's pos. embedding
    paper = ("Jingyang Qiao, Zhizhong Zhang, Xin Tan, Chengwei Chen, Yanyun Qu, Yong Peng, Yuan Xie, Prompt "
             "Gradient Projection for Continual Learning, ICLR 2024")
    reference = "JingyangQiao/prompt-gradient-projection: l2p-pgp/engine.py, memory.py"
    deviations = ("subspace='pca': the code's PCA (9 prompt / 5 key components) taken in the embedding space",
                  "subspace='pca': the input and prompt parts are stacked (the sum of their spans: up to 2 x 9 "
                  "directions a task), where l2p-pgp/engine.py:210-224 adds the two 768 x 9 PCA score matrices "
                  "(rep = rep + p; memory.py:39-40 then keeps at most 9): that sum pairs components by rank "
                  "and sklearn's sign convention, which has no meaning in the embedding space",
                  "energy on squared singular values (the code's update_memory squares twice)")
    hparams = {**L2P.hparams,
               "prompt_threshold": clh.Float(0.01, 1.0, default=0.50),
               "key_threshold": clh.Float(0.01, 1.0, default=0.97),
               "memory_images": clh.Int(1, 100000, default=768),
               "subspace": clh.Choice(["exact", "pca"], default="exact"),
               "prompt_components": clh.Int(1, 1000, default=9, when={"subspace": ["pca"]}),
               "key_components": clh.Int(1, 1000, default=5, when={"subspace": ["pca"]})}
    # CLDyB B.3 selection space (clharness/engine/hparam_selection.py): the lr and prompt length of
    # JingyangQiao/prompt-gradient-projection's configs: lr 0.03 and --length 5 in every l2p-pgp config
    # (l2p-pgp/configs/*_l2p_pgp.py: our defaults) and in dualprompt-pgp's CIFAR/CUB/TinyImageNet ones,
    # lr 0.005 and length 20 in dualprompt-pgp/configs/imr_dualprompt_pgp.py (both scaled by batch / 256
    # as ours). The thresholds 0.50 / 0.97 are constants in its engine.py, not searched. 4 candidates.
    tuning_space = {"lr": clh.Choice([0.005, 0.03]),
                    "prompt_length": clh.Choice([5, 20])}

    def __init__(self, context, **hparams):
        super().__init__(context, **hparams)
        self.prompt_space = FeatureSubspace(self.hp["prompt_threshold"])
        self.key_space = FeatureSubspace(self.hp["key_threshold"])
        self.tasks_learned = 0

    def project_gradients(self) -> None:
        """Prompt and key gradients with their components in the stored subspaces removed."""
        pool = self.pool
        if pool.prompts.grad is not None:
            pool.prompts.grad = self.prompt_space.project(pool.prompts.grad)
        if pool.keys.grad is not None:
            pool.keys.grad = self.key_space.project(pool.keys.grad)

    def learn(self, experience):
        self.labels.add(experience)
        self.seen[list(experience.classes)] = True
        params = list(self.pool.parameters()) + list(self.head.parameters())
        start = self.pool.prompts.detach().clone() if self.tasks_learned else None   # the prompt space (task 2 on)
        trainer = Trainer.for_method(self, params)      # L2P's optimizer and schedule
        opt = trainer.optimizer
        for x, y in experience.batches(epochs=self.context.epochs):
            loss = self.loss(x, y)
            if not torch.isfinite(loss):
                raise clh.Diverged(f"method 'pgp': non-finite loss ({loss.item()}); try a lower learning rate")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if self.hp["clip_grad"] > 0:
                torch.nn.utils.clip_grad_norm_(params, self.hp["clip_grad"])
            self.project_gradients()
            opt.step()
            trainer.steps += 1
            if trainer.scheduler is not None and trainer.steps % trainer.epoch_steps == 0:
                trainer.scheduler.step()
        self.remember(experience, start)
        self.tasks_learned += 1

    @torch.no_grad()
    def remember(self, experience, prompts: torch.Tensor | None = None) -> None:
        """Add this task's subspaces to the memories: patch embeddings and (from the second task
        on) the prompt rows ``prompts`` of the task's start for the prompts, queries for the keys."""
        vit = vit_of(self.frozen, self.name)
        tokens, queries, n = [], [], 0
        for x, _ in experience.batches(shuffle=False, augment=False):
            x = x[:self.hp["memory_images"] - n]
            tokens.append(vit.patch_embed(x).flatten(0, -2))
            queries.append(self.frozen(x))
            n += len(x)
            if n >= self.hp["memory_images"]:
                break
        tokens, queries = torch.cat(tokens), torch.cat(queries)
        dtype = tokens.dtype
        rows = [] if prompts is None else [prompts.reshape(-1, prompts.shape[-1])]
        if self.hp["subspace"] == "pca":
            k = self.hp["prompt_components"]
            tokens, rows = principal_part(tokens, k), [principal_part(r, k) for r in rows]
            queries = principal_part(queries, self.hp["key_components"])
        self.prompt_space.add(torch.cat([tokens.to(dtype), *(r.to(dtype) for r in rows)]))
        self.key_space.add(queries.to(dtype))

    def memory_report(self):
        """The stored subspace bases count as kept tensors (CLDyB B.4)."""
        report = super().memory_report()
        report.tensor_elements += sum(s.basis.numel() for s in (self.prompt_space, self.key_space)
                                      if s.basis is not None)
        return report
