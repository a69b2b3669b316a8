"""Backbones: feature extractors with an ``out_dim`` attribute, registered by name.

Every entry of ``BUILTIN_BACKBONES`` is a factory ``fn(input_shape, **options) -> nn.Module``
whose forward maps normalised inputs (N, C, H, W) to penultimate features (N, out_dim).
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import logging
import math
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    """Flatten, then ``layers`` x (Linear, ReLU) of width ``hidden``."""

    def __init__(self, input_shape, hidden: int = 256, layers: int = 2):
        super().__init__()
        dims = [math.prod(input_shape)] + [hidden] * layers
        blocks = [nn.Flatten()]
        for d_in, d_out in zip(dims, dims[1:]):
            blocks += [nn.Linear(d_in, d_out), nn.ReLU(inplace=True)]
        self.net = nn.Sequential(*blocks)
        self.out_dim = dims[-1]

    def forward(self, x):
        return self.net(x)


# --- the small CNN of the STF paper (Chrysakis & Moens), appendix C, Table 2 ------------------------------

def _conv_block(c_in: int, c_out: int) -> nn.Sequential:
    """Table 2 (left): Conv2D, ReLU, BatchNorm2D, Conv2D, ReLU, BatchNorm2D, MaxPooling2D(2, 2).
    The table gives no kernel size; 3x3 with padding 1 keeps the spatial size until the pooling."""
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU(inplace=True), nn.BatchNorm2d(c_out),
        nn.Conv2d(c_out, c_out, 3, padding=1), nn.ReLU(inplace=True), nn.BatchNorm2d(c_out),
        nn.MaxPool2d(2, 2))


class CNN(nn.Module):
    """STF paper, Table 2 (middle), the EMNIST network: ConvBlock(1, 32), ConvBlock(32, 64),
    Linear(64, c). The Linear(64, c) head implies 64 features, so the 64 feature maps are
    averaged globally (works for any input size >= 4x4). The input channel count follows the data."""

    def __init__(self, input_shape, widths: tuple[int, int] = (32, 64)):
        super().__init__()
        c = input_shape[0]
        self.features = nn.Sequential(_conv_block(c, widths[0]), _conv_block(widths[0], widths[1]),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.out_dim = widths[1]

    def forward(self, x):
        return self.features(x)


# --- residual networks -----------------------------------------------------------------------------------

class _BasicBlock(nn.Module):
    """He et al. 2016 basic block: conv3x3-BN-ReLU-conv3x3-BN plus shortcut, ReLU.
    ``shortcut="B"``: 1x1 conv + BN projection when the shape changes (GEM's reduced ResNet-18);
    ``shortcut="A"``: parameter-free, subsample and zero-pad the channels (He et al. 2016, sec. 4.2,
    the CIFAR ResNets; PyCIL's ``DownsampleA``)."""

    def __init__(self, c_in: int, c_out: int, stride: int, shortcut: str = "B"):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Identity()
        self.option_a = shortcut == "A" and (stride != 1 or c_in != c_out)
        self.pad, self.stride = c_out - c_in, stride   # option A: subsample, zero-pad the channels
        if shortcut == "B" and (stride != 1 or c_in != c_out):
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))
        self.last_relu = True   # False: the sum is returned before the ReLU (ResNet.raw_features)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.option_a:
            x = F.pad(x[:, :, ::self.stride, ::self.stride], (0, 0, 0, 0, 0, self.pad))
        else:
            x = self.shortcut(x)
        return F.relu(out + x) if self.last_relu else out + x


