"""MEMO: Memory-efficient Expandable MOdel (Zhou, Wang, Ye & Zhan, "A model or 603 exemplars:
towards memory-efficient class-incremental learning", ICLR 2023). Reference implementation read:
PyCIL ``models/memo.py``, ``utils/inc_net.py`` (``AdaptiveNet``), ``convs/memo_cifar_resnet.py`` and
``exps/memo.json``."""
import torch

import clharness as clh
from clharness.toolkit.expansion import BranchNet, clone_module, simple_linear, split_backbone

from .der import DER


class MEMO(DER):
    """DER's expansion applied to the deep layers only: the shallow "generalised" blocks
    are shared by every task and trained on the first task only; each task adds one "specialised"
    deep block (initialised from the previous one, the old ones frozen) on top of them. The
    classifier reads the concatenated outputs of the specialised blocks; the loss is DER's,
    CE(W^T [phi_s1(phi_g(x)), ..., phi_sk(phi_g(x))], y) + lambda_aux * CE of the auxiliary head
    over the newest block's features (new classes + one "old" class), weight aligning after each
    incremental task and herded exemplars (PyCIL ``memo.py``).

    Where to cut: PyCIL hard-codes the cut per network (ResNet-32: conv1 + stages 1-2 shared,
    stage 3 + pooling specialised; ResNet-18: layer4 specialised). Here it is derived from any
    sequential backbone (``clharness.toolkit.expansion.split_backbone``): its children in order, every
    ``nn.Sequential`` opened, and the specialised block is the shortest suffix holding at least
    ``specialised_share`` of the parameters. The default 0.7 reproduces PyCIL's cut on resnet32
    (stage 3 holds 76% of its weights) and resnet18-reduced (the last stage); on the MLP the last
    Linear+ReLU is specialised.

    The generalised blocks keep training in every task (``train_shared=True``, default), as PyCIL's
    ``exps/memo.json`` (``train_base: true``) and ``models/memo.py`` train them: they stay in the
    optimizer and in train mode (BatchNorm statistics) after the first task. ``train_shared=False``
    freezes them after the first task (weights and BatchNorm statistics; PyCIL ``train_base: false``).

    ``exemplar_batch_size`` (GTEP Table 4's "Exemplar batch size", its grid [16, 32, 64, 128, 256]; the
    appendix's ``exemplar_bs_64`` for PyCIL's MEMO) is PyCIL ``memo.py``'s module constant
    ``batch_size = 64``: the batch size of the loaders ``_construct_exemplar`` runs the network over,
    in eval mode, to herd a new class's exemplars and to average their features. It is not the
    training batch (``args["batch_size"]``, our ``batch_size``) and does not change which or how many
    exemplars a step trains on. Here ``features`` runs the network in batches of at most
    ``exemplar_batch_size`` rows (herding reads a class's samples 512 rows at a time; the grid's sizes
    divide 512, so every batch but a class's last holds exactly that many). The network is in eval
    mode there, so the chosen exemplars do not depend on it beyond floating-point rounding, as in
    PyCIL. 0 (the default) keeps one forward pass per call (the 512-row chunks).

    Deliberate differences: DER's (they apply here too).
    """
    name = "memo"
    paper = ("Zhou, Wang, Ye, Zhan, A Model or 603 Exemplars: Towards Memory-Efficient Class-Incremental "
             "Learning, ICLR 2023")
    reference = "G-U-N/PyCIL: models/memo.py (exps/memo.json)"
    deviations = (
        *DER.deviations,
        "the generalised/specialised cut derived from any sequential backbone (specialised_share)",
        "herding features in one pass per 512 rows by default (exemplar_batch_size=0; PyCIL: batches of 64, "
        "exemplar_batch_size=64); eval mode, so the exemplars are the same up to rounding",
    )
    version = "2"      # 2: joint rehearsal (PyCIL's steps); shared blocks trained in every task (train_base)
    later_hparams = {"exemplar_batch_size": 0}   # added later: stored runs keep their keys
    hparams = {**DER.hparams,
               "specialised_share": clh.Float(0.05, 1.0, default=0.7),
               "train_shared": clh.Choice([True, False], default=True),
               # PyCIL memo.py: batch_size = 64, the herding feature-extraction loaders' (0 = one pass)
               "exemplar_batch_size": clh.Int(0, 512, default=0)}
    tuning_space = DER.tuning_space        # GTEP Table 4: lambda (Aux) of DER and MEMO

    def __init__(self, context, **hparams):
        super().__init__(context, **hparams)
        shared, self.template = split_backbone(context.make_backbone(), self.hp["specialised_share"],
                                               context.input_shape)
        self.model = BranchNet(context.num_classes, trunk=shared)
        self.out_dim = None                     # features of one specialised block

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The network's features, run over ``x`` in batches of ``exemplar_batch_size`` rows when it
        is set (PyCIL ``_construct_exemplar``'s loaders); herding is its caller while training."""
        bs, base = self.hp["exemplar_batch_size"], super().features
        if not bs:
            return base(x)
        return torch.cat([base(x[i:i + bs]) for i in range(0, len(x), bs)])

    def expand(self) -> None:
        """Add one specialised block (the template's first, then a copy of the newest) and a new
        auxiliary head; freeze the shared blocks once the first task is learned."""
        branches = self.model.branches
        if len(branches):
            block = clone_module(branches[-1])
            if not self.hp["train_shared"]:
                self.model.trunk.requires_grad_(False)
        else:
            block, self.template = self.template, None
            with torch.no_grad():
                probe = torch.zeros(1, *self.context.input_shape, device=self.context.device)
                self.out_dim = block(self.model.trunk.eval()(probe)).flatten(1).shape[1]
        self.model.add_branch(block, self.out_dim)
        self.model.freeze_old()
        new = len(self.labels.tasks[-1])
        self.aux_head = simple_linear(self.out_dim, new + 1).to(self.context.device)
