"""The plugin manager and the registries its hooks fill.

Plugins arrive three ways, as with pytest: the ``clharness`` entry-point group (installed
packages, the reference methods included), modules named by ``-p``/``--clh-plugin``, and
``conftest.py`` files (the pytest plugin forwards every pytest plugin that carries
``clharness_*`` hook implementations).

An installed entry point that fails to load (a stale distribution whose module is gone, an import
error in it) does not take the session down: it is skipped with one :class:`PluginWarning` line
naming the distribution, the entry point, the exception and the fix. A ``-p``/``--clh-plugin``
module name found in more than one place (installed, and a file in the current directory) is
imported as Python would, with a warning naming the copy it loaded.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
import warnings
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


class PluginWarning(UserWarning):
    """A plugin skipped (an entry point that fails to load) or ambiguous (a -p name found twice)."""


def has_hookimpls(plugin: Any) -> bool:
    return any(name.startswith("clharness_") and callable(getattr(plugin, name, None))
               and getattr(getattr(plugin, name), "clharness_impl", None) is not None
               for name in dir(plugin))


# The augmentation recipes of the last Harness built (every loaded plugin's); the toolkit reads them
# (toolkit.augment.recipes), so the contract never imports the toolkit.
_augmentations: Registry | None = None


def active_augmentations() -> Registry | None:
    """The recipes of the last Harness built, or None before any (the toolkit then uses its built-ins)."""
    return _augmentations


class Harness:
    """Everything registered: ``harness.methods``, ``.datasets``, ``.suites``, ``.backbones``."""

    def __init__(self, plugins: tuple[Any, ...] = (), entry_points: bool = True):
        self.pm = pluggy.PluginManager("clharness")
        self.pm.add_hookspecs(hookspecs)
        self._registries: dict[str, Registry] | None = None
        self.dists: dict[int, tuple[str, str]] = {}   # id(plugin) -> (distribution, version), entry points
        self.register(BUILTIN)
        self.register(BUILTIN_KINDS)   # the five benchmark families, as any plugin
        if entry_points:
            self.load_entry_points()
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

    def load_entry_points(self, group: str = "clharness") -> int:
        """Register every installed entry point of ``group`` (as pluggy's load_setuptools_entrypoints:
        one per name, in distribution order), skipping with a :class:`PluginWarning` any that fails to
        import or to register. Returns the number registered."""
        from importlib import metadata
        count = 0
        for dist in list(metadata.distributions()):
            for ep in dist.entry_points:
                if ep.group != group or self.pm.has_plugin(ep.name) or self.pm.is_blocked(ep.name):
                    continue
                try:
                    plugin = ep.load()
                    self.pm.register(plugin, name=ep.name)
                except Exception as exc:   # noqa: BLE001 - any failure of a third-party import
                    if self.pm.has_plugin(ep.name):
                        self.pm.unregister(name=ep.name)   # a hook that failed validation half-way
                    warnings.warn(PluginWarning(entry_point_failure(dist, ep, exc)), stacklevel=2)
                    continue
                self.dists[id(plugin)] = (_dist_name(dist), dist.version)
                self._registries = None
                count += 1
        return count

    def _build(self) -> dict[str, Registry]:
        if self._registries is None:
            registries = {}
            for attr, (kind, hook) in _KINDS.items():
                registry = Registry(kind)
                for impl in getattr(self.pm.hook, hook).get_hookimpls():   # registration order
                    dist = self.dists.get(id(impl.plugin))
                    registry.source = (f"entry point of {dist[0]} {dist[1]} ({impl.plugin_name})"
                                       if dist is not None else impl.plugin_name)
                    impl.function(registry=registry)
                registries[attr] = registry
            self._registries = registries
            global _augmentations
            _augmentations = registries["augmentations"]   # suite files are checked against these
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

    @property
    def wants_training_loss(self) -> bool:
        """Whether a plugin implements ``clharness_training_loss`` (reading a loss syncs a GPU)."""
        return bool(self.pm.hook.clharness_training_loss.get_hookimpls())

    def training_loss(self, record, step: int, loss: float) -> None:
        self.pm.hook.clharness_training_loss(record=record, step=step, loss=loss)


def entry_point_failure(dist, ep, exc: BaseException) -> str:
    """The one-line warning for an entry point of ``dist`` that failed to load with ``exc``."""
    name = _dist_name(dist)
    why = " ".join(f"{type(exc).__name__}: {exc}".split())   # one line, whatever the exception says
    return (f"clharness: skipped the plugin entry point {ep.name!r} ({ep.value}) of the installed "
            f"distribution {name} {dist.version}: it failed to load ({why}). Fix: `pip uninstall {name}` "
            f"if it is stale, or reinstall it (`pip install --force-reinstall {name}`, or `pip install -e` "
            "its source folder)")


def _dist_name(dist) -> str:
    return dist.metadata["Name"] or getattr(dist, "name", None) or "?"


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
        module = importlib.import_module(spec)
    except ModuleNotFoundError as exc:
        top = spec.split(".")[0]
        local = Path.cwd() / top
        if exc.name != top or not ((local.with_suffix(".py")).is_file() or (local / "__init__.py").is_file()):
            raise ImportError(f"clharness plugin module {spec!r} could not be imported: {exc}. Give "
                              "-p/--clh-plugin an importable module name, a module in the current directory "
                              "or a path to a .py file") from exc
    else:
        _say_which_copy(spec, module)
        return module
    if str(Path.cwd()) not in sys.path:
        sys.path.append(str(Path.cwd()))   # as `python -m` would have it, behind the installed packages
    return importlib.import_module(spec)


def _say_which_copy(spec: str, module: ModuleType) -> None:
    """Warn when the top-level module of ``spec`` exists in several places (installed, and in the
    current directory, which ``python -m`` puts first and the console scripts leave out): name the
    copy Python imported and the others."""
    from importlib.machinery import PathFinder
    top = spec.split(".")[0]
    loaded = _origin(sys.modules.get(top))
    if loaded is None:
        return
    found = []
    for entry in [*sys.path, str(Path.cwd())]:
        try:
            origin = PathFinder.find_spec(top, [entry or "."])
        except (ImportError, ValueError, OSError):
            continue
        if origin is not None and origin.origin not in (None, "namespace"):
            where = _package_dir(Path(origin.origin))
            if where not in found:
                found.append(where)
    others = [w for w in found if w != loaded]
    if others:
        warnings.warn(PluginWarning(
            f"clharness: -p/--clh-plugin {spec!r} loaded {top} from {loaded}; another module of that name "
            f"is at {', '.join(map(str, others))} (not loaded). To load another copy give its path "
            "(-p ./NAME.py) or uninstall the one you do not want"), stacklevel=3)


def _origin(module: ModuleType | None) -> Path | None:
    where = getattr(module, "__file__", None)
    return _package_dir(Path(where)) if where else None


def _package_dir(path: Path) -> Path:
    """A module's file, or its package folder for a package's ``__init__.py``."""
    path = path.resolve()
    return path.parent if path.name == "__init__.py" else path


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
