"""WA: weight aligning (Zhao et al. 2020, "Maintaining discrimination and fairness in class
incremental learning"), as the authors' code (bwbwzhao/Weight-Aligning) and PyCIL ``models/wa.py``
train it."""
import torch
import torch.nn.functional as F

import clharness as clh
from clharness.toolkit.exemplars import ExemplarLearner, incremental_space, kd_loss


def align_weights(weight: torch.Tensor, old: list[int], new: list[int], p: float = 2,
                  max_gamma: float | None = None) -> float:
    """Weight aligning, in place (Zhao et al. 2020, sec. 3.3): Norm_old = (||W_1||_p, ..., ||W_old||_p),
    Norm_new likewise, gamma = Mean(Norm_old) / Mean(Norm_new), clamped to ``max_gamma`` when given
    (the authors' code: ``clamp_(max=1.0)``), W_new <- gamma W_new. The biases are left alone.
    Returns gamma."""
    if not old or not new:
        raise ValueError("weight aligning needs old and new classes")
    with torch.no_grad():
        gamma = weight[old].norm(p=p, dim=1).mean() / weight[new].norm(p=p, dim=1).mean()
        if max_gamma is not None:
            gamma = gamma.clamp(max=max_gamma)
        weight[new] *= gamma
    return float(gamma)


