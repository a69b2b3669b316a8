"""Synaptic Intelligence (Zenke, Poole & Ganguli 2017, "Continual learning through synaptic intelligence")."""
import torch
from torch.nn.modules.batchnorm import _NormBase

import clharness as clh
from clharness.toolkit.training import SupervisedMethod, Trainer, anchored_penalty, optimizer_space

AVALANCHE_CLIP = 1e-3   # Avalanche 0.2.1's SynapticIntelligencePlugin: importance capped here (clip_to)


class SI(SupervisedMethod):
    """Each parameter's importance is the path integral of the task loss along its trajectory
    (eq. 3, discretised per step: omega += -g * delta_theta, g the gradient of the unregularised loss),
    normalised at the end of each task by the squared total displacement plus xi (eq. 5) and summed
    over tasks; training adds the surrogate loss c * sum_k Omega_k (theta_k - theta~_k)^2 (eq. 4).

    ``si_variant``:

    - ``"paper"`` (default): the above, eq. 3-5 as written.
    - ``"pathint"``: the authors' code (ganguli-lab/pathint ``protocols.PATH_INT_PROTOCOL``), which
      also passes the summed Omega through a ReLU after each task (Omega = max(0, Omega + omega /
      (Delta^2 + xi))): a parameter whose path integral is negative gets no stiffness instead of a
      negative one. Eq. 5 has no such clamp.
    - ``"avalanche"``: Avalanche 0.2.1's ``SynapticIntelligencePlugin``, which the M2I authors' code
      runs (lifelonglab/M2I_I2M_benchmark, ``SynapticIntelligence(si_lambda, eps)``; M2I suites set
      it under ``protocol = "authors"``). Its quirks, reproduced: the path integral uses the full
      gradient (the SI penalty's included), the accumulated sum S += sum_steps g * delta / (Delta^2 +
      eps) gives the importance min(-S, 1e-3) (capped at 1e-3, never floored: negative importances
      stay), the penalty is (lambda / 2) sum importance (theta - theta~)^2 (half of eq. 4's c), and the
      parameters of BatchNorm layers (``_NormBase``) are left out of both the path integral and the
      penalty. ``si_lambda`` is its ``si_lambda``, ``si_epsilon`` its ``eps``.

    Mixed precision: g is read after the step, when GradScaler has unscaled ``p.grad`` in place; a
    step the scaler skipped (inf/NaN gradients, weights unmoved) adds nothing to the path integral,
    as the parameters did not move along the trajectory (``Trainer.step_taken``)."""
    name = "si"
    ensemble_obstacle = ("SI's path integral reads every step's gradient and weight change (p.grad after trainer.step, "
                         "before the next), per member and step, outside any loss; the batched step has no per-step "
                         "hook after the optimizer step")
    settings = frozenset({clh.Setting.CLASS_IL, clh.Setting.TASK_IL, clh.Setting.DOMAIN_IL})
    version = "2"   # 2: steps skipped by the AMP scaler no longer turn the path integral into NaN
    paper = "Zenke, Poole & Ganguli, Continual Learning Through Synaptic Intelligence, ICML 2017"
    reference = "ganguli-lab/pathint: pathint/protocols.py"
    deviations = (
        "si_variant='pathint': the reference's ReLU on the summed importance (not in eq. 5) is an option; "
        "the default follows eq. 5",
        "si_variant='avalanche': Avalanche 0.2.1's SynapticIntelligencePlugin (M2I authors' code), quirks "
        "included: full gradient, importance capped at 1e-3 and not floored, lambda/2, BatchNorm excluded",
    )
    hparams = {**optimizer_space(lr=0.01, momentum=0.9),
               # c in eq. 4 (M2I Table 9: 1); up to 1e5: van de Ven et al.'s domain-IL split MNIST uses 5e4
               "si_lambda": clh.Float(1e-3, 1e5, default=1.0, log=True),
               "si_epsilon": clh.Float(1e-6, 1.0, default=1e-3, log=True),   # xi in eq. 5 (M2I Table 9: 0.001)
               "si_variant": clh.Choice(["paper", "pathint", "avalanche"])}
    later_hparams = {"si_variant": "paper"}   # added later: stored runs keep their keys

    def __init__(self, context, **hparams):
        super().__init__(context, **hparams)
        params = self._params()
        self.omega_total = {k: torch.zeros_like(p) for k, p in params.items()}   # Omega (eq. 5), summed
        self.anchor = {k: p.detach().clone() for k, p in params.items()}          # theta~: end of last task
        # avalanche: the running sum S of g * delta / (Delta^2 + eps) (its ``cum_trajectory``)
        self.cum_trajectory = {k: torch.zeros_like(p) for k, p in params.items()}

    @property
    def avalanche(self) -> bool:
        return self.hp["si_variant"] == "avalanche"

    def _params(self):
        params = {k: p for k, p in self.model.named_parameters() if p.requires_grad}
        if self.hp["si_variant"] == "avalanche":   # Avalanche excludes every normalisation layer's parameters
            norm = {f"{m}.{n}" if m else n for m, mod in self.model.named_modules() if isinstance(mod, _NormBase)
                    for n, _ in mod.named_parameters(recurse=False)}
            params = {k: p for k, p in params.items() if k not in norm}
        return params

    def penalty(self):
        scale = 0.5 if self.avalanche else 1.0   # Avalanche: (lambda / 2) sum importance (theta - theta~)^2
        return scale * anchored_penalty(self.model, self.omega_total, self.anchor)

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
                if self.avalanche:   # the full gradient, the penalty's included
                    g = p.grad
                else:   # the task loss's own gradient: the total gradient minus the penalty's, 2c Omega (theta - theta~)
                    g = p.grad - 2 * c * self.omega_total[k] * (before[k] - self.anchor[k])
                omega[k] -= g * (p.detach() - before[k])
        trainer.check()
        eps = self.hp["si_epsilon"]
        for k, p in params.items():
            delta = p.detach() - start[k]
            if self.avalanche:
                self.cum_trajectory[k] -= omega[k] / (delta.pow(2) + eps)   # S += sum g * delta / (Delta^2 + eps)
                self.omega_total[k] = (-self.cum_trajectory[k]).clamp(max=AVALANCHE_CLIP)
            else:
                self.omega_total[k] += omega[k] / (delta.pow(2) + eps)
                if self.hp["si_variant"] == "pathint":
                    self.omega_total[k].clamp_(min=0.0)
            self.anchor[k] = p.detach().clone()
        self.last_omega = omega   # the path integral of the task just learned (inspection and tests)
