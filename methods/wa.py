"""WA: weight aligning (Zhao et al. 2020, "Maintaining discrimination and fairness in class
incremental learning"), as PyCIL ``models/wa.py`` trains it."""
import torch
import torch.nn.functional as F

import clharness as clh
from clharness.toolkit.exemplars import ExemplarLearner, incremental_space, kd_loss


def align_weights(weight: torch.Tensor, old: list[int], new: list[int]) -> float:
    """Weight aligning, in place (Zhao et al. 2020, sec. 3.3): Norm_old = (||W_1||, ..., ||W_old||),
    Norm_new likewise, gamma = Mean(Norm_old) / Mean(Norm_new), W_new <- gamma W_new; the biases are
    left alone (PyCIL ``IncrementalNet.weight_align``). Returns gamma."""
    if not old or not new:
        raise ValueError("weight aligning needs old and new classes")
    with torch.no_grad():
        gamma = weight[old].norm(dim=1).mean() / weight[new].norm(dim=1).mean()
        weight[new] *= gamma
    return float(gamma)


class WA(ExemplarLearner):
    """Each task trains on the new data plus a herded exemplar memory with
    (1 - lambda) CE + lambda KD, lambda = old classes / seen classes (the adaptive rule, when
    ``kd_lambda`` = 0, the default) or CE + ``kd_lambda`` KD otherwise, KD at temperature
    ``temperature`` over the old classes. After every task but the first the new classes' head
    weights are rescaled so their mean norm equals the old classes' (``align_weights``).
    ``clip_weights`` (default on) keeps the head's weights non-negative after every step, the
    paper's weight clipping (sec. 3.3), which PyCIL leaves out (``clip_weights=False`` is PyCIL).

    Deliberate differences from PyCIL: weight clipping (above, as the paper); the head covers
    the global classes from the start (logits of unseen classes are left out of the loss and
    predictions; PyCIL grows its head); exemplars join every batch in a fixed share
    (``rehearsal_batches``); the schedule is the harness's; PyCIL aligns twice (after training
    and in after_task, the second time with gamma = 1), here once."""
    name = "wa"
    hparams = {**incremental_space(),
               "temperature": clh.Float(0.5, 10.0, default=2.0),
               "kd_lambda": clh.Float(0.0, 10.0, default=0.0),
               "clip_weights": clh.Choice([True, False], default=True)}
    # GTEP Table 4: T (KD) and lambda (KD) of BiC/WA/FOSTER ("lambda_kd = 0": the adaptive rule).
    tuning_space = {"temperature": clh.Choice([0.5, 1.0, 1.5, 2.0, 2.5]),
                    "kd_lambda": clh.Choice([0.5, 1.0, 1.5, 2.0, 3.0])}

    def __init__(self, context, **hparams):
        super().__init__(context, **hparams)
        self.gammas: list[float] = []

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
                self.gammas.append(align_weights(self.model.head.weight, self.known, new))
