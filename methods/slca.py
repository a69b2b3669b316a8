"""SLCA, Slow Learner with Classifier Alignment (Zhang et al., ICCV 2023), as the authors' code
(GengDavid/SLCA, models/slca.py) runs it.

- Slow learner (sec. 4.1): the pretrained backbone and the classifier are fine-tuned together with
  very different learning rates: 0.0001 for the backbone (the code's lr x bcb_lrscale 1/100), 0.01
  for the head (SGD, momentum 0.9, weight decay 5e-4), cross-entropy over the current task's
  classes only, the learning rate divided by 10 at ``milestone`` x epochs (the code's MultiStepLR:
  milestones [40] of 50 epochs on ImageNet-R, [18] of 20 on CIFAR). The heads of earlier tasks are
  frozen while a new task trains (the code's per-task heads with freeze_old).
- Classifier alignment (sec. 4.2), from the second task on (the code: ``_cur_task > 0``): after each
  task the mean μ_c and covariance Σ_c of every new class's features are stored (Σ_c + 1e-4·I, the
  authors' regulariser, keeps it positive definite); then the classifier alone is retrained on
  features sampled from N(s_c μ_c, Σ_c) of every class seen, drawn afresh every alignment epoch
  (256 per class, 5 epochs, batches of 256, SGD lr 0.01 with momentum 0.9, weight decay 5e-4 and
  cosine decay per epoch). s_c is the code's mean scaling: 0.9 + 0.1 (t_c + 1) / (T + 1) for a class
  of task t_c after task T (0-based), so older classes' means shrink more. Logit normalisation:
  logits divided by the mean over tasks of each task's logit norm, and by τ = 0.1.
- The aligned head serves evaluation only: the next task trains from the head as it was before
  alignment (the code's ``fc.backup()`` before alignment and ``fc.recall()`` in ``after_task``).
The statistics (C·(d + d²) values) and the pre-alignment head are what the memory report counts
besides the network.

Deliberate differences: the head is one linear layer over the global classes; freezing the earlier
tasks' rows is done by restoring them after the task's training (their logits are masked out of the
loss, so only weight decay and momentum could have moved them — exactly what freezing prevents)."""
import torch
import torch.nn.functional as F

import clharness as clh
from clharness.toolkit.training import NEG, SupervisedMethod, Trainer


