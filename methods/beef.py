"""BEEF: Bi-Compatible Class-Incremental Learning via Energy-Based Expansion and Fusion (Wang, Zhou,
Ye & Zhan, ICLR 2023), the "iso" variant PyCIL ships. Reference implementation read: PyCIL
``models/beef_iso.py``, ``utils/inc_net.py`` (``BEEFISONet``, ``BiasLayer``) and ``exps/beef.json``."""
import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

import clharness as clh
from clharness.toolkit.exemplars import (ExemplarMemory, RehearsalLabels, rehearsal_batches, rehearsal_space,
                                         tensor_batches)
from clharness.toolkit.expansion import (BranchNet, clone_module, method_rng, phase_trainer, seen_logits,
                                 simple_linear, update_memory)
from clharness.toolkit.training import SupervisedMethod, optimizer_space


class BiasLayer(nn.Module):
    """PyCIL ``BiasLayer``: x -> (alpha + 1) x + beta, alpha = beta = 0 at the start."""

    def __init__(self):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(1))
        self.beta = nn.Parameter(torch.zeros(1))

    def forward(self, x, bias: bool = True):
        return (self.alpha + 1) * x + (self.beta if bias else 0)


def sample_negatives(energy_fn, x: torch.Tensor, steps: int = 3, lr: float = 1e-2,
                     noise: float = 1e-3) -> torch.Tensor:
    """PyCIL ``sample_q``: start from the batch rotated by 180 degrees and take ``steps`` SGD steps
    on the input that lower log(sum of the softmax mass on the energy outputs) (``energy_fn``
    returns that scalar), each followed by Gaussian noise of std ``noise``."""
    z = torch.rot90(x.detach(), 2, (2, 3)).clone()
    for _ in range(steps):
        z.requires_grad_(True)
        (grad,) = torch.autograd.grad(energy_fn(z), [z])
        z = (z.detach() - lr * grad + noise * torch.randn_like(z)).detach()
    return z


