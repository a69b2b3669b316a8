"""The harness's own plugin: built-in datasets, backbones and shipped suite files."""
from __future__ import annotations

from importlib import resources
from pathlib import Path

from .hookspecs import hookimpl


# The built-in dataset sources by name, as module:class (clharness.data.BUILTIN_SOURCES holds the classes):
# registered without importing them, so checking a suite's names never imports torchvision's datasets.
BUILTIN_DATASETS = {
    "digits": "clharness.data.bundled:Digits",
    "mnist": "clharness.data.torchvision_sources:MNIST",
    "fashion-mnist": "clharness.data.torchvision_sources:FashionMNIST",
    "kmnist": "clharness.data.torchvision_sources:KMNIST",
    "emnist": "clharness.data.torchvision_sources:EMNIST",
    "cifar10": "clharness.data.torchvision_sources:CIFAR10",
    "cifar100": "clharness.data.torchvision_sources:CIFAR100",
    "svhn": "clharness.data.torchvision_sources:SVHN",
    "omniglot": "clharness.data.torchvision_sources:Omniglot",
    "imagefolder": "clharness.data.imagefolder:ImageFolder",
    "tinyimagenet": "clharness.data.imagefolder:TinyImageNet",
    "imagenet-r": "clharness.data.imagefolder:ImageNetR",
    "cub200": "clharness.data.imagefolder:CUB200",
    "synthetic": "clharness.data.synthetic:Synthetic",
    "core50": "clharness.data.domains:CORe50",
    "domainnet": "clharness.data.domains:DomainNet",
}


@hookimpl
def clharness_add_datasets(registry):
    from .registry import Lazy   # by name: a source's module is imported when a scenario first uses it
    for name, where in BUILTIN_DATASETS.items():
        registry.add(name, Lazy(*where.split(":")))


@hookimpl
def clharness_add_backbones(registry):
    from .toolkit.backbones import BUILTIN_BACKBONES
    for name, factory in BUILTIN_BACKBONES.items():
        registry.add(name, factory)


@hookimpl
def clharness_add_augmentations(registry):
    from .toolkit.augment import BUILTIN_RECIPES
    for name, recipe in BUILTIN_RECIPES.items():
        registry.add(name, recipe)


def suite_dir() -> Path:
    """The shipped suite files (the repo's suites/ folder, installed as clharness_suites)."""
    return Path(str(resources.files("clharness_suites")))


@hookimpl
def clharness_add_suites(registry):
    for path in sorted(suite_dir().glob("*.toml")):
        registry.add(path.stem, path)
