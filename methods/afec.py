"""AFEC, active forgetting with an expanded parameter space (Wang et al. 2021, "AFEC: Active forgetting
of negative transfer in continual learning", NeurIPS; reference: lywang3081/AFEC
``approaches/afec_ewc.py``).

EWC protects the old tasks' parameters; AFEC adds a second quadratic term that pulls the main
model towards an expanded model trained on the new task alone, weighted by that model's Fisher,
so the main model actively forgets old knowledge that would hinder the new task. The main
model minimises the paper's AFEC objective (its section 4, the Fisher approximation of its Bayesian
derivation; equation numbers not cited: the paper text was not available offline, the code was)

    L_B(theta) + lambda/2 sum_i F_A,i (theta_i - theta*_A,i)^2 + lambda_e/2 sum_i F_e,i (theta_i - theta*_e,i)^2

with theta*_A, F_A the weights after the previous task and the old tasks' Fisher, theta*_e, F_e the
expanded model's weights and Fisher on the new task. With lambda_e = 0 it is EWC.

Schedule: the expanded model starts as a copy of the initial main model and is never reset (it
keeps training task after task, as in the reference's ``train``); on each task it first trains on
the new task (plain cross-entropy over the new task's classes, the reference's per-task head), its
Fisher is computed, then the main model trains on the objective above (both terms only from the
second task on, as the reference). After each task the old-task Fisher becomes the
running average F_A <- (F_new + t F_A) / (t + 1) (the reference's merge) and theta*_A the weights.

Defaults: the reference's README for CIFAR-100: Adam lr 1e-3, lambda 1e4, lambda_e 1.

Deliberate differences from the reference:
- the Fisher is the mean of per-sample squared gradients of log p(y|x) (as ``methods/ewc.py``); the
  reference squares minibatch gradients of the training criterion (which includes the EWC term);
- one head over all classes, penalised like every other parameter (the reference's multi-head
  networks exclude their per-task heads, ``'last'``, from both terms); the main model's
  cross-entropy is over all seen classes in class-incremental settings (``TaskLabels``);
- the expanded model trains all its epochs before the main model (theta*_e is the trained expanded
  model, as the paper defines it); the reference interleaves one epoch of each and recomputes F_e
  after every expanded epoch (one Fisher per task here instead of one per epoch);
- no validation split: no best-epoch restore and no learning-rate decay on plateaus.
"""
import copy

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

import clharness as clh
from clharness.toolkit.training import SupervisedMethod, Trainer, anchored_penalty, optimizer_space


@torch.no_grad()
def empirical_fisher(model, batches, mask=lambda logits, y: logits):
    """Mean over the samples of squared per-sample gradients of log p(y|x) (true labels); ``mask``
    selects the competing logits (TaskLabels)."""
    model = model.eval()
    params = {k: p.detach() for k, p in model.named_parameters() if p.requires_grad}
    buffers = dict(model.named_buffers())

    def nll(p, x, y):
        logits = functional_call(model, (p, buffers), (x[None],))
        return F.cross_entropy(mask(logits, y[None]), y[None])

    chunk = max(1, 2**28 // sum(p.numel() for p in params.values()))   # ~1 GiB of per-sample grads
    per_sample = vmap(grad(nll), in_dims=(None, 0, 0), chunk_size=chunk)
    fisher, n = {k: torch.zeros_like(p) for k, p in params.items()}, 0
    with torch.enable_grad():
        for x, y in batches:
            for k, g in per_sample(params, x, y).items():
                fisher[k] += g.pow(2).sum(0)
            n += len(y)
    return {k: f / max(n, 1) for k, f in fisher.items()}


class AFEC(SupervisedMethod):
    name = "afec"
    hparams = {**optimizer_space(lr=1e-3, optimizer="adam"),
               "ewc_lambda": clh.Float(1.0, 1e7, default=1e4, log=True),   # lambda (old tasks)
               "forget_lambda": clh.Float(0.0, 1e4, default=1.0)}          # lambda_e (expanded model)

    def __init__(self, context, **hparams):
        super().__init__(context, **hparams)
        self.fisher: dict[str, torch.Tensor] = {}       # F_A, averaged over the finished tasks
        self.anchor: dict[str, torch.Tensor] = {}       # theta*_A
        self.expanded = None                            # the expanded model (theta_e)
        self.expanded_fisher: dict[str, torch.Tensor] = {}
        self.expanded_anchor: dict[str, torch.Tensor] = {}
        self.tasks_done = 0

    def penalty(self):
        """lambda/2 sum F_A (theta - theta*_A)^2 + lambda_e/2 sum F_e (theta - theta*_e)^2."""
        if not self.fisher:
            return 0.0
        ewc = self.hp["ewc_lambda"] / 2 * anchored_penalty(self.model, self.fisher, self.anchor)
        if self.hp["forget_lambda"] == 0:
            return ewc
        forget = anchored_penalty(self.model, self.expanded_fisher, self.expanded_anchor)
        return ewc + self.hp["forget_lambda"] / 2 * forget

    def loss(self, x, y):
        return self.cross_entropy(self.model(x), y) + self.penalty()

    def expanded_loss(self, x, y):
        # the expanded model learns the new task alone (the reference's per-task head)
        return F.cross_entropy(self.labels.mask_current(self.expanded(x)), y)

    def learn(self, experience):
        self.labels.add(experience)
        if self.expanded is None:     # the reference copies the main model before the first task
            self.expanded = copy.deepcopy(self.model)
        # theta*_e: the expanded model trained on the new task; F_e: its Fisher there
        expanded_trainer = Trainer.for_method(self, params=self.expanded.parameters())
        self.expanded.train()
        for x, y in experience.batches(epochs=self.context.epochs):
            expanded_trainer.step(self.expanded_loss, x, y)
        expanded_trainer.check()
        if self.fisher:               # only used from the second task on
            self.expanded_fisher = empirical_fisher(self.expanded, experience.batches(shuffle=False),
                                                    lambda logits, y: self.labels.mask_current(logits))
            self.expanded_anchor = {k: p.detach().clone() for k, p in self.expanded.named_parameters()}
        self.fit(experience.batches(epochs=self.context.epochs))
        # the old-task Fisher: running average over tasks (the reference's merge), anchor = weights now
        new = empirical_fisher(self.model, experience.batches(shuffle=False), self.labels.mask)
        t = self.tasks_done
        self.fisher = {k: (f + t * self.fisher[k]) / (t + 1) if t else f for k, f in new.items()}
        self.anchor = {k: p.detach().clone() for k, p in self.model.named_parameters()}
        self.tasks_done += 1
