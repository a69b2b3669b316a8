"""Training-time data augmentation: named recipes applied to whole minibatches on the device.

A suite names a recipe with the scenario key ``augment`` (``none``, ``cifar``, ``imagenet``,
``vit``, ``strong``; plugins add more through ``clharness_add_augmentations(registry)``). The data objects
(``clharness.data.TensorData``/``StreamData``) apply it: ``Recipe.train`` to training batches
when a method asks ``experience.batches()`` (never to test or validation data), and
``Recipe.eval``, the deterministic test-time view some recipes define (resize 256, centre crop
224), to every other batch. Random draws come from a ``torch.Generator`` on the data's device
seeded by the run (``Experience`` owns it), so a run is reproducible and ``none`` draws nothing.

Every op works on the whole minibatch at once (no per-sample Python loop): crop and flip together
as one ``gather`` over the padded batch (on the uint8 pixels where the data allow it), brightness
as a per-sample affine map (fused into the uint8 -> float normalisation on the hot path), random
resized crops (and their flips) as one ``affine_grid`` + ``grid_sample``.
Inputs are float tensors in any affine pixel space, described by a ``Frame``: the per-channel
values of black and white. The harness augments after its uint8 -> mean/std normalisation, so
the frame is (-mean/std, (1-mean)/std); brightness then acts exactly as on [0, 1] pixels
(out = black + f (x - black), clipped to [black, white]) and crop padding is black, as in
torchvision on PIL images.

Deliberate differences from the torchvision/PIL pipelines the recipes come from:
- pixels stay float: no rounding to uint8 after brightness jitter;
- random resized crops sample bilinearly without antialiasing (PIL/torchvision antialias when
  a crop is shrunk; for the usual upscaling to 224 there is no difference);
- replay memories keep the raw (test-view) float images a method offered them, counted as uint8
  (CLDyB B.4); replayed samples are augmented from that view (a crop of the eval view for ``vit``);
- the random resized crop box is drawn as torchvision draws it (10 tries of scale and log-ratio,
  first valid one, else the centre crop with clamped ratio), with all tries drawn at once;
- ``Recipe.eval``'s "resize shorter side to 256, centre crop 224" is one resampling of the
  centred square of side 224/256 of the shorter side (same geometry, one interpolation);
- for file trees streamed by a DataLoader the recipe acts on the decoded batch at the
  scenario's image size (already resized by the workers), not on the full-resolution file;
- ``strong``'s colour jitter works on float [0, 1] pixels (PIL's ImageEnhance/HSV work on uint8):
  contrast blends with the exact mean luma, not PIL's rounded histogram mean, and hue rotates in
  float HSV; luma weights are PIL's (0.299, 0.587, 0.114).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from ..registry import Registry


@dataclass(frozen=True)
class Frame:
    """Per-channel values of black and white (shape (1, C, 1, 1)) in the space of the inputs."""
    black: torch.Tensor
    white: torch.Tensor

    @classmethod
    def unit(cls, channels: int, device=None) -> "Frame":
        """Plain [0, 1] pixels."""
        return cls(torch.zeros(1, channels, 1, 1, device=device), torch.ones(1, channels, 1, 1, device=device))

    @classmethod
    def normalised(cls, mean, std, device=None) -> "Frame":
        """Pixels p in [0, 1] stored as (p - mean) / std."""
        mean = torch.as_tensor(mean, dtype=torch.float32, device=device).view(1, -1, 1, 1)
        std = torch.as_tensor(std, dtype=torch.float32, device=device).view(1, -1, 1, 1)
        return cls(-mean / std, (1 - mean) / std)


# ------------------------------------------------------------------------------ batched ops
def crop_at(x: torch.Tensor, padding: int, fill: torch.Tensor | None, top: torch.Tensor, left: torch.Tensor,
            flip: torch.Tensor | None = None) -> torch.Tensor:
    """Crop each image of ``x`` (N, C, H, W), padded by ``padding`` pixels of ``fill`` (1, C, 1, 1;
    None: zeros, black for uint8 pixels), at (``top[n]``, ``left[n]``) of the padded image, keeping
    H x W, mirrored left-right where ``flip[n]``: one ``gather`` over the flattened padded batch."""
    n, c, h, w = x.shape
    p = padding
    padded = F.pad(x if fill is None else x - fill.to(x.dtype), (p, p, p, p))   # pad value 0 = the fill
    k = torch.arange(w, device=x.device)
    cols = left.view(n, 1) + (k if flip is None else torch.where(flip.view(n, 1), w - 1 - k, k))
    rows = top.view(n, 1) + torch.arange(h, device=x.device)
    index = (rows.view(n, h, 1) * (w + 2 * p) + cols.view(n, 1, w)).view(n, 1, h * w).expand(n, c, h * w)
    out = padded.reshape(n, c, -1).gather(2, index).view(n, c, h, w)
    return out if fill is None else out.add_(fill.to(x.dtype))


def random_crop(x: torch.Tensor, padding: int, fill: torch.Tensor | None, generator: torch.Generator,
                flip_p: float = 0.0) -> torch.Tensor:
    """torchvision ``RandomCrop(size=(H, W), padding)`` (offsets uniform in [0, 2 * padding]),
    then ``RandomHorizontalFlip(flip_p)`` folded into the same gather."""
    offsets = torch.randint(0, 2 * padding + 1, (2, len(x)), generator=generator, device=x.device)
    flip = torch.rand(len(x), generator=generator, device=x.device) < flip_p if flip_p else None
    return crop_at(x, padding, fill, offsets[0], offsets[1], flip)


def random_flip(x: torch.Tensor, generator: torch.Generator, p: float = 0.5) -> torch.Tensor:
    """``RandomHorizontalFlip(p)``: each image mirrored left-right with probability p."""
    flip = torch.rand(len(x), generator=generator, device=x.device) < p
    return torch.where(flip.view(-1, 1, 1, 1), x.flip(3), x)


def brightness(x: torch.Tensor, frame: Frame, factor: torch.Tensor) -> torch.Tensor:
    """PIL/torchvision brightness: a blend with black, black + f (x - black), clipped to [black, white]."""
    black, white = frame.black.to(x), frame.white.to(x)
    out = torch.addcmul(black, factor.view(-1, 1, 1, 1).to(x.dtype), x - black)
    return torch.minimum(torch.maximum(out, black), white)


def random_brightness(x: torch.Tensor, frame: Frame, amount: float, generator: torch.Generator) -> torch.Tensor:
    """``ColorJitter(brightness=amount)``: factor uniform in [max(0, 1 - amount), 1 + amount] per image."""
    factor = torch.empty(len(x), device=x.device).uniform_(max(0.0, 1 - amount), 1 + amount, generator=generator)
    return brightness(x, frame, factor)


def resized_crop(x: torch.Tensor, boxes: torch.Tensor, size: tuple[int, int], flip: torch.Tensor | None = None,
                 mode: str = "bilinear") -> torch.Tensor:
    """Resample box ``boxes[n] = (top, left, height, width)`` (input pixels, float) of every image
    to ``size``, mirrored where ``flip[n]``: one ``affine_grid`` + ``grid_sample`` for the batch."""
    n, c, h, w = x.shape
    top, left, bh, bw = boxes.to(torch.float32).unbind(1)
    sx, sy = bw / w, bh / h
    if flip is not None:
        sx = torch.where(flip, -sx, sx)
    theta = torch.zeros(n, 2, 3, device=x.device)
    theta[:, 0, 0], theta[:, 0, 2] = sx, (2 * left + bw) / w - 1
    theta[:, 1, 1], theta[:, 1, 2] = sy, (2 * top + bh) / h - 1
    grid = F.affine_grid(theta, [n, c, *size], align_corners=False)
    return F.grid_sample(x.float(), grid.to(torch.float32), mode=mode, padding_mode="border", align_corners=False)


def resized_crop_boxes(n: int, h: int, w: int, scale: tuple[float, float], ratio: tuple[float, float],
                       generator: torch.Generator, device=None, tries: int = 10) -> torch.Tensor:
    """``RandomResizedCrop.get_params`` for n images at once: (N, 4) boxes (top, left, height, width)."""
    area = h * w
    s = torch.empty(n, tries, device=device).uniform_(scale[0], scale[1], generator=generator)
    log_r = torch.empty(n, tries, device=device).uniform_(math.log(ratio[0]), math.log(ratio[1]), generator=generator)
    aspect = torch.exp(log_r)
    bw = torch.round(torch.sqrt(area * s * aspect))
    bh = torch.round(torch.sqrt(area * s / aspect))
    ok = (bw > 0) & (bw <= w) & (bh > 0) & (bh <= h)
    first = ok.to(torch.uint8).argmax(1, keepdim=True)     # the first valid try (0 when none is)
    bw, bh, found = bw.gather(1, first).squeeze(1), bh.gather(1, first).squeeze(1), ok.any(1)
    # no valid try: the whole image, its ratio clamped to the range, centred (torchvision's fallback)
    if w / h < min(ratio):
        fw, fh = w, round(w / min(ratio))
    elif w / h > max(ratio):
        fw, fh = round(h * max(ratio)), h
    else:
        fw, fh = w, h
    bw = torch.where(found, bw, torch.full_like(bw, fw))
    bh = torch.where(found, bh, torch.full_like(bh, fh))
    u = torch.rand(2, n, generator=generator, device=device)
    top = torch.where(found, torch.floor(u[0] * (h - bh + 1)), torch.div(h - bh, 2, rounding_mode="floor"))
    left = torch.where(found, torch.floor(u[1] * (w - bw + 1)), torch.div(w - bw, 2, rounding_mode="floor"))
    return torch.stack([top, left, bh, bw], 1)


def centre_crop_resize(x: torch.Tensor, fraction: float, size: tuple[int, int], frame: Frame,
                       mode: str = "bilinear") -> torch.Tensor:
    """``Resize(round(S / fraction))`` then ``CenterCrop(S)``: the centred square of side
    fraction x min(H, W), resampled to ``size``; bicubic overshoot clipped to the frame."""
    n, _, h, w = x.shape
    side = fraction * min(h, w)
    box = torch.tensor([(h - side) / 2, (w - side) / 2, side, side], device=x.device).expand(n, 4)
    out = resized_crop(x, box, size, mode=mode)
    if mode == "bicubic":
        out = torch.minimum(torch.maximum(out, frame.black.to(out)), frame.white.to(out))
    return out


# ------------------------------------------------------------------------------ colour ops (on [0, 1] pixels)
# ITU-R 601-2 luma, PIL's "L" conversion (the reference's ColorJitter runs on PIL images)
LUMA = (0.299, 0.587, 0.114)


def to_unit(x: torch.Tensor, frame: Frame) -> torch.Tensor:
    """Inputs in ``frame`` -> [0, 1] pixels."""
    black, white = frame.black.to(x), frame.white.to(x)
    return (x - black) / (white - black)


def from_unit(p: torch.Tensor, frame: Frame) -> torch.Tensor:
    """[0, 1] pixels -> inputs in ``frame``."""
    black, white = frame.black.to(p), frame.white.to(p)
    return black + p * (white - black)


def luma(p: torch.Tensor) -> torch.Tensor:
    """(N, 3, H, W) RGB -> (N, 1, H, W) grey."""
    w = torch.tensor(LUMA, dtype=p.dtype, device=p.device).view(1, 3, 1, 1)
    return (p * w).sum(1, keepdim=True)


def _per_sample(f: torch.Tensor) -> torch.Tensor:
    return f.view(-1, 1, 1, 1)


def adjust_brightness(p: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Blend with black: f p, clipped to [0, 1] (``brightness`` in the unit frame)."""
    return brightness(p, Frame.unit(p.shape[1], p.device), factor)


