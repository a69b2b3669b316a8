"""Dataset sources (one registry, filled by the ``clharness_add_datasets`` hook)."""
from __future__ import annotations

import functools
from pathlib import Path

from .base import ArrayDataset, DatasetMissing, DatasetSource, FileDataset, StreamData, TensorData
from .bundled import Digits
from .domains import CORe50, DomainNet
from .imagefolder import CUB200, ImageFolder, ImageNetR, TinyImageNet
from .synthetic import Synthetic
from .torchvision_sources import CIFAR10, CIFAR100, EMNIST, KMNIST, MNIST, SVHN, FashionMNIST, Omniglot

# name -> source class. clharness.builtin (the harness's plugin, above this layer) registers the same
# names lazily, by module path, so naming a dataset never imports torchvision; tests/test_layers.py
# checks that the two tables agree.
BUILTIN_SOURCES: dict[str, type[DatasetSource]] = {
    "digits": Digits, "mnist": MNIST, "fashion-mnist": FashionMNIST, "kmnist": KMNIST, "emnist": EMNIST,
    "cifar10": CIFAR10, "cifar100": CIFAR100, "svhn": SVHN, "omniglot": Omniglot, "imagefolder": ImageFolder,
    "tinyimagenet": TinyImageNet, "imagenet-r": ImageNetR, "cub200": CUB200, "synthetic": Synthetic,
    "core50": CORe50, "domainnet": DomainNet}


@functools.lru_cache(maxsize=16)
def _load_cached(cls, options: tuple, name: str, root: str | None, train: bool, download: bool,
                 system_folders: tuple = ()):   # in the key: a copy found elsewhere is another split
    source = cls(**dict(options))
    source.name = name
    return source.load(Path(root) if root else None, train, download)


# (source identity, train) -> a split of a root-free source handed to this process instead of being
# made here again (clharness.engine.ray_backend: once per session through Ray's object store)
PRELOADED: dict[tuple[str, bool], ArrayDataset] = {}


def load_split(source: DatasetSource, root: str | Path | None, train: bool, download: bool = False):
    """Load one split once per process (suites reuse a dataset across methods and seeds)."""
    if not source.needs_root and (source.identity(), train) in PRELOADED:
        return PRELOADED[(source.identity(), train)]
    if source.needs_root and root is None and not source.system_folders:
        raise DatasetMissing(source.name, None, source.layout or "see the dataset's documentation",
                             source.can_download)
    return _load_cached(type(source), tuple(sorted(source.options.items())), source.name,
                        str(root) if root else None, train, download, tuple(source.system_folders))


__all__ = ["ArrayDataset", "DatasetMissing", "DatasetSource", "FileDataset", "StreamData", "TensorData",
           "BUILTIN_SOURCES", "load_split"]
