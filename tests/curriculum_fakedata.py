"""Tiny copies of the six M2I / I2M datasets in their real on-disk formats, under one data root."""
from __future__ import annotations

from pathlib import Path

from fakedata import (write_cifar10, write_fashion_mnist, write_mnist, write_omniglot, write_svhn,
                      write_tinyimagenet)

from clharness.benchmarks.m2i.kind import TINYIMAGENET_CLASSES

# Two Tiny ImageNet classes outside the ten, listed first in wnids.txt: listing order must not matter.
OTHER_WNIDS = ("n01443537", "n01629819")


def write_six(root, n_per_class: int = 3, omniglot_characters: int = 11, tiny_wnids=tuple(TINYIMAGENET_CLASSES),
              skip: tuple[str, ...] = ()) -> Path:
    """MNIST and Fashion-MNIST IDX files, Omniglot's background folder (the Alphabet of the Magi with
    ``omniglot_characters`` characters of 20 drawings, plus another alphabet), SVHN .mat files, CIFAR-10
    pickle batches and a Tiny ImageNet tree (wnids.txt, words.txt, val_annotations.txt). MNIST-like
    sets get ``n_per_class`` train and ``n_per_class // 2`` test images per class, and class 0 one
    extra train image, so balancing has a majority class to cut. ``skip`` leaves datasets out."""
    root = Path(root)
    if "mnist" not in skip:
        write_mnist(root, n_per_class=n_per_class, classes=list(range(10)) + [0])
    if "fashion-mnist" not in skip:
        write_fashion_mnist(root, n_per_class=n_per_class, seed=1)
    if "omniglot" not in skip:
        write_omniglot(root, alphabets=("Alphabet_of_the_Magi", "Latin"), characters=omniglot_characters,
                       drawings=20)
    if "svhn" not in skip:
        write_svhn(root, n_per_class=n_per_class, seed=2)
    if "cifar10" not in skip:
        write_cifar10(root, n_per_class=n_per_class, seed=3)
    if "tinyimagenet" not in skip:
        write_tinyimagenet(root, wnids=tuple(tiny_wnids), n_train=n_per_class, n_val=2, size=64,
                           extra_wnids=OTHER_WNIDS)
    return root
