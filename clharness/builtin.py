"""The harness's own plugin: built-in datasets, backbones and shipped suite files."""
from __future__ import annotations

from importlib import resources
from pathlib import Path

from .hookspecs import hookimpl


@hookimpl
def clharness_add_datasets(registry):
    from .data import BUILTIN_SOURCES
    for name, source in BUILTIN_SOURCES.items():
        registry.add(name, source)


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
