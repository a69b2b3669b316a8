"""clharness: a pytest-style benchmark harness for continual-learning methods.

Python API: ``clharness.run(suite, ...)``, ``clharness.load_case(suite, scenario, method, seed)``,
``clharness.results.open(path)`` (docs/api.md).

``import clharness as clh``; register methods with ``@clh.hookimpl def clharness_add_methods(registry)``.
Heavy names (torch-backed) load on first use, so the always-on pytest plugin stays light.
"""
from importlib import import_module

from .hookspecs import hookimpl, hookspec

__version__ = "0.1.0"

_LAZY = {
    "Choice": "hparams", "Float": "hparams", "Int": "hparams", "HParamError": "hparams",
    "Batch": "method", "Classifier": "method", "Context": "method", "Diverged": "method",
    "Experience": "method", "MemoryReport": "method", "Method": "method", "MethodError": "method",
    "Setting": "method", "Harness": "plugins", "Kind": "kinds", "Family": "kinds", "Scenario": "kinds", "Task": "kinds",
    "ScenarioError": "kinds", "Registry": "registry", "RegistryError": "registry",
    "run": "engine.api", "load_case": "engine.api", "Records": "engine.api", "LoadedCase": "engine.api",
}


def __getattr__(name):
    if name == "results":   # clharness.results.open(path)
        return import_module(".results", __name__)
    if name in _LAZY:
        value = getattr(import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'clharness' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_LAZY])


__all__ = ["hookimpl", "hookspec", "__version__", *_LAZY]
