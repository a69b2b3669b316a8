"""Deep Generative Replay (Shin et al. 2017, "Continual learning with deep generative replay"),
as Avalanche's ``GenerativeReplay`` strategy runs it in M2I (section 4.1, Table 9: a VAE generator,
replay size 200, replay size not increasing). The "scholar" is a solver (the suite's classifier)
and a generator (a fully connected VAE over the input). From the second task on, every training
step adds ``replay_size`` samples x' of the previous generator G', labelled by the previous solver
S' (y' = argmax S'(x') over the classes seen before the task), to the incoming minibatch:

    solver:    L = CE(S([x; x']), [y; y'])         (Shin et al. eq. 1, with the concatenation of
                                                    Avalanche's plugin in place of the ratio r)
    generator: L = ||G_dec(z) - x||^2 + KL(q(z|x) || N(0, I)) on [x; x']   (VAE, Kingma & Welling
                                                    2014; Avalanche's ``VAE_loss``: squared error + KL)

so the new generator learns the current task and the old generator's distribution at once (the
new generator is trained on real and replayed inputs mixed, section 3.1). G' and S' are frozen
copies taken when the task starts.

Deliberate differences:
- The generator is trained alongside the solver on the same mixed minibatches, one Adam step per
  solver step (as GMvandeVen/continual-learning does), not after the solver in a separate pass
  over the experience (Avalanche's ``TrainGeneratorAfterExpPlugin``).
- The VAE is Avalanche's layout (encoder 400-128, latent 16, decoder 64-128-256) without its
  BatchNorm layers, with a linear output and the reparameterisation std = exp(logvar / 2):
  inputs here are normalised (unbounded), so no sigmoid + MNIST normalisation on the output, and
  Avalanche's std = 0.5 exp(logvar) is not the Gaussian's.
- Replayed labels are the previous solver's argmax over the classes seen so far, not over all
  outputs (the heads of unseen classes are untrained; Shin's S' only knows the old tasks).
- The reconstruction error and KL are summed over a sample's elements and averaged over the
  minibatch (Avalanche sums over the minibatch too; Adam is invariant to that scale).
"""
import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

import clharness as clh
from clharness.toolkit.training import NEG, OPTIMIZER_SPACE, SupervisedMethod, Trainer, make_optimizer


class VAE(nn.Module):
    """A fully connected VAE over inputs of ``input_shape``: encoder D-400-128 -> (mu, logvar) of
    ``latent`` dims; decoder latent-64-128-256-D (Avalanche's ``MlpVAE`` layout)."""

    def __init__(self, input_shape, latent: int = 16):
        super().__init__()
        self.input_shape, self.latent = tuple(input_shape), latent
        d = math.prod(input_shape)
        self.encoder = nn.Sequential(nn.Flatten(), nn.Linear(d, 400), nn.LeakyReLU(), nn.Linear(400, 128), nn.ReLU())
        self.mean, self.logvar = nn.Linear(128, latent), nn.Linear(128, latent)
        self.decoder = nn.Sequential(nn.Linear(latent, 64), nn.ReLU(), nn.Linear(64, 128), nn.ReLU(),
                                     nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, d))

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return self.decoder(z).view(len(z), *self.input_shape)

    def loss(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Negative ELBO per sample (squared error + KL), averaged over the minibatch."""
        h = self.encoder(x)
        mean, logvar = self.mean(h), self.logvar(h)
        eps = torch.randn(mean.shape, generator=generator).to(mean.device, mean.dtype)
        z = mean + eps * torch.exp(0.5 * logvar)     # reparameterisation
        recon = (self.decode(z) - x).pow(2).flatten(1).sum(1)
        kl = 0.5 * (mean.pow(2) + logvar.exp() - 1 - logvar).sum(1)
        return (recon + kl).mean()

    @torch.no_grad()
    def generate(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``n`` samples: decode z ~ N(0, I)."""
        device = next(self.parameters()).device
        z = torch.randn(n, self.latent, generator=generator).to(device)
        return self.decode(z)


class GenerativeReplay(SupervisedMethod):
    name = "generative_replay"
    settings = frozenset({clh.Setting.CLASS_IL, clh.Setting.TASK_IL})
    hparams = {**OPTIMIZER_SPACE,
               "replay_size": clh.Int(1, 4096, default=200),      # generated samples per step (M2I Table 9)
               "latent_dim": clh.Int(2, 512, default=16),          # Avalanche MlpVAE nhid
               "generator_lr": clh.Float(1e-5, 1e-1, default=1e-3, log=True)}   # Adam (van de Ven et al.)

    def __init__(self, context, **hparams):
        super().__init__(context, **hparams)
        self.generator = VAE(context.input_shape, self.hp["latent_dim"]).to(context.device)
        self.previous_generator: VAE | None = None     # G' and S': frozen at the start of each task
        self.previous_solver: nn.Module | None = None
        self.previous_classes: list[int] = []
        self.gen = torch.Generator().manual_seed(context.seed)   # replay and VAE noise: snapshots replay exactly

    def replay(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``n`` samples of G', labelled by S' (argmax over the classes seen before this task)."""
        x = self.previous_generator.generate(n, self.gen)
        with torch.no_grad():
            logits = self.previous_solver(x)
        seen = torch.zeros(logits.shape[1], dtype=torch.bool, device=logits.device)
        seen[self.previous_classes] = True
        return x, logits.masked_fill(~seen, NEG).argmax(1)

    def learn(self, experience):
        if self.labels.seen:     # a trained scholar exists: freeze copies to replay from
            self.previous_generator = copy.deepcopy(self.generator).eval().requires_grad_(False)
            self.previous_solver = copy.deepcopy(self.model).eval().requires_grad_(False)
            self.previous_classes = list(self.labels.seen)
        self.labels.add(experience)
        solver = Trainer.for_method(self)
        generator = Trainer(self.name, make_optimizer(self.generator.parameters(), "adam", self.hp["generator_lr"]),
                            self.context)
        self.model.train()
        self.generator.train()
        for x, y in experience.batches(epochs=self.context.epochs):
            if self.previous_generator is not None:
                xr, yr = self.replay(self.hp["replay_size"])
                x, y = torch.cat([x, xr]), torch.cat([y, yr])
            solver.step(self.loss, x, y)
            generator.step(self.generator.loss, x, self.gen)
        solver.check()
        generator.check()
