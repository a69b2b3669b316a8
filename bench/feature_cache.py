"""Frozen-feature cache: repeated feature passes with and without ``FrozenFeatures``, side by side.

    python bench/feature_cache.py                                   # ViT-S/16 at 224x224, CPU
    python bench/feature_cache.py --model vit_base_patch16_224 --images 512 --device cuda
    python bench/feature_cache.py --sweep                           # 5 frozen-backbone methods, tiny ViT, CPU
    python bench/feature_cache.py --sweep --model vit_base_patch16_224 --size 224 --depth 12 --device cuda

Both sides pass the same normalised images through the same frozen, randomly initialised timm ViT
``--passes`` times in batches (as epochs, evaluations and CLDyB look-ahead clones do): the plain side
calls the backbone every time; the cached side computes each image once and serves the other passes
from the cache. Also reported: the fingerprinting cost alone (what a fully cached pass costs), and
that the cached features equal the plain ones bit for bit.

``--sweep``: five frozen-backbone methods (SimpleCIL, RanPAC with phase 1 off, APER, EASE, HiDe-Prompt)
learn and are evaluated one after another on one class-incremental scenario (synthetic classes,
one frozen randomly initialised timm ViT shared by name and weights), with the shared cache on and
with it off (every frozen-feature request runs the backbone). Counted: the images the frozen
backbone itself processed (a forward hook; the adapted and prompted passes of APER, EASE and HiDe go
through the ViT's blocks, not this module, and are not cacheable), against the number of distinct
images in the scenario (the target: one pass for all five); wall time, median of ``--repeats``.
Finally SimpleCIL is run again with the cache on: a finished frozen-backbone method, re-run.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from clharness.toolkit.backbones import timm_backbone
from clharness.toolkit.feature_cache import FrozenFeatures


def timed(fn, device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, out


SWEEP = {"simplecil": {}, "ranpac": {"adapter": "none", "projection_dim": 2000},
         "aper": {}, "ease": {}, "hide_prompt": {"layers": "0-1"}}


def sweep(args) -> dict:
    """The five frozen-backbone methods over one scenario, shared cache on and off."""
    import statistics
    from unittest import mock

    import clharness as clh
    from clharness.toolkit import feature_cache
    from clharness.data.base import TensorData
    from clharness.data.synthetic import Synthetic
    from clharness_methods import REFERENCE_METHODS

    methods = {cls.name: cls for cls in REFERENCE_METHODS}
    device = torch.device(args.device)
    classes, tasks = 10, 5
    src = Synthetic(num_classes=classes, channels=3, image_size=args.size, similarity=0.3, noise=0.15,
                    train_per_class=args.per_class, test_per_class=args.per_class // 2, seed=0)
    train, test = src.load(None, True), src.load(None, False)
    mean, std = train.channel_stats()

    def part(ds, cls):
        return TensorData(ds.subset(torch.isin(ds.labels, torch.tensor(cls)).nonzero().squeeze(1)), mean, std,
                          device=device)
    splits = [tuple(range(2 * t, 2 * t + 2)) for t in range(tasks)]
    exps = [clh.Experience(part(train, c), c, None, args.batch, t) for t, c in enumerate(splits)]
    tests = [part(test, c) for c in splits]
    images = []
    vit = dict(model=args.model, img_size=args.size, depth=args.depth, **({"patch_size": 8} if args.size <= 64 else {}))

    def backbone():
        torch.manual_seed(0)                 # the same "pretrained" weights for every method
        net = timm_backbone((3, args.size, args.size), **vit)
        net.register_forward_hook(lambda m, i, o: images.append(len(i[0])))
        return net

    def run(name):
        ctx = clh.Context(clh.Setting.CLASS_IL, classes, (3, args.size, args.size), device=device, seed=0,
                          epochs=args.epochs, batch_size=args.batch, backbone_factory=backbone)
        method = methods[name](ctx, **SWEEP[name])
        for exp in exps:
            method.learn(exp)
        with torch.no_grad():
            for data in tests:
                for x, _ in data.batches(256, shuffle=False):
                    method.predict(x)

    def uncached(self, x):                   # cache off: every request runs the frozen backbone
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16, enabled=self.amp and x.is_cuda):
            return self.backbone(x).float()

    result = {"model": args.model, "depth": args.depth, "size": args.size, "device": str(device),
              "methods": args.methods, "distinct_images": sum(len(d) for d in exps) + sum(len(d) for d in tests)}
    for mode in ("off", "on"):               # "on" last: the re-run below finds its pool
        times, forwards = [], []
        for _ in range(args.repeats):
            feature_cache.clear_shared()
            images.clear()
            patch = mock.patch.object(feature_cache.FrozenFeatures, "forward", uncached) if mode == "off" else None
            if patch:
                patch.start()
            try:
                t, _ = timed(lambda: [run(name) for name in args.methods], device)
            finally:
                if patch:
                    patch.stop()
            times.append(t)
            forwards.append(sum(images))
        result[f"cache_{mode}_s"] = round(statistics.median(times), 2)
        result[f"cache_{mode}_backbone_images"] = forwards[0]
    images.clear()
    run("simplecil")                         # re-run a finished method: the pool still holds its features
    result["rerun_backbone_images"] = sum(images)
    feature_cache.clear_shared()
    result["speedup"] = round(result["cache_off_s"] / result["cache_on_s"], 2)
    print(json.dumps(result, indent=1))
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="default vit_small_patch16_224 (--sweep: the ptm-mini tiny ViT)")
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--size", type=int, default=None, help="default 224 (--sweep with the tiny ViT: 32)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sweep", action="store_true", help="five frozen-backbone methods, cache on vs off")
    ap.add_argument("--depth", type=int, default=None, help="--sweep: ViT blocks (default 12; tiny ViT: 2)")
    ap.add_argument("--epochs", type=int, default=1, help="--sweep: epochs per task")
    ap.add_argument("--per-class", type=int, default=40, help="--sweep: training images per class")
    ap.add_argument("--repeats", type=int, default=3, help="--sweep: repeats (median wall time)")
    ap.add_argument("--methods", nargs="+", default=list(SWEEP), choices=list(SWEEP), help="--sweep: a subset")
    args = ap.parse_args(argv)
    if args.sweep:
        tiny = args.model is None                # the ptm-mini ViT: 2 blocks, 8x8 patches on 32x32
        args.model = args.model or "vit_tiny_patch16_224"
        args.size = args.size or (32 if tiny else 224)
        args.depth = args.depth or (2 if tiny else 12)
        return sweep(args)
    args.model, args.size = args.model or "vit_small_patch16_224", args.size or 224
    device = torch.device(args.device)
    torch.manual_seed(0)
    backbone = timm_backbone((3, args.size, args.size), model=args.model, freeze=True).to(device)
    images = torch.randint(0, 256, (args.images, 3, args.size, args.size), dtype=torch.uint8)
    x_all = ((images.float() / 255 - 0.5) / 0.25).to(device)
    batches = list(x_all.split(args.batch))

    @torch.no_grad()
    def plain():
        return [torch.cat([backbone(x) for x in batches]) for _ in range(args.passes)]

    cache = FrozenFeatures(backbone)

    def cached():
        return [torch.cat([cache(x) for x in batches]) for _ in range(args.passes)]

    plain()                                   # warm-up (allocations, kernels) on the plain side only
    t_plain, ref = timed(plain, device)
    t_cached, got = timed(cached, device)
    t_keys, _ = timed(lambda: [cache.fingerprints(x) for x in batches], device)
    result = {"model": args.model, "device": str(device), "images": args.images, "passes": args.passes,
              "plain_s": round(t_plain, 3), "cached_s": round(t_cached, 3),
              "speedup": round(t_plain / t_cached, 2),        # all passes, the first (uncached) one included
              "per_pass_speedup": round(t_plain / args.passes / t_keys, 1),   # one pass served from the cache
              "per_pass_plain_s": round(t_plain / args.passes, 3),
              "per_cached_pass_s": round(t_keys, 4),
              "backbone_calls_cached": cache.calls, "backbone_calls_plain": args.passes * len(batches),
              "identical": all(torch.equal(a, b) for a, b in zip(ref, got))}
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
