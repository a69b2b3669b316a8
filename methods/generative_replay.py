"""Deep Generative Replay (Shin et al. 2017, "Continual learning with deep generative replay"),
as Avalanche 0.2.1's ``GenerativeReplay`` strategy runs it in M2I (section 4.1, Table 9: a VAE
generator, replay size 200, replay size not increasing; lifelonglab/M2I_I2M_benchmark
``strategies/strategies_provider.py``). The "scholar" is a solver (the suite's classifier) and a
generator (Avalanche's fully connected ``MlpVAE`` over the input). From the second task on, every
training step adds ``replay_size`` samples x' of the previous generator G', labelled by the previous
solver S' (y' = argmax S'(x') over all its outputs), to the incoming minibatch:

    solver:    L = CE(S([x; x']), [y; y'])         (Shin et al. eq. 1, with the concatenation of
                                                    Avalanche's plugin in place of the ratio r)

After the solver has finished the task, the generator trains on it (Avalanche's
``TrainGeneratorAfterExpPlugin`` with ``VAETraining``): ``generator_epochs`` epochs (M2I: 16) of
the suite's minibatches, each extended from the second task on by ``replay_size`` samples of G'
(its own ``GenerativeReplayPlugin``), so the new generator learns the current task and the old
generator's distribution at once (section 3.1), on

    generator: L = sum_batch ||x^ - x||^2 + 1/2 sum_batch (-1 - logvar + exp(logvar) + mu^2)
                                                   (Avalanche's ``VAE_loss``: summed squared error + KL)

with Adam (lr 0.01, weight decay 1e-4, a fresh optimizer state per task as Avalanche resets it).
G' and S' are frozen copies taken when the task starts (eval mode: BatchNorm on running statistics).

The VAE is Avalanche's ``MlpVAE(shape, nhid=16)``: encoder D-400 (BatchNorm, LeakyReLU) -128
(BatchNorm, ReLU) -> (mu, logvar) of ``latent_dim`` dims; decoder latent-64-128-256 (each with
BatchNorm and ReLU) -D, a sigmoid, then MNIST's normalisation (x - 0.1307) / 0.3081 whatever the
dataset (generated inputs lie in [-0.42, 2.82]); reparameterisation z = mu + eps * 0.5 exp(logvar)
(Avalanche's sigma, not the Gaussian's exp(logvar / 2)). These quirks are Avalanche's and are kept.

Deliberate differences from Avalanche:
- ``MlpVAE``'s unused classification head (never in the loss) is left out.
- Noise (latent samples, reparameterisation) comes from the method's seeded generator, not the
  global RNG, so snapshots replay exactly; the replayed inputs carry no graph into G'.
- ``replay_labels = "seen"`` labels the replay by S''s argmax over the classes seen before the task
  (Shin's S' only knows the old tasks) instead of all outputs (Avalanche's, the default).
"""
import copy
import math

import torch
from torch import nn

import clharness as clh
from clharness.toolkit.training import NEG, OPTIMIZER_SPACE, SupervisedMethod, Trainer, make_optimizer

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081   # Avalanche's VAEMLPDecoder normalises every output with these


