"""Learning without Forgetting (Li & Hoiem 2017)."""
import copy

import torch
import torch.nn.functional as F

import clharness as clh
from clharness.toolkit.training import SupervisedMethod, optimizer_space


class LwF(SupervisedMethod):
    """Cross-entropy on the new task plus distillation of the previous model's outputs for the old
    classes (one softmax over all old classes when the task id is hidden, one per old task when given).

    ``lwf_loss = "avalanche"``: Avalanche 0.2.1's LwF (LwFPlugin), which the M2I authors' code runs
    (Table 9: alpha 2, temperature 1): plain cross-entropy over all outputs plus
    alpha * KL(softmax(old[:, U] / T) || softmax(new[:, U] / T)) (kl_div, batchmean) over the units U
    of its ``prev_classes["0"]``. That entry is rewritten after every experience with task label 0
    (the plugin compares int task labels with the str key "0"), so U is the latest experience's
    classes in class-incremental runs and the first experience's in task-incremental ones (the ten
    shared labels under the authors' shared head). The teacher is the copied model in train mode, as
    Avalanche's deepcopy leaves it (BatchNorm on batch statistics)."""
    name = "lwf"
    hparams = {**optimizer_space(lr=1e-3, optimizer="adam"),
               "lwf_lambda": clh.Float(0.0, 100.0, default=1.0),
               "temperature": clh.Float(0.5, 10.0, default=2.0),
               "lwf_loss": clh.Choice(["li-hoiem", "avalanche"])}
    later_hparams = {"lwf_loss": "li-hoiem"}   # added later: stored runs keep their keys
    # GTEP search sets (its paper's table 4: T (KD) and lambda (KD) of the distillation methods it
    # covers, iCaRL/BiC/WA/FOSTER); the general parameters come from clharness.hparams.TABLE4/5.
    tuning_space = {"temperature": clh.Choice([0.5, 1.0, 1.5, 2.0, 2.5]),
                    "lwf_lambda": clh.Choice([0.5, 1.0, 1.5, 2.0, 3.0])}

    def __init__(self, context, **hparams):
        super().__init__(context, **hparams)
        self.old_model = None
        self.old_groups: list[list[int]] = []   # old classes, grouped by softmax

    def loss(self, x, y):
        if self.hp["lwf_loss"] == "avalanche":
            return self.avalanche_loss(x, y)
        logits = self.model(x)
        # L_new: the new task's own outputs only (LwF trains a new head per task; eq. 1-2's ŷ_n)
        loss = F.cross_entropy(self.labels.mask_current(logits), y)
        if self.old_model is not None:
            # Li & Hoiem 2017, eq. 2: L_old = -Σ y'_o log ŷ'_o with y' = softmax(old logits / T) and
            # ŷ' = softmax(new logits / T) over the old classes; total loss L_new + λ_o L_old (T = 2).
            T = self.hp["temperature"]
            with torch.no_grad():
                old = self.old_model(x)
            for group in self.old_groups:
                target = F.softmax(old[:, group].float() / T, dim=1)
                l_old = -(target * F.log_softmax(logits[:, group].float() / T, dim=1)).sum(1).mean()
                loss = loss + self.hp["lwf_lambda"] * l_old
        return loss

    def avalanche_loss(self, x, y):
        """Avalanche 0.2.1: CE over all outputs + alpha * KL on the distilled units (see the class)."""
        logits = self.model(x)
        loss = F.cross_entropy(logits, y)
        if self.old_model is not None:
            T, units = self.hp["temperature"], self.distilled_units
            with torch.no_grad():
                target = F.softmax(self.old_model(x)[:, units].float() / T, dim=1)
            log_p = F.log_softmax(logits[:, units].float() / T, dim=1)
            loss = loss + self.hp["lwf_lambda"] * F.kl_div(log_p, target, reduction="batchmean")
        return loss

    @property
    def distilled_units(self) -> list[int]:
        """Avalanche's prev_classes["0"]: the first experience's classes when task labels are given,
        else the latest experience's."""
        return sorted(self.labels.tasks[0] if self.labels.task_il else self.labels.tasks[-1])

    def learn(self, experience):
        super().learn(experience)
        self.old_groups = [list(t) for t in self.labels.tasks] if self.labels.task_il else [list(self.labels.seen)]
        self.old_model = copy.deepcopy(self.model).requires_grad_(False)
        if self.hp["lwf_loss"] != "avalanche":   # Avalanche's copy stays in train mode
            self.old_model.eval()
