"""BiC: bias correction (Wu et al. 2019, "Large scale incremental learning"), as PyCIL
``models/bic.py`` trains it."""
import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

import clharness as clh
from clharness.toolkit.exemplars import ExemplarLearner, incremental_space, kd_loss, tensor_batches
from clharness.toolkit.training import Trainer


class BiasLayer(nn.Module):
    """The bias correction layer of one task (Wu et al. 2019, eq. 5): q_k = alpha o_k + beta for the
    task's classes k, q_k = o_k for every other class. alpha = 1, beta = 0 at creation (identity)."""

    def __init__(self, classes):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1))
        self.beta = nn.Parameter(torch.zeros(1))
        self.register_buffer("classes", torch.as_tensor(list(classes), dtype=torch.long))

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        corrected = logits.clone()
        corrected[:, self.classes] = self.alpha * logits[:, self.classes] + self.beta
        return corrected


class BiCModel(nn.Module):
    """Backbone, linear head, then one bias layer per task applied in order (PyCIL
    ``IncrementalNetWithBias``); the first task's layer is never trained (no old classes yet)."""

    def __init__(self, classifier: nn.Module):
        super().__init__()
        self.backbone, self.head = classifier.backbone, classifier.head
        self.bias_layers = nn.ModuleList()

    def features(self, x):
        return self.backbone(x)

    def correct(self, logits):
        for layer in self.bias_layers:
            logits = layer(logits)
        return logits

    def forward(self, x):
        return self.correct(self.head(self.backbone(x)))


