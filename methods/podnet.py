"""PODNet: pooled outputs distillation for small-tasks incremental learning (Douillard et al. 2020),
as the authors' code trains it (arthurdouillard/incremental_learning.pytorch); where PyCIL's
``models/podnet.py`` differs, its behaviour is an option (class docstring, ``deviations``).

Intermediate feature maps from any backbone (PODNet distils the outputs of a ResNet's stages):
``stage_modules`` runs the backbone once on a dummy input with forward hooks on its *units*, the
modules reached from the backbone through ``nn.Sequential``/``ModuleList``/``ModuleDict``
containers only (a residual block or a ViT block is one unit, a Sequential is opened). Units are
grouped into blocks: a unit with parameters starts a block, the parameter-free units after it
(activations, pooling) join it; the last block keeps only the trailing units that keep its shape
(global pooling and flattening belong to the embedding, distilled by POD-flat). A stage ends where
the next block's output has another shape, and at the last block: on the CIFAR ResNet-32 these are
the outputs of its three stages, as in PyCIL. A backbone whose blocks all keep one shape (an MLP of
equal widths) has every block as a stage. Maps of shape (N, C) count as (N, C, 1, 1); tokens
(N, L, D) as (N, D, L, 1).
"""
from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

import clharness as clh
from clharness.toolkit.exemplars import ExemplarLearner, incremental_space, tensor_batches
from clharness.hparams import Choice
from clharness.method import MethodError
from clharness.toolkit.training import NEG, Trainer

CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


