"""Benchmark families ("scenario kinds"): the registry that ``clharness_add_kinds`` fills.

A suite's ``kind = "stf"`` names a kind. The five built-in kinds (split, stf, curriculum, gtep,
cldyb) live in ``clharness.benchmarks`` and register through the same hook an outside package uses:

    @clharness.hookimpl
    def clharness_add_kinds(registry):
        registry.add(clharness.Kind("domain-il", "my_package.domain_il"))   # a module name or the module

A kind is a module (imported on first use: most need torch) that defines
    OPTIONS: dict[str, tuple[type | tuple[type, ...], default]]   its own scenario keys
    build(spec, source, seed, device, data_root, download) -> Scenario (or a protocol object)
and optionally
    MULTI_DATASET = True      build receives the dataset registry instead of one source
    check(spec)               raise ValueError on values out of range (shown with file and table)
    collect(node, suite, spec, methods, seeds)   its own pytest items (multi-run protocols)
    terminal_summary(session, terminalreporter)  its section at session end
    write_scorecard(path, records, harness)      its section in --clh-scorecard files
    report_sections(records, fmt, harness) -> [(title, text)]   its sections in `clharness report`
                              (``harness()`` builds the plugin registries on first call)
    html_sections(records, harness) -> [(title, html)]   its sections in the HTML report
    page_html_sections(records, page, harness) -> [(title, html)]   instead of html_sections where a
                              suite's section needs runs of other suites of the page (``page``: every
                              record of the page, in page order; M2I pairs an ``m2i`` with an ``i2m`` suite)
    split_scenario(name) -> (scenario, phase, k) | None   scenario names that are phases of one scenario
    preset_seeds(presets, suite) -> int | None   the seeds a ``--clh-preset FAMILY:NAME`` of the kind
                              asks of ``suite`` (STF's Table 1: 20 runs); None: not its preset or suite
    PSEUDO_METHODS = (...)    method names of its records that are protocol steps, not methods (CLDyB's
                              sequence search): left out of comparisons between methods
A kind's ``cli`` module (optional, kept light: no torch) adds its ``clharness`` subcommands:
    add_commands(subparsers) -> {command: run(args) -> exit code}
Keys of a [[scenario]] table outside the common ones go to ``spec.options`` and are checked
against the kind's OPTIONS with the same errors as the common keys.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from .registry import Registry

BUILTIN_KINDS = "clharness.benchmarks"


class ScenarioError(ValueError):
    """A scenario that a family cannot build from its dataset (raised by a family's ``build``)."""   # the plugin module of the five built-in families


@dataclass(frozen=True)
class Kind:
    """A benchmark family: the name suites use (``kind = name``), the module implementing it, and
    optionally the module adding its ``clharness`` subcommands."""
    name: str
    module: str | ModuleType
    cli: str | ModuleType | None = None

    def load(self) -> ModuleType:
        return _module(self.module)

    @property
    def where(self) -> str:
        return self.module if isinstance(self.module, str) else self.module.__name__


_active: Registry | None = None


def install(registry: Registry) -> None:
    """Make ``registry`` (filled by every loaded plugin's ``clharness_add_kinds``) the kinds suites use."""
    global _active
    _active = registry


def registry() -> Registry:
    """The kinds in use: those of the last Harness built, else the built-in ones alone (suite files
    parsed without a plugin manager)."""
    global _active
    if _active is None:
        builtin = importlib.import_module(BUILTIN_KINDS)
        reg = Registry("kind")
        reg.source = BUILTIN_KINDS
        builtin.clharness_add_kinds(registry=reg)
        _active = reg
    return _active


def names() -> tuple[str, ...]:
    return tuple(e.name for e in registry().entries())


def kind_module(kind: str) -> ModuleType:
    """The module that builds scenarios of ``kind``."""
    return registry()[kind].load()


def kind_modules() -> list[ModuleType]:
    return [e.obj.load() for e in registry().entries()]


def split_scenario(name: str):
    """``(scenario, phase, k)`` where a kind names runs of one scenario's phases (GTEP's ``X:eval``), else None."""
    for module in kind_modules():
        split = getattr(module, "split_scenario", None)
        parsed = split(name) if split is not None else None
        if parsed is not None:
            return parsed
    return None


def pseudo_methods() -> frozenset[str]:
    """Every kind's ``PSEUDO_METHODS``: record method names that are protocol steps, not methods."""
    return frozenset(name for module in kind_modules() for name in getattr(module, "PSEUDO_METHODS", ()))


def preset_seeds(presets, suite) -> int | None:
    """The seed count the session's ``--clh-preset`` values ask of ``suite`` (the largest any kind's
    ``preset_seeds`` answers), or None where no preset names one (the suite's ``seeds`` then)."""
    if not presets:
        return None
    counts = [n for module in kind_modules() if hasattr(module, "preset_seeds")
              for n in [module.preset_seeds(list(presets), suite)] if n is not None]
    return max(counts, default=None)


def family_commands(subparsers) -> dict:
    """Let every kind with a ``cli`` module add its subcommands; {command: run(args) -> exit code}."""
    commands = {}
    for entry in registry().entries():
        if entry.obj.cli is not None:
            commands.update(_module(entry.obj.cli).add_commands(subparsers))
    return commands


def report_sections(records, fmt: str, make_harness, page=None) -> list[tuple[str, str]]:
    """Every kind's own sections of ``clharness report`` as (title, text), or as (title, html) for
    ``fmt="html"`` (the kinds' html_sections, or page_html_sections given ``page``: all records of
    the page ``records`` are one suite of); ``make_harness()`` is called at most once, and only
    by a kind that needs the registries."""
    records, built = list(records), []

    def harness():
        if not built:
            built.append(make_harness())
        return built[0]

    out = []
    for module in kind_modules():
        if fmt == "html" and page is not None and hasattr(module, "page_html_sections"):
            out.extend(module.page_html_sections(records, page, harness))
        elif fmt == "html" and hasattr(module, "html_sections"):
            out.extend(module.html_sections(records, harness))
        elif fmt != "html" and hasattr(module, "report_sections"):
            out.extend(module.report_sections(records, fmt, harness))
    return out


def _module(module: str | ModuleType) -> ModuleType:
    return module if isinstance(module, ModuleType) else importlib.import_module(module)
