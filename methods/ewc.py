"""Elastic weight consolidation (Kirkpatrick et al. 2017)."""
import weakref

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

import clharness as clh
from clharness.toolkit.metering import uncounted
from clharness.toolkit.training import SupervisedMethod, anchored_penalty, optimizer_space


class EWC(SupervisedMethod):
    """After each task, the diagonal (empirical) Fisher of its log-likelihood is computed and the
    weights are stored as that task's anchor; training then adds the quadratic penalty.

    ``ewc_mode``: ``accumulated`` (default) sums the Fishers into one penalty anchored at the weights
    after the latest task (Huszár 2018; Avalanche's "online" mode with decay 1); ``separate`` keeps
    one penalty per finished task t, each with its own Fisher F_t and anchor theta*_t,
    sum_t lambda/2 sum_i F_t,i (theta_i - theta*_t,i)^2 ("two separate penalties", Kirkpatrick et al.
    2017, after eq. 3; Avalanche's mode="separate", which M2I Table 9 uses). Difference from
    Avalanche: lambda/2 as in eq. 3 (Avalanche scales by lambda), in both modes; a suite reproducing
    Avalanche's lambda sets ewc_lambda to twice it.

    ``ewc_fisher``: ``per-sample`` (default) is the empirical Fisher, the mean over the task's samples
    of squared per-sample gradients of log p(y|x); ``minibatch`` is Avalanche 0.2.1's
    ``EWCPlugin.compute_importances`` (the M2I authors' code): the squared gradient of each
    minibatch's mean loss, averaged over the minibatches (model in eval mode, the suite's batch size,
    data in order). The two differ by about the batch size where per-sample gradients disagree."""
    name = "ewc"
    ensemble = True   # seeds train as one batched model (engine.ensemble): members equal their solo runs
    ensemble_state = ("fisher", "anchor", "task_fishers", "task_anchors")   # what its loss reads per member
    settings = frozenset({clh.Setting.CLASS_IL, clh.Setting.TASK_IL, clh.Setting.DOMAIN_IL})
    paper = ("J. Kirkpatrick et al., Overcoming catastrophic forgetting in neural networks, PNAS 2017; "
             "F. Huszár, Note on the quadratic penalties in elastic weight consolidation, PNAS 2018")
    reference = "ContinualAI/avalanche: avalanche/training/plugins/ewc.py"
    deviations = ("penalty lambda/2 sum F (theta - theta*)^2 as in eq. 3; Avalanche scales by lambda, so reproducing "
                  "its lambda takes ewc_lambda = 2x",
                  "ewc_mode='accumulated' (default): one penalty with the summed Fishers anchored at the latest "
                  "weights (Huszár 2018; Avalanche mode='online' with decay 1); 'separate' is one penalty per "
                  "task (Kirkpatrick et al., Avalanche's default)",
                  "ewc_fisher='per-sample' (default): the empirical Fisher from per-sample gradients; 'minibatch' "
                  "is Avalanche's squared minibatch-mean gradients",
                  "Adam lr 1e-3 by default: plain SGD diverges once lr*lambda*F_i > 2")
    # Adam by default: plain SGD diverges once the penalty is stiff (lr·λ·F_i > 2), i.e. before λ is
    # large enough to matter on the quickstart.
    hparams = {**optimizer_space(lr=1e-3, optimizer="adam"),
               # up to 1e11: van de Ven et al.'s split-MNIST lambdas reach 1e10 (suites/split-fmnist.toml)
               "ewc_lambda": clh.Float(1.0, 1e11, default=1e4, log=True),
               "ewc_mode": clh.Choice(["accumulated", "separate"]),
               "ewc_fisher": clh.Choice(["per-sample", "minibatch"])}
    later_hparams = {"ewc_fisher": "per-sample"}   # added later: stored runs keep their keys
    # GTEP does not search the mode; it searches lambda over [1, 1e7], the declared range before it widened
    tuning_space = {"ewc_lambda": clh.Float(1.0, 1e7, default=1e4, log=True)}

    def __init__(self, context, **hparams):
        super().__init__(context, **hparams)
        self.fisher: dict[str, torch.Tensor] = {}     # accumulated mode: summed Fisher, latest anchor
        self.anchor: dict[str, torch.Tensor] = {}
        self.task_fishers: list[dict[str, torch.Tensor]] = []   # separate mode: one per finished task
        self.task_anchors: list[dict[str, torch.Tensor]] = []

    def loss(self, x, y):
        loss = self.cross_entropy(self.model(x), y)
        if self.task_fishers:
            loss = loss + self.hp["ewc_lambda"] / 2 * self.separate_penalty()
        if self.fisher:
            # Kirkpatrick et al. 2017, eq. 3: L(θ) = L_B(θ) + Σ_i λ/2 F_i (θ_i - θ*_A,i)^2, with F summed
            # over the finished tasks and θ* the weights after the latest one (Huszár 2018).
            loss = loss + self.hp["ewc_lambda"] / 2 * anchored_penalty(self.model, self.fisher, self.anchor)
        return loss

    def separate_penalty(self):
        """sum_t sum_i F_t,i (theta_i - theta*_t,i)^2 over the finished tasks (separate mode)."""
        params = dict(self.model.named_parameters())
        if FUSED_PENALTY and all(p.is_leaf for p in params.values()) and not torch.is_autocast_enabled():
            return _SeparatePenalty.apply(self.task_fishers, self.task_anchors, list(params), *params.values())
        # a seed ensemble's member (rows of stacked parameters) or under autocast: autograd's own graph
        return sum(anchored_penalty(self.model, f, a) for f, a in zip(self.task_fishers, self.task_anchors))

    def learn(self, experience):
        super().learn(experience)
        if self.hp["ewc_mode"] == "separate":
            fisher = self.task_fisher(experience)
            self.task_fishers.append(fisher)
            self.task_anchors.append({k: p.detach().clone() for k, p in self.model.named_parameters() if k in fisher})
            return
        for k, f in self.task_fisher(experience).items():
            self.fisher[k] = self.fisher[k] + f if k in self.fisher else f
        self.anchor = {k: p.detach().clone() for k, p in self.model.named_parameters() if k in self.fisher}

    def task_fisher(self, experience):
        return (self.minibatch_fisher if self.hp["ewc_fisher"] == "minibatch" else self.sample_fisher)(experience)

    def minibatch_fisher(self, experience):
        """Mean over the task's minibatches of the squared gradient of the minibatch's mean loss
        (Avalanche 0.2.1, EWCPlugin.compute_importances)."""
        model = self.model.eval()
        params = {k: p for k, p in model.named_parameters() if p.requires_grad}
        fisher = {k: torch.zeros_like(p) for k, p in params.items()}
        batches = 0
        for x, y in experience.batches(shuffle=False):
            grads = torch.autograd.grad(self.cross_entropy(model(x), y), list(params.values()), allow_unused=True)
            with uncounted("EWC's Fisher sum"):   # elementwise: the FLOP meter steps aside (toolkit.metering)
                for k, g in zip(params, grads):
                    if g is not None:
                        fisher[k] += g.detach().pow(2)
            batches += 1
        return {k: f / batches for k, f in fisher.items()}

    @torch.no_grad()
    def sample_fisher(self, experience):
        """Mean over the task's samples of squared per-sample gradients of log p(y|x) (true labels)."""
        model = self.model.eval()
        params = {k: p.detach() for k, p in model.named_parameters() if p.requires_grad}
        buffers = dict(model.named_buffers())

        def nll(p, x, y):
            logits = functional_call(model, (p, buffers), (x[None],))
            return F.cross_entropy(self.labels.mask(logits, y[None]), y[None])

        chunk = max(1, 2**28 // sum(p.numel() for p in params.values()))   # ~1 GiB of per-sample grads
        per_sample = vmap(grad(nll), in_dims=(None, 0, 0), chunk_size=chunk)
        fisher = {k: torch.zeros_like(p) for k, p in params.items()}
        with torch.enable_grad():
            for x, y in experience.batches(shuffle=False):
                grads = per_sample(params, x, y)
                with uncounted("EWC's per-sample Fisher sum"):   # elementwise and sums: nothing to count
                    for k, g in grads.items():
                        fisher[k] += g.pow(2).sum(0)
        return {k: f / len(experience) for k, f in fisher.items()}


# separate_penalty through _SeparatePenalty (False: autograd's graph of anchored_penalty, the reference)
FUSED_PENALTY = True


class _SeparatePenalty(torch.autograd.Function):
    """sum_t sum_i F_t,i (theta_i - theta*_t,i)^2 with autograd's arithmetic, bit for bit, as one graph node whose
    forward and backward run outside the FLOP meter (elementwise ops and sums: nothing to count). Through
    autograd the penalty was ~5 nodes and ~11 ops per task and parameter, each op paying the meter's dispatch
    (issue 40: most of an ewc run's ops). The same ops in the same order: the forward is anchored_penalty's
    (``0 + s_1 + s_2 ...`` as Python's sum, per task, then over tasks); the backward is what autograd's nodes
    compute, d/dtheta = (g F) * (2 (theta - theta*)), and accumulate: the engine runs the nodes created last
    first, so a parameter's task terms were summed from the last task to the first (then the cross-entropy's
    gradient was added, as it is to this node's output).

    The backward's (g F) * (2 d) is computed as (2 (g F)) * d: the same real product (doubling is exact), so the
    same rounding, with 2 g F kept per Fisher tensor while g (lambda/2: the loss's scale) stays the same (on the
    CPU; a GPU recomputes it, as comparing g would wait for the device): one pass over each weight a task instead
    of three. Not where 2 g F overflows (it falls back to (g F) * (2 d) there) nor where |theta - theta*| >= 2^127
    (then 2 d overflows in autograd's form, and training has diverged long before)."""

    @staticmethod
    def forward(ctx, fishers, anchors, names, *params):
        with uncounted("EWC's separate penalty"):
            by_name = dict(zip(names, params))
            diffs, total = [], 0
            for fisher, anchor in zip(fishers, anchors):
                diffs.append({k: by_name[k] - anchor[k] for k in fisher})
                total = total + sum((w * diffs[-1][k].pow(2)).sum() for k, w in fisher.items())
        ctx.fishers, ctx.names, ctx.diffs = fishers, names, diffs
        return total

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        with uncounted("EWC's separate penalty (backward)"):
            sums = {}
            for fisher, diffs in zip(reversed(ctx.fishers), reversed(ctx.diffs)):
                for k, w in fisher.items():
                    double = _doubled_scale(grad, w)
                    term = double * diffs[k] if double is not None else (grad * w) * (diffs[k] * 2.0)
                    sums[k] = term if k not in sums else sums[k] + term
        return (None, None, None, *(sums.get(k) for k in ctx.names))


_DOUBLED: dict[int, tuple] = {}   # id(Fisher tensor) -> (weak reference to it, its version, g, 2 g F or None)


def _doubled_scale(grad: torch.Tensor, fisher: torch.Tensor) -> torch.Tensor | None:
    """2 (g F) for the backward of _SeparatePenalty, kept per Fisher tensor (and its in-place version) while g is
    unchanged; None on a GPU (comparing g would wait for it) and where doubling g F overflows: then autograd's
    (g F) * (2 d) is computed."""
    if grad.device.type != "cpu" or fisher.device.type != "cpu":
        return None
    key = id(fisher)
    entry = _DOUBLED.get(key)
    if entry is not None and entry[0]() is fisher and entry[1] == fisher._version and torch.equal(entry[2], grad):
        return entry[3]
    scaled = grad * fisher
    double = scaled * 2.0
    if bool((torch.isinf(double) & torch.isfinite(scaled)).any()):
        double = None
    _DOUBLED[key] = (weakref.ref(fisher, lambda _, key=key: _DOUBLED.pop(key, None)), fisher._version,
                     grad.detach().clone(), double)
    return double