class WA(ExemplarLearner):
    """Each task trains on the new data plus a herded exemplar memory with
    (1 - lambda) CE + lambda KD, lambda = old classes / seen classes (the adaptive rule, when
    ``kd_lambda`` = 0, the default) or CE + ``kd_lambda`` KD otherwise, KD at temperature
    ``temperature`` over the old classes. After every task but the first the new classes' head
    weights are rescaled by gamma = Mean(||W_old||_p) / Mean(||W_new||_p) (``align_weights``).

    As the authors' code (bwbwzhao/Weight-Aligning, ``main.py`` defaults, ``iLearn.py``), the
    defaults are: p = 1 (``align_norm``; its ``--norm 1``), gamma clamped at 1 (``clamp_gamma``;
    ``alpha.clamp_(max=1.0)``: new classes are only ever scaled down), a head without bias
    (``head_bias=False``; ``nn.Linear(..., bias=args.withbias)``, off), and the head's weights
    kept non-negative after every step (``clip_weights``; its ``--restrict``, the paper's weight
    clipping), and the weight decay of stage t (t = 0 the first task) divided by t + 1
    (``iLearn.py:114``; ``weight_decay_schedule="per-stage"``). PyCIL ``models/wa.py``
    (``IncrementalNet.weight_align``) instead uses L2 norms, no clamp, a head with bias (left
    unscaled), no clipping and a constant weight decay: ``align_norm=2, clamp_gamma=False,
    head_bias=True, clip_weights=False, weight_decay_schedule="constant"``. Each epoch is one shuffled pass over the task's data and
    the exemplars at the batch size (``rehearsal="joint"``, both references; ``"balanced"``: the
    task's batches each joined by a share of the exemplars).

    Deliberate differences: the head covers the global classes from the start (logits of unseen
    classes are left out of the loss and predictions; both references grow it); the aligned weights
    are written into the head (the authors scale the new classes' outputs at test time and let the
    old model's distillation targets see the same scaling: equal predictions and targets, but the
    next task trains from the scaled weights where the authors' code starts a fresh head); the
    schedule is the harness's; PyCIL aligns twice (after training and in after_task, the second time
    with gamma = 1), here once. The paper's text was not available offline: its norm and clamp are
    taken from the authors' code."""
    name = "wa"
    paper = ("Zhao, Xiao, Gan, Zhang, Xia, Maintaining Discrimination and Fairness in Class Incremental "
             "Learning, CVPR 2020")
    reference = "bwbwzhao/Weight-Aligning: iLearn.py, main.py"
    deviations = (
        "head over the global classes from the start, unseen classes masked (references grow it)",
        "aligned weights written into the head; the authors scale outputs and re-create the head per task",
        "learning-rate schedule: the harness's",
        "PyCIL models/wa.py variant (L2 norms, no gamma clamp, FC bias, no clipping) as options",
        "rehearsal='balanced' option: exemplars in a fixed share of the task's batches",
        "weight_decay_schedule='constant' option: PyCIL's constant weight decay (the default 'per-stage' is "
        "the authors' iLearn.py:114, weight_decay / (stage + 1))",
    )
    later_hparams = {"weight_decay_schedule": "constant"}   # added later: stored runs (constant) keep their keys
    # 2: joint rehearsal (one loader over data + exemplars); the authors' L1 norm, gamma <= 1, no FC bias
    version = "3"  # 3: GTEP Table 3 first task with the sampled scheduler kind (issue 30 item 1)
    hparams = {**incremental_space(),
               "temperature": clh.Float(0.5, 10.0, default=2.0),
               "kd_lambda": clh.Float(0.0, 10.0, default=0.0),
               "clip_weights": clh.Choice([True, False], default=True),
               "align_norm": clh.Choice([1, 2], default=1),              # p of ||W||_p (authors 1, PyCIL 2)
               "clamp_gamma": clh.Choice([True, False], default=True),   # gamma <= 1 (authors; PyCIL: no)
               "head_bias": clh.Choice([False, True], default=False),    # FC bias (authors: none; PyCIL: yes)
               # the authors' iLearn.py:114 divides the weight decay by stage + 1 (stage 0: the first task)
               "weight_decay_schedule": clh.Choice(["per-stage", "constant"], default="per-stage")}
    # GTEP Table 4: T (KD) and lambda (KD) of BiC/WA/FOSTER ("lambda_kd = 0": the adaptive rule).
    tuning_space = {"temperature": clh.Choice([0.5, 1.0, 1.5, 2.0, 2.5]),
                    "kd_lambda": clh.Choice([0.5, 1.0, 1.5, 2.0, 3.0])}

    def __init__(self, context, **hparams):
        super().__init__(context, **hparams)
        self.gammas: list[float] = []
        if not self.hp["head_bias"]:          # the authors' FC has no bias: zero and never trained
            with torch.no_grad():
                self.model.head.bias.zero_()
            self.model.head.bias.requires_grad_(False)

    def loss(self, x, y):
        logits = self.model(x)
        ce = F.cross_entropy(self.restrict(logits, y), y)
        if self.old_model is None or not self.known:
            return ce
        kd = kd_loss(logits[:, self.known], self.old_model(x)[:, self.known], self.hp["temperature"])
        if self.hp["kd_lambda"] == 0:   # adaptive: lambda = C_old / (C_old + C_new)
            lam = len(self.known) / len(self.labels.seen)
            return (1 - lam) * ce + lam * kd
        return ce + self.hp["kd_lambda"] * kd

    def task_trainer(self, params=None, first=None):
        trainer, epochs = super().task_trainer(params, first)
        if self.hp["weight_decay_schedule"] == "per-stage":   # iLearn.py:114: weight_decay / (stage + 1)
            stage = len(self.labels.tasks) - 1
            for group in trainer.optimizer.param_groups:
                group["weight_decay"] /= stage + 1
        return trainer, epochs

    def fit(self, batches, loss_fn=None, params=None, trainer=None):
        if not self.hp["clip_weights"]:
            return super().fit(batches, loss_fn, params, trainer)
        head = self.model.head.weight
        def clipped(batches):   # clamp after each step: the step for a batch ran when the next is asked for
            for batch in batches:
                yield batch
                with torch.no_grad():
                    head.clamp_(min=0)
        return super().fit(clipped(batches), loss_fn, params, trainer)

    def after_training(self, experience):
        if self.known:
            new = [c for c in experience.classes if c not in self.known]
            if new:
                self.gammas.append(align_weights(self.model.head.weight, self.known, new, self.hp["align_norm"],
                                                 1.0 if self.hp["clamp_gamma"] else None))