class ResNet(nn.Module):
    """conv3x3 stem (no max-pool), stages of basic blocks, global average pooling."""

    def __init__(self, input_shape, widths, blocks, strides, shortcut: str):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(input_shape[0], widths[0], 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(widths[0]), nn.ReLU(inplace=True))
        layers, c_in = [], widths[0]
        for width, n, stride in zip(widths, blocks, strides):
            for i in range(n):
                layers.append(_BasicBlock(c_in, width, stride if i == 0 else 1, shortcut))
                c_in = width
        self.layers = nn.Sequential(*layers)
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.out_dim = c_in
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        return self.pool(self.layers(self.stem(x)))

    def raw_features(self, raw: bool = True) -> "ResNet":
        """``raw``: the last block returns its residual sum before the ReLU, so the embedding (and
        the last stage's map) is pre-ReLU, as PODNet's references use it (PyCIL's resnet32 built with
        ``last=True``; the authors' ``raw_features``). Other methods keep the ReLU (the default)."""
        self.layers[-1].last_relu = not raw
        return self


def resnet18_reduced(input_shape, nf: int = 20) -> ResNet:
    """The reduced ResNet-18 of Lopez-Paz & Ranzato 2017 (GEM), used by MIR and the STF paper
    (Table 2, right): BasicBlock(nf, 2, 1), (2nf, 2, 2), (4nf, 2, 2), (8nf, 2, 2), nf=20, so 160
    features. GEM averages a 4x4 window (sized for 32x32 inputs); here the pooling is global, so
    any input size works and the features stay 8*nf wide."""
    return ResNet(input_shape, [nf, 2 * nf, 4 * nf, 8 * nf], [2, 2, 2, 2], [1, 2, 2, 2], shortcut="B")


def resnet32(input_shape) -> ResNet:
    """The CIFAR ResNet-32 of He et al. 2016 (sec. 4.2; 6n+2 layers with n=5) as in PyCIL, used by
    GTEP: 3 stages of 5 basic blocks with 16/32/64 filters, identity (option A) shortcuts, 64 features."""
    return ResNet(input_shape, [16, 32, 64], [5, 5, 5], [1, 2, 2], shortcut="A")


# --- timm models -----------------------------------------------------------------------------------------

# Pretrained weights without --clh-download come from local files only: a ``checkpoint`` file, or timm's
# own caches (the Hugging Face hub cache, the torch hub cache). The session sets this (pytest_plugin).
_downloads: dict = {"allowed": False}


class WeightsMissing(FileNotFoundError):
    """Pretrained weights that are not on this machine (and may not be downloaded)."""


def _not_cached(model: str, looked: list[str], why: str = "") -> WeightsMissing:
    where = " and in ".join(looked) or "no cache (timm names no weights file for it)"
    return WeightsMissing(
        f"timm backbone {model!r}: pretrained weights not found on this machine and downloads are off"
        f"{f' ({why})' if why else ''}; looked in {where}. Fix: set checkpoint = \"PATH\" (a local weights "
        "file) in the suite's backbone_options, or add --clh-download to fetch them into the cache once")


def allow_downloads(allowed: bool) -> None:
    """Whether pretrained weights may be downloaded (--clh-download). Off: timm loads cached files only,
    and the Hugging Face hub runs in offline mode (HF_HUB_OFFLINE, also for code that calls it directly)
    until ``reset_downloads()``."""
    _downloads["allowed"] = allowed
    if not allowed and "saved" not in _downloads:
        _downloads["saved"] = os.environ.get("HF_HUB_OFFLINE")
        _hub_offline("1")
    elif allowed:
        reset_downloads(allowed=True)


def reset_downloads(allowed: bool = False) -> None:
    """The hub's offline setting as it was before ``allow_downloads(False)`` (end of a session)."""
    _downloads["allowed"] = allowed
    if "saved" in _downloads:
        _hub_offline(_downloads.pop("saved"))


def _hub_offline(value: str | None) -> None:
    if value is None:
        os.environ.pop("HF_HUB_OFFLINE", None)
    else:
        os.environ["HF_HUB_OFFLINE"] = value
    constants = sys.modules.get("huggingface_hub.constants")   # read at its import; is_offline_mode() reads this
    if constants is not None:
        constants.HF_HUB_OFFLINE = (value or "").upper() in ("1", "ON", "YES", "TRUE")


