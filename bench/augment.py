"""Augmentation throughput: clharness's on-device batched recipes vs torchvision transforms v2
applied per sample in a DataLoader with worker processes (what PyCIL and Avalanche do), same
recipe, side by side in one process, interleaved repeats, median images per second.

    python bench/augment.py                        # cifar (50,000 32x32 images) and vit (64x64 -> 224)
    python bench/augment.py --repeats 3 --device cuda --json augment.json

Both sides start from the same uint8 images in memory, shuffle, augment, convert to float and
normalise every minibatch of one epoch, and hand it over on the device (the timer stops after a
device sync). ``cifar``: RandomCrop(32, padding=4), RandomHorizontalFlip, ColorJitter(brightness=
63/255) (PyCIL). ``vit``: RandomResizedCrop(224, scale=(0.05, 1)), RandomHorizontalFlip (LAMDA-PILOT),
from 64x64 images.
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import time

import torch

from clharness.toolkit import augment
from clharness.data import ArrayDataset, TensorData
from clharness.method import Experience

MEAN, STD = [0.507, 0.487, 0.441], [0.267, 0.256, 0.276]


class UInt8Images(torch.utils.data.Dataset):
    """Per-sample access to uint8 (N, C, H, W) images with a torchvision v2 transform (module level: picklable)."""

    def __init__(self, images, labels, transform):
        self.images, self.labels, self.transform = images, labels, transform

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.transform(self.images[i]), self.labels[i]


def v2_transform(recipe: str):
    from torchvision.transforms import v2
    if recipe == "cifar":
        steps = [v2.RandomCrop(32, padding=4), v2.RandomHorizontalFlip(), v2.ColorJitter(brightness=63 / 255)]
    else:
        steps = [v2.RandomResizedCrop(224, scale=(0.05, 1.0), ratio=(3 / 4, 4 / 3), antialias=False),
                 v2.RandomHorizontalFlip()]
    return v2.Compose([*steps, v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cpu_seconds() -> float:
    """CPU time of this process (all threads) and of its finished children (DataLoader workers)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def ours(images, labels, recipe, size, batch_size, device, seed) -> tuple[float, float]:
    data = TensorData(ArrayDataset(images, labels, ["c"]), MEAN, STD, device, image_size=size,
                      recipe=augment.get(recipe))
    experience = Experience(data, (0,), None, batch_size=batch_size, seed=seed)
    sync(device)
    t0, c0 = time.perf_counter(), cpu_seconds()
    checksum = torch.zeros((), device=device)
    for batch in experience.batches():
        checksum += batch.x[0, 0, 0, 0]   # touch every batch, as a training step would
    sync(device)
    return len(labels) / (time.perf_counter() - t0), len(labels) / (cpu_seconds() - c0)


def dataloader(images, labels, recipe, batch_size, device, workers, seed) -> tuple[float, float]:
    loader = torch.utils.data.DataLoader(UInt8Images(images, labels, v2_transform(recipe)), batch_size=batch_size,
                                         shuffle=True, num_workers=workers, generator=torch.Generator().manual_seed(seed),
                                         pin_memory=device.type == "cuda", persistent_workers=False)
    sync(device)
    t0, c0 = time.perf_counter(), cpu_seconds()
    checksum = torch.zeros((), device=device)
    for x, _ in loader:
        checksum += x.to(device, non_blocking=True)[0, 0, 0, 0]
    sync(device)
    seconds = time.perf_counter() - t0
    del loader   # workers exit and are reaped: their CPU time joins RUSAGE_CHILDREN
    return len(labels) / seconds, len(labels) / (cpu_seconds() - c0)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipes", nargs="+", default=["cifar", "vit"], choices=["cifar", "vit"])
    p.add_argument("--images", type=int, default=50_000, help="images for the cifar recipe (32x32)")
    p.add_argument("--vit-images", type=int, default=5_000, help="images for the vit recipe (64x64 -> 224)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=1, help="torch threads of this process, both sides (0: torch's default); "
                   "1 by default: the loader's workers run one thread each, and on a shared machine more threads spin")
    p.add_argument("--json", help="write the per-recipe medians to this file")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    g = torch.Generator().manual_seed(0)
    rows = []
    for recipe in args.recipes:
        n, side, size = (args.images, 32, (32, 32)) if recipe == "cifar" else (args.vit_images, 64, (224, 224))
        images = torch.randint(0, 256, (n, 3, side, side), dtype=torch.uint8, generator=g)
        labels = torch.randint(0, 100, (n,), generator=g)
        a, b, ca, cb = [], [], [], []
        for r in range(args.repeats):   # interleaved, so load changes on a shared machine hit both sides
            wall, cpu = ours(images, labels, recipe, size, args.batch_size, device, r)
            a.append(wall), ca.append(cpu)
            wall, cpu = dataloader(images, labels, recipe, args.batch_size, device, args.workers, r)
            b.append(wall), cb.append(cpu)
        row = {"recipe": recipe, "ours_img_s": statistics.median(a), "dataloader_img_s": statistics.median(b)}
        row["speedup"] = row["ours_img_s"] / row["dataloader_img_s"]
        # images per CPU-second (workers included): the work each side does, whatever the machine's load
        row.update(ours_img_cpu_s=statistics.median(ca), dataloader_img_cpu_s=statistics.median(cb))
        row["cpu_speedup"] = row["ours_img_cpu_s"] / row["dataloader_img_cpu_s"]
        rows.append(row)
        print(f"{recipe:6s} {n} images {side}x{side} -> {size[0]}x{size[1]}, batch {args.batch_size}, {device}: "
              f"ours {row['ours_img_s']:,.0f} img/s, DataLoader ({args.workers} workers, v2 per sample) "
              f"{row['dataloader_img_s']:,.0f} img/s, speedup {row['speedup']:.1f}x "
              f"(median of {args.repeats}; ours {[round(v) for v in a]}, loader {[round(v) for v in b]}); per CPU-second: "
              f"ours {row['ours_img_cpu_s']:,.0f}, loader {row['dataloader_img_cpu_s']:,.0f} img, "
              f"{row['cpu_speedup']:.1f}x", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)


if __name__ == "__main__":
    main()
