"""iCaRL: incremental classifier and representation learning (Rebuffi et al. 2017), as PyCIL
``models/icarl.py`` trains it."""
import torch.nn.functional as F

import clharness as clh
from clharness.toolkit.exemplars import ExemplarLearner, incremental_space, kd_loss


class ICaRL(ExemplarLearner):
    """Each task trains on the new data plus a herded exemplar memory (Algorithms 2-3) with
    cross-entropy over the classes seen so far plus ``kd_lambda`` times the distillation of the
    previous model's old-class outputs at temperature ``temperature`` (PyCIL: T = 2, weight 1).
    After training, every class keeps m = memory_size / classes-seen exemplars: old classes their
    first m (Algorithm 5), new classes m chosen by herding (Algorithm 4). Predictions use the
    nearest mean of exemplars (Algorithm 1, ``classifier="nme"``, default) or the network's own
    outputs (``classifier="cnn"``; PyCIL reports both).

    Deliberate differences from the paper (all as PyCIL does it):
    - the representation loss is softmax cross-entropy + KD at T = 2 (PyCIL), not the paper's
      per-class sigmoid binary cross-entropy with sigmoid distillation targets (Algorithm 3);
    - the head covers the global classes from the start; logits of classes not seen yet are left
      out of the loss and get a very low finite value in predictions (PyCIL grows its head);
    - the learning-rate schedule is the harness's (``scheduler``; PyCIL: MultiStepLR [80, 120] of
      170 epochs, and its init_* schedule on the first task when the suite gives
      ``first_task_train``).

    Training data per epoch: one shuffled pass over the task's data and the exemplars at the batch
    size, ceil((N + M) / B) steps (``rehearsal="joint"``, PyCIL's DataLoader over ``appendent``);
    ``rehearsal="balanced"`` joins each of the task's batches with a share of the exemplars instead
    (``clharness.toolkit.exemplars.rehearsal_batches``)."""
    name = "icarl"
    paper = ("Rebuffi, Kolesnikov, Sperl, Lampert, iCaRL: Incremental Classifier and Representation Learning, "
             "CVPR 2017")
    reference = "G-U-N/PyCIL: models/icarl.py"
    deviations = (
        "softmax cross-entropy + KD at T = 2 (PyCIL), not the paper's sigmoid binary cross-entropy",
        "head over the global classes from the start, unseen classes masked (PyCIL grows it)",
        "learning-rate schedule: the harness's (PyCIL: MultiStepLR [80, 120] of 170 epochs)",
        "rehearsal='balanced' option: exemplars in a fixed share of the task's batches",
    )
    version = "3"  # 3: GTEP Table 3 first task with the sampled scheduler kind (issue 30 item 1); 2: one shuffled loader over task data + exemplars (PyCIL's optimizer steps)
    hparams = {**incremental_space(),
               "temperature": clh.Float(0.5, 10.0, default=2.0),
               "kd_lambda": clh.Float(0.0, 10.0, default=1.0),
               "classifier": clh.Choice(["nme", "cnn"], default="nme")}
    # GTEP Table 4: T (KD) for iCaRL/BiC/WA/FOSTER; lambda (Aux) for iCaRL/PODNet/DER/MEMO, here
    # the weight of iCaRL's distillation term (GTEP's original setting "T_2_lambda_aux_1").
    tuning_space = {"temperature": clh.Choice([0.5, 1.0, 1.5, 2.0, 2.5]),
                    "kd_lambda": clh.Choice([0.5, 1.0, 1.5, 2.0, 3.0])}

    def loss(self, x, y):
        logits = self.model(x)
        loss = F.cross_entropy(self.restrict(logits, y), y)
        if self.old_model is not None and self.known:
            old = self.old_model(x)[:, self.known]
            loss = loss + self.hp["kd_lambda"] * kd_loss(logits[:, self.known], old, self.hp["temperature"])
        return loss
