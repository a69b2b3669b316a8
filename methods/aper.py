"""APER, AdaPt and mERge (Zhou et al., IJCV 2024, "Revisiting class-incremental learning with
pre-trained models: generalizability and adaptivity are all you need"; ADAM in the preprint).

1. First-session adaptation (sec. 5.1): on the first task only, a copy of the pretrained model is
   adapted with a cosine classifier and cross-entropy, then frozen for good. ``adapter`` picks how:
   "adapter": AdaptFormer adapters beside every block's MLP (bottleneck ``ffn_num`` = 64, scale
   0.1, dropout 0.1, zero-initialised up-projection, the backbone itself frozen);
   "finetune": every weight of a private copy of the backbone;
   "vpt_deep" / "vpt_shallow": ``prompt_token_num`` = 5 learnable prompt tokens before every block
   (deep) or at the input only (shallow), zero-initialised as in the code;
   "ssf": a learnable scale and shift after every operation of the ViT (``vit_adapters.SSFViT``).
2. Merge (sec. 5.2): every image is represented by the concatenation
   [φ*(x), φ(x)] of the frozen pretrained model's and the adapted model's features, and the
   classifier is SimpleCIL's prototype classifier on it: the prototype of class i is the mean of
   the concatenated features of its training images, a test image is scored by cosine similarity.
Both branches are frozen after task 1, so their features come from caches (FrozenFeatures), one
per branch. Defaults are LAMDA-PILOT's ``aper_aperpter.json``: SGD, momentum 0.9, lr 0.01, weight
decay 5e-4, cosine schedule.

Deliberate differences: the cosine schedule anneals per epoch
to 0 (PILOT: CosineAnnealingLR to min_lr 0, the same); the adaptation runs ``context.epochs``
epochs (PILOT's tuned_epoch is 20); VPT prompts are inserted after [CLS] rather than appended
(the position does not change a transformer without position embeddings on them)."""
import copy

import torch
import torch.nn.functional as F
from torch import nn

import clharness as clh
from clharness.toolkit.feature_cache import FrozenFeatures
from clharness.toolkit.training import NEG, TaskLabels, Trainer, optimizer_space
from clharness.toolkit.vit_adapters import AdaptedViT, CosineClassifier, SSFViT, adapter_set
from clharness.toolkit.vit_prompts import vit_of

PEFT = ["adapter", "finetune", "vpt_deep", "vpt_shallow", "ssf"]


class APER(clh.Method):
    name = "aper"
    paper = ("Zhou, Cai, Ye, Zhan & Liu, Revisiting Class-Incremental Learning with Pre-Trained Models: "
             "Generalizability and Adaptivity are All You Need, IJCV 2024")
    reference = "sun-hailong/LAMDA-PILOT: models/aper_adapter.py"
    deviations = (
        "the first-session adaptation runs the run's epochs (PILOT's tuned_epoch: 20)",
        "VPT prompts are inserted after [CLS] rather than appended (same output without position embeddings on them)",
        "optimizer 'adam' is torch Adam; PILOT's 'adam' builds AdamW (our 'adamw')",
    )
    hparams = {**optimizer_space(lr=0.01, optimizer="sgd", momentum=0.9, weight_decay=0.0005),
               "scheduler": clh.Choice(["constant", "steplr", "cosine"], default="cosine"),
               "adapter": clh.Choice(PEFT, default="adapter"),
               "ffn_num": clh.Int(1, 4096, default=64, when={"adapter": ["adapter"]}),
               "prompt_token_num": clh.Int(1, 200, default=5, when={"adapter": ["vpt_deep", "vpt_shallow"]})}
    # GTEP table 5: "FFN num" of Adam-Adapter
    tuning_space = {"ffn_num": clh.Choice([4, 8, 16, 32, 64])}

    def __init__(self, context, **hparams):
        super().__init__(context, **hparams)
        self.frozen = FrozenFeatures(context.make_backbone(), amp=context.amp)
        vit_of(self.frozen, self.name)                  # a ViT is needed for adapters and prompts
        self.adapted: FrozenFeatures | None = None      # the adapted branch, frozen after task 1
        self.labels = TaskLabels(context)
        dim = 2 * self.frozen.out_dim
        self.sums = torch.zeros(context.num_classes, dim, device=context.device)
        self.counts = torch.zeros(context.num_classes, device=context.device)

    def adaptable(self) -> nn.Module:
        """The model the first session tunes (its trainable parameters require grad)."""
        kind = self.hp["adapter"]
        if kind == "finetune":
            # a private copy: clones and the frozen branch share the pretrained backbone
            return copy.deepcopy(self.frozen.backbone).requires_grad_(True).train()
        vit = vit_of(self.frozen, self.name)
        if kind == "ssf":
            return SSFViT(vit).to(self.context.device).train()
        if kind == "adapter":
            adapters = adapter_set(len(vit.blocks), vit.embed_dim, self.hp["ffn_num"], scale=0.1, dropout=0.1)
            return AdaptedViT(vit, adapters.to(self.context.device)).train()
        depth = len(vit.blocks) if kind == "vpt_deep" else 1
        prompts = torch.zeros(depth, self.hp["prompt_token_num"], vit.embed_dim, device=self.context.device)
        return AdaptedViT(vit, vpt=prompts, deep=kind == "vpt_deep").train()

    def adapt(self, experience) -> None:
        """First-session adaptation with a cosine classifier on the first task's classes."""
        model = self.adaptable()
        head = CosineClassifier(model.out_dim, self.context.num_classes).to(self.context.device)
        params = [p for p in [*model.parameters(), *head.parameters()] if p.requires_grad]
        trainer = Trainer.for_method(self, params)

        def loss(x, y):
            return F.cross_entropy(self.labels.mask_current(head(model(x))), y)

        for x, y in experience.batches(epochs=self.context.epochs):
            trainer.step(loss, x, y)
        trainer.check()
        self.adapted = FrozenFeatures(model, amp=self.context.amp)   # frozen from now on

    def learn(self, experience):
        self.labels.add(experience)
        if self.adapted is None:
            self.adapt(experience)
        for x, y in experience.batches(shuffle=False, augment=False):   # prototypes of raw views (PILOT mode='test')
            self.sums.index_add_(0, y, self.features(x))
            self.counts.index_add_(0, y, torch.ones_like(y, dtype=self.counts.dtype))

    @torch.no_grad()
    def features(self, x):
        """[φ*(x), φ(x)]: frozen pretrained features, then the adapted model's (sec. 5.2)."""
        return torch.cat([self.frozen(x), self.adapted(x)], 1)

    @torch.no_grad()
    def predict(self, x, task_id=None):
        if self.adapted is None:
            return torch.full((len(x), self.context.num_classes), NEG, device=x.device)
        prototypes = self.sums / self.counts.clamp(min=1)[:, None]
        logits = F.normalize(self.features(x), dim=1) @ F.normalize(prototypes, dim=1).T
        return logits.masked_fill(self.counts == 0, NEG)