class BiC(ExemplarLearner):
    """Stage 1 trains backbone and head on the new data plus the exemplars with
    lambda KD + (1 - lambda) CE, lambda = n / (n + m) for n old and m new classes (eq. 4; or
    CE + ``kd_lambda`` KD when ``kd_lambda`` > 0), KD over the old classes at temperature
    ``temperature`` against the previous (bias-corrected) model (eqs. 1-3). From the second task
    on, ``split_ratio`` of the exemplar budget per old class, and as many samples of each new class,
    are held out of stage 1 as a balanced validation set (PyCIL: int(split_ratio * memory_size /
    old classes) per class); stage 2 then trains only this task's bias layer (alpha, beta on the
    new classes' logits, eq. 5) with the cross-entropy of the corrected logits on that set (eq. 6),
    everything else frozen. The memory is then rebuilt by herding.

    Deliberate differences from PyCIL: stage 2 minimises the cross-entropy of the corrected
    logits (eq. 6); PyCIL applies cross-entropy to their softmax (a double softmax); the head
    covers the global classes from the start (unseen classes' logits are left out of the loss and
    predictions); stage 1's training set is shuffled from tensors (the held-out samples must be
    left out), augmented by ``experience.augment`` where the experience has one; the schedule is
    the harness's. Stage 2 runs ``context.epochs`` epochs with the method's optimizer, as PyCIL,
    with the network in train mode (``stage2_mode="train"``, PyCIL ``_run``: BatchNorm normalises
    with the validation batches' statistics and updates its running ones) or in eval mode
    (``stage2_mode="eval"``: frozen statistics, the paper's "frozen" network read literally)."""
    name = "bic"
    paper = "Wu, Chen, Wang, Ye, Liu, Guo, Fu, Large Scale Incremental Learning, CVPR 2019"
    reference = "G-U-N/PyCIL: models/bic.py"
    deviations = (
        "stage 2: cross-entropy of the corrected logits (eq. 6); PyCIL applies it to their softmax",
        "head over the global classes from the start, unseen classes masked (PyCIL grows it)",
        "stage 1's training set shuffled from tensors (the held-out samples left out)",
        "learning-rate schedule: the harness's",
        "stage2_mode='eval' option: BatchNorm statistics frozen in stage 2",
    )
    version = "3"  # 3: GTEP Table 3 first task with the sampled scheduler kind (issue 30 item 1); 2: stage 2 in train mode (PyCIL)
    hparams = {**{k: v for k, v in incremental_space().items() if k != "rehearsal"},   # its own split
               "temperature": clh.Float(0.5, 10.0, default=2.0),
               "kd_lambda": clh.Float(0.0, 10.0, default=0.0),
               "split_ratio": clh.Float(0.01, 0.5, default=0.1),
               # the network's mode in stage 2: "train" (PyCIL: BatchNorm normalises with the batch's
               # statistics and updates its running ones; no weight but alpha, beta changes) or "eval"
               "stage2_mode": clh.Choice(["train", "eval"], default="train")}
    # GTEP Table 4: T (KD), lambda (KD) ("lambda_kd = 0": the adaptive rule) and split ratio of BiC.
    tuning_space = {"temperature": clh.Choice([0.5, 1.0, 1.5, 2.0, 2.5]),
                    "kd_lambda": clh.Choice([0.5, 1.0, 1.5, 2.0, 3.0]),
                    "split_ratio": clh.Choice([0.05, 0.1, 0.15, 0.2, 0.3])}

    def __init__(self, context, **hparams):
        super().__init__(context, **hparams)
        self.model = BiCModel(self.model)

    def loss(self, x, y):
        logits = self.model(x)
        ce = F.cross_entropy(self.restrict(logits, y), y)
        if self.old_model is None or not self.known:
            return ce
        kd = kd_loss(logits[:, self.known], self.old_model(x)[:, self.known], self.hp["temperature"])
        if self.hp["kd_lambda"] == 0:   # eq. 4: lambda = n / (n + m)
            lam = len(self.known) / len(self.labels.seen)
            return lam * kd + (1 - lam) * ce
        return ce + self.hp["kd_lambda"] * kd

    def split(self, experience):
        """(train x, train y), (validation x, validation y): per class, a random held-out part."""
        x, y = experience.tensors()
        mx, my = self.memory.tensors()
        if len(my):
            x, y = torch.cat([x, mx.to(x.device)]), torch.cat([y, my.to(y.device)])
        per_class = int(self.hp["split_ratio"] * self.context.memory_size / len(self.known)) if self.known else 0
        held = torch.zeros(len(y), dtype=torch.bool, device=y.device)
        for c in y.unique().tolist():
            rows = (y == c).nonzero().squeeze(1)
            take = rows[torch.randperm(len(rows), generator=self.gen)[:min(per_class, len(rows) - 1)].to(y.device)]
            held[take] = True
        return (x[~held], y[~held]), (x[held], y[held])

    def learn(self, experience):
        self.known = list(self.labels.seen)
        self.labels.add(experience)
        self.seen_mask[list(experience.classes)] = True
        new = [c for c in experience.classes if c not in self.known]
        self.model.bias_layers.append(BiasLayer(new).to(self.context.device))
        (tx, ty), (vx, vy) = self.split(experience)
        bs = self.context.batch_size
        augment = getattr(experience, "augment", None)
        # stage 1: everything but the bias layers
        self.labels.epoch_steps = math.ceil(len(ty) / bs)
        params = [p for n, p in self.model.named_parameters() if not n.startswith("bias_layers.")]
        trainer, epochs = self.task_trainer(params)
        self.fit(tensor_batches(tx, ty, bs, epochs, self.gen, augment), self.loss, trainer=trainer)
        # stage 2: this task's bias layer on the held-out balanced set
        if self.known and len(vy):
            self.correct_bias(vx, vy, augment)
        self.update_memory(experience)
        self.old_model = copy.deepcopy(self.model).eval().requires_grad_(False)

    def correct_bias(self, vx, vy, augment=None):
        """Eq. 6: L_b = -sum_k delta_{y=k} log softmax(q)_k over the validation set, only alpha and
        beta of the newest bias layer trained. The network runs in ``stage2_mode``: train mode (PyCIL
        ``_run`` calls ``train()`` every epoch: BatchNorm uses and tracks the validation batches'
        statistics) or eval mode (running statistics, untouched)."""
        layer = self.model.bias_layers[-1]
        bs = self.context.batch_size
        self.labels.epoch_steps = math.ceil(len(vy) / bs)
        trainer = Trainer.for_method(self, layer.parameters())
        self.model.train(self.hp["stage2_mode"] == "train")
        def loss(x, y):
            with torch.no_grad():
                raw = self.model.head(self.model.backbone(x))
            return F.cross_entropy(self.restrict(self.model.correct(raw), y), y)
        for x, y in tensor_batches(vx, vy, bs, self.context.epochs, self.gen, augment):
            trainer.step(loss, x, y)
        trainer.check()
