"""DER: Dynamically Expandable Representation (Yan, Xie & He, CVPR 2021), not Dark Experience
Replay (that is ``derpp``). Reference implementation read: PyCIL ``models/der.py`` and
``utils/inc_net.py`` (``DERNet``)."""
import torch
import torch.nn.functional as F

import clharness as clh
from clharness.toolkit.exemplars import ExemplarMemory, RehearsalLabels, rehearsal_batches, rehearsal_space
from clharness.toolkit.expansion import (BranchNet, align_weights, clone_module, method_rng, seen_logits,
                                 simple_linear, update_memory)
from clharness.toolkit.training import SupervisedMethod, optimizer_space


class DER(SupervisedMethod):
    """One new feature extractor per task; the super-feature is the concatenation of all of them
    (the paper's super-feature u = Phi_t(x) = [Phi_{t-1}(x), F_t(x)]) and the classifier H_t reads
    it. The old extractors are frozen (weights and BatchNorm statistics); the new one starts from
    the previous one's weights (PyCIL ``update_fc``). Loss per step (the paper's
    L_ER = L_{H_t} + lambda_a L_{H_t^a}, without the sparsity term L_S):
    L = CE(H_t(u), y) + lambda_a * CE(H_t^a(F_t(x)), y_a), where the auxiliary classifier H_t^a over
    the new extractor's features has |Y_t| + 1 outputs: the new classes and one for "any old class"
    (y_a = 0 for old samples). Training data: the task's samples plus the exemplar memory.

    Deliberate differences (the first three as PyCIL does):
    - no channel-level masks and pruning, so no sparsity loss L_S: PyCIL omits them too;
    - no classifier-learning stage (the paper's second stage: retraining H_t on a class-balanced
      subset with a temperature): PyCIL replaces it with weight aligning of the new classes' head
      rows after each incremental task (Zhao et al. 2020), which we follow (``weight_align``);
    - the memory is ``context.memory_size`` exemplars shared equally by the seen classes, chosen by
      herding on the concatenated features (PyCIL ``fixed_memory: false``; the paper's memory too);
    - the head spans all ``context.num_classes`` global ids, with the unseen ones masked out of the
      loss and to a large negative logit in ``predict`` (PyCIL's head has only the seen classes);
    - the learning-rate schedule defaults to constant (see ``hparams``), not PyCIL's MultiStepLR.

    Each epoch is one shuffled pass over the task's data and the exemplars at the batch size,
    ceil((N + M) / B) steps (``rehearsal="joint"``, PyCIL's loader over ``appendent``);
    ``rehearsal="balanced"`` joins each of the task's batches with a share of the exemplars.
    """
    name = "der"
    paper = "Yan, Xie, He, DER: Dynamically Expandable Representation for Class Incremental Learning, CVPR 2021"
    reference = "G-U-N/PyCIL: models/der.py"
    deviations = (
        "no channel masks, pruning or sparsity loss (PyCIL omits them too)",
        "weight aligning instead of the paper's classifier-learning stage (as PyCIL)",
        "head over the global classes from the start, unseen classes masked (PyCIL grows it)",
        "learning-rate schedule constant by default (PyCIL: MultiStepLR)",
        "rehearsal='balanced' option: exemplars in a fixed share of the task's batches",
    )
    version = "2"      # 2: one shuffled loader over task data + exemplars (PyCIL's optimizer steps)
    settings = frozenset({clh.Setting.CLASS_IL, clh.Setting.TASK_IL})
    # PyCIL der.py: SGD momentum 0.9, lr 0.1, weight decay 2e-4. Its MultiStepLR ([80, 120, 150] of
    # 170 epochs) is a general hyperparameter here (scheduler="steplr", num_milestones=3); the default
    # stays constant as for every reference method, since GTEP's milestone rule decays the rate
    # before the first step when a suite trains 1-2 epochs per task.
    hparams = {**optimizer_space(lr=0.1, momentum=0.9, weight_decay=2e-4),
               "aux_weight": clh.Float(0.0, 10.0, default=1.0),       # lambda_a (PyCIL: 1)
               "weight_align": clh.Choice([True, False]),
               **rehearsal_space()}
    # GTEP Table 4: lambda (Aux) of iCaRL, PODNet, DER and MEMO
    tuning_space = {"aux_weight": clh.Choice([0.5, 1.0, 1.5, 2.0, 3.0])}

    def __init__(self, context, **hparams):
        clh.Method.__init__(self, context, **hparams)
        self.model = BranchNet(context.num_classes)
        self.aux_head = None                        # H_t^a, replaced every task
        self.memory = ExemplarMemory(context.memory_size)
        self.labels = RehearsalLabels(context, self.memory, self.hp["rehearsal"])
        self.gen = torch.Generator().manual_seed(context.seed)
        self.seen = torch.zeros(0, dtype=torch.long, device=context.device)

    def expand(self) -> None:
        """Add F_t (a copy of F_{t-1}, or a fresh backbone on the first task) and a new H_t^a."""
        branches = self.model.branches
        branch = clone_module(branches[-1]) if len(branches) else self.context.make_backbone()
        self.model.add_branch(branch, branch.out_dim)
        self.model.freeze_old()
        new = len(self.labels.tasks[-1])
        self.aux_head = simple_linear(self.model.dims[-1], new + 1).to(self.context.device)

    def aux_targets(self, y: torch.Tensor) -> torch.Tensor:
        """y_a: 1..|Y_t| for the current task's classes (in task order), 0 for every old class."""
        table = torch.zeros(self.context.num_classes, dtype=torch.long, device=y.device)
        table[list(self.labels.tasks[-1])] = torch.arange(1, len(self.labels.tasks[-1]) + 1, device=y.device)
        return table[y]

    def loss(self, x, y):
        feats = self.model.branch_features(x)
        logits = seen_logits(self.model.head(torch.cat(feats, 1)), self.seen)
        loss = self.cross_entropy(logits, y)                         # L_{H_t}
        if len(self.labels.tasks) > 1:                               # PyCIL: no aux loss on task 1
            aux = self.aux_head(feats[-1])
            loss = loss + self.hp["aux_weight"] * F.cross_entropy(aux, self.aux_targets(y))   # L_{H_t^a}
        return loss

    def learn(self, experience):
        with method_rng(self.gen, self.context.device):   # snapshots replay new modules' init
            self.learn_task(experience)

    def learn_task(self, experience):
        self.labels.add(experience)
        self.seen = torch.tensor(self.labels.seen, device=self.context.device)
        old = [c for c in self.labels.seen if c not in experience.classes]
        self.expand()
        params = [p for p in [*self.model.parameters(), *self.aux_head.parameters()] if p.requires_grad]
        batches = rehearsal_batches(experience, *self.memory.tensors(), self.task_epochs(), self.gen,
                                    self.hp["rehearsal"])
        self.fit(batches, params=params)     # the first task: the suite's first_task_train, if any
        if old and self.hp["weight_align"]:
            align_weights(self.model.head, old, list(experience.classes))
        self.model.eval()
        update_memory(self, self.memory, experience, len(self.labels.seen))

    @torch.no_grad()
    def predict(self, x, task_id=None):
        if self.model.head is None:          # nothing learned yet: no class is preferred
            return torch.zeros(len(x), self.context.num_classes, device=x.device)
        return seen_logits(super().predict(x, task_id), self.seen)
