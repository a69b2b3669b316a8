"""Benchmark families ("scenario kinds"): the family contract (``Family``) and the registry that
``clharness_add_kinds`` fills.

A suite's ``kind = "stf"`` names a kind. The six built-in families (split, stf, curriculum, gtep, cldyb,
domain) live in ``clharness.benchmarks`` and register through the same hook an outside package uses:

    @clharness.hookimpl
    def clharness_add_kinds(registry):
        registry.add(clharness.Kind("domain-il", "my_package.domain_il"))   # a module, its name, or a Family

Every hook a family may define is a member of ``Family`` below, with its type, default and meaning;
a family is a ``Family`` subclass instance or a module defining some of those names (``ModuleFamily``
reads them once). The engine and the front ends call a family only through ``family(kind)``.
A kind's ``cli`` module (optional, kept light: no torch) adds its ``clharness`` subcommands:
    add_commands(subparsers) -> {command: run(args) -> exit code}
(a command reads a results store by ``clharness.results.read_records``). A family's HTML sections draw
with the ``Drawing`` the report hands them; a family imports no reporting, engine or front-end module.
docs/families.md shows the smallest complete family.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Protocol

from .registry import Registry

BUILTIN_KINDS = "clharness.benchmarks"   # the plugin module of the built-in families


class ScenarioError(ValueError):
    """A scenario that a family cannot build from its dataset (raised by a family's ``build``)."""


@dataclass
class Task:
    classes: tuple[int, ...]         # global ids (positions in the class order)
    train: object                    # TensorData / StreamData: handed to the method
    test: object                     # kept by the runner, never handed to the method
    val: object | None = None        # carved from train when the scenario asks for it


@dataclass
class Scenario:
    spec: Any                        # clharness.scenario_spec.ScenarioSpec
    seed: int
    setting: Any                     # clharness.Setting
    tasks: list[Task]
    class_names: list[str]           # class_names[g] = name of global id g
    input_shape: tuple[int, int, int]
    dataset: str                     # identity of the dataset (name and options)
    extra: dict = field(default_factory=dict)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def experience(self, t: int) -> "Experience":
        """What the method may see of task t: its train data and classes, the id only in task-IL."""
        from .method import Experience, Setting   # torch-backed: imported when a scenario runs
        task = self.tasks[t]
        return Experience(data=task.train, classes=task.classes,
                          task_id=t if self.setting is Setting.TASK_IL else None,
                          batch_size=self.spec.batch_size, seed=self.seed * 1000 + t)


@dataclass(eq=False)
class Unit:
    """One unit of a session: one test id (``scenario[method-seedN]``), the work behind it and what it
    leaves behind. ``run(session, unit)`` does the work and raises a ``clharness.outcomes`` exception
    when it does not pass; what it leaves behind goes to ``properties``. The engine makes the plain
    ones; a family's ``collect`` makes its own (``FamilySession.case_unit`` for a unit running a case)."""
    name: str                                   # "scenario[method-seedN]": the test id inside the suite
    run: Callable[[Any, "Unit"], Any]
    suite: str = ""
    path: Path | None = None                    # the suite file (a front end reports the unit there)
    label: str | None = None                    # how a report names it (default: "<suite>::<name>")
    case: Any = None                            # a case (FamilySession.case), for units that run one as is
    key: str | None = None                      # the record key it produces, when known before it runs
    amend: Callable | None = None               # edits its fresh record (also for a remote executor's)
    after: str | None = None                    # a record key it waits for first (a CLDyB search)
    shared: bool = False                        # several units may hold ``key``: the first trains it
    role: str = "case"                          # case | gate | search | selection | selected | eval | ...
    data: dict = field(default_factory=dict)    # the family's own payload
    properties: list = field(default_factory=list)

    @property
    def title(self) -> str:
        return self.label or f"{self.suite}::{self.name}"


class Scoring(Protocol):
    """What a family's own protocol (``Scenario.protocol``: STF's stream) scores with: the engine's one
    evaluation path, guarded (evaluation never changes the method) and counted as evaluation FLOPs. The
    engine installs it (``install_scoring``) before any protocol runs; a family asks ``scoring()``."""

    def accuracy(self, method, data, classes, num_classes: int, device, after, task_id: int | None = None,
                 batch_size: int = 512, what: str = "test data") -> float:
        """Accuracy of ``method.predict`` on ``data`` (only ``classes``' logits compete when given); a wrong
        logits shape or a non-finite logit fails the case, naming ``after`` and ``what``."""

    def isolated_rng(self, device=None):
        """A context in which evaluation leaves every random stream (Python, NumPy, torch, the device's)
        as it found it."""

    def sync(self, device) -> None:
        """Wait for the device's queued work (so a timing ends where the work does)."""


_scoring: Scoring | None = None


def install_scoring(impl: Scoring) -> None:
    """The engine's evaluation path for families' protocols (clharness.engine.runner installs it)."""
    global _scoring
    _scoring = impl


def scoring() -> Scoring:
    if _scoring is None:
        raise RuntimeError("no scoring installed: a family's protocol runs under the engine "
                           "(import clharness.engine.runner first)")
    return _scoring


class FamilySession(Protocol):
    """The session as a collecting family sees it: ``collect(session, ...)`` and its units'
    ``run(session, unit)`` receive one. The engine's ``Session`` implements it (engine.family_session);
    a family reaches the engine only through it, so it imports no engine module."""
    harness: Any          # the registries: methods, datasets, backbones
    options: Any          # what the session was asked (presets, results, data_root, download, reuse_stale, ...)
    session_id: str
    device: Any           # the torch device runs train on
    store: Any            # the results store (records(), put())
    remote: Any           # a remote executor (Ray: map_method) or None
    stale_reused: dict    # key -> the record --clh-reuse-stale answered it with

    # --- collecting: cases, their units and keys ---
    def case(self, suite: str, spec, method: str, seed: int, hparams: dict, shared: bool = False) -> Any:
        """The run of ``method`` on ``spec`` for ``seed``; ``shared``: its key leaves out the suite, so
        scenarios of several suites share one stored run (GTEP's tuning runs)."""

    def resolve_hparams(self, method_cls, *layers: dict) -> dict:
        """The method's hyperparameters with ``layers`` applied in order (later wins), checked (ValueError)."""

    def case_unit(self, suite, name: str, case, **fields) -> Unit:
        """The unit that runs ``case`` through the store, keyed by it; ``fields`` as Unit's (``run``, ...)."""

    def selection_units(self, suite, case, name: str, *, after: str | None, make_plain: Callable[[], Unit]) -> list[Unit]:
        """With the scenario's ``select_hparams``: the selection runs of ``case``, then the unit ``name``
        that runs it with their choice; else ``[make_plain()]``."""

    def search_keys(self, suite: str, scenario: dict, job: str, seed: int, search_version: int,
                    methods: list, code) -> tuple[str, str]:
        """(record key, base key) of a protocol step that is not a case (a CLDyB search)."""

    def code_digest(self, obj, family_file: str | None) -> str:
        """The digest of the code ``obj`` (a class) runs with, as record keys hold it."""

    def versions(self) -> dict[str, str]:
        """The library versions record keys hold."""

    # --- running: the store, other units' records, a method of one's own ---
    def run_stored(self, unit: Unit, case, amend: Callable | None = None, divergence_expected: bool = False) -> Any:
        """Run ``case`` through the store (reused when stored) and raise its status as an outcome."""

    def wait_for(self, keys: list[str]) -> tuple[list, list[str]]:
        """(records, missing keys): the records of ``keys``, awaited where this session runs them."""

    def owner(self, key: str) -> Unit | None:
        """The first scheduled unit sharing ``key``: it trains the run, the others wait for it."""

    def reuse(self, key: str, base_key: str | None = None) -> Any:
        """The stored record that stands for ``key`` (the session's one reuse rule), or None."""

    def say_stale(self, unit: Unit, record, now: str) -> None:
        """Note on ``unit`` that --clh-reuse-stale answered it with ``record`` made by other code."""

    def method_context(self, case, shape, harness, device) -> Any:
        """The ``clharness.Context`` a method of ``case`` is built with, for ``shape`` (setting, classes, input)."""

    def seed_everything(self, seed: int) -> None:
        """Seed Python's, NumPy's and torch's random streams as a run's start does."""

    def counted(self, record) -> Any:
        """A context whose work is counted as ``record``'s run (a protocol step that is not a case: a CLDyB
        search): at its exit ``record`` holds train_gflops, eval_gflops, peak_rss_mb and peak_cuda_mb as a case's
        record would. It yields ``evaluating()``, a context that marks work inside it as evaluation."""


class Drawing(Protocol):
    """What a family's HTML sections draw with, handed to ``html_sections`` and ``page_html_sections`` by
    the report (``clharness.reporting.drawing.DRAWING`` implements it): the page's method colours, its
    figure embedding and export, its SVG charts and the statistics its figures share. A family draws
    through it, so it imports no reporting module and a plugin family draws like a built-in one."""

    #: dots per inch of the page's matplotlib figures (``Figure(dpi=drawing.DPI)``)
    DPI: int
    #: one bar of ``bar_chart``: ``Bar(value, ci=0.0, color="#4c72b0", series="", data={})`` (NaN value: "n/a")
    Bar: type

    def method_colors(self, methods) -> dict[str, tuple]:
        """Each method's RGBA colour, the one it has everywhere on the page."""

    def hex_color(self, rgba) -> str:
        """An RGBA colour (0-1) as ``#rrggbb`` (for SVG)."""

    def to_img(self, fig, alt: str, tight: bool = True) -> str:
        """A matplotlib figure as an embedded ``<img>`` (PNG), also exported with the page's figures."""

    def export_svg(self, svg: str, alt: str) -> None:
        """A hand-drawn ``<svg>`` exported with the page's figures (``--figures``); nothing without them."""

    def radar_figure(self, labels, values, colors):
        """Methods (``values``: method -> one value in [0, 1] per axis) as polygons over ``labels``' axes."""

    def bar_chart(self, groups, title: str, ylabel: str, legend=(), height: int = 230, bar_width: int = 16) -> str:
        """One ``<svg>``: a group of ``Bar`` per ``(label, bars)`` of ``groups``, CIs as error bars, a legend
        of ``(name, colour)``."""

    def spread_labels(self, ys, gap: float, top: float) -> list[float]:
        """Label heights ``ys`` moved apart to at least ``gap`` each, in their order, none above ``top``."""

    def text_width(self, text: str, font_size: float = 11) -> float:
        """The width an SVG text of ``font_size`` takes on the page (for margins)."""

    def mean_band(self, values, confidence: float = 0.95) -> tuple:
        """(mean, lo, hi) over the rows of ``values`` (seeds x points): the Student-t band the page's
        curves draw."""

    def mean_matrix(self, records):
        """The mean accuracy matrix of ``records`` (NaN where none holds a value)."""


class Family:
    """The family contract: every hook a benchmark family may define. ``build`` is required; every other
    hook has the default below (a family without it behaves as a plain one). Subclass it, or write a
    module with the same names (``ModuleFamily``)."""

    #: its own scenario keys, beside the common ones: key -> (type or types, default); a suite's other keys
    #: go to ``spec.options`` and are checked against it (file:line, did-you-mean)
    OPTIONS: dict[str, tuple[Any, Any]] = {}
    #: keys added after records were stored: key -> default; left out of record keys while at the default
    LATER_OPTIONS: dict[str, Any] = {}
    #: True: ``build`` receives the dataset registry instead of one dataset source (curricula, pools)
    MULTI_DATASET: bool = False
    #: True: a family with ``collect`` that still applies a scenario's ``select_hparams`` itself
    SELECTS_HPARAMS: bool = False
    #: method names of its records that are protocol steps, not methods (left out of comparisons)
    PSEUDO_METHODS: tuple[str, ...] = ()
    #: ``collect(session: FamilySession, suite, spec, methods, seeds) -> [Unit]``: its own units (multi-run
    #: protocols: GTEP's phases, CLDyB's search), reaching the engine only through ``session``. None: one
    #: plain case per method and seed
    collect: Callable | None = None
    #: ``page_html_sections(records, page, harness, drawing) -> [(title, html)]``: instead of ``html_sections``
    #: where its section needs runs of other suites of the page (M2I pairs an m2i suite with an i2m one).
    #: None: unused
    page_html_sections: Callable | None = None

    def build(self, spec, source, seed: int, device, data_root=None, download: bool = False):
        """The scenario of ``spec`` for one seed (an ``engine.scenario.Scenario``, or an object with its
        own ``protocol``); ``source``: the dataset source (the registry when MULTI_DATASET)."""
        raise NotImplementedError(f"{type(self).__name__}: a family defines build(spec, source, seed, device, "
                                  "data_root, download)")

    def check(self, spec) -> None:
        """Raise ValueError on option values out of range (reported with the suite file and table)."""

    def terminal_summary(self, session, terminalreporter) -> None:
        """Its section at the end of a pytest session."""

    def write_scorecard(self, path, records, harness) -> None:
        """Its section in a --clh-scorecard file."""

    def report_sections(self, records, fmt: str, harness) -> list[tuple[str, str]]:
        """Its sections of ``clharness report`` as (title, text); ``harness()`` builds the registries."""
        return []

    def html_sections(self, records, harness, drawing: Drawing) -> list[tuple[str, str]]:
        """Its sections of the HTML report as (title, html), drawn with ``drawing`` (the page's ``Drawing``)."""
        return []

    def split_scenario(self, name: str) -> tuple[str, str, int | None] | None:
        """``(scenario, phase, k)`` where its record scenario names are phases of one scenario (GTEP's X:eval)."""
        return None

    def preset_seeds(self, presets: list[str], suite) -> int | None:
        """The seeds one of its ``--clh-preset FAMILY:NAME`` asks of ``suite`` (STF's Table 1: 20); None: not its."""
        return None


HOOKS = tuple(name for name in vars(Family) if not name.startswith("_"))


class ModuleFamily(Family):
    """A family written as a module (the built-in ones are): each hook it defines at module level replaces
    Family's default, read once here."""

    def __init__(self, module: ModuleType):
        self.module = module
        for name in HOOKS:
            if name in vars(module):
                setattr(self, name, vars(module)[name])
        if "build" not in vars(module):
            raise TypeError(f"kind module {module.__name__}: a family defines build(spec, source, seed, device, "
                            "data_root, download); see clharness.kinds.Family")

    @property
    def file(self) -> str | None:
        return getattr(self.module, "__file__", None)


@dataclass(frozen=True)
class Kind:
    """A benchmark family: the name suites use (``kind = name``), the module implementing it, and
    optionally the module adding its ``clharness`` subcommands."""
    name: str
    module: str | ModuleType
    cli: str | ModuleType | None = None

    def load(self) -> ModuleType:
        """The module implementing it (for a Family instance: the module defining its class)."""
        if isinstance(self.module, Family):
            return importlib.import_module(type(self.module).__module__)
        return _module(self.module)

    def family(self) -> Family:
        """Its hooks through the contract (a Family instance as given, a module read by ModuleFamily)."""
        if isinstance(self.module, Family):
            return self.module
        key = self.where
        if key not in _FAMILIES:
            _FAMILIES[key] = ModuleFamily(self.load())
        return _FAMILIES[key]

    @property
    def where(self) -> str:
        if isinstance(self.module, Family):
            return f"{type(self.module).__module__}.{type(self.module).__qualname__}"
        return self.module if isinstance(self.module, str) else self.module.__name__


_active: Registry | None = None
_FAMILIES: dict[str, Family] = {}


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


def family(kind: str) -> Family:
    """The family of ``kind``, through the contract."""
    return registry()[kind].family()


def families() -> list[Family]:
    return [e.obj.family() for e in registry().entries()]


def family_file(kind: str) -> str | None:
    """The source file of ``kind``'s family (its folder's code enters record keys: engine.code_identity)."""
    fam = family(kind)
    return fam.file if isinstance(fam, ModuleFamily) else importlib.import_module(type(fam).__module__).__file__


def kind_module(kind: str) -> ModuleType:
    """The module that implements ``kind`` (for a Family instance: the module defining its class)."""
    fam = family(kind)
    return fam.module if isinstance(fam, ModuleFamily) else importlib.import_module(type(fam).__module__)


def split_scenario(name: str):
    """``(scenario, phase, k)`` where a kind names runs of one scenario's phases (GTEP's ``X:eval``), else None."""
    for fam in families():
        parsed = fam.split_scenario(name)
        if parsed is not None:
            return parsed
    return None


def pseudo_methods() -> frozenset[str]:
    """Every kind's ``PSEUDO_METHODS``: record method names that are protocol steps, not methods."""
    return frozenset(name for fam in families() for name in fam.PSEUDO_METHODS)


def preset_seeds(presets, suite) -> int | None:
    """The seed count the session's ``--clh-preset`` values ask of ``suite`` (the largest any kind's
    ``preset_seeds`` answers), or None where no preset names one (the suite's ``seeds`` then)."""
    if not presets:
        return None
    counts = [n for fam in families() for n in [fam.preset_seeds(list(presets), suite)] if n is not None]
    return max(counts, default=None)


def family_commands(subparsers) -> dict:
    """Let every kind with a ``cli`` module add its subcommands; {command: run(args) -> exit code}."""
    commands = {}
    for entry in registry().entries():
        if entry.obj.cli is not None:
            commands.update(_module(entry.obj.cli).add_commands(subparsers))
    return commands


def report_sections(records, fmt: str, make_harness, page=None, drawing: Drawing | None = None
                    ) -> list[tuple[str, str]]:
    """Every kind's own sections of ``clharness report`` as (title, text), or as (title, html) for
    ``fmt="html"`` (the kinds' html_sections, or page_html_sections given ``page``: all records of
    the page ``records`` are one suite of), drawn with ``drawing``, which the HTML format needs;
    ``make_harness()`` is called at most once, and only by a kind that needs the registries."""
    if fmt == "html" and drawing is None:
        raise TypeError("report_sections(..., 'html') needs drawing=: the page's Drawing "
                        "(clharness.reporting.drawing.DRAWING), which the families draw with")
    records, built = list(records), []

    def harness():
        if not built:
            built.append(make_harness())
        return built[0]

    out = []
    for fam in families():
        if fmt == "html" and page is not None and fam.page_html_sections is not None:
            out.extend(fam.page_html_sections(records, page, harness, drawing))
        elif fmt == "html":
            out.extend(fam.html_sections(records, harness, drawing))
        else:
            out.extend(fam.report_sections(records, fmt, harness))
    return out


def _module(module: str | ModuleType) -> ModuleType:
    return module if isinstance(module, ModuleType) else importlib.import_module(module)
