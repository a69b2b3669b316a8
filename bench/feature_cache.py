"""Frozen-feature cache: repeated feature passes with and without ``FrozenFeatures``, side by side.

    python bench/feature_cache.py                                   # ViT-S/16 at 224x224, CPU
    python bench/feature_cache.py --model vit_base_patch16_224 --images 512 --device cuda

Both sides pass the same normalised images through the same frozen, randomly initialised timm ViT
``--passes`` times in batches (as epochs, evaluations and CLDyB look-ahead clones do): the plain side
calls the backbone every time; the cached side computes each image once and serves the other passes
from the cache. Also reported: the fingerprinting cost alone (what a fully cached pass costs), and
that the cached features equal the plain ones bit for bit.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from clharness.backbones import timm_backbone
from clharness.feature_cache import FrozenFeatures


def timed(fn, device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="vit_small_patch16_224")
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
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