def cached_weights(model: str) -> Path:
    """The local file of timm's pretrained weights for ``model``: the Hugging Face cache entry timm would
    load, else the torch hub cache file of its URL. Raises WeightsMissing naming every place it looked."""
    import timm
    import torch.hub
    from urllib.parse import urlparse

    if model.startswith(("hf-hub:", "hf_hub:")):   # timm reads such a model's config from the hub itself
        raise _not_cached(model, [], "a hub model name: timm fetches its config and weights from the hub")
    cfg = timm.models.get_pretrained_cfg(model)
    if cfg is None:
        raise _not_cached(model, [], "timm has no pretrained weights of that name")
    looked = []
    if cfg.hf_hub_id:
        from huggingface_hub import constants, try_to_load_from_cache
        repo, _, revision = cfg.hf_hub_id.partition("@")
        names = [cfg.hf_hub_filename] if cfg.hf_hub_filename else ["model.safetensors", "pytorch_model.bin"]
        for name in names:   # timm prefers the safetensors file
            hit = try_to_load_from_cache(repo, name, cache_dir=constants.HF_HUB_CACHE, revision=revision or None)
            if isinstance(hit, str):
                return Path(hit)
        looked.append(f"the Hugging Face cache {constants.HF_HUB_CACHE} ({repo}: {' or '.join(names)})")
    if cfg.url:
        path = Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(urlparse(cfg.url).path)
        if path.is_file():
            return path
        looked.append(f"the torch hub cache {path}")
    raise _not_cached(model, looked)


class TimmBackbone(nn.Module):
    """A timm model created with ``num_classes=0`` (forward gives pooled features).
    With ``freeze`` every parameter is frozen and the model stays in eval mode (fixed BN
    statistics, no dropout) even when a method calls ``train()``."""

    def __init__(self, model: nn.Module, freeze: bool = False):
        super().__init__()
        self.model = model
        self.out_dim = model.num_features
        self.frozen = freeze
        if freeze:
            self.model.requires_grad_(False)
            self.model.eval()

    def train(self, mode: bool = True):
        super().train(mode)
        if self.frozen:
            self.model.eval()
        return self

    def forward(self, x):
        return self.model(x)


def timm_backbone(input_shape, model: str = "vit_base_patch16_224", pretrained: bool = False,
                  checkpoint: str | None = None, img_size=None, freeze: bool = False,
                  **timm_kwargs) -> TimmBackbone:
    """Any timm model as a feature extractor.

    ``pretrained``: timm's own weights: from its local caches, or downloaded only when the session
    allows it (``allow_downloads``, --clh-download). ``checkpoint``: a local weights file, loaded
    through timm's pretrained path (``pretrained_cfg_overlay=dict(file=...)``) so the usual
    adaptations (input channels, position-embedding resampling, dropped classifier) apply; loading
    fails if any backbone weight is missing from the file, and the file is refused (WeightsMismatch)
    when it names other weights than ``model`` does (``checkpoint_tag``: a bare architecture name means
    the weights timm resolves it to, ``full_tag``). ``img_size``: passed to models that take it; by
    default the input's (H, W) is offered to models that accept ``img_size`` (ViTs)."""
    import timm

    kwargs = dict(num_classes=0, in_chans=input_shape[0], **timm_kwargs)
    if checkpoint is None and pretrained and not _downloads["allowed"]:
        checkpoint = cached_weights(model)   # a cached file goes the checkpoint way: timm never asks the hub
    if checkpoint is not None:
        path = Path(checkpoint).expanduser()
        if not path.is_file():
            raise WeightsMissing(f"timm backbone {model!r}: checkpoint file {str(path)!r} does not exist. Fix: point "
                                 "checkpoint = \"PATH\" in the suite's backbone_options at a weights file on this "
                                 "machine, or drop checkpoint and use pretrained = true with --clh-download")
        check_checkpoint(model, path)   # a file of other weights than the suite names is refused
        kwargs.update(pretrained_cfg_overlay=dict(file=str(path)))
        pretrained = True
    sizes = [img_size] if img_size is not None else [tuple(input_shape[1:]), None]

    records: list[logging.LogRecord] = []
    handler = _ListHandler(records)
    log = logging.getLogger("timm.models._builder")
    old_level = log.level
    log.addHandler(handler)
    if not log.isEnabledFor(logging.INFO):
        log.setLevel(logging.INFO)
    try:
        for i, size in enumerate(sizes):
            extra = {} if size is None else {"img_size": size}
            try:
                net = timm.create_model(model, pretrained=pretrained, **kwargs, **extra)
                break
            except TypeError as exc:   # the model does not take img_size: retry without
                if "img_size" not in str(exc) or i == len(sizes) - 1 or img_size is not None:
                    raise
            except RuntimeError as exc:   # a tensor of the file has another shape than the model's
                if checkpoint is None or "size mismatch" not in str(exc):
                    raise
                raise WeightsMismatch(f"timm backbone {model!r}: checkpoint {str(checkpoint)!r} holds weights of "
                                      f"another architecture: {_shorten(str(exc))}. Fix: point checkpoint at weights "
                                      f"of {model!r} (with these backbone_options), or name their model") from None
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)
    if checkpoint is not None:   # every weight of the model from the file, and nothing the model does not hold
        for what, start in (("does not hold every weight of the model", "Missing keys"),
                            ("holds weights the model does not have", "Unexpected keys")):
            found = [r.getMessage() for r in records if r.getMessage().startswith(start)]
            if found:
                raise WeightsMismatch(f"timm backbone {model!r}: checkpoint {str(checkpoint)!r} {what} (weights of "
                                      f"another architecture): {_shorten(found[0])}. Fix: point checkpoint at "
                                      f"weights of {model!r} (with these backbone_options), or name their model")
    return TimmBackbone(net, freeze=freeze)