def _units(module: nn.Module, prefix: str = ""):
    for name, child in module.named_children():
        if isinstance(child, CONTAINERS):
            yield from _units(child, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", child


class capture_outputs:
    """Context manager: records the first output of each named submodule of ``module`` in a dict."""

    def __init__(self, module: nn.Module, names):
        self.module, self.names, self.outputs, self.handles = module, list(names), {}, []

    def __enter__(self) -> dict:
        modules = dict(self.module.named_modules())
        for name in self.names:
            def hook(_, __, out, name=name):
                self.outputs.setdefault(name, out)
            self.handles.append(modules[name].register_forward_hook(hook))
        return self.outputs

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()


@torch.no_grad()
def stage_modules(backbone: nn.Module, input_shape, device) -> list[str]:
    """Names of the backbone units whose outputs are PODNet's intermediate maps (module docstring)."""
    units = list(_units(backbone))
    if not units:
        raise MethodError("podnet: the backbone has no submodules to take intermediate maps from; "
                          "build it from nn.Sequential blocks or child modules")
    has_params = {name: any(True for _ in m.parameters()) for name, m in units}
    order = []
    was_training = backbone.training
    backbone.eval()
    hooks = []
    for name, m in units:
        hooks.append(m.register_forward_hook(lambda _, __, out, name=name: order.append((name, out.shape))))
    try:
        backbone(torch.zeros((2, *input_shape), device=device))
    finally:
        for h in hooks:
            h.remove()
        backbone.train(was_training)
    fired, seen = [], set()
    for name, shape in order:
        if name not in seen and isinstance(shape, torch.Size):
            seen.add(name)
            fired.append((name, tuple(shape[1:])))
    param_rows = [i for i, (name, _) in enumerate(fired) if has_params[name]]
    if not param_rows:
        raise MethodError("podnet: no backbone unit with parameters ran; cannot take intermediate maps")
    blocks: list[list[tuple[str, tuple]]] = []
    for name, shape in fired[param_rows[0]:param_rows[-1] + 1]:
        if has_params[name] or not blocks:
            blocks.append([])
        blocks[-1].append((name, shape))
    for name, shape in fired[param_rows[-1] + 1:]:   # trailing units that keep the shape
        if shape != blocks[-1][-1][1]:
            break
        blocks[-1].append((name, shape))
    ends = [b[-1] for b in blocks]
    stages = [ends[i][0] for i in range(len(ends) - 1) if ends[i][1] != ends[i + 1][1]] + [ends[-1][0]]
    return stages if len(stages) > 1 else [e[0] for e in ends]


def as_map(h: torch.Tensor) -> torch.Tensor:
    """(N, C) -> (N, C, 1, 1); tokens (N, L, D) -> (N, D, L, 1); (N, C, H, W) unchanged."""
    if h.dim() == 2:
        return h[:, :, None, None]
    if h.dim() == 3:
        return h.transpose(1, 2)[..., None]
    if h.dim() == 4:
        return h
    raise MethodError(f"podnet: cannot distil an intermediate output of shape {tuple(h.shape)}")


def pod_spatial(old_maps, new_maps) -> torch.Tensor:
    """POD-spatial (Douillard et al. 2020, sec. 3.1): per map h (N, C, H, W), squared as in the
    authors' and PyCIL's code, Phi(h) = [sum over W of h^2 (C*H values), sum over H of h^2 (C*W
    values)] L2-normalised; the loss is || Phi(h_old) - Phi(h_new) ||_2 averaged over the batch,
    then over the maps."""
    if len(old_maps) != len(new_maps) or not old_maps:
        raise ValueError("pod_spatial needs the same non-zero number of old and new maps")
    total = 0.0
    for a, b in zip(old_maps, new_maps):
        a, b = as_map(a).float().pow(2), as_map(b).float().pow(2)
        if a.shape != b.shape:
            raise ValueError(f"pod_spatial: map shapes differ, {tuple(a.shape)} vs {tuple(b.shape)}")
        pa = torch.cat([a.sum(3).flatten(1), a.sum(2).flatten(1)], 1)
        pb = torch.cat([b.sum(3).flatten(1), b.sum(2).flatten(1)], 1)
        total = total + (F.normalize(pa, dim=1) - F.normalize(pb, dim=1)).norm(dim=1).mean()
    return total / len(old_maps)


def pod_flat(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """POD-flat on the final embeddings, as PyCIL computes it: mean of 1 - cos(h_old, h_new)."""
    return (1 - F.cosine_similarity(new.float(), old.float(), dim=1)).mean()


class LocalSimilarityClassifier(nn.Module):
    """LSC (sec. 3.2): K proxies theta_{c,k} per class; s_{c,k} = <theta_{c,k}/||.||, h/||h||>, the
    class similarity y_c = sum_k softmax_k(s_{c,k}) s_{c,k}, scaled by a learned eta (init 1).
    ``similarity="neg_sq_distance"``: s_{c,k} = -||theta_{c,k}/||.|| - h/||h|| ||^2 = 2 cos - 2, the
    authors' config (``distance: neg_stable_cosine_distance``, proxy softmax at gamma 1)."""

    def __init__(self, dim: int, num_classes: int, proxies: int, similarity: str = "cosine"):
        super().__init__()
        if similarity not in ("cosine", "neg_sq_distance"):
            raise MethodError(f"podnet: unknown similarity {similarity!r}; choose cosine or neg_sq_distance")
        self.proxies, self.similarity = proxies, similarity
        self.weight = nn.Parameter(torch.empty(num_classes * proxies, dim).uniform_(-1 / math.sqrt(dim),
                                                                                   1 / math.sqrt(dim)))
        self.eta = nn.Parameter(torch.ones(1))
        self.frozen = None    # bool (num_classes,): classes whose proxies get no gradient

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if self.frozen is not None and self.frozen.any():
            keep = self.frozen.repeat_interleave(self.proxies)[:, None]
            w = torch.where(keep, w.detach(), w)
        s = F.linear(F.normalize(h, dim=1), F.normalize(w, dim=1)).view(len(h), -1, self.proxies)
        if self.similarity == "neg_sq_distance":
            s = 2 * s - 2
        return self.eta * (F.softmax(s, dim=2) * s).sum(2)


class PODNetModel(nn.Module):
    def __init__(self, backbone: nn.Module, num_classes: int, proxies: int, similarity: str = "cosine"):
        super().__init__()
        self.backbone = backbone
        self.head = LocalSimilarityClassifier(backbone.out_dim, num_classes, proxies, similarity)

    def features(self, x):
        return self.backbone(x)

    def forward(self, x):
        return self.head(self.backbone(x))

    def forward_with_maps(self, x, names):
        with capture_outputs(self.backbone, names) as maps:
            h = self.backbone(x)
        return [maps[n] for n in names], h, self.head(h)


def nca_loss(logits: torch.Tensor, y: torch.Tensor, margin: float, form: str = "code",
             scale=1.0) -> torch.Tensor:
    """The LSC's NCA loss on the scaled class similarities z = eta * y_c (``scale`` = eta).

    ``form="code"`` (default): ``nca`` of the authors' ``inclearn/lib/losses/base.py`` as PODNet's
    config calls it (exclude_pos_denominator true, hinge_proxynca false), copied unchanged in PyCIL:
    the margin is subtracted from every class, z' = z - eta * delta, M = max_j z'_j, and the true
    class's slot of the denominator is zeroed *after* the shift by M, so it stays as exp(0):
        loss = -(z'_y - M) + log( sum_{i != y} exp(z'_i - M) + 1 ),
    averaged over the batch, no hinge (the margin cancels; the loss is
    -z_y + log(sum_{i != y} exp z_i + exp max_j z_j) > 0).
    ``form="paper"``: eq. of sec. 3.2, [ -log exp(eta (y_y - delta)) / sum_{i != y} exp(eta y_i) ]_+ ,
    the true class out of the denominator, the margin on it only, hinged at 0.
    Classes masked to a very low logit drop out of the sums."""
    rows = torch.arange(len(y), device=y.device)
    if form == "code":
        z = logits - scale * margin
        z = z - z.max(1, keepdim=True).values
        pos = z[rows, y]
        rest = z.scatter(1, y[:, None], 0.0)        # the true class's slot: exp(0) = 1
        return (-pos + torch.logsumexp(rest, dim=1)).mean()
    if form == "paper":
        pos = logits[rows, y] - scale * margin
        others = logits.scatter(1, y[:, None], NEG)
        return F.relu(-pos + torch.logsumexp(others, dim=1)).mean()
    raise MethodError(f"podnet: unknown nca form {form!r}; choose 'code' or 'paper'")


def kmeans_centres(features: torch.Tensor, k: int, seed: int) -> torch.Tensor:
    """k-means (scikit-learn's KMeans, k-means++ init, 10 restarts, as the authors' code calls it)
    on ``features``; (k, D) centres. Fewer distinct samples than k: the centres of as many clusters
    as there are samples, repeated in turn."""
    from sklearn.cluster import KMeans
    f = features.detach().double().cpu().numpy()
    n = min(k, len(torch.unique(features, dim=0)))
    centres = torch.as_tensor(KMeans(n_clusters=n, n_init=10, random_state=seed).fit(f).cluster_centers_)
    return centres[torch.arange(k) % n].to(features)


class PODNet(ExemplarLearner):
    """Trains on the new data plus a herded exemplar memory with the LSC classifier's NCA loss,
    plus, from the second task on, lambda_c * POD-spatial over the backbone's stage outputs and
    lambda_f * POD-flat on the embedding against the previous model, both times the adaptive
    factor sqrt(classes seen / new classes) (``adaptive_factor=False``: 1). Old classes' proxies
    are frozen while a new task trains (the authors' ``groupwise_factors: old_weights: 0``, PyCIL's
    fc1 at lr 0).

    As the authors' code (arthurdouillard/incremental_learning.pytorch, ``inclearn/models/podnet.py``
    with ``options/podnet/podnet_cnn_cifar100.yaml``):
    - the NCA loss is their ``nca`` (``nca="code"``; see ``nca_loss``; ``nca="paper"``: sec. 3.2's
      hinged form with the true class out of the denominator);
    - from the second task on, the new classes' proxies are *imprinted* before training
      (``weight_init="imprinted"``; their ``weight_generation: imprinted, multi_class_diff: kmeans``):
      the class's training samples are embedded (eval mode), L2-normalised, clustered by k-means
      into K = ``proxies`` clusters, and the K centres times the mean norm of the existing (old)
      proxies become its K proxies (K = 1: the normalised mean of the normalised features);
      ``weight_init="random"`` keeps the initial random proxies (PyCIL);
    - after every task but the first the memory is rebuilt by herding and the LSC is fine-tuned
      on it (class-balanced fine-tuning, their ``finetuning_config``: undersampling, tuning
      classifier, lr 0.05, 20 epochs, no scheduler): ``finetune_params="classifier"`` trains the
      proxies of every seen class (old ones too; not eta, their post-processor is outside the
      classifier) at ``finetune_lr`` with ``finetune_scheduler``, SGD with the method's momentum
      and weight decay, on the same loss (the POD terms do not reach the classifier), memory samples
      through the suite's augmentation.
    The LSC similarity is the paper's (and PyCIL's) cosine; ``similarity="neg_sq_distance"`` gives the
    authors' config, 2 cos - 2 (see ``LocalSimilarityClassifier``).
    Predictions: the nearest mean of exemplars (``classifier="nme"``, default: the results PyCIL
    reports for PODNet; the authors' ``podnet_nme_cifar100.yaml``) or the LSC outputs (``"cnn"``, the
    authors' ``podnet_cnn`` configs)."""
    name = "podnet"
    version = "3"  # 3: GTEP Table 3 first task with the sampled scheduler kind (issue 30 item 1); 2: the authors' NCA, imprinted proxies, classifier-only fine-tuning (issue 28)
    paper = ("Douillard, Cord, Ollion, Robert & Valle, PODNet: Pooled Outputs Distillation for "
             "Small-Tasks Incremental Learning, ECCV 2020")
    reference = "arthurdouillard/incremental_learning.pytorch: inclearn/models/podnet.py"
    deviations = (
        "nca='code' (default) is the authors' loss, identical in PyCIL: the margin is subtracted from "
        "every class and cancels, the true class keeps exp(0) after the max-shift in the denominator, no "
        "hinge; nca='paper' is sec. 3.2's hinged loss with the margin on the true class only",
        "class-balanced fine-tuning as the authors' config (LSC proxies of all classes, lr 0.05, constant); "
        "PyCIL fine-tunes everything but the old proxies (eta included) at lr 0.005 with a cosine schedule: "
        "finetune_params='all_but_old', finetune_lr=0.005, finetune_scheduler='cosine'",
        "new proxies imprinted from k-means centres of normalised features as the authors' code "
        "(weight_init='imprinted'); PyCIL initialises them at random (weight_init='random')",
        "lambda_c defaults to PyCIL's 5 (the authors' CIFAR-100 config: 3)",
        "the LSC similarity is the paper's and PyCIL's cosine (similarity='cosine'); the authors' config "
        "uses -||h/|h| - theta/|theta|||^2 = 2 cos - 2 (similarity='neg_sq_distance'): twice the cosine "
        "inside the proxy softmax and before eta",
        "no element-wise gradient clamp to [-5, 5] (the authors' code registers one on every parameter; "
        "PyCIL does not)",
        "the balanced fine-tuning set is the memory already reduced to the budget (the authors' fixed "
        "memory per class; PyCIL fine-tunes on memory_size / old-classes exemplars per class)",
        "intermediate maps come from any backbone by the rule in the module docstring",
        "the global head exists from the start (unseen classes masked); exemplars and the task's data are "
        "one shuffled pass per epoch, as the reference's loader (rehearsal = 'balanced' gives a fixed share "
        "per batch)",
        "old proxies are frozen by a detached copy in the forward pass, so SGD's weight decay still "
        "shrinks them (their directions, all a cosine classifier uses, do not change)",
        "embedding='pre-relu' (default): on the harness's ResNets the last block returns its sum before the "
        "ReLU, so the LSC, POD-flat, NME and imprinting see a pre-ReLU embedding and POD-spatial a pre-ReLU "
        "last-stage map, as PyCIL's resnet32 with last=True (convs/ucir_cifar_resnet.py); the authors' "
        "rebuffi net (inclearn/convnet/my_resnet.py:284-301, raw_features) also keeps its earlier stage maps "
        "pre-ReLU. Other backbones embed as they are; embedding='post-relu' keeps the last ReLU",
    )
    hparams = {**incremental_space(weight_decay=5e-4),
               "scheduler": Choice(["constant", "steplr", "cosine"], default="cosine"),
               "lambda_c": clh.Float(0.0, 20.0, default=5.0),
               "lambda_f": clh.Float(0.0, 20.0, default=1.0),
               "proxies": clh.Int(1, 100, default=10),
               "margin": clh.Float(0.0, 2.0, default=0.6),
               "nca": Choice(["code", "paper"], default="code"),
               "similarity": Choice(["cosine", "neg_sq_distance"], default="cosine"),
               "weight_init": Choice(["imprinted", "random"], default="imprinted"),
               "finetune_epochs": clh.Int(0, 200, default=20),
               "finetune_lr": clh.Float(1e-5, 1.0, default=0.05, log=True),
               "finetune_params": Choice(["classifier", "all_but_old"], default="classifier"),
               "finetune_scheduler": Choice(["constant", "cosine"], default="constant"),
               "adaptive_factor": clh.Choice([True, False], default=True),
               "classifier": clh.Choice(["nme", "cnn"], default="nme"),
               # both references embed before the last ReLU (ResNet.raw_features; class docstring)
               "embedding": clh.Choice(["pre-relu", "post-relu"], default="pre-relu")}
    later_hparams = {"embedding": "post-relu"}   # added later: stored runs (post-ReLU) keep their keys
    # GTEP Table 4's PODNet sets (num proxy, post-FT epochs and LR, adaptive factor); the table
    # gives no sets for lambda_c / lambda_f, which keep PyCIL's 5 and 1.
    tuning_space = {"proxies": clh.Choice([10, 20, 30, 50, 100]),
                    "finetune_epochs": clh.Choice([5, 10, 20, 30, 50]),
                    "finetune_lr": clh.Choice([0.001, 0.003, 0.005, 0.007, 0.01]),
                    "adaptive_factor": clh.Choice([True, False])}

    def __init__(self, context, **hparams):
        super().__init__(context, **hparams)
        backbone = self.model.backbone
        if self.hp["embedding"] == "pre-relu" and hasattr(backbone, "raw_features"):
            backbone.raw_features()   # the harness's ResNets; other backbones embed as they are
        self.model = PODNetModel(backbone, context.num_classes, self.hp["proxies"],
                                 self.hp["similarity"]).to(context.device)
        self.map_names = stage_modules(backbone, context.input_shape, context.device)
        self.factor = 1.0

    def loss(self, x, y):
        maps, h, logits = self.model.forward_with_maps(x, self.map_names)
        loss = nca_loss(self.restrict(logits, y), y, self.hp["margin"], self.hp["nca"], self.model.head.eta)
        if self.old_model is not None and self.known:
            with torch.no_grad():
                old_maps, old_h, _ = self.old_model.forward_with_maps(x, self.map_names)
            loss = loss + self.factor * (self.hp["lambda_f"] * pod_flat(old_h, h)
                                         + self.hp["lambda_c"] * pod_spatial(old_maps, maps))
        return loss

    def learn(self, experience):
        self.known = list(self.labels.seen)
        self.labels.add(experience)
        self.seen_mask[list(experience.classes)] = True
        new = len(self.labels.seen) - len(self.known)
        adaptive = self.known and new and self.hp["adaptive_factor"]
        self.factor = math.sqrt(len(self.labels.seen) / new) if adaptive else 1.0
        if self.known and self.hp["weight_init"] == "imprinted":
            self.imprint(*experience.tensors(), [c for c in experience.classes if c not in self.known])
        frozen = torch.zeros_like(self.seen_mask)
        frozen[self.known] = True
        self.model.head.frozen = frozen
        trainer, epochs = self.task_trainer()
        self.fit(self.train_batches(experience, epochs), self.loss, trainer=trainer)
        self.update_memory(experience)
        if self.known and self.hp["finetune_epochs"] and len(self.memory):
            self.balanced_finetune(getattr(experience, "augment", None))
            self.update_class_means()
        self.model.head.frozen = None
        self.old_model = copy.deepcopy(self.model).eval().requires_grad_(False)

    @torch.no_grad()
    def imprint(self, x, y, classes):
        """Imprinted proxies for ``classes`` (class docstring), from their samples ``x``/``y``, scaled
        by the mean norm of the proxies of the classes seen before (``self.known``)."""
        head, k = self.model.head, self.hp["proxies"]
        rows = lambda c: slice(c * k, (c + 1) * k)   # noqa: E731
        norm = torch.cat([head.weight[rows(c)] for c in self.known]).norm(dim=1).mean()
        for c in classes:
            xc = x[y == c]
            if not len(xc):
                continue
            f = F.normalize(self.embed(xc), dim=1)
            if k == 1:
                centres = F.normalize(f.mean(0, keepdim=True), dim=1)
            else:
                centres = kmeans_centres(f, k, self.context.seed)
            head.weight[rows(c)] = centres.to(head.weight) * norm

    def balanced_finetune(self, augment=None):
        mx, my = self.memory.tensors()
        bs, epochs = self.context.batch_size, self.hp["finetune_epochs"]
        if self.hp["finetune_params"] == "classifier":
            self.model.head.frozen = None               # every class's proxies, not eta
            params = [self.model.head.weight]
        else:                                           # PyCIL: all but the old proxies (still frozen)
            params = None
        trainer = Trainer.for_method(self, params, lr=self.hp["finetune_lr"], scheduler="constant")
        if self.hp["finetune_scheduler"] == "cosine":
            trainer.schedule("cosine", epochs, math.ceil(len(my) / bs))
        self.fit(tensor_batches(mx, my, bs, epochs, self.gen, augment), self.loss, trainer=trainer)
