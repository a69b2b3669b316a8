"""The plugin manager and the registries its hooks fill.

Plugins arrive three ways, as with pytest: the ``clharness`` entry-point group (installed
packages, the reference methods included), modules named by ``-p``/``--clh-plugin``, and
``conftest.py`` files (the pytest plugin forwards every pytest plugin that carries
``clharness_*`` hook implementations).
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pluggy

from . import hookspecs
from .kinds import BUILTIN_KINDS
from .registry import Registry

BUILTIN = "clharness.builtin"            # datasets, backbones and the shipped suite files
REFERENCE_METHODS = "clharness_methods"  # also found by entry point when installed

_KINDS = {"methods": ("method", "clharness_add_methods"),
          "datasets": ("dataset", "clharness_add_datasets"),
          "suites": ("suite", "clharness_add_suites"),
          "backbones": ("backbone", "clharness_add_backbones"),
          "augmentations": ("augmentation recipe", "clharness_add_augmentations"),
          "kinds": ("kind", "clharness_add_kinds")}


def has_hookimpls(plugin: Any) -> bool:
    return any(name.startswith("clharness_") and callable(getattr(plugin, name, None))
               and getattr(getattr(plugin, name), "clharness_impl", None) is not None
               for name in dir(plugin))


class Harness:
    """Everything registered: ``harness.methods``, ``.datasets``, ``.suites``, ``.backbones``."""

    def __init__(self, plugins: tuple[Any, ...] = (), entry_points: bool = True):
        self.pm = pluggy.PluginManager("clharness")
        self.pm.add_hookspecs(hookspecs)
        self._registries: dict[str, Registry] | None = None
        self.register(BUILTIN)
        self.register(BUILTIN_KINDS)   # the five benchmark families, as any plugin
        if entry_points:
            self.pm.load_setuptools_entrypoints("clharness")
        self.register(REFERENCE_METHODS)   # no-op when its entry point already loaded it
        for plugin in plugins:
            self.register(plugin)

    def register(self, plugin: str | ModuleType | Any, source: str | None = None) -> None:
        if isinstance(plugin, str):
            plugin = import_plugin(plugin)
        if self.pm.is_registered(plugin):
            return
        self.pm.register(plugin, name=source or _describe(plugin))
        self._registries = None

    def _build(self) -> dict[str, Registry]:
        if self._registries is None:
            dists = {id(p): d for p, d in self.pm.list_plugin_distinfo()}
            registries = {}
            for attr, (kind, hook) in _KINDS.items():
                registry = Registry(kind)
                for impl in getattr(self.pm.hook, hook).get_hookimpls():   # registration order
                    dist = dists.get(id(impl.plugin))
                    registry.source = (f"entry point of {dist.project_name} {dist.version} ({impl.plugin_name})"
                                       if dist is not None else impl.plugin_name)
                    impl.function(registry=registry)
                registries[attr] = registry
            self._registries = registries
            from .toolkit import augment
            augment.install(registries["augmentations"])   # suite files are checked against these
            from . import kinds
            kinds.install(registries["kinds"])             # ... and their scenario kinds against these
        return self._registries

    @property
    def methods(self) -> Registry:
        return self._build()["methods"]

    @property
    def datasets(self) -> Registry:
        return self._build()["datasets"]

    @property
    def suites(self) -> Registry:
        return self._build()["suites"]

    @property
    def backbones(self) -> Registry:
        return self._build()["backbones"]

    @property
    def kinds(self) -> Registry:
        """Benchmark families (clharness.kinds.Kind), named by a scenario's ``kind``."""
        return self._build()["kinds"]

    @property
    def augmentations(self) -> Registry:
        """Training augmentation recipes (clharness.toolkit.augment), named by the suite key ``augment``."""
        return self._build()["augmentations"]

    def run_finished(self, record) -> None:
        self.pm.hook.clharness_run_finished(record=record)


def import_plugin(spec: str) -> ModuleType:
    """A plugin named by -p/--clh-plugin: a path to a ``.py`` file, or a module name importable from
    sys.path or from the current directory. The ``pytest`` and ``clharness`` console scripts do not put
    the current directory on sys.path (``python -m`` does), so a method file next to the user is found
    here rather than failing with "No module named ..."."""
    path = Path(spec)
    if spec.endswith(".py") or os.sep in spec or (os.altsep and os.altsep in spec):
        if not path.is_file():
            raise ImportError(f"clharness plugin file {spec!r} does not exist (cwd {Path.cwd()}); "
                              "give -p/--clh-plugin a path to a .py file or an importable module name")
        return _import_file(path.resolve())
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as exc:
        top = spec.split(".")[0]
        local = Path.cwd() / top
        if exc.name != top or not ((local.with_suffix(".py")).is_file() or (local / "__init__.py").is_file()):
            raise ImportError(f"clharness plugin module {spec!r} could not be imported: {exc}. Give "
                              "-p/--clh-plugin an importable module name, a module in the current directory "
                              "or a path to a .py file") from exc
    if str(Path.cwd()) not in sys.path:
        sys.path.append(str(Path.cwd()))   # as `python -m` would have it, behind the installed packages
    return importlib.import_module(spec)


def _import_file(path: Path) -> ModuleType:
    name = path.stem
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__file__", None) and Path(loaded.__file__).resolve() == path:
        return loaded
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"clharness plugin file {str(path)!r} is not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module   # so pickling and later imports by name find the same module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _describe(plugin: Any) -> str:
    name = getattr(plugin, "__name__", type(plugin).__name__)
    try:
        where = inspect.getfile(plugin if inspect.ismodule(plugin) else type(plugin))
    except TypeError:
        return name
    return f"{name} ({where})"
