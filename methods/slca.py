"""SLCA, Slow Learner with Classifier Alignment (Zhang et al., ICCV 2023).

- Slow learner (sec. 4.1): the pretrained backbone and the classifier are fine-tuned together with
  very different learning rates: 0.0001 for the backbone, 0.01 for the head (SGD, momentum 0.9),
  cross-entropy over the current task's classes only.
- Classifier alignment (sec. 4.2): after each task, the mean μ_c and covariance Σ_c of every new
  class's features are stored (Σ_c + 1e-4·I, the authors' regulariser, keeps it positive definite);
  then the classifier alone is retrained on features sampled from N(μ_c, Σ_c) of every class seen
  (256 per class, 5 epochs, SGD lr 0.01 with cosine decay, batches of 256), with the authors' logit
  normalisation: logits divided by the mean over tasks of each task's logit norm, and by τ = 0.1.
The statistics (C·(d + d²) values) are what the memory report counts besides the network."""
import torch
import torch.nn.functional as F

import clharness as clh
from clharness.training import NEG, SupervisedMethod, Trainer


class SLCA(SupervisedMethod):
    name = "slca"
    hparams = {"lr": clh.Float(1e-4, 1.0, default=0.01, log=True),            # head
               "backbone_lr": clh.Float(0.0, 1.0, default=0.0001),
               "momentum": clh.Float(0.0, 0.99, default=0.9),
               "weight_decay": clh.Float(0.0, 1e-2, default=5e-4),
               "ca_epochs": clh.Int(0, 100, default=5),
               "ca_lr": clh.Float(1e-4, 1.0, default=0.01, log=True),
               "samples_per_class": clh.Int(1, 10000, default=256),
               "logit_norm": clh.Float(0.0, 10.0, default=0.1)}                 # τ; 0 = off

    def __init__(self, context, **hparams):
        super().__init__(context, **hparams)
        # per seen class only (a CLDyB pool can have thousands of classes): class -> μ_c, Σ_c
        self.means: dict[int, torch.Tensor] = {}
        self.covs: dict[int, torch.Tensor] = {}
        self.seen = torch.zeros(context.num_classes, dtype=torch.bool, device=context.device)
        self.gen = torch.Generator().manual_seed(context.seed)

    def loss(self, x, y):
        return F.cross_entropy(self.labels.mask_current(self.model(x)), y)

    def learn(self, experience):
        self.labels.add(experience)
        # slow learner: backbone lr 1e-4 vs head lr 1e-2
        groups = [{"params": [p for p in self.model.backbone.parameters() if p.requires_grad],
                   "lr": self.hp["backbone_lr"]},
                  {"params": list(self.model.head.parameters()), "lr": self.hp["lr"]}]
        opt = torch.optim.SGD(groups, lr=self.hp["lr"], momentum=self.hp["momentum"],
                              weight_decay=self.hp["weight_decay"])
        self.fit(experience.batches(epochs=self.context.epochs), trainer=Trainer(self.name, opt, self.context))
        self.store_statistics(experience)
        if self.hp["ca_epochs"] > 0:
            self.align()

    @torch.no_grad()
    def store_statistics(self, experience):
        feats, labels = zip(*((self.features(x), y) for x, y in experience.batches(shuffle=False, augment=False)))
        feats, labels = torch.cat(feats).double(), torch.cat(labels)
        eye = torch.eye(feats.shape[1], dtype=feats.dtype, device=feats.device)
        for c in labels.unique().tolist():
            f = feats[labels == c]
            self.means[c] = f.mean(0).float()
            cov = torch.cov(f.T) if len(f) > 1 else torch.zeros_like(eye)
            self.covs[c] = (cov + 1e-4 * eye).float()
            self.seen[c] = True

    def sample(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``samples_per_class`` features per seen class from N(μ_c, Σ_c), and their labels."""
        classes = self.seen.nonzero().squeeze(1)
        n = self.hp["samples_per_class"]
        means = torch.stack([self.means[c] for c in classes.tolist()])                # (C, d)
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
        """Classifier alignment with features sampled from the class Gaussians."""
        head = self.model.head
        opt = torch.optim.SGD(head.parameters(), lr=self.hp["ca_lr"], momentum=0.9, weight_decay=5e-4)
        feats, labels = self.sample()
        batch = 256
        steps = -(-len(labels) // batch)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, self.hp["ca_epochs"] * steps)
        seen = self.seen.nonzero().squeeze(1)
        targets = torch.searchsorted(seen, labels)       # position among the seen classes
        for _ in range(self.hp["ca_epochs"]):
            perm = torch.randperm(len(labels), generator=self.gen).to(labels.device)
            for i in range(steps):
                idx = perm[i * batch:(i + 1) * batch]
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
