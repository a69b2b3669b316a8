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

Fisher (``afec_fisher``): the reference's ``utils.fisher_matrix_diag`` (and ``_emp`` for the
expanded model), by default: the model in train mode, the task's data in order in minibatches of
20, each minibatch's gradient of the plain mean cross-entropy (the criterion passed in is replaced
by ``CrossEntropyLoss()``: no EWC or forgetting term in it) squared and multiplied by 20 (also for
a shorter last minibatch), the sum divided by the number of samples:
F = (20 / N) sum_b (d CE_b / d theta)^2. Train mode means BatchNorm on batch statistics, its
running statistics moved by this pass, and dropout on, as in the reference. ``"per-sample"``: the
empirical Fisher of the paper's derivation, the mean of per-sample squared gradients of
log p(y|x) in eval mode (as ``methods/ewc.py``); for independent per-sample gradients the
reference's is about the same where they disagree and up to 20x larger where they agree.

Deliberate differences from the reference:
- one head over all classes, penalised like every other parameter (the reference's multi-head
  networks exclude their per-task heads, ``'last'``, from both terms); the main model's
  cross-entropy (and its Fisher's) is over all seen classes in class-incremental settings
  (``TaskLabels``), the expanded model's over the new task's classes (the reference's task head);
- the expanded model trains all its epochs before the main model (theta*_e is the trained expanded
  model, as the paper defines it); the reference interleaves one epoch of each and recomputes F_e
  after every expanded epoch (one Fisher per task here instead of one per epoch);
- no validation split: no best-epoch restore and no learning-rate decay on plateaus;
- the Fisher's minibatches are the un-augmented training inputs (the reference has no augmentation).
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


REFERENCE_FISHER_BATCH = 20   # the reference's fisher_matrix_diag(..., sbatch=20)


def reference_fisher(model, experience, mask=lambda logits, y: logits, sbatch: int = REFERENCE_FISHER_BATCH):
    """The reference's ``fisher_matrix_diag``: train mode, minibatches of ``sbatch`` in order,
    (sbatch / N) sum_b (d mean-CE_b / d theta)^2 (see the module docstring)."""
    model.train()
    params = {k: p for k, p in model.named_parameters() if p.requires_grad}
    fisher = {k: torch.zeros_like(p) for k, p in params.items()}
    n = 0
    for x, y in experience.batches(batch_size=sbatch, shuffle=False, augment=False):
        with torch.enable_grad():
            loss = F.cross_entropy(mask(model(x).float(), y), y)
            grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
        for k, g in zip(params, grads):
            if g is not None:
                fisher[k] += sbatch * g.detach().pow(2)
        n += len(y)
    return {k: f / max(n, 1) for k, f in fisher.items()}


class AFEC(SupervisedMethod):
    name = "afec"
    version = "2"   # 2: the reference's Fisher (train mode, minibatches of 20, x20), not per-sample
    paper = ("Wang, Zhang, Jia, Li, Bao, Ma, Zhu & Zhong, AFEC: Active Forgetting of Negative Transfer "
             "in Continual Learning, NeurIPS 2021")
    reference = "lywang3081/AFEC: approaches/afec_ewc.py"
    deviations = (
        "one head over all classes, penalised like the rest (the reference's per-task heads 'last' are "
        "excluded from both terms)",
        "the expanded model trains all its epochs before the main model; one expanded Fisher per task "
        "(the reference interleaves epochs and recomputes it every epoch)",
        "no validation split: no best-epoch restore, no learning-rate decay on plateaus",
        "afec_fisher='per-sample': the per-sample empirical Fisher in eval mode is an option; the default "
        "is the reference's minibatch Fisher",
    )
    hparams = {**optimizer_space(lr=1e-3, optimizer="adam"),
               "ewc_lambda": clh.Float(1.0, 1e7, default=1e4, log=True),   # lambda (old tasks)
               "forget_lambda": clh.Float(0.0, 1e4, default=1.0),          # lambda_e (expanded model)
               "afec_fisher": clh.Choice(["reference", "per-sample"])}
    # CLDyB B.3 selection space (clharness/engine/hparam_selection.py; GTEP's "method" reading too): the
    # lambda (--lamb) and lambda_e (--lamb_emp) of lywang3081/AFEC's README.md runs of afec_ewc:
    # --lamb 10000 (split_cifar100, our default), 25000 (split_cifar10_100) or 40000 (split_cifar100_SC)
    # with --lamb_emp 1 (our default); its large-scale runs (CUB200, ImageNet) take --lamb_emp 0.001.
    # The lr stays at arguments.py's 0.001 (never varied there). 6 candidates.
    tuning_space = {"ewc_lambda": clh.Choice([10000.0, 25000.0, 40000.0]),
                    "forget_lambda": clh.Choice([0.001, 1.0])}

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
            self.expanded_fisher = self.task_fisher(self.expanded, experience,
                                                    lambda logits, y: self.labels.mask_current(logits))
            self.expanded_anchor = {k: p.detach().clone() for k, p in self.expanded.named_parameters()}
        self.fit(experience.batches(epochs=self.context.epochs))
        # the old-task Fisher: running average over tasks (the reference's merge), anchor = weights now
        new = self.task_fisher(self.model, experience, self.labels.mask)
        t = self.tasks_done
        self.fisher = {k: (f + t * self.fisher[k]) / (t + 1) if t else f for k, f in new.items()}
        self.anchor = {k: p.detach().clone() for k, p in self.model.named_parameters()}
        self.tasks_done += 1

    def task_fisher(self, model, experience, mask):
        if self.hp["afec_fisher"] == "per-sample":
            return empirical_fisher(model, experience.batches(shuffle=False), mask)
        return reference_fisher(model, experience, mask)
