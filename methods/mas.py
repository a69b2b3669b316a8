"""Memory Aware Synapses (Aljundi et al. 2018, "Memory aware synapses: learning what (not) to forget")."""
import torch
from torch.func import functional_call, grad, vmap

import clharness as clh
from clharness.toolkit.training import SupervisedMethod, anchored_penalty, optimizer_space

AVALANCHE_BATCH_FIELDS = 3   # Avalanche 0.2.1 multiplies each batch's |gradient| by len(batch) = len((x, y, t))


class MAS(SupervisedMethod):
    """After each task, each parameter's importance is the mean over the task's samples of the absolute
    gradient of the squared L2 norm of the network's output (eq. 4, unsupervised: no labels), the
    output being the logits of the classes learned so far (the task's own head in task-incremental
    settings). Importances are merged as Omega = alpha * Omega_old + (1 - alpha) * Omega_new, the
    running average of the M2I paper's implementation (Table 9: alpha = 0.5); training adds
    lambda * sum_ij Omega_ij (theta_ij - theta*_ij)^2 (eq. 3).

    ``mas_variant`` (how Omega_new is computed; the merge and the penalty are as above unless said):

    - ``"paper"`` (default): eq. 4 as written, per-sample absolute gradients of ||F(x_k)||_2^2, eval mode.
    - ``"aljundi-code"``: the authors' code (rahafaljundi/MAS-Memory-Aware-Synapses,
      ``MAS_utils/MAS_based_Training.py``, ``compute_importance_l2`` with ``MAS_Omega_update``): per
      minibatch, the absolute value of the gradient of the minibatch's summed squared norm
      (``MSELoss(size_average=False)`` against zeros), kept as their running average
      Omega <- (Omega * b * n_b + |g_b|) / ((b + 1) * n_b) over minibatches b of n_b samples (the
      suite's batch size here; theirs was 200), model in eval mode.
    - ``"avalanche"``: Avalanche 0.2.1's ``MASPlugin``, which the M2I authors' code runs
      (lifelonglab/M2I_I2M_benchmark, ``MAS(lambda_reg=1)``, its alpha default 0.5; M2I suites set it
      under ``protocol = "authors"``). Its quirks, reproduced: the model in train mode (BatchNorm on
      batch statistics, its running statistics updated by this pass, dropout on); per minibatch (the
      suite's batch size, data in order) the gradient of the minibatch's mean of the plain (not
      squared) L2 norm of all the network's outputs (not only the seen classes'), its absolute value
      times 3 (``len(batch)`` counts the fields x, y, task label, not the samples), averaged over the
      minibatches; the merged importance starts from zeros, so the first task's is (1 - alpha) times
      its own (the paper variants keep it whole)."""
    name = "mas"
    ensemble = True   # seeds train as one batched model (engine.ensemble): members equal their solo runs
    ensemble_state = ("importance", "anchor")   # what its loss reads per member
    settings = frozenset({clh.Setting.CLASS_IL, clh.Setting.TASK_IL, clh.Setting.DOMAIN_IL})
    paper = "Aljundi, Babiloni, Elhoseiny, Rohrbach & Tuytelaars, Memory Aware Synapses: Learning what (not) to forget, ECCV 2018"
    reference = "rahafaljundi/MAS-Memory-Aware-Synapses: MAS_to_be_published/MAS_utils/MAS_based_Training.py"
    deviations = (
        "Omega merged as alpha * old + (1 - alpha) * new (M2I Table 9, Avalanche/FACIL) rather than the "
        "reference's recomputation on all previous tasks' data, which needs their data",
        "mas_variant='aljundi-code': the reference's per-minibatch |gradient| (eq. 4 takes it per sample) is "
        "an option; the default follows eq. 4",
        "mas_variant='avalanche': Avalanche 0.2.1's MASPlugin (M2I authors' code), quirks included: train mode, "
        "plain norm of all outputs, batch-mean gradient, x3 factor, first task's importance times (1 - alpha)",
    )
    hparams = {**optimizer_space(lr=0.01, momentum=0.9),
               "mas_lambda": clh.Float(1e-3, 1e4, default=1.0, log=True),
               "mas_alpha": clh.Float(0.0, 1.0, default=0.5),
               "mas_variant": clh.Choice(["paper", "aljundi-code", "avalanche"])}
    later_hparams = {"mas_variant": "paper"}   # added later: stored runs keep their keys

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
        variant = self.hp["mas_variant"]
        new = {"paper": self.task_importance, "aljundi-code": self.minibatch_importance,
               "avalanche": self.avalanche_importance}[variant](experience)
        a = self.hp["mas_alpha"]
        if variant == "avalanche" and not self.importance:   # Avalanche's running average starts from zeros
            self.importance = {k: torch.zeros_like(w) for k, w in new.items()}
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

    def _batch_gradients(self, experience, objective):
        """(batch size, {name: gradient of objective(model(x))}) per minibatch, data in order."""
        params = {k: p for k, p in self.model.named_parameters() if p.requires_grad}
        for x, _ in experience.batches(shuffle=False):
            with torch.enable_grad():
                grads = torch.autograd.grad(objective(self.model(x).float()), list(params.values()), allow_unused=True)
            yield len(x), {k: g for k, g in zip(params, grads) if g is not None}

    def minibatch_importance(self, experience):
        """The reference's running average of |d sum_k ||F(x_k)||^2 / d theta| over minibatches."""
        self.model.eval()
        mask = self.output_mask(experience)
        omega = {k: torch.zeros_like(p) for k, p in self.model.named_parameters() if p.requires_grad}
        for b, (n, grads) in enumerate(self._batch_gradients(experience, lambda out: out[:, mask].pow(2).sum())):
            for k, g in grads.items():
                omega[k] = (omega[k] * (b * n) + g.abs()) / ((b + 1) * n)
        return omega

    def avalanche_importance(self, experience):
        """Avalanche 0.2.1 ``MASPlugin._get_importance``: train mode, mean over the minibatch of the
        plain L2 norm of all outputs; 3 |gradient| per minibatch, averaged over the minibatches."""
        self.model.train()
        total = {k: torch.zeros_like(p) for k, p in self.model.named_parameters() if p.requires_grad}
        batches = 0
        for _, grads in self._batch_gradients(experience, lambda out: out.norm(dim=1).mean()):
            for k, g in grads.items():
                total[k] += g.abs() * AVALANCHE_BATCH_FIELDS
            batches += 1
        return {k: t / max(batches, 1) for k, t in total.items()}
