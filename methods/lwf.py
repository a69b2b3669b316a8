"""Learning without Forgetting (Li & Hoiem 2017)."""
import copy
import warnings

import torch
import torch.nn.functional as F

import clharness as clh
from clharness.toolkit.training import SupervisedMethod, optimizer_space

RENAMED = {"avalanche": "avalanche-0.2.1"}   # lwf_loss's old spelling -> its name now


class LossChoice(clh.Choice):
    """``lwf_loss``'s values; the old spelling "avalanche" is accepted and read as "avalanche-0.2.1"
    (with a FutureWarning), so the record holds the new name."""

    def check(self, name, value):
        if value in RENAMED:
            warnings.warn(f"lwf {name}={value!r} is Avalanche 0.2.1's LwF and is now spelled {RENAMED[value]!r} "
                          f"(Avalanche 0.6's is 'avalanche-0.6'); read as {RENAMED[value]!r}", FutureWarning,
                          stacklevel=2)
            value = RENAMED[value]
        return super().check(name, value)


class LwF(SupervisedMethod):
    """Cross-entropy on the new task plus distillation of the previous model's outputs for the old
    classes (one softmax over all old classes when the task id is hidden, one per old task when given).

    ``lwf_loss = "avalanche-0.2.1"`` (old spelling "avalanche", still accepted): Avalanche 0.2.1's LwF
    (LwFPlugin), which the M2I authors' code runs (Table 9: alpha 2, temperature 1): plain
    cross-entropy over all outputs plus alpha * KL(softmax(old[:, U] / T) || softmax(new[:, U] / T))
    (kl_div, batchmean) over the units U of its ``prev_classes["0"]``, set after each experience
    (``after_training_exp``). That entry is rewritten after every experience with task label 0 (the
    plugin compares int task labels with the str key "0"), so while task t trains, U is the classes of
    the latest finished experience (t - 1) in class-incremental runs and the first experience's in
    task-incremental ones (the ten shared labels under the authors' shared head).

    ``lwf_loss = "avalanche-0.6"``: Avalanche 0.6's LearningWithoutForgetting, the same loss with
    ``prev_classes_by_task[0]`` the union of every finished experience of task label 0: all old classes
    in class-incremental runs, the first experience's in task-incremental ones (a single-head model
    is distilled through task label 0 only).

    In both, the teacher is the copied model in train mode, as Avalanche's deepcopy leaves it
    (BatchNorm on batch statistics)."""
    name = "lwf"
    ensemble = True   # seeds train as one batched model (engine.ensemble): members equal their solo runs (with SGD only)
    ensemble_state = ("old_model", "old_groups", "avalanche_units")   # what its loss reads per member

    @staticmethod
    def ensemble_solo_when(hp) -> str | None:
        """LwF under Adam is chaotic at the rounding level. At a task's first step the student equals its
        teacher, so the distillation's gradient is rounding noise (quickstart: 411 components with
        0 < |g| < 1e-8, against 0-15 at other steps), and Adam moves each such weight by ~lr (g / (|g| + eps)).
        Solo, a 1e-7 relative perturbation of the weights after task 1 moves the run's own accuracy matrix by
        0.018-0.056 (seeds 0-2), and by 0 once gradients under 1e-8 are zeroed; the batched gradients differ
        from solo's by ~1e-9 (vmap's backward sums in another order), and members ended 0.028-0.045 from
        their solo runs. With SGD (no such gain) the members equal their solo runs."""
        if hp.get("optimizer", "sgd") == "sgd":
            return None
        return (f"lwf with {hp.get('optimizer')!r}: Adam turns the distillation's rounding noise at each task's "
                "first step into weight changes, and the run is chaotic at that level (members measured 0.028-0.045 "
                "from their solo accuracy matrices on the quickstart, past the floor of 1e-4); lwf with "
                "optimizer='sgd' is batched")

    paper = "Li & Hoiem, Learning without Forgetting, TPAMI 2017"
    reference = "ContinualAI/avalanche: avalanche/training/regularization.py"
    deviations = (
        "lwf_loss='li-hoiem' (default) follows the paper: CE on the new task's outputs + lambda * "
        "Li & Hoiem's distillation (T = 2) per old softmax group",
        "lwf_loss='avalanche-0.2.1' / 'avalanche-0.6': Avalanche's LwF of that release (CE over all "
        "outputs + alpha * KL on the distilled units, teacher in train mode)",
    )
    hparams = {**optimizer_space(lr=1e-3, optimizer="adam"),
               "lwf_lambda": clh.Float(0.0, 100.0, default=1.0),
               "temperature": clh.Float(0.5, 10.0, default=2.0),
               "lwf_loss": LossChoice(["li-hoiem", "avalanche-0.2.1", "avalanche-0.6"])}
    later_hparams = {"lwf_loss": "li-hoiem"}   # added later: stored runs keep their keys
    # GTEP search sets (its paper's table 4: T (KD) and lambda (KD) of the distillation methods it
    # covers, iCaRL/BiC/WA/FOSTER); the general parameters come from clharness.hparams.TABLE4/5.
    tuning_space = {"temperature": clh.Choice([0.5, 1.0, 1.5, 2.0, 2.5]),
                    "lwf_lambda": clh.Choice([0.5, 1.0, 1.5, 2.0, 3.0])}

    def __init__(self, context, **hparams):
        super().__init__(context, **hparams)
        self.old_model = None
        self.old_groups: list[list[int]] = []   # old classes, grouped by softmax
        self.avalanche_units: list[int] = []     # Avalanche's prev_classes["0"], after each experience

    def loss(self, x, y):
        if self.hp["lwf_loss"] != "li-hoiem":
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
        """Avalanche: CE over all outputs + alpha * KL on the distilled units (see the class)."""
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
        """Avalanche's prev_classes["0"] (0.2.1) or prev_classes_by_task[0] (0.6) as it stands while a
        task trains: set at the end of each experience (see the class)."""
        return self.avalanche_units

    def learn(self, experience):
        super().learn(experience)
        self.old_groups = [list(t) for t in self.labels.tasks] if self.labels.task_il else [list(self.labels.seen)]
        self.old_model = copy.deepcopy(self.model).requires_grad_(False)
        if self.hp["lwf_loss"] == "li-hoiem":   # Avalanche's copy stays in train mode
            self.old_model.eval()
        # Avalanche's after_training_exp: the classes of task label 0 (the first experience under task
        # labels; every experience without them): 0.2.1 overwrites its entry, 0.6 takes the union
        if not (self.labels.task_il and len(self.labels.tasks) > 1):
            finished = set(experience.classes)
            if self.hp["lwf_loss"] == "avalanche-0.6":
                finished |= set(self.avalanche_units)
            self.avalanche_units = sorted(finished)