def adjust_contrast(p: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Blend with the image's mean grey level: f p + (1 - f) mean, clipped (1 channel: its mean)."""
    grey = luma(p) if p.shape[1] == 3 else p
    mean = grey.mean((1, 2, 3), keepdim=True)
    f = _per_sample(factor)
    return (f * p + (1 - f) * mean).clamp_(0, 1)


def adjust_saturation(p: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Blend with the grey image: f p + (1 - f) luma(p), clipped (RGB only)."""
    f = _per_sample(factor)
    return (f * p + (1 - f) * luma(p)).clamp_(0, 1)


def rgb_to_hsv(p: torch.Tensor) -> torch.Tensor:
    """(N, 3, H, W) RGB in [0, 1] -> HSV, each in [0, 1] (hue in turns; grey pixels get hue 0)."""
    r, g, b = p.unbind(1)
    v = torch.maximum(torch.maximum(r, g), b)
    c = v - torch.minimum(torch.minimum(r, g), b)            # chroma
    s = c / torch.where(v > 0, v, torch.ones_like(v))
    # hue sextant times chroma: from the largest channel, r first as PIL and colorsys
    h6c = torch.where(v == r, g - b, torch.where(v == g, 2 * c + b - r, 4 * c + r - g))
    h = h6c / (6 * torch.where(c > 0, c, torch.ones_like(c)))
    h = torch.where(h < 0, h + 1, h)
    return torch.stack([h, s, v], 1)


def hsv_to_rgb(hsv: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`rgb_to_hsv`: channel c = v - v s clamp(min(k, 4 - k), 0, 1) with
    k = (n_c + 6 h) mod 6, n = (5, 3, 1) for (r, g, b) (the six-sector formula, without branches)."""
    h, s, v = hsv[:, 0:1], hsv[:, 1:2], hsv[:, 2:3]
    n = torch.tensor([5.0, 3.0, 1.0], dtype=hsv.dtype, device=hsv.device).view(1, 3, 1, 1)
    k = (n + 6 * h) % 6
    return v - v * s * torch.minimum(k, 4 - k).clamp(0, 1)


def adjust_hue(p: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Rotate every pixel's hue by ``shift[n]`` turns (HSV), saturation and value kept (RGB only)."""
    hsv = rgb_to_hsv(p)
    hsv[:, 0] = (hsv[:, 0] + _per_sample(shift).squeeze(1)) % 1.0
    return hsv_to_rgb(hsv)


def grayscale(p: torch.Tensor) -> torch.Tensor:
    """RGB -> grey replicated over the three channels."""
    return luma(p).expand_as(p).clone()


def random_color_jitter(p: torch.Tensor, brightness: float, contrast: float, saturation: float, hue: float,
                        apply_p: float, generator: torch.Generator) -> torch.Tensor:
    """``RandomApply([ColorJitter(brightness, contrast, saturation, hue)], p=apply_p)`` on [0, 1]
    pixels, per-sample factors (uniform in [1 - a, 1 + a], hue in [-hue, hue]) and, as torchvision,
    a random order of the four adjustments per image. 1-channel inputs: brightness and contrast
    only (torchvision leaves grey images unchanged under saturation and hue)."""
    n, device = len(p), p.device
    apply = torch.rand(n, generator=generator, device=device) < apply_p
    u = torch.rand(4, n, generator=generator, device=device)
    factors = [1 - brightness + 2 * brightness * u[0], 1 - contrast + 2 * contrast * u[1],
               1 - saturation + 2 * saturation * u[2], hue * (2 * u[3] - 1)]
    order = torch.rand(n, 4, generator=generator, device=device).argsort(1)   # a permutation per image
    ops = [adjust_brightness, adjust_contrast, adjust_saturation, adjust_hue]
    if p.shape[1] != 3:
        ops = ops[:2]
    p = p.clone()
    for step in range(4):
        for k, op in enumerate(ops):
            rows = (apply & (order[:, step] == k)).nonzero().squeeze(1)
            if len(rows):
                p[rows] = op(p[rows], factors[k][rows])
    return p


def random_grayscale(p: torch.Tensor, prob: float, generator: torch.Generator) -> torch.Tensor:
    """``RandomGrayscale(prob)`` on [0, 1] RGB pixels; 1-channel inputs are returned unchanged
    (the draw is still made, so the random stream does not depend on the channel count)."""
    chosen = torch.rand(len(p), generator=generator, device=p.device) < prob
    if p.shape[1] != 3:
        return p
    return torch.where(chosen.view(-1, 1, 1, 1), grayscale(p), p)


# ------------------------------------------------------------------------------ recipes
class Recipe:
    """A named augmentation recipe. ``train(x, frame, size, generator)`` returns a random view of
    the batch at ``size``; ``eval(x, frame, size)`` the deterministic view of test (and raw train)
    batches, or None where the data's own resize is the view. ``resizes``: ``train``/``eval`` take
    images at their native size and resample to ``size`` themselves (one interpolation, not two)."""
    name: ClassVar[str] = ""
    source: ClassVar[str] = ""       # the paper or codebase and the exact transforms it copies
    resizes: ClassVar[bool] = False

    @property
    def active(self) -> bool:
        """False only for the identity recipe: data objects then skip augmentation entirely."""
        return True

    def train(self, x: torch.Tensor, frame: Frame, size: tuple[int, int], generator: torch.Generator) -> torch.Tensor:
        raise NotImplementedError(f"augmentation recipe {self.name!r} does not define train()")

    def train_pixels(self, images: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, frame: Frame,
                     size: tuple[int, int], generator: torch.Generator) -> torch.Tensor:
        """``train`` on uint8 ``images`` normalised as shift + scale * pixel (the data's hot path). A
        recipe may override it to work on the uint8 pixels and fuse the normalisation (same draws)."""
        return self.train(torch.addcmul(shift, images, scale), frame, size, generator)

    def eval(self, x: torch.Tensor, frame: Frame, size: tuple[int, int]) -> torch.Tensor | None:
        return None

    def __repr__(self) -> str:
        return f"<augmentation {self.name!r}: {self.source}>"


class NoAugmentation(Recipe):
    """No augmentation (STF section 4: "We have not used any data augmentation"; M2I's public
    code (lifelonglab/M2I_I2M_benchmark, scenarios/datasets/*: ToTensor, Resize, Normalize))."""
    name = "none"
    source = "identity"

    @property
    def active(self) -> bool:
        return False

    def train(self, x, frame, size, generator):
        return x


class CifarAugmentation(Recipe):
    """PyCIL's CIFAR-10/100 train transform (G-U-N/PyCIL utils/data.py, iCIFAR100.train_trsf):
    RandomCrop(32, padding=4) (black padding), RandomHorizontalFlip(p=0.5),
    ColorJitter(brightness=63/255); test: none. Applied at the scenario's image size."""
    name = "cifar"
    source = "PyCIL iCIFAR10/100: RandomCrop(32, padding=4), RandomHorizontalFlip(), ColorJitter(brightness=63/255)"
    padding, flip_p, brightness = 4, 0.5, 63 / 255

    def train(self, x, frame, size, generator):
        x = random_crop(x, self.padding, frame.black, generator, self.flip_p)
        return random_brightness(x, frame, self.brightness, generator)

    def train_pixels(self, images, shift, scale, frame, size, generator):
        # the same draws as train(); crop and flip on the uint8 pixels (zero padding is black), then
        # brightness fused into the normalisation: black + f (x - black) = shift + (f * scale) * pixel,
        # never below black (pixel, f >= 0), clipped at white
        x = random_crop(images, self.padding, None, generator, self.flip_p)
        n = len(x)
        factor = torch.empty(n, device=x.device).uniform_(1 - self.brightness, 1 + self.brightness, generator=generator)
        out = torch.addcmul(shift, x, scale * factor.view(n, 1, 1, 1))
        return torch.minimum(out, frame.white, out=out)


class ResizedCropAugmentation(Recipe):
    """RandomResizedCrop(size, scale, ratio) + RandomHorizontalFlip(0.5) (+ brightness jitter),
    crop and flip in one grid_sample; test view: Resize(256) + CenterCrop(224) (``eval_fraction``)."""
    resizes = True
    scale: ClassVar[tuple[float, float]] = (0.08, 1.0)
    ratio: ClassVar[tuple[float, float]] = (3 / 4, 4 / 3)
    brightness: ClassVar[float] = 0.0
    eval_fraction: ClassVar[float] = 224 / 256
    eval_mode: ClassVar[str] = "bilinear"

    def train(self, x, frame, size, generator):
        n, _, h, w = x.shape
        boxes = resized_crop_boxes(n, h, w, self.scale, self.ratio, generator, x.device)
        flip = torch.rand(n, generator=generator, device=x.device) < 0.5
        out = resized_crop(x, boxes, size, flip)
        return random_brightness(out, frame, self.brightness, generator) if self.brightness else out

    def eval(self, x, frame, size):
        return centre_crop_resize(x, self.eval_fraction, size, frame, self.eval_mode)


class ImageNetAugmentation(ResizedCropAugmentation):
    """PyCIL's ImageNet train transform (G-U-N/PyCIL utils/data.py, iImageNet1000): 
    RandomResizedCrop(224) (scale (0.08, 1), ratio (3/4, 4/3), bilinear), RandomHorizontalFlip(),
    ColorJitter(brightness=63/255); test: Resize(256), CenterCrop(224) (bilinear)."""
    name = "imagenet"
    source = ("PyCIL iImageNet1000: RandomResizedCrop(224), RandomHorizontalFlip(), ColorJitter(brightness=63/255); "
              "test Resize(256), CenterCrop(224)")
    brightness = 63 / 255


class ViTAugmentation(ResizedCropAugmentation):
    """LAMDA-PILOT's pretrained-ViT transform (sun-hailong/LAMDA-PILOT utils/data.py,
    build_transform): RandomResizedCrop(224, scale=(0.05, 1.0), ratio=(3/4, 4/3)),
    RandomHorizontalFlip(p=0.5); test: Resize(256, bicubic), CenterCrop(224)."""
    name = "vit"
    source = ("LAMDA-PILOT build_transform: RandomResizedCrop(224, scale=(0.05, 1), ratio=(3/4, 4/3)), "
              "RandomHorizontalFlip(0.5); test Resize(256, bicubic), CenterCrop(224)")
    scale = (0.05, 1.0)
    eval_mode = "bicubic"


class StrongAugmentation(Recipe):
    """SimCLR-style strong views, mammoth's ``strong_aug`` (utils/augmentations.py), which X-DER
    uses for its future-heads consistency term: RandomHorizontalFlip(0.5),
    RandomResizedCrop(size, scale=(0.2, 1), ratio (3/4, 4/3)),
    RandomApply([ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8), RandomGrayscale(0.2) (luma 0.299,
    0.587, 0.114). Flip and crop are one grid_sample; the colour ops run on [0, 1] pixels mapped
    from the frame and back, with per-sample factors and, as torchvision's ColorJitter, a random
    order of the four adjustments per image. 1-channel inputs: saturation, hue and grayscale are
    skipped (identities on grey images in torchvision). Test view: none (the data's own)."""
    name = "strong"
    source = ("mammoth strong_aug (X-DER): RandomHorizontalFlip(), RandomResizedCrop(size, scale=(0.2, 1)), "
              "RandomApply([ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8), RandomGrayscale(0.2)")
    scale: ClassVar[tuple[float, float]] = (0.2, 1.0)
    ratio: ClassVar[tuple[float, float]] = (3 / 4, 4 / 3)
    jitter: ClassVar[tuple[float, float, float, float]] = (0.4, 0.4, 0.4, 0.1)
    jitter_p: ClassVar[float] = 0.8
    grayscale_p: ClassVar[float] = 0.2

    def train(self, x, frame, size, generator):
        n, _, h, w = x.shape
        boxes = resized_crop_boxes(n, h, w, self.scale, self.ratio, generator, x.device)
        flip = torch.rand(n, generator=generator, device=x.device) < 0.5
        p = to_unit(resized_crop(x, boxes, tuple(size), flip), frame).clamp_(0, 1)
        p = random_color_jitter(p, *self.jitter, self.jitter_p, generator)
        return from_unit(random_grayscale(p, self.grayscale_p, generator), frame)


BUILTIN_RECIPES: dict[str, Recipe] = {r.name: r for r in
                                      (NoAugmentation(), CifarAugmentation(), ImageNetAugmentation(), ViTAugmentation(),
                                       StrongAugmentation())}

_builtin: Registry | None = None


def recipes() -> Registry:
    """The recipes known to this process: those of the last Harness built (every plugin it loaded, so
    suite files are checked against what plugins added), else the built-ins."""
    global _builtin
    from ..plugins import active_augmentations
    installed = active_augmentations()
    if installed is not None:
        return installed
    if _builtin is None:
        registry = Registry("augmentation recipe")
        registry.source = "clharness.builtin"
        for name, recipe in BUILTIN_RECIPES.items():
            registry.add(name, recipe)
        _builtin = registry
    return _builtin


def get(name: str) -> Recipe | None:
    """The recipe named ``name``, or None for ``none`` (data objects then take their plain path)."""
    if name not in recipes():
        raise ValueError(f"augment = {name!r} is not a registered augmentation recipe; registered: "
                         f"{', '.join(recipes())}. Plugins add recipes with clharness_add_augmentations(registry)")
    recipe = recipes()[name]
    return recipe if recipe.active else None
