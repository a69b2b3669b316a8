"""Memory Aware Synapses (Aljundi et al. 2018, "Memory aware synapses: learning what (not) to forget")."""
import torch
from torch.func import functional_call, grad, vmap

import clharness as clh
from clharness.toolkit.training import SupervisedMethod, anchored_penalty, optimizer_space


class MAS(SupervisedMethod):
    """After each task, each parameter's importance is the mean over the task's samples of the absolute
    gradient of the squared L2 norm of the network's output (eq. 4, unsupervised: no labels), the
    output being the logits of the classes learned so far (the task's own head in task-incremental
    settings). Importances are merged as Omega = alpha * Omega_old + (1 - alpha) * Omega_new, the
    running average of the M2I paper's implementation (Table 9: alpha = 0.5); training adds
    lambda * sum_ij Omega_ij (theta_ij - theta*_ij)^2 (eq. 3)."""
    name = "mas"
    hparams = {**optimizer_space(lr=0.01, momentum=0.9),
               "mas_lambda": clh.Float(1e-3, 1e4, default=1.0, log=True),
               "mas_alpha": clh.Float(0.0, 1.0, default=0.5)}

    def __init__(self, context, **hparams):
        super().__init__(context, **hparams)
        self.importance: dict[str, torch.Tensor] = {}
        self.anchor: dict[str, torch.Tensor] = {}

    def loss(self, x, y):
        loss = self.cross_entropy(self.model(x), y)
        if self.importance:
            loss = loss + self.hp["mas_lambda"] * anchored_penalty(self.model, self.importance, self.anchor)
        return loss

    def learn(self, experience):
        super().learn(experience)
        new = self.task_importance(experience)
        a = self.hp["mas_alpha"]
        self.importance = {k: a * self.importance[k] + (1 - a) * w if k in self.importance else w
                           for k, w in new.items()}
        self.anchor = {k: p.detach().clone() for k, p in self.model.named_parameters() if k in self.importance}

    def output_mask(self, experience) -> torch.Tensor:
        """Which logits form F(x): the classes seen so far (class-IL) or the task's own (task-IL)."""
        classes = list(experience.classes) if self.labels.task_il else list(self.labels.seen)
        mask = torch.zeros(self.context.num_classes, dtype=torch.bool, device=self.context.device)
        mask[classes] = True
        return mask

    @torch.no_grad()
    def task_importance(self, experience):
        """Eq. 4: Omega_ij = 1/N sum_k |d ||F(x_k)||_2^2 / d theta_ij|, per-sample gradients by vmap."""
        model = self.model.eval()
        params = {k: p.detach() for k, p in model.named_parameters() if p.requires_grad}
        buffers = dict(model.named_buffers())
        mask = self.output_mask(experience)

        def sq_norm(p, x):
            out = functional_call(model, (p, buffers), (x[None],))
            return out[:, mask].float().pow(2).sum()

        chunk = max(1, 2**28 // sum(p.numel() for p in params.values()))
        per_sample = vmap(grad(sq_norm), in_dims=(None, 0), chunk_size=chunk)
        total = {k: torch.zeros_like(p) for k, p in params.items()}
        with torch.enable_grad():
            for x, _ in experience.batches(shuffle=False):
                for k, g in per_sample(params, x).items():
                    total[k] += g.abs().sum(0)
        return {k: t / len(experience) for k, t in total.items()}