class SLCA(SupervisedMethod):
    name = "slca"
    paper = "Zhang et al., SLCA: Slow Learner with Classifier Alignment for Continual Learning, ICCV 2023"
    reference = "GengDavid/SLCA: models/slca.py"
    deviations = (
        "one linear head over the global classes; earlier tasks' rows are frozen by restoring them after "
        "the task (the code keeps per-task heads with freeze_old)",
    )
    version = "2"   # alignment from task 2, resampled per epoch, mean scaling, head restored, MultiStepLR
    hparams = {"lr": clh.Float(1e-4, 1.0, default=0.01, log=True),            # head
               "backbone_lr": clh.Float(0.0, 1.0, default=0.0001),
               "momentum": clh.Float(0.0, 0.99, default=0.9),
               "weight_decay": clh.Float(0.0, 1e-2, default=5e-4),
               "milestone": clh.Float(0.0, 1.0, default=0.8),                  # lr x 0.1 at this share of the epochs
               "ca_epochs": clh.Int(0, 100, default=5),
               "ca_lr": clh.Float(1e-4, 1.0, default=0.01, log=True),
               "samples_per_class": clh.Int(1, 10000, default=256),
               "logit_norm": clh.Float(0.0, 10.0, default=0.1)}                 # τ; 0 = off
    # CLDyB B.3 selection space (clharness/engine/hparam_selection.py; GTEP's "method" reading too): the
    # slow learner's backbone lr, i.e. GengDavid/SLCA's lrate 0.01 x bcb_lrscale: 0 (models/slca.py's
    # fix_bcb branch, a frozen backbone), 1/100 (its default: our 0.0001) and 1/10 (exps/slcapp/*.json);
    # and the logit normalisation tau of exps/slca/*.json: 0.05 (slca_cars) or 0.1 (the others, our
    # default; LAMDA-PILOT's exps/slca.json too). The head lr is 0.01 in every config: not searched. 6 candidates.
    tuning_space = {"backbone_lr": clh.Choice([0.0, 0.0001, 0.001]),
                    "logit_norm": clh.Choice([0.05, 0.1])}

    def __init__(self, context, **hparams):
        super().__init__(context, **hparams)
        # per seen class only (a CLDyB pool can have thousands of classes): class -> μ_c, Σ_c
        self.means: dict[int, torch.Tensor] = {}
        self.covs: dict[int, torch.Tensor] = {}
        self.seen = torch.zeros(context.num_classes, dtype=torch.bool, device=context.device)
        self.gen = torch.Generator().manual_seed(context.seed)
        self.unaligned: dict[str, torch.Tensor] | None = None   # the head before the last alignment

    def loss(self, x, y):
        return F.cross_entropy(self.labels.mask_current(self.model(x)), y)

    def slow_learner(self) -> Trainer:
        """SGD with the backbone at backbone_lr and the head at lr, MultiStepLR at ``milestone``."""
        groups = [{"params": [p for p in self.model.backbone.parameters() if p.requires_grad],
                   "lr": self.hp["backbone_lr"]},
                  {"params": list(self.model.head.parameters()), "lr": self.hp["lr"]}]
        opt = torch.optim.SGD(groups, lr=self.hp["lr"], momentum=self.hp["momentum"],
                              weight_decay=self.hp["weight_decay"])
        trainer = Trainer(self.name, opt, self.context)
        epochs = self.task_epochs()
        trainer.schedule("steplr", epochs, self.labels.epoch_steps, lr_decay=0.1,
                         marks=[int(self.hp["milestone"] * epochs)])
        return trainer

    def learn(self, experience):
        head = self.model.head
        if self.unaligned is not None:           # train from the head as it was before alignment
            head.load_state_dict(self.unaligned)
        self.labels.add(experience)
        old = [p.detach().clone() for p in head.parameters()]
        self.fit(experience.batches(epochs=self.task_epochs()), trainer=self.slow_learner())
        with torch.no_grad():                    # earlier tasks' heads stay frozen
            others = ~self.labels.current
            for p, before in zip(head.parameters(), old):
                p[others] = before[others]
        self.unaligned = {k: v.detach().clone() for k, v in head.state_dict().items()}
        self.store_statistics(experience)
        if self.hp["ca_epochs"] > 0 and len(self.labels.tasks) > 1:
            self.align()

    @torch.no_grad()
    def store_statistics(self, experience):
        self.model.eval()
        feats, labels = zip(*((self.features(x), y) for x, y in experience.batches(shuffle=False, augment=False)))
        feats, labels = torch.cat(feats).double(), torch.cat(labels)
        eye = torch.eye(feats.shape[1], dtype=feats.dtype, device=feats.device)
        for c in labels.unique().tolist():
            f = feats[labels == c]
            self.means[c] = f.mean(0).float()
            cov = torch.cov(f.T) if len(f) > 1 else torch.zeros_like(eye)
            self.covs[c] = (cov + 1e-4 * eye).float()
            self.seen[c] = True

    def mean_scales(self) -> dict[int, float]:
        """s_c = 0.9 + 0.1 (t_c + 1) / (T + 1): the code's shrinking of older classes' means."""
        last = len(self.labels.tasks) - 1
        return {c: 0.9 + 0.1 * (t + 1) / (last + 1) for t, classes in enumerate(self.labels.tasks) for c in classes}

    def sample(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``samples_per_class`` features per seen class from N(s_c μ_c, Σ_c), and their labels."""
        classes = self.seen.nonzero().squeeze(1)
        n, scales = self.hp["samples_per_class"], self.mean_scales()
        means = torch.stack([self.means[c] * scales[c] for c in classes.tolist()])   # (C, d)
        covs = torch.stack([self.covs[c] for c in classes.tolist()])                  # (C, d, d)
        chol = torch.linalg.cholesky(covs.double()).float()
        z = torch.randn(len(classes), n, means.shape[1], generator=self.gen).to(means.device)
        feats = means[:, None] + z @ chol.transpose(1, 2)
        return feats.flatten(0, 1), classes.repeat_interleave(n)

    def normalised_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Authors' logit normalisation: divide by the mean of the per-task logit norms, then by τ."""
        tau = self.hp["logit_norm"]
        if tau == 0:
            return logits
        norms = torch.stack([logits[:, list(t)].norm(dim=1) + 1e-7 for t in self.labels.tasks], 1)
        return logits / norms.mean(1, keepdim=True) / tau

    def align(self):
        """Classifier alignment on features sampled from the class Gaussians, resampled every epoch."""
        head = self.model.head
        opt = torch.optim.SGD(head.parameters(), lr=self.hp["ca_lr"], momentum=0.9, weight_decay=5e-4)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, self.hp["ca_epochs"])   # stepped per epoch
        seen = self.seen.nonzero().squeeze(1)
        batch = 256
        for _ in range(self.hp["ca_epochs"]):
            feats, labels = self.sample()
            targets = torch.searchsorted(seen, labels)       # position among the seen classes
            perm = torch.randperm(len(labels), generator=self.gen).to(labels.device)
            for i in range(0, len(labels), batch):
                idx = perm[i:i + batch]
                logits = self.normalised_logits(head(feats[idx]))[:, seen]
                loss = F.cross_entropy(logits, targets[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            sched.step()
            if not torch.isfinite(loss):
                raise clh.Diverged(f"method 'slca': non-finite classifier-alignment loss ({loss.item()}); "
                                   "try a lower ca_lr")

    @torch.no_grad()
    def predict(self, x, task_id=None):
        return super().predict(x, task_id).masked_fill(~self.seen, NEG)