class BEEF(SupervisedMethod):
    """Per task after the first, two phases; the network keeps every backbone (PyCIL
    ``is_compress: false``), like DER.

    Expansion: a new backbone F_t (initialised from the first backbone, old ones frozen) is trained
    with its own head over t + |Y_t| outputs: one *backward prototype* per old task (the whole task
    as one class) and the new classes; the old tasks' logits are divided by the logit-alignment
    factor (1.7). An energy term trains *forward prototypes* (one per seen class) to absorb
    negatives: samples made by rotating the batch 180 degrees and descending the energy
    (``sample_negatives``) must be classified as their class's forward prototype, with the columns of
    the batch's own targets neutralised. Loss: CE(aligned logits, task-level targets) +
    energy_weight * CE(energy).

    Fusion: the fused classifier adds, to the old head's logits on the old features, the new
    backbone's backward prototype of each old task (through a per-task ``BiasLayer``,
    (alpha_i + 1) z + beta_i) on that task's classes, and the new head on the new classes. Only the
    bias layers train, with cross-entropy on a class-balanced set (m = memory per class samples of
    each new class plus the exemplars), lr 0.05. The fused classifier is then merged exactly into
    one linear head over the concatenated features (``merge``; PyCIL ``update_fc_after``).

    Deliberate differences:
    - the fused bias is old bias + prototype bias in ``forward`` too (PyCIL's forward writes
      ``fc_bias=+new_fc_bias``, dropping the old head's bias during fusion, while its merge adds
      them); here training and the merged head agree exactly (a test pins it);
    - every frozen backbone stays in eval mode (PyCIL leaves backbones 2..t-1 in train mode, so
      their BatchNorm statistics drift), and the new backbone is in eval mode during fusion;
    - the balanced fusion set draws from the task's data (PyCIL draws a validation split the same
      way, without holding it out of expansion either);
    - memory: herding with ``memory_size // seen`` per class (PyCIL's BEEF config fixes 20 per class);
    - ``fusion_epochs`` 0 (default) scales PyCIL's 60 fusion to 170 expansion epochs to the suite;
    - the head spans all global ids, unseen ones at a large negative logit (PyCIL: seen only);
    - task-incremental runs (not in the paper) mask the fusion loss to each sample's task; the
      expansion phase is the same as in class-incremental runs.

    Each expansion epoch is one shuffled pass over the task's data and the exemplars at the batch
    size, ceil((N + M) / B) steps (``rehearsal="joint"``, PyCIL's loader over ``appendent``);
    ``rehearsal="balanced"`` joins each of the task's batches with a share of the exemplars.
    """
    name = "beef"
    paper = ("Wang, Zhou, Ye, Zhan, BEEF: Bi-Compatible Class-Incremental Learning via Energy-Based Expansion "
             "and Fusion, ICLR 2023")
    reference = "G-U-N/PyCIL: models/beef_iso.py (exps/beef.json)"
    deviations = (
        "fused bias = old bias + prototype bias in training too (PyCIL's forward drops the old bias)",
        "frozen backbones stay in eval mode; the new one is in eval mode during fusion",
        "the balanced fusion set is drawn from the task's data",
        "memory: one budget over the seen classes (PyCIL's config: 20 per class)",
        "fusion epochs scaled from PyCIL's 60/170 to the suite's epochs unless set",
        "head over the global classes from the start, unseen classes masked (PyCIL grows it)",
        "task-incremental runs mask the fusion loss to each sample's task",
        "rehearsal='balanced' option: exemplars in a fixed share of the task's batches",
    )
    # 2: one shuffled loader over task data + exemplars (PyCIL's optimizer steps); the fusion schedule
    # counts epochs of the balanced set (it counted the expansion's)
    version = "2"
    settings = frozenset({clh.Setting.CLASS_IL, clh.Setting.TASK_IL})
    # PyCIL exps/beef.json: SGD momentum 0.9, lr 0.1, weight decay 5e-4, cosine annealing,
    # energy weight 0.01, logits alignment 1.7; fusion lr 0.05 (beef_iso.py).
    hparams = {**optimizer_space(lr=0.1, momentum=0.9, weight_decay=5e-4),
               "energy_weight": clh.Float(0.0, 1.0, default=0.01),
               "logits_alignment": clh.Float(0.1, 10.0, default=1.7),
               "fusion_lr": clh.Float(1e-4, 1.0, default=0.05, log=True),
               "fusion_epochs": clh.Int(0, 1000, default=0),
               **rehearsal_space()}
    hparams["scheduler"] = clh.Choice(["constant", "steplr", "cosine"], default="cosine")
    # GTEP Table 4: BEEF's energy weight, logit alignment and post-FT (fusion) epochs
    tuning_space = {"energy_weight": clh.Choice([0.001, 0.005, 0.01, 0.02, 0.05]),
                    "logits_alignment": clh.Choice([1.1, 1.4, 1.7, 2.0, 2.3]),
                    "fusion_epochs": clh.Choice([30, 70, 120, 160, 200])}

    def __init__(self, context, **hparams):
        clh.Method.__init__(self, context, **hparams)
        self.model = BranchNet(context.num_classes)
        self.memory = ExemplarMemory(context.memory_size)
        self.labels = RehearsalLabels(context, self.memory, self.hp["rehearsal"])
        self.gen = torch.Generator().manual_seed(context.seed)
        self.seen = torch.zeros(0, dtype=torch.long, device=context.device)
        # exist only while a task is learned
        self.old_head = self.new_head = self.backward = self.forward_protos = None
        self.biases = nn.ModuleList()

    # --- label bookkeeping ------------------------------------------------------------------------
    def positions(self, classes) -> torch.Tensor:
        """Global id -> position in ``classes`` (others -> 0)."""
        table = torch.zeros(self.context.num_classes, dtype=torch.long, device=self.context.device)
        table[list(classes)] = torch.arange(len(classes), device=self.context.device)
        return table

    def task_targets(self, y: torch.Tensor) -> torch.Tensor:
        """Expansion targets: old task index for old classes, t + position for the new classes."""
        t = len(self.labels.tasks) - 1
        table = torch.zeros(self.context.num_classes, dtype=torch.long, device=y.device)
        for i, classes in enumerate(self.labels.tasks[:-1]):
            table[list(classes)] = i
        table[list(self.labels.tasks[-1])] = t + torch.arange(len(self.labels.tasks[-1]), device=y.device)
        return table[y]

    # --- the logits -------------------------------------------------------------------------------
    def train_logits(self, new_feats: torch.Tensor) -> torch.Tensor:
        """The new backbone's head: [backward prototypes of the old tasks, new classes]."""
        logits = self.new_head(new_feats)
        return logits if self.backward is None else torch.cat([self.backward(new_feats), logits], 1)

    def fused_logits(self, feats: list[torch.Tensor]) -> torch.Tensor:
        """Old head on the old features plus the new backbone's contribution, over global ids."""
        old, new = torch.cat(feats[:-1], 1), feats[-1]
        logits = self.old_head(old)
        back = self.backward(new)
        extra = torch.zeros_like(logits)
        for i, classes in enumerate(self.labels.tasks[:-1]):
            extra[:, list(classes)] = self.biases[i](back[:, i:i + 1])
        extra[:, list(self.labels.tasks[-1])] = self.new_head(new)
        return logits + extra

    def energy_loss(self, x: torch.Tensor, y: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """PyCIL ``get_energy_loss``: negatives of each sample must land on its class's forward prototype."""
        def negative_energy(z):        # eval-mode copy of the network, as PyCIL's frozen copy
            f = self.model.newest_features(z)
            logits = torch.cat([self.train_logits(f), self.forward_protos(f)], 1)
            return torch.log(F.softmax(logits, 1)[:, -self.forward_protos.out_features:].sum())
        self.model.eval()
        z = sample_negatives(negative_energy, x)
        self.model.train()
        f = self.model.newest_features(z)
        train = self.train_logits(f)
        logits = torch.cat([train, self.forward_protos(f)], 1)
        taken = torch.zeros(logits.shape[1], dtype=torch.bool, device=x.device)
        taken[targets] = True
        logits = logits.masked_fill(taken, 1e-9)
        return F.cross_entropy(logits, train.shape[1] + self.positions(self.labels.seen)[y])

    def expansion_loss(self, x, y):
        targets = self.task_targets(y) if self.backward is not None else self.positions(self.labels.tasks[-1])[y]
        logits = self.train_logits(self.model.newest_features(x))
        if self.backward is not None:
            t = self.backward.out_features
            logits = torch.cat([logits[:, :t] / self.hp["logits_alignment"], logits[:, t:]], 1)
        loss = F.cross_entropy(logits, targets)
        if self.hp["energy_weight"]:
            loss = loss + self.hp["energy_weight"] * self.energy_loss(x, y, targets)
        return loss

    def fusion_loss(self, x, y):
        logits = seen_logits(self.fused_logits(self.model.branch_features(x)), self.seen)
        return self.cross_entropy(logits, y)          # task-incremental: masked to the sample's task

    # --- phases -----------------------------------------------------------------------------------
    @torch.no_grad()
    def merge(self) -> None:
        """One linear head over all features equal to the fused classifier (PyCIL ``update_fc_after``)."""
        d, dims = self.model.dims[-1], self.model.out_dim
        head = simple_linear(dims, self.context.num_classes).to(self.context.device)
        head.weight.zero_()
        rows_new = list(self.labels.tasks[-1])
        if self.old_head is not None:
            head.weight[:, :dims - d] = self.old_head.weight
            head.bias.copy_(self.old_head.bias)
            for i, classes in enumerate(self.labels.tasks[:-1]):
                bias_layer = self.biases[i]
                head.weight[list(classes), dims - d:] = bias_layer(self.backward.weight[i], bias=False)
                head.bias[list(classes)] += bias_layer(self.backward.bias[i:i + 1])
        head.weight[rows_new, dims - d:] = self.new_head.weight
        head.bias[rows_new] += self.new_head.bias
        self.model.head = head

    def balanced_set(self, experience, m: int):
        """m random samples of each new class plus the exemplars (PyCIL's fusion split)."""
        x, y = experience.tensors()
        keep = []
        for c in experience.classes:
            idx = (y == c).nonzero().squeeze(1)
            keep.append(idx[torch.randperm(len(idx), generator=self.gen)[:m].to(idx.device)])
        keep = torch.cat(keep)
        mx, my = self.memory.tensors()
        return torch.cat([x[keep], mx.to(x.dtype)]), torch.cat([y[keep], my.to(y.device)])

    def learn(self, experience):
        with method_rng(self.gen, self.context.device):   # snapshots replay new modules' init
            self.learn_task(experience)

    def learn_task(self, experience):
        old = list(self.labels.seen)
        self.labels.add(experience)
        self.seen = torch.tensor(self.labels.seen, device=self.context.device)
        device, k = self.context.device, len(experience.classes)
        if old:
            self.old_head = copy.deepcopy(self.model.head).requires_grad_(False)
            self.model.add_branch(clone_module(self.model.branches[0]), self.model.dims[0])
            self.model.freeze_old()
            self.model.head.requires_grad_(False)      # replaced by ``merge``; unused until then
            self.backward = simple_linear(self.model.dims[-1], len(self.labels.tasks) - 1).to(device)
            self.biases = nn.ModuleList([BiasLayer() for _ in self.labels.tasks[:-1]]).to(device)
        else:
            branch = self.context.make_backbone()
            self.model.add_branch(branch, branch.out_dim)
        self.new_head = simple_linear(self.model.dims[-1], k).to(device)
        self.forward_protos = simple_linear(self.model.dims[-1], len(self.labels.seen)).to(device)
        params = [p for m in (self.model, self.new_head, self.backward, self.forward_protos) if m is not None
                  for p in m.parameters() if p.requires_grad]
        batches = rehearsal_batches(experience, *self.memory.tensors(), self.task_epochs(), self.gen,
                                    self.hp["rehearsal"])
        self.fit(batches, self.expansion_loss, params=params)
        if old:
            epochs = self.hp["fusion_epochs"] or max(1, round(self.context.epochs * 60 / 170))
            x, y = self.balanced_set(experience, self.memory.per_class(len(old)))
            # the fusion schedule (PyCIL: cosine over fusion_epochs) counts epochs of the balanced set
            rehearsal_steps, self.labels.epoch_steps = self.labels.epoch_steps, math.ceil(len(y) / experience.batch_size)
            trainer = phase_trainer(self, self.biases.parameters(), epochs, lr=self.hp["fusion_lr"])
            self.labels.epoch_steps = rehearsal_steps
            augment = getattr(experience, "augment", None)
            batches = tensor_batches(x, y, experience.batch_size, epochs, self.gen, augment)
            self.fit(batches, self.fusion_loss, trainer=trainer)
        self.merge()
        self.old_head = self.new_head = self.backward = self.forward_protos = None
        self.biases = nn.ModuleList()
        update_memory(self, self.memory, experience, len(self.labels.seen))

    @torch.no_grad()
    def predict(self, x, task_id=None):
        if self.model.head is None:          # nothing learned yet: no class is preferred
            return torch.zeros(len(x), self.context.num_classes, device=x.device)
        return seen_logits(super().predict(x, task_id), self.seen)