class VAE(nn.Module):
    """Avalanche 0.2.1's ``MlpVAE`` over inputs of ``input_shape`` (see the module docstring)."""

    def __init__(self, input_shape, latent: int = 16):
        super().__init__()
        self.input_shape, self.latent = tuple(input_shape), latent
        d = math.prod(input_shape)
        self.encoder = nn.Sequential(nn.Flatten(), nn.Linear(d, 400), nn.BatchNorm1d(400), nn.LeakyReLU(),
                                     nn.Linear(400, 128), nn.BatchNorm1d(128), nn.ReLU())
        self.mean, self.logvar = nn.Linear(128, latent), nn.Linear(128, latent)
        hidden = []
        for a, b in ((latent, 64), (64, 128), (128, 256)):
            hidden += [nn.Linear(a, b), nn.BatchNorm1d(b), nn.ReLU()]
        self.decoder = nn.Sequential(*hidden, nn.Linear(256, d), nn.Sigmoid())

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return (self.decoder(z).view(len(z), *self.input_shape) - MNIST_MEAN) / MNIST_STD

    def loss(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Avalanche's ``VAE_loss`` on ``MlpVAE.forward``: squared error and KL, summed over the batch."""
        h = self.encoder(x)
        mean, logvar = self.mean(h), self.logvar(h)
        eps = torch.randn(mean.shape, generator=generator).to(mean.device, mean.dtype)
        z = mean + eps * (0.5 * torch.exp(logvar))     # Avalanche's sampling: sigma = 0.5 exp(logvar)
        recon = (self.decode(z).float() - x.float()).pow(2).sum()
        kl = 0.5 * (-1 - logvar + logvar.exp() + mean.pow(2)).float().sum()
        return recon + kl

    @torch.no_grad()
    def generate(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``n`` samples: decode z ~ N(0, I)."""
        device = next(self.parameters()).device
        z = torch.randn(n, self.latent, generator=generator).to(device)
        return self.decode(z)


class GenerativeReplay(SupervisedMethod):
    name = "generative_replay"
    version = "2"   # 2: Avalanche's generator (BatchNorm, sigmoid, its sigma, summed loss, Adam 0.01, 16 epochs after the solver), all-output labels
    paper = "Shin, Lee, Kim & Kim, Continual Learning with Deep Generative Replay, NeurIPS 2017"
    reference = "ContinualAI/avalanche: avalanche/training/plugins/generative_replay.py"
    deviations = (
        "Avalanche 0.2.1's generator as the M2I authors ran it (MlpVAE, VAE_loss, Adam 0.01, 16 epochs after "
        "the solver), its sigma = 0.5 exp(logvar) and MNIST output normalisation included",
        "MlpVAE's unused classification head left out; noise from the method's seeded generator",
        "replay_labels='seen': the previous solver's argmax over the classes seen before the task (option; "
        "default all outputs, as Avalanche)",
    )
    settings = frozenset({clh.Setting.CLASS_IL, clh.Setting.TASK_IL})
    hparams = {**OPTIMIZER_SPACE,
               "replay_size": clh.Int(1, 4096, default=200),      # generated samples per step (M2I Table 9)
               "latent_dim": clh.Int(2, 512, default=16),          # Avalanche MlpVAE nhid (M2I: 16)
               "generator_lr": clh.Float(1e-5, 1e-1, default=1e-2, log=True),     # M2I's Adam lr
               "generator_weight_decay": clh.Float(0.0, 1e-2, default=1e-4),      # M2I's Adam weight decay
               "generator_epochs": clh.Int(1, 1000, default=16),                  # M2I's VAETraining epochs
               "replay_labels": clh.Choice(["all", "seen"])}

    def __init__(self, context, **hparams):
        super().__init__(context, **hparams)
        self.generator = VAE(context.input_shape, self.hp["latent_dim"]).to(context.device)
        self.previous_generator: VAE | None = None     # G' and S': frozen at the start of each task
        self.previous_solver: nn.Module | None = None
        self.previous_classes: list[int] = []
        self.gen = torch.Generator().manual_seed(context.seed)   # replay and VAE noise: snapshots replay exactly

    def replay(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``n`` samples of G', labelled by S' (argmax over all outputs, or the classes seen before)."""
        x = self.previous_generator.generate(n, self.gen)
        with torch.no_grad():
            logits = self.previous_solver(x)
        if self.hp["replay_labels"] == "seen":
            seen = torch.zeros(logits.shape[1], dtype=torch.bool, device=logits.device)
            seen[self.previous_classes] = True
            logits = logits.masked_fill(~seen, NEG)
        return x, logits.argmax(1)

    def learn(self, experience):
        if self.labels.seen:     # a trained scholar exists: freeze copies to replay from
            self.previous_generator = copy.deepcopy(self.generator).eval().requires_grad_(False)
            self.previous_solver = copy.deepcopy(self.model).eval().requires_grad_(False)
            self.previous_classes = list(self.labels.seen)
        self.labels.add(experience)
        n = self.hp["replay_size"]
        solver = Trainer.for_method(self)
        self.model.train()
        for x, y in experience.batches(epochs=self.context.epochs):
            if self.previous_generator is not None:
                xr, yr = self.replay(n)
                x, y = torch.cat([x, xr]), torch.cat([y, yr])
            solver.step(self.loss, x, y)
        solver.check()
        self.train_generator(experience)

    def train_generator(self, experience):
        """The generator on the task just learned, after the solver (Avalanche's VAETraining)."""
        opt = make_optimizer(self.generator.parameters(), "adam", self.hp["generator_lr"],
                             weight_decay=self.hp["generator_weight_decay"])
        trainer = Trainer(self.name, opt, self.context)
        self.generator.train()
        for x, _ in experience.batches(epochs=self.hp["generator_epochs"]):
            if self.previous_generator is not None:
                x = torch.cat([x, self.previous_generator.generate(self.hp["replay_size"], self.gen)])
            trainer.step(self.generator.loss, x, self.gen)
        trainer.check()
