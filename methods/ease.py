"""EASE, ExpAndable Subspace Ensemble (Zhou et al., CVPR 2024).

- Expandable subspaces (sec. 4.1): every task t trains a new set of adapters (one AdaptFormer
  adapter beside each block's MLP, bottleneck ``ffn_num`` = 64, scale 0.1, dropout 0.1) on the
  frozen pretrained ViT, with a cosine classifier over the task's own classes; afterwards the
  adapters are frozen for good. Adapter set i maps an image to φ_i(x) (the [CLS] feature), its
  "subspace"; the representation is the concatenation [φ_1(x), ..., φ_T(x)]. Frozen subspaces are
  served from feature caches (FrozenFeatures), one per adapter set.
- Prototype classifier: the prototype of class c in subspace i is the mean of φ_i over c's training
  images, computed for the new task's classes in every subspace (new data through old adapters).
- Semantic-guided prototype complement (sec. 4.2): an old class c of task i has no data when
  subspace j > i is created. Its prototype there is synthesised from the classes that have
  prototypes in both spaces (those of tasks j..T): with A = their prototypes in subspace i, B the
  same classes' in subspace j, and the similarity of c to each of them in subspace i,
      p_j(c) = Σ_k softmax_k(cos(p_i(c), A_k)) B_k.
  Recomputed after every task from all classes available (the code's ``recalc_sim``).
- Subspace reweighting at inference (sec. 4.3): for a class c of task i,
      logit_c(x) = cos(φ_i(x), p_i(c)) + (α / (T - 1)) Σ_{j≠i} cos(φ_j(x), p_j(c)),   α = 0.1
  (T - 1 = the code's ``cur_task``; a class's own subspace counts fully, the others are damped).
Defaults are LAMDA-PILOT's ``ease.json``: SGD, momentum 0.9, lr 0.025, weight decay 5e-4, cosine
schedule; no exemplars, no pretrained-model subspace (``use_init_ptm`` false).

Deliberate differences: the adaptation of every task runs ``context.epochs`` epochs (the code's
init/later_epochs, 20); the training classifier's scale σ is learnable per task as in the code's
proxy classifier, the evaluation scale is 1 (the code's never-trained σ)."""
import torch
import torch.nn.functional as F

import clharness as clh
from clharness.toolkit.feature_cache import FrozenFeatures
from clharness.toolkit.training import NEG, TaskLabels, Trainer, optimizer_space
from clharness.toolkit.vit_adapters import AdaptedViT, CosineClassifier, adapter_set
from clharness.toolkit.vit_prompts import vit_of


class EASE(clh.Method):
    name = "ease"
    paper = ("Zhou, Sun, Ye & Zhan, Expandable Subspace Ensemble for Pre-Trained Model-Based Class-Incremental "
             "Learning, CVPR 2024")
    reference = "sun-hailong/LAMDA-PILOT: models/ease.py"
    deviations = (
        "every task's adaptation runs the run's epochs (the code's init_epochs/later_epochs: 20)",
        "the evaluation scale of the cosine classifier is 1 (the code's never-trained sigma); the training scale is "
        "learnable per task, as the code's proxy classifier",
    )
    hparams = {**optimizer_space(lr=0.025, optimizer="sgd", momentum=0.9, weight_decay=0.0005),
               "scheduler": clh.Choice(["constant", "steplr", "cosine"], default="cosine"),
               "ffn_num": clh.Int(1, 4096, default=64),
               "alpha": clh.Float(0.0, 10.0, default=0.1)}
    # GTEP table 5: FFN num and alpha of EASE
    tuning_space = {"ffn_num": clh.Choice([4, 8, 16, 32, 64]),
                    "alpha": clh.Choice([0.01, 0.05, 0.1, 0.15, 0.2])}

    def __init__(self, context, **hparams):
        super().__init__(context, **hparams)
        self.frozen = FrozenFeatures(context.make_backbone(), amp=context.amp)   # holds the shared ViT
        vit_of(self.frozen, self.name)
        self.subspaces: list[FrozenFeatures] = []        # one frozen adapted ViT per task
        self.prototypes: list[torch.Tensor] = []         # per subspace: (num_classes, D)
        self.labels = TaskLabels(context)

    def train_subspace(self, experience) -> FrozenFeatures:
        """A new adapter set trained on this task with a cosine classifier over its classes."""
        vit = vit_of(self.frozen, self.name)
        adapters = adapter_set(len(vit.blocks), vit.embed_dim, self.hp["ffn_num"], scale=0.1, dropout=0.1)
        model = AdaptedViT(vit, adapters.to(self.context.device)).train()
        head = CosineClassifier(vit.embed_dim, self.context.num_classes).to(self.context.device)
        trainer = Trainer.for_method(self, [*adapters.parameters(), *head.parameters()])
        for x, y in experience.batches(epochs=self.context.epochs):
            trainer.step(lambda x, y: F.cross_entropy(self.labels.mask_current(head(model(x))), y), x, y)
        trainer.check()
        return FrozenFeatures(model, amp=self.context.amp)   # frozen from now on

    def learn(self, experience):
        self.labels.add(experience)
        self.subspaces.append(self.train_subspace(experience))
        self.prototypes.append(torch.zeros(self.context.num_classes, self.frozen.out_dim, device=self.context.device))
        classes = list(experience.classes)
        for i, space in enumerate(self.subspaces):       # the new classes in every subspace, from data
            sums = torch.zeros_like(self.prototypes[i])
            counts = torch.zeros(self.context.num_classes, device=sums.device)
            for x, y in experience.batches(shuffle=False, augment=False):   # raw views (PILOT mode='test')
                sums.index_add_(0, y, space(x))
                counts.index_add_(0, y, torch.ones_like(y, dtype=counts.dtype))
            self.prototypes[i][classes] = sums[classes] / counts[classes].clamp(min=1)[:, None]
        self.complement()

    @torch.no_grad()
    def complement(self) -> None:
        """Semantic-guided prototype complement: old classes' prototypes in the later subspaces."""
        tasks = [list(t) for t in self.labels.tasks]
        for i in range(len(tasks) - 1):
            for j in range(i + 1, len(tasks)):
                shared = [c for t in tasks[j:] for c in t]        # real prototypes in subspaces i and j
                A, B = self.prototypes[i][shared], self.prototypes[j][shared]
                sim = F.normalize(self.prototypes[i][tasks[i]], dim=1) @ F.normalize(A, dim=1).T
                self.prototypes[j][tasks[i]] = sim.softmax(1) @ B

    @torch.no_grad()
    def features(self, x):
        """[φ_1(x), ..., φ_T(x)], every subspace's [CLS] feature."""
        return torch.cat([space(x) for space in self.subspaces], 1)

    @torch.no_grad()
    def predict(self, x, task_id=None):
        logits = torch.full((len(x), self.context.num_classes), NEG, device=x.device)
        if not self.subspaces:
            return logits
        T = len(self.subspaces)
        # cos(φ_j(x), p_j(c)) for every subspace j and class c: (T, N, C)
        cos = torch.stack([F.normalize(space(x), dim=1) @ F.normalize(proto, dim=1).T
                           for space, proto in zip(self.subspaces, self.prototypes)])
        for i, classes in enumerate(self.labels.tasks):
            weight = torch.full((T,), self.hp["alpha"] / max(T - 1, 1), device=x.device)
            weight[i] = 1.0                                # the class's own subspace counts fully
            logits[:, list(classes)] = torch.einsum("t,tnc->nc", weight, cos[:, :, list(classes)])
        return logits
