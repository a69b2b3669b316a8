"""PGP, Prompt Gradient Projection (Qiao et al., ICLR 2024), on top of L2P (methods/l2p.py).

L2P's prompts and keys are shared by every task, so learning a new task moves what old tasks
selected and read. PGP constrains their updates to the directions old tasks do not use (sec. 4,
the orthogonality condition on the prompt gradient): after each task, the representation subspace
of that task is added to a Gradient Projection Memory (Saha et al. 2021; ``FeatureSubspace``):
- for the prompts, the span of the task's patch embeddings (the tokens the prompts are prepended
  to; the code's ``act['rep']``), kept up to the energy threshold ε = 0.50;
- for the keys, the span of the task's queries (frozen [CLS] features), ε = 0.97.
From the second task on, every gradient step replaces the prompt gradient g (rows in R^D) by
g − g U Uᵀ and the key gradient likewise with the key basis, so the update is orthogonal to the
stored subspaces; gradients are clipped to norm 1.0 first, as the code does. Everything else is
L2P (Adam, constant lr 0.03 per 256 images, M = 10, Lp = 5, N = 5, λ = 0.1, ``clip_grad`` 1.0),
in fp32 (the projection reads unscaled gradients).

Deliberate differences: the subspaces are computed exactly (SVD energy of the full representation
matrix of up to ``memory_images`` images) rather than after the code's PCA to 9 (prompts) and 5
(keys) components, whose "768 samples = 768 dimensions" reshaping is not transferable to other
widths; the representation is taken after each task rather than before it (the frozen patch
embeddings and queries do not change)."""
import torch

import clharness as clh
from clharness.toolkit.gradient_projection import FeatureSubspace
from clharness.toolkit.training import Trainer
from clharness.toolkit.vit_prompts import vit_of
from clharness_methods.l2p import L2P


class PGP(L2P):
    name = "pgp"
    version = "1"
    hparams = {**L2P.hparams,
               "prompt_threshold": clh.Float(0.01, 1.0, default=0.50),
               "key_threshold": clh.Float(0.01, 1.0, default=0.97),
               "memory_images": clh.Int(1, 100000, default=768)}

    def __init__(self, context, **hparams):
        super().__init__(context, **hparams)
        self.prompt_space = FeatureSubspace(self.hp["prompt_threshold"])
        self.key_space = FeatureSubspace(self.hp["key_threshold"])

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
        self.remember(experience)

    @torch.no_grad()
    def remember(self, experience) -> None:
        """Add this task's patch-embedding and query subspaces to the memories."""
        vit = vit_of(self.frozen, self.name)
        tokens, queries, n = [], [], 0
        for x, _ in experience.batches(shuffle=False, augment=False):
            x = x[:self.hp["memory_images"] - n]
            tokens.append(vit.patch_embed(x).flatten(0, -2))
            queries.append(self.frozen(x))
            n += len(x)
            if n >= self.hp["memory_images"]:
                break
        self.prompt_space.add(torch.cat(tokens))
        self.key_space.add(torch.cat(queries))

    def memory_report(self):
        """The stored subspace bases count as kept tensors (CLDyB B.4)."""
        report = super().memory_report()
        report.tensor_elements += sum(s.basis.numel() for s in (self.prompt_space, self.key_space)
                                      if s.basis is not None)
        return report
