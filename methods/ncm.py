"""Nearest class mean classifier over backbone features (Mensink et al. 2013; iCaRL's NME,
Rebuffi et al. 2017)."""
import torch
import torch.nn.functional as F

import clharness as clh
from clharness.toolkit.training import NEG, OPTIMIZER_SPACE, SupervisedMethod


class NCM(SupervisedMethod):
    """Features are L2-normalised; a class mean is the normalised mean of its normalised train
    features; the logit of class c is -||f(x) - μ_c||², a monotone function of the cosine
    similarity. Classes not seen yet get a very low, finite logit. ``train_backbone``:
    ``first-task`` trains backbone+head with cross-entropy on the first task and then freezes it;
    ``frozen`` (default) never trains: a pretrained backbone, or on the quickstart a random MLP,
    whose features keep the digits apart better than ones fitted to the first task's two classes."""
    name = "ncm"
    ensemble = True   # seeds train as one batched model (engine.ensemble): members equal their solo runs (trains with the standard fit, or not at all)
    paper = ("T. Mensink, J. Verbeek, F. Perronnin, G. Csurka, Distance-Based Image Classification: Generalizing to "
             "New Classes at Near-Zero Cost, TPAMI 2013; S.-A. Rebuffi et al., iCaRL: Incremental Classifier and "
             "Representation Learning, CVPR 2017 (nearest-mean-of-exemplars)")
    reference = "ContinualAI/avalanche: avalanche/models/ncm_classifier.py"
    deviations = ("class means from every training sample of a class (no exemplar memory), features and means "
                  "L2-normalised as iCaRL's NME",
                  "train_backbone='frozen' (default): the backbone is never trained (a pretrained encoder, or a "
                  "random MLP on the quickstart); 'first-task' trains it with cross-entropy on the first task and "
                  "then freezes it",
                  "classes not seen yet get a very low finite logit")
    hparams = {**OPTIMIZER_SPACE, "train_backbone": clh.Choice(["first-task", "frozen"], default="frozen")}

    def __init__(self, context, **hparams):
        super().__init__(context, **hparams)
        self.sums = torch.zeros(context.num_classes, self.model.backbone.out_dim, device=context.device)
        self.counts = torch.zeros(context.num_classes, device=context.device)

    def learn(self, experience):
        first = not self.labels.tasks
        self.labels.add(experience)
        if first and self.hp["train_backbone"] == "first-task":
            self.fit(experience.batches(epochs=self.task_epochs()))
        for x, y in experience.batches(shuffle=False, augment=False):   # class means of raw views (iCaRL)
            self.sums.index_add_(0, y, F.normalize(self.features(x), dim=1))
            self.counts.index_add_(0, y, torch.ones_like(y, dtype=self.counts.dtype))

    @torch.no_grad()
    def predict(self, x, task_id=None):
        means = F.normalize(self.sums, dim=1)
        logits = -torch.cdist(F.normalize(self.features(x), dim=1), means).pow(2)
        return logits.masked_fill(self.counts == 0, NEG)
