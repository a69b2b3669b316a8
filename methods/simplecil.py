"""SimpleCIL (Zhou et al. 2023, "Revisiting class-incremental learning with pre-trained models:
generalizability and adaptivity are all you need", sec. 4): a frozen pretrained backbone and a
prototype classifier. The classifier weight of class i is its prototype p_i = mean of φ(x) over
its training images (eq. 4); a test image is scored by the cosine similarity of φ(x) with every
prototype. No training at all, so the frozen features come from a cache (computed once per image).

Not a subclass of ``ncm``: NCM averages L2-normalised features and scores by Euclidean distance to
the normalised mean, and it builds a trainable classifier; SimpleCIL's prototype is the plain mean
of the raw features and its score the cosine, and it holds nothing but the frozen backbone."""
import torch
import torch.nn.functional as F

import clharness as clh
from clharness.toolkit.feature_cache import FrozenFeatures
from clharness.toolkit.training import NEG, TaskLabels


class SimpleCIL(clh.Method):
    name = "simplecil"
    paper = ("Zhou et al., Revisiting Class-Incremental Learning with Pre-Trained Models: Generalizability "
             "and Adaptivity are All You Need, IJCV 2024")
    reference = "sun-hailong/LAMDA-PILOT: models/simplecil.py"
    deviations = ()
    hparams = {}

    def __init__(self, context, **hparams):
        super().__init__(context, **hparams)
        self.frozen = FrozenFeatures(context.make_backbone(), amp=context.amp)
        self.labels = TaskLabels(context)
        self.sums = torch.zeros(context.num_classes, self.frozen.out_dim, device=context.device)
        self.counts = torch.zeros(context.num_classes, device=context.device)

    def learn(self, experience):
        self.labels.add(experience)
        for x, y in experience.batches(shuffle=False, augment=False):   # prototypes of test-view images (PILOT mode='test')
            self.sums.index_add_(0, y, self.features(x))
            self.counts.index_add_(0, y, torch.ones_like(y, dtype=self.counts.dtype))

    @torch.no_grad()
    def features(self, x):
        return self.frozen(x)

    @torch.no_grad()
    def predict(self, x, task_id=None):
        prototypes = self.sums / self.counts.clamp(min=1)[:, None]                       # eq. 4
        logits = F.normalize(self.features(x), dim=1) @ F.normalize(prototypes, dim=1).T  # cosine classifier
        return logits.masked_fill(self.counts == 0, NEG)