def _shorten(text: str, limit: int = 400) -> str:
    return text if len(text) <= limit else text[:limit] + " ...)"


class _ListHandler(logging.Handler):
    def __init__(self, records):
        super().__init__(logging.DEBUG)
        self.records = records

    def emit(self, record):
        self.records.append(record)


# --- Wide-VGG9 of the M2I/I2M benchmark ----------------------------------------------------------------

class WideVGG9(nn.Module):
    """The Wide-VGG9 of M2I/I2M (Faber et al. 2024, sec. 4.1, "4.5M parameters"), as in the paper's
    public code (lifelonglab/M2I_I2M_benchmark, models/VGGSlim.py config 'wide_VGG9' and
    models/model_provider.py): conv3x3 64, M, 128, M, 256, 256, M, 512, 512, M, each conv followed by
    BatchNorm and ReLU; then the VGG classifier's hidden part Linear(flat, 512), ReLU, Linear(512, 512),
    ReLU (flat = 512 * (H/16) * (W/16) = 8192 at 64x64). The last Linear(512, classes) is our head."""

    CONFIG = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M")

    def __init__(self, input_shape, hidden: int = 512):
        super().__init__()
        layers, c = [], input_shape[0]
        for v in self.CONFIG:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(c, v, 3, padding=1), nn.BatchNorm2d(v), nn.ReLU(inplace=True)]
                c = v
        self.features = nn.Sequential(*layers, nn.Flatten())
        h, w = (max(1, d // 16) for d in input_shape[1:])
        if min(input_shape[1:]) < 16:
            raise ValueError(f"wide-vgg9 needs inputs of at least 16x16 (four 2x2 poolings); got {tuple(input_shape)}")
        self.classifier = nn.Sequential(nn.Linear(c * h * w, hidden), nn.ReLU(inplace=True),
                                        nn.Linear(hidden, hidden), nn.ReLU(inplace=True))
        self.out_dim = hidden

    def forward(self, x):
        return self.classifier(self.features(x))


def wide_vgg9(input_shape, hidden: int = 512) -> WideVGG9:
    return WideVGG9(input_shape, hidden)


def efficientnet_b1(input_shape, pretrained: bool = False, **options) -> TimmBackbone:
    """EfficientNet-B1 (Tan & Le 2019) from timm, the M2I/I2M mid-size backbone; random init by default."""
    return timm_backbone(input_shape, model="efficientnet_b1", pretrained=pretrained, **options)


def resnet34(input_shape, pretrained: bool = False, **options) -> TimmBackbone:
    """ResNet-34 (He et al. 2016) from timm, the M2I/I2M large backbone; random init by default."""
    return timm_backbone(input_shape, model="resnet34", pretrained=pretrained, **options)


def vit_b16_in21k(input_shape, pretrained: bool = True, model: str = "vit_base_patch16_224.orig_in21k",
                  **options) -> TimmBackbone:
    """ViT-B/16 pretrained supervised on ImageNet-21K, the "Sup-21K" backbone of the prompt methods
    CLDyB compares: the original Google weights ``imagenet21k/ViT-B_16.npz`` that the codes of L2P,
    DualPrompt, HiDe-Prompt and PGP load (l2p-pytorch ``vision_transformer.py:92-93``, HiDe-Prompt
    ``vits/dp_vision_transformer.py:95``), timm's ``orig_in21k`` tag (not the later ``augreg_in21k``
    weights). Pretrained by default: the weights come from ``checkpoint = "PATH"`` or timm's local
    cache (else --clh-download).
    ``model`` names another timm model with the same treatment (tests use a tiny one)."""
    return timm_backbone(input_shape, model=model, pretrained=pretrained, **options)


def vit_b16_clip(input_shape, pretrained: bool = True, model: str = "vit_base_patch16_clip_224.openai",
                 **options) -> TimmBackbone:
    """CLIP ViT-B/16 image encoder (OpenAI weights through timm; CLDyB fig. 11), its 768-d pooled
    [CLS] feature before CLIP's projection. Pretrained by default, weights as for ``vit-b16-in21k``.
    CLIP was trained on inputs normalised with its own mean/std: a scenario's ``normalize = "timm"``
    feeds it those (``input_normalization``); otherwise the scenario's own normalisation applies."""
    return timm_backbone(input_shape, model=model, pretrained=pretrained, **options)


BUILTIN_BACKBONES = {
    "mlp": MLP,
    "cnn": CNN,
    "resnet18-reduced": resnet18_reduced,
    "resnet32": resnet32,
    "timm": timm_backbone,
    "wide-vgg9": wide_vgg9,
    "efficientnet-b1": efficientnet_b1,
    "resnet34": resnet34,
    "vit-b16-in21k": vit_b16_in21k,
    "vit-b16-clip": vit_b16_clip,
}


# --- what the input pipeline feeds a backbone, and which weights it holds --------------------------------

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
# A scenario's ``normalize`` key: how pixels in [0, 1] become the backbone's inputs, x' = (x - mean) / std.
#   "dataset":  the dataset source's own statistics (in-memory data: its train split's per-channel mean
#               and std; image trees: ImageNet's), the harness's behaviour before the key existed;
#   "none":     the [0, 1] tensors themselves (mean 0, std 1): what LAMDA-PILOT, L2P/DualPrompt-pytorch and
#               their descendants feed their pretrained ViTs (ToTensor, no Normalize);
#   "imagenet": ImageNet's mean (0.485, 0.456, 0.406) and std (0.229, 0.224, 0.225);
#   "timm":     the mean and std of the timm model's ``pretrained_cfg`` (augreg ViTs: 0.5 and 0.5, CLIP: its
#               own), i.e. what the weights were trained on.
NORMALIZATIONS = ("dataset", "none", "imagenet", "timm")


def _factory_default(backbone: str, option: str):
    factory = BUILTIN_BACKBONES.get(backbone)
    if factory is None:
        return None
    param = inspect.signature(factory).parameters.get(option)
    return None if param is None or param.default is inspect.Parameter.empty else param.default


def timm_model(backbone: str, options: dict | None = None) -> str | None:
    """The timm model name a registered backbone builds with these options (None: not a timm model)."""
    options = options or {}
    if backbone in ("efficientnet-b1", "resnet34"):
        return backbone.replace("-", "_")
    model = options.get("model", _factory_default(backbone, "model"))
    return model if isinstance(model, str) else None


def full_tag(model: str) -> str:
    """``architecture.tag`` of a timm model name: a bare architecture resolves to the weights timm picks
    for it (timm >= 1.0: ``vit_base_patch16_224`` -> ``vit_base_patch16_224.augreg2_in21k_ft_in1k``).
    Names timm has no pretrained weights for come back unchanged."""
    if "." in model or model.startswith(("hf-hub:", "hf_hub:")):
        return model
    import timm
    cfg = timm.models.get_pretrained_cfg(model)
    tag = getattr(cfg, "tag", None) if cfg is not None else None
    return f"{model}.{tag}" if tag else model


def input_normalization(normalize: str = "dataset", backbone: str = "", options: dict | None = None,
                        dataset_stats=None) -> tuple[list[float], list[float]]:
    """(mean, std) per channel for a scenario's ``normalize`` (see NORMALIZATIONS), the one place that
    decides it for every family: ``backbone`` and ``options`` are the scenario's (``"timm"`` reads the
    model's ``pretrained_cfg``), ``dataset_stats`` a callable giving the dataset's own (``"dataset"``)."""
    if normalize == "dataset":
        if dataset_stats is None:
            raise ValueError('normalize = "dataset" needs the dataset\'s statistics')
        return dataset_stats()
    if normalize == "none":
        return [0.0], [1.0]
    if normalize == "imagenet":
        return list(IMAGENET_MEAN), list(IMAGENET_STD)
    if normalize == "timm":
        model = timm_model(backbone, options)
        if model is None:
            raise ValueError(f'normalize = "timm" needs a timm backbone; backbone {backbone!r} is not one '
                             '(use "dataset", "none" or "imagenet")')
        import timm
        cfg = timm.models.get_pretrained_cfg(model) if not model.startswith(("hf-hub:", "hf_hub:")) else None
        if cfg is None or not cfg.mean or not cfg.std:
            raise ValueError(f'normalize = "timm": timm names no pretrained mean/std for {model!r}')
        return [float(v) for v in cfg.mean], [float(v) for v in cfg.std]
    raise ValueError(f"normalize = {normalize!r}; allowed: {', '.join(NORMALIZATIONS)}")


def weights_identity(backbone: str, options: dict | None = None) -> str:
    """What a run's record stores about its backbone's weights: for a weights file it loads (a checkpoint,
    or timm's cached pretrained file) the tag the file carries (``checkpoint_tag``) or ``untagged``, and
    ``sha256:<first 16>`` of its content; the full timm tag of pretrained weights whose file is not
    here (loaded some other way); ``"<model> (random init)"`` for an untrained timm model; "" otherwise."""
    options = options or {}
    model = timm_model(backbone, options)
    if model is None:
        return ""
    pretrained = options.get("pretrained", _factory_default(backbone, "pretrained")) or options.get("checkpoint")
    if not pretrained:
        return f"{model} (random init)"
    path = weights_file(backbone, options)
    if path is None:
        try:
            path = cached_weights(model)
        except Exception:   # not in timm's caches (or a name timm does not know): the run itself reports it
            path = None
    if path is not None and path.is_file():
        return f"{checkpoint_tag(path) or 'untagged'} sha256:{file_sha256(path)[:16]}"
    try:
        return full_tag(model)
    except Exception:   # a name timm does not know: the run itself reports it
        return model


def weights_file(backbone: str, options: dict | None = None) -> Path | None:
    """The weights file a suite names for its backbone (``backbone_options.checkpoint``), None without one."""
    options = options or {}
    checkpoint = options.get("checkpoint")
    if not checkpoint or timm_model(backbone, options) is None:
        return None
    return Path(checkpoint).expanduser()


def weights_key(backbone: str, options: dict | None = None) -> str | None:
    """What the record key holds of the weights file a run loads: its content hash, so replacing the file
    retrains. A named checkpoint (a file not there yet: its path, the run then fails naming it), else timm's
    cached pretrained file of the model (other weights cached under the same model name retrain too). None
    without a file: no weights, or pretrained weights not cached here (timm fetches them; the model name in
    the key is all that is known before the run)."""
    path = weights_file(backbone, options)
    if path is None:
        path = _cached_pretrained_file(backbone, options or {})
        if path is None:
            return None
    return f"sha256:{file_sha256(path)}" if path.is_file() else f"missing:{path}"


def _cached_pretrained_file(backbone: str, options: dict) -> Path | None:
    """The cached file of timm's pretrained weights this backbone loads, None if it loads none or none is here."""
    model = timm_model(backbone, options)
    if model is None or not options.get("pretrained", _factory_default(backbone, "pretrained")):
        return None
    try:
        return cached_weights(model)
    except Exception:   # not cached, or a name timm does not know: the run itself reports it
        return None


def file_sha256(path) -> str:
    """The sha256 of a file's content, hashed once per path, size and modification time (an unchanged
    file is never read twice; a replaced one is)."""
    path = Path(path).resolve()
    st = path.stat()
    return _sha256(str(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=256)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def pretrained_weights(backbone: str, options: dict | None = None) -> bool:
    """Whether the backbone starts from pretrained or checkpoint weights (its options or its factory's default)."""
    options = options or {}
    return bool(options.get("pretrained", _factory_default(backbone, "pretrained")) or options.get("checkpoint"))


class WeightsMismatch(WeightsMissing):
    """A checkpoint that holds other weights than the ones the suite names."""


TAG_KEY = "timm_model"   # where save_checkpoint writes the full tag (torch dict key / safetensors metadata)


def save_checkpoint(state_dict: dict, path, model: str) -> Path:
    """Write ``state_dict`` as a checkpoint that names its weights (``model``'s full tag): safetensors
    metadata for a ``.safetensors`` path, else a torch file {"state_dict": ..., "timm_model": tag} (timm
    loads both)."""
    path = Path(path)
    tag = full_tag(model)
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file
        save_file({k: v.contiguous() for k, v in state_dict.items()}, str(path), metadata={TAG_KEY: tag})
    else:
        torch.save({"state_dict": state_dict, TAG_KEY: tag}, path)
    return path


def checkpoint_tag(path) -> str | None:
    """The full timm tag a weights file names, None when it names none: the tag the file carries
    (``save_checkpoint``), else the ``config.json`` beside it (timm's hub layout: architecture and
    pretrained_cfg.tag), else its Hugging Face cache folder (``models--timm--<model.tag>``)."""
    import json
    path = Path(path)
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open
            with safe_open(str(path), framework="pt") as f:
                tag = (f.metadata() or {}).get(TAG_KEY)
        else:
            try:
                obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError:   # not a zip file: mmap is unavailable
                obj = torch.load(path, map_location="cpu", weights_only=True)
            tag = obj.get(TAG_KEY) if isinstance(obj, dict) else None
    except Exception:   # unreadable here: timm's own loader reports it
        tag = None
    if isinstance(tag, str) and tag:
        return tag
    config = path.parent / "config.json"
    if config.is_file():
        try:
            data = json.loads(config.read_text())
            arch, tag = data.get("architecture"), (data.get("pretrained_cfg") or {}).get("tag")
            if arch and tag:
                return f"{arch}.{tag}"
        except (ValueError, OSError):
            pass
    for part in reversed(path.parts):
        if part.startswith("models--timm--"):
            return part[len("models--timm--"):]
    return None


def check_checkpoint(model: str, path) -> None:
    """Refuse a checkpoint whose weights are not the ones ``model`` names (WeightsMismatch)."""
    found = checkpoint_tag(path)
    named = full_tag(model)
    if found is not None and found != named:
        raise WeightsMismatch(
            f"timm backbone {model!r}: checkpoint {str(path)!r} holds the weights "
            f"{found!r}, but the suite names {named!r}"
            f"{f' (timm resolves {model!r} to it)' if named != model else ''}. Fix: name the weights the paper "
            f"used in full (model = \"{found}\" if these are the ones), or point checkpoint at a file of {named!r}")
