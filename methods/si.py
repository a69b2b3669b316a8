"""Synaptic Intelligence (Zenke, Poole & Ganguli 2017, "Continual learning through synaptic intelligence")."""
import torch

import clharness as clh
from clharness.toolkit.training import SupervisedMethod, Trainer, anchored_penalty, optimizer_space


class SI(SupervisedMethod):
    """Each parameter's importance is the path integral of the task loss along its trajectory
    (eq. 3, discretised per step: omega += -g * delta_theta, g the gradient of the unregularised loss),
    normalised at the end of each task by the squared total displacement plus xi (eq. 5) and summed
    over tasks; training adds the surrogate loss c * sum_k Omega_k (theta_k - theta~_k)^2 (eq. 4).

    Mixed precision: g is read after the step, when GradScaler has unscaled ``p.grad`` in place; a
    step the scaler skipped (inf/NaN gradients, weights unmoved) adds nothing to the path integral,
    as the parameters did not move along the trajectory (``Trainer.step_taken``)."""
    name = "si"
    version = "2"   # 2: steps skipped by the AMP scaler no longer turn the path integral into NaN
    hparams = {**optimizer_space(lr=0.01, momentum=0.9),
               "si_lambda": clh.Float(1e-3, 1e4, default=1.0, log=True),     # c in eq. 4 (M2I Table 9: 1)
               "si_epsilon": clh.Float(1e-6, 1.0, default=1e-3, log=True)}   # xi in eq. 5 (M2I Table 9: 0.001)

    def __init__(self, context, **hparams):
        super().__init__(context, **hparams)
        params = self._params()
        self.omega_total = {k: torch.zeros_like(p) for k, p in params.items()}   # Omega (eq. 5), summed
        self.anchor = {k: p.detach().clone() for k, p in params.items()}          # theta~: end of last task

    def _params(self):
        return {k: p for k, p in self.model.named_parameters() if p.requires_grad}

    def penalty(self):
        return anchored_penalty(self.model, self.omega_total, self.anchor)

    def loss(self, x, y):
        return self.cross_entropy(self.model(x), y) + self.hp["si_lambda"] * self.penalty()

    def learn(self, experience):
        self.labels.add(experience)
        params = self._params()
        start = {k: p.detach().clone() for k, p in params.items()}
        omega = {k: torch.zeros_like(p) for k, p in params.items()}
        trainer = Trainer.for_method(self)
        self.model.train()
        c = self.hp["si_lambda"]
        for x, y in experience.batches(epochs=self.context.epochs):
            before = {k: p.detach().clone() for k, p in params.items()}
            trainer.step(self.loss, x, y)
            if not trainer.step_taken():
                continue    # skipped by the AMP scaler: no movement, and the gradient holds inf
            for k, p in params.items():
                if p.grad is None:
                    continue
                # the task loss's own gradient: the total gradient minus the penalty's, 2c Omega (theta - theta~)
                g = p.grad - 2 * c * self.omega_total[k] * (before[k] - self.anchor[k])
                omega[k] -= g * (p.detach() - before[k])
        trainer.check()
        for k, p in params.items():
            delta = p.detach() - start[k]
            self.omega_total[k] += omega[k] / (delta.pow(2) + self.hp["si_epsilon"])
            self.anchor[k] = p.detach().clone()
        self.last_omega = omega   # the path integral of the task just learned (inspection and tests)
