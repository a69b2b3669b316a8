"""The pytest plugin: suite files become parametrised test cases, the session ends in a scorecard.

Active in every pytest run once clharness is installed (entry point ``pytest11``), and inert
until a suite is asked for: ``--clh-suite NAME|PATH`` or a suite file given on the command
line (``pytest suites/quickstart.toml -k er``). Each case is a ``pytest.Function`` whose id
reads ``<suite file>::<scenario>[<method>-seed<N>]``, so -k, -x, --lf, fixtures and
pytest-xdist work as on any test.
"""
from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from .plugins import has_hookimpls
from .results import RunRecord
from .engine.suites import Suite, SuiteError, is_suite_file, kind_module, load_suite

# torch-backed modules (plugins.Harness, runner) load only once a suite is collected.

RECORD_PROPERTY = "clharness_record"
GATE_PROPERTY = "clharness_gate"
REUSED_PROPERTY = "clharness_reused"
NOT_REGISTERED_PROPERTY = "clharness_not_registered"
session_key = pytest.StashKey["ClhSession"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("clharness", "continual-learning benchmark suites (clharness)")
    group.addoption("--clh-suite", action="append", default=[], metavar="NAME|PATH",
                    help="run this suite (a registered name or a .toml path); repeatable")
    group.addoption("--clh-method", action="append", default=[], metavar="NAME",
                    help="only these methods (default: the suite's list, else every applicable one); repeatable")
    group.addoption("--clh-seeds", type=int, default=None, metavar="N", help="seeds 0..N-1 (default: the suite's)")
    group.addoption("--clh-device", default="auto", metavar="auto|cpu|cuda|cuda:K",
                    help="device for every case (auto: CUDA when present)")
    group.addoption("--clh-data-root", default=os.environ.get("CLH_DATA_ROOT"), metavar="DIR",
                    help="folder holding the datasets (default: $CLH_DATA_ROOT)")
    group.addoption("--clh-download", action="store_true", help="let torchvision download missing datasets")
    group.addoption("--clh-results", default=".clharness/results.sqlite", metavar="PATH",
                    help="SQLite results store: finished runs are reused on a rerun (default: %(default)s)")
    group.addoption("--clh-fresh", action="store_true", help="rerun every case, even those already stored")
    group.addoption("--clh-scorecard", default=None, metavar="PATH",
                    help="write the session's scorecard (.md, .json or .csv by suffix)")
    group.addoption("--clh-compare", default=None, metavar="SCORECARD.json",
                    help="add regression gates against a saved scorecard (see --clh-max-drop)")
    group.addoption("--clh-max-drop", action="append", default=[], metavar="METRIC=VALUE",
                    help="allowed drop of a metric's seed mean against --clh-compare "
                         "(repeatable; default: final_acc=0.02)")
    group.addoption("--clh-gate-timeout", type=float, default=3600, metavar="SECONDS",
                    help="how long a gate waits for the cases it judges (pytest-xdist) (default: %(default)s)")
    group.addoption("--clh-quick", action="store_true", help="shrunk budgets: the suites' [quick] settings")
    group.addoption("--clh-preset", action="append", default=[], metavar="FAMILY:NAME",
                    help="a family's published configurations, e.g. gtep:cifar50-1-10tasks (GTEP: also run the "
                         "paper's H* on D^E beside the tuned one); repeatable")
    group.addoption("--clh-plugin", action="append", default=[], metavar="MODULE",
                    help="import MODULE as a clharness plugin; repeatable")
    group.addoption("--clh-log", action="append", default=[], metavar="tensorboard:DIR|wandb:PROJECT|mlflow:URI",
                    help="log every run this session trains (optional extras clharness[tensorboard|wandb|mlflow]); "
                         "repeatable")
    group.addoption("--clh-ray", default=None, metavar="local|auto|ray://HOST:PORT",
                    help="run the cases as Ray tasks (pip install 'clharness[ray]'): local starts a Ray runtime "
                         "here, auto joins the cluster of `ray start`, ray://HOST:PORT uses Ray Client")
    group.addoption("--clh-gpus-per-run", type=float, default=None, metavar="F",
                    help="GPUs per Ray task, fractional allowed: 0.25 packs four runs on one GPU "
                         "(default: the scenario's gpus_per_run, else 0)")
    group.addoption("--clh-cpus-per-run", type=float, default=None, metavar="N",
                    help="CPUs per Ray task (default: the scenario's cpus_per_run, else 1)")


def pytest_configure(config: pytest.Config) -> None:
    _pin_xdist_worker(config)
    clh = ClhSession(config)
    config.stash[session_key] = clh
    config.pluginmanager.register(clh, "clharness-session")
    if config.getoption("clh_suite") or any(str(a).split("::")[0].endswith(".toml") for a in config.args):
        # task i/T and ETA inside long cases, runs done under xdist/Ray; inert (unregistered) in a
        # pytest run that asks for no suite, so other projects' sessions print nothing of ours
        from .progress import ProgressPlugin
        config.pluginmanager.register(ProgressPlugin(config), "clharness-progress")
    if config.getoption("clh_ray"):
        _start_ray_plugin(config, clh)
    if config.getoption("clh_suite") and config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args[:] = []   # no explicit test paths: run only the suites, not the project's tests
    if config.getoption("clh_suite") or any(str(a).split("::")[0].endswith(".toml") for a in config.args):
        from .results import StoreError
        try:   # a store that cannot take writes fails the session before any training
            clh.store.check_writable()
        except StoreError as exc:
            raise pytest.UsageError(str(exc)) from None
        clh.harness   # two plugins claiming one name: a usage error now, not an INTERNALERROR later
        from .toolkit.backbones import allow_downloads
        allow_downloads(config.getoption("clh_download"))   # off: no hub traffic, cached weights only
        if config.getoption("clh_device") not in ("auto", "cpu"):
            try:   # an unusable device fails up front, even when every run is stored and none trains
                clh.device
            except RuntimeError as exc:
                raise pytest.UsageError(str(exc)) from None


def _start_ray_plugin(config: pytest.Config, clh: "ClhSession") -> None:
    """--clh-ray: cases become Ray tasks (clharness.engine.ray_backend, the only module that imports Ray)."""
    if hasattr(config, "workerinput") or config.getoption("numprocesses", None):
        raise pytest.UsageError("--clh-ray and pytest-xdist (-n) do not combine: Ray spreads the cases over "
                                "its workers; drop -n")
    try:
        from .engine.ray_backend import RayPlugin
    except ImportError as exc:
        raise pytest.UsageError(f"--clh-ray needs Ray ({exc}); install it with: pip install 'clharness[ray]'") from None
    clh.remote = RayPlugin(clh)
    config.pluginmanager.register(clh.remote, "clharness-ray")


def _pin_xdist_worker(config: pytest.Config) -> None:
    """Each xdist worker takes one GPU of the caller's CUDA_VISIBLE_DEVICES (before CUDA starts)
    and its share of the CPU threads (N workers x all-core torch pools thrash the cores)."""
    workerinput = getattr(config, "workerinput", {})
    worker = workerinput.get("workerid")
    if not worker:
        return
    share = max(1, (os.cpu_count() or 1) // int(workerinput.get("workercount", 1)))
    os.environ.setdefault("OMP_NUM_THREADS", str(share))   # read when torch starts, later
    if config.getoption("clh_device") not in ("auto", "cuda"):
        return
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        import torch   # only counting devices; CUDA_VISIBLE_DEVICES is read at CUDA init, later
        visible = ",".join(str(i) for i in range(torch.cuda.device_count()))
    gpus = [g for g in visible.split(",") if g.strip()]
    if gpus:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus[int(worker.lstrip("gw")) % len(gpus)]


class ClhSession:
    """Per-session state and hooks: the harness, the device, the finished records."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self._arrived: list[tuple[int, RunRecord]] = []   # (collection position, record)
        self._position: dict[str, int] = {}                # node id -> position in collection order
        self._plugins: list[tuple[object, str]] = []
        self._harness = None
        self._device = None
        self._store = None
        self._baseline = None
        self.reused = 0
        self.remote = None                # clharness.engine.ray_backend.RayPlugin under --clh-ray
        self.resources: dict[tuple[str, str], dict] = {}   # (suite, scenario) -> cpus/gpus_per_run
        self.selected: set[str] = set()   # keys of the cases this session runs (after -k, --lf)
        self.not_registered: dict[str, None] = {}   # one line per planned method skipped as not registered
        self.session_id = getattr(config, "workerinput", {}).get("clh_session") or uuid.uuid4().hex

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        """pytest-xdist: workers share the controller's session id (gates wait for its records)."""
        node.workerinput["clh_session"] = self.session_id

    def pytest_collection_finish(self, session) -> None:
        self.selected = {item.case_key for item in session.items if isinstance(item, CaseItem)}
        self._position = {item.nodeid: i for i, item in enumerate(session.items)}

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids) -> None:
        """pytest-xdist: the controller collects nothing itself; every worker reports the same ids."""
        self._position = self._position or {nodeid: i for i, nodeid in enumerate(ids)}

    @property
    def records(self) -> list[RunRecord]:
        """Finished records in collection order, however the workers interleaved them."""
        return [r for _, r in sorted(self._arrived, key=lambda pair: pair[0])]

    @property
    def baseline(self) -> dict:
        """--clh-compare: (suite, scenario, method) -> saved summary row."""
        if self._baseline is None:
            self._baseline = {}
            path = self.config.getoption("clh_compare")
            if path:
                import json
                try:
                    rows = json.loads(Path(path).read_text())["summary"]
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    raise pytest.UsageError(f"--clh-compare {path}: not a clharness scorecard JSON ({exc}); "
                                            "write one with --clh-scorecard FILE.json") from None
                self._baseline = {(r["suite"], r["scenario"], r["method"]): r for r in rows}
        return self._baseline

    def max_drops(self) -> dict[str, float]:
        from .reporting.compare import parse_drops
        try:
            return parse_drops(self.config.getoption("clh_max_drop"))
        except ValueError as exc:
            raise pytest.UsageError(f"--clh-max-drop: {exc}") from None

    def wait_for(self, keys: list[str]) -> tuple[list[RunRecord], list[str]]:
        """Records of ``keys``: cases this session runs are awaited (other xdist workers may still
        be running them); others come from the store as they are. Returns (records, missing keys)."""
        from .results import REUSABLE
        fresh = self.config.getoption("clh_fresh")
        deadline = time.monotonic() + self.config.getoption("clh_gate_timeout")
        found, pending = {}, set(keys)
        while True:
            for key in sorted(pending):
                record = self.store.get(key)
                if record is None and key in self.selected:
                    continue
                if record is not None and key in self.selected and record.session != self.session_id \
                        and (fresh or record.status not in REUSABLE):
                    continue   # an older record; this session's run is still to come
                pending.discard(key)
                if record is not None:
                    found[key] = record
            if not pending or time.monotonic() > deadline:
                return list(found.values()), sorted(pending | (set(keys) - set(found)))
            time.sleep(0.2)

    @property
    def store(self):
        if self._store is None:
            from .results import ResultsStore
            self._store = ResultsStore(self.config.getoption("clh_results"), on_unreadable=_note)
        return self._store

    def pytest_unconfigure(self, config) -> None:
        """Close the store (checkpointing its WAL): the .sqlite file alone then holds every record.
        The hub's offline setting goes back to what it was before the session."""
        if self._store is not None:
            self._store.close()
            self._store = None
        if self._harness is not None:   # clharness was active, so backbones set the hub's mode
            from .toolkit.backbones import reset_downloads
            reset_downloads()

    # --- plugins: every pytest plugin (conftest.py, -p module) with clharness hooks joins ---
    def pytest_plugin_registered(self, plugin, plugin_name) -> None:
        if plugin is not self and has_hookimpls(plugin):
            self._plugins.append((plugin, _plugin_source(plugin, plugin_name)))
            if self._harness is not None:
                self._harness.register(plugin, source=self._plugins[-1][1])

    @property
    def harness(self):
        if self._harness is None:
            from .plugins import Harness
            harness = Harness(plugins=tuple(self.config.getoption("clh_plugin")))
            for plugin, source in self._plugins:
                harness.register(plugin, source=source)
            from .reporting.loggers import LoggerError, make_logger
            for spec in self.config.getoption("clh_log"):
                try:
                    harness.register(make_logger(spec), source=f"--clh-log {spec}")
                except LoggerError as exc:
                    raise pytest.UsageError(str(exc)) from None
            self._harness = harness
        from .registry import RegistryError
        try:   # builds the registries once (again after a late conftest): a clash is the user's to fix
            self._harness.methods
        except RegistryError as exc:
            raise pytest.UsageError(str(exc)) from None
        return self._harness

    @property
    def device(self):
        if self._device is None:
            from .engine.runner import pick_device
            self._device = pick_device(self.config.getoption("clh_device"))
        return self._device

    def suite_path(self, name_or_path: str) -> Path:
        if name_or_path in self.harness.suites:
            return Path(self.harness.suites[name_or_path])
        path = Path(name_or_path)
        if path.suffix == ".toml" or os.sep in name_or_path:
            if not path.exists():
                raise pytest.UsageError(f"--clh-suite {name_or_path}: no such file")
            return path
        known = ", ".join(self.harness.suites) or "none"
        raise pytest.UsageError(f"--clh-suite {name_or_path}: unknown suite; known suites: {known} "
                                "(or give a path to a .toml suite file)")

    # --- collection ---
    def pytest_collect_file(self, file_path: Path, parent):
        """Suite files named on the command line (or their folder) are collected as tests."""
        session = parent.session
        if (file_path.suffix == ".toml" and (session.isinitpath(file_path) or session.isinitpath(file_path.parent))
                and is_suite_file(file_path)):
            return SuiteFile.from_parent(parent, path=file_path)
        return None

    @pytest.hookimpl(tryfirst=True)   # before -k/-m deselection and --lf filtering see the items
    def pytest_collection_modifyitems(self, session, config, items) -> None:
        """``--clh-suite NAME``: cases under a node named after the suite, so ids read
        ``NAME::scenario[method-seedN]`` wherever the file lives (installed suites included)."""
        from _pytest.runner import collect_one_node
        for requested in config.getoption("clh_suite"):
            suite_file = self.suite_path(requested)
            node = SuiteFile.from_parent(session, path=config.rootpath / suite_file.stem)
            node.suite_file = suite_file
            report = collect_one_node(node)
            session.ihook.pytest_collectreport(report=report)
            if report.passed:
                items.extend(report.result)

    # --- outcomes ---
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call":
            for name, value in report.user_properties:
                if name == RECORD_PROPERTY:
                    position = self._position.get(report.nodeid, len(self._position) + len(self._arrived))
                    self._arrived.append((position, RunRecord.from_json(value)))
                elif name == REUSED_PROPERTY:
                    self.reused += 1
                elif name == NOT_REGISTERED_PROPERTY:
                    self.not_registered[value] = None

    def pytest_report_teststatus(self, report, config):
        if report.when != "call":
            return None
        record = next((RunRecord.from_json(v) for n, v in report.user_properties if n == RECORD_PROPERTY), None)
        if record is None:
            return None
        stored = " (stored)" if any(n == REUSED_PROPERTY for n, _ in report.user_properties) else ""
        if record.status == "passed":
            acc = record.metrics.get("final_acc", float("nan"))
            return "passed", ".", (f"PASSED{stored} final_acc={acc:.3f} train={record.train_seconds:.1f}s",
                                   {"green": True})
        if record.status == "not-applicable":
            return "skipped", "s", ("N/A", {"yellow": True})
        if hasattr(report, "wasxfail"):   # a divergence the protocol expects and counts
            return "xfailed", "x", ("DIVERGED (counted)", {"yellow": True})
        letter = "D" if record.status == "diverged" else "F"
        return "failed", letter, (record.status.upper(), {"red": True})

    def pytest_terminal_summary(self, terminalreporter, exitstatus, config) -> None:
        for line in self.not_registered:
            terminalreporter.write_line(f"clharness: {line}", yellow=True)
        if not self.records:
            return
        from .reporting.scorecard import default_columns, rank_agreement, render, render_agreement, summarize
        terminalreporter.section("clharness scorecard (mean ± 95% CI over seeds)")
        columns = default_columns(self.records)
        summary = summarize(self.records, columns)
        terminalreporter.write_line(render(summary, columns))
        agreement = rank_agreement(summary)
        if not agreement.empty:
            terminalreporter.write_line("\nRanking agreement between scenarios (methods ranked by seed mean):")
            terminalreporter.write_line(render_agreement(agreement))
        terminalreporter.write_line(f"clharness: {len(self.records)} runs, {self.reused} reused from "
                                    f"{config.getoption('clh_results')}, {len(self.records) - self.reused} run now")
        for module in _kind_modules():   # kinds with an end-of-session section (GTEP, CLDyB)
            if hasattr(module, "terminal_summary"):
                module.terminal_summary(self, terminalreporter)

        path = config.getoption("clh_scorecard")
        if path and not hasattr(config, "workerinput"):
            terminalreporter.write_line(f"scorecard written to {path}")

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session, exitstatus) -> None:
        # Interrupted or not, every finished record makes it into the file.
        path = self.config.getoption("clh_scorecard")
        if path and not hasattr(self.config, "workerinput"):
            from .reporting.scorecard import write
            write(path, self.records)
            for module in _kind_modules():
                if hasattr(module, "write_scorecard"):
                    module.write_scorecard(path, self.records, self.harness)


def _kind_modules():
    from .kinds import kind_modules
    return kind_modules()


def _plugin_source(plugin, plugin_name: str) -> str:
    where = getattr(plugin, "__file__", None)
    if where and Path(where).name == "conftest.py":
        return f"conftest {where}"
    return f"{getattr(plugin, '__name__', plugin_name)} ({where})" if where else str(plugin_name)


class SuiteFile(pytest.File):
    """A suite TOML file: one test case per scenario x method x seed, in file order."""
    suite_file: Path | None = None   # set when the node is named after the suite, not its file

    def collect(self):
        from .engine.runner import Case, case_key, resolve_hparams
        clh: ClhSession = self.config.stash[session_key]
        from .kinds import install, preset_seeds
        install(clh.harness.kinds)   # every plugin's kinds (clharness_add_kinds), before the suite's are checked
        cases: list[CaseItem] = []
        suite = load_suite(self.suite_file or self.path, quick=self.config.getoption("clh_quick"))
        clh.resources.update({(suite.name, name): res for name, res in suite.resources.items()})
        seeds = self.config.getoption("clh_seeds") or preset_seeds(self.config.getoption("clh_preset"), suite) \
            or suite.seeds   # --clh-seeds, else a family's preset (stf:table1), else the suite's
        for spec in suite.scenarios:
            module = kind_module(spec.kind)
            if hasattr(module, "collect"):   # multi-run protocols (GTEP, CLDyB) make their own items
                yield from module.collect(self, suite, spec, _methods_for(clh, suite, spec.setting_enum), seeds)
                continue
            if spec.select_hparams is not None:   # selection runs on the first tasks, then the full runs
                from .engine.hparam_selection import collect as select
                yield from select(self, suite, spec, _methods_for(clh, suite, spec.setting_enum), seeds)
                continue
            for method in _methods_for(clh, suite, spec.setting_enum):
                method_cls = clh.harness.methods[method]
                try:
                    hparams = resolve_hparams(method_cls, suite.hparams.get(method, {}))
                except ValueError as exc:
                    raise SuiteError(f"{self.path}: [hparams.{method}]: {exc}") from None
                for seed in range(seeds):
                    case = Case(suite.name, spec, method, seed, hparams)
                    item = make_item(CaseItem, self, f"{spec.name}[{method}-seed{seed}]", _run_clh_case)
                    item.case, item.case_key = case, case_key(case, method_cls)
                    cases.append(item)
                    yield item
        for spec in suite.scenarios:   # the suite's planned methods that no plugin registers
            for method in _not_registered(clh, suite):
                item = make_item(NotRegisteredItem, self, f"{spec.name}[{method}-not-registered]", _skip_not_registered)
                item.message = (f"not registered: method {method!r}, named in planned_methods of suite "
                                f"{suite.name!r}; its cases are skipped until a plugin registers it")
                yield item
        yield from self._gates(clh, suite, cases)

    def _gates(self, clh: "ClhSession", suite: Suite, cases: list["CaseItem"]):
        """Gate items, after the cases: the suite's own gates, then --clh-compare regressions."""
        from .reporting.gates import Gate
        running = {c.case.method for c in cases}
        gates = []
        for gate in suite.gates:
            for m in gate.methods:
                if m != "*" and m not in suite.planned_methods:
                    clh.harness.methods.entry(m)   # a typo is an error listing the known methods
            absent = [m for m in gate.methods if m != "*" and m not in running]
            if absent:   # e.g. --clh-method mine: the suite's gates about other methods do not apply
                _note(f"{suite.name}: gate {gate.text!r} not judged: this session does not run {absent}")
                continue
            gates.append((f"gate[{gate.text}]", gate))
        drops = clh.max_drops() if clh.config.getoption("clh_compare") else {}
        for (b_suite, scenario, method), row in clh.baseline.items():
            if b_suite != suite.name:
                continue
            if not any(c.case.method == method and c.case.scenario.name == scenario for c in cases):
                _note(f"--clh-compare: baseline has {b_suite}::{scenario}[{method}], not run in this session")
                continue
            for metric, drop in drops.items():
                if row.get(metric) is None:
                    _note(f"--clh-compare: baseline {b_suite}::{scenario}[{method}] has no metric {metric!r}")
                    continue
                text = f"{scenario}/{method}: {metric} drops at most {drop} from {row[metric]:.4f}"
                gates.append((f"compare[{scenario}/{method}-{metric}]",
                              Gate(text, method, metric, "max-drop", drop, scenario=scenario,
                                   baseline=float(row[metric]))))
        for name, gate in gates:
            judged = [c.case_key for c in cases if (gate.method == "*" or c.case.method in gate.methods)
                      and (gate.scenario is None or c.case.scenario.name == gate.scenario)]
            item = make_item(GateItem, self, name, _run_gate)
            item.gate, item.judged = gate, judged
            yield item

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, (SuiteError, LookupError, ValueError)):
            return str(excinfo.value)
        return super().repr_failure(excinfo)


def _methods_for(clh: ClhSession, suite: Suite, setting) -> list[str]:
    """The registered methods to run: --clh-method, else the suite's methods and its registered
    planned_methods, else every method supporting the setting."""
    requested = clh.config.getoption("clh_method")
    chosen = list(requested) or ([*suite.methods, *suite.planned_methods] if suite.methods else [])
    missing = _not_registered(clh, suite)
    chosen = [name for name in chosen if name not in missing]
    for name in chosen:
        clh.harness.methods.entry(name)   # unknown name: error listing the known ones
    if chosen or requested or suite.methods:
        return chosen
    return [name for name in clh.harness.methods if setting in set(clh.harness.methods[name].settings)]


def _not_registered(clh: ClhSession, suite: Suite) -> list[str]:
    """The suite's planned methods (those --clh-method asks for, if given) that no plugin registers."""
    requested = clh.config.getoption("clh_method")
    return [m for m in suite.planned_methods if m not in clh.harness.methods and (not requested or m in requested)]


class ClhWarning(pytest.PytestWarning):
    """Something a suite asked for that this session does not do (shown in the warnings summary)."""


def _note(message: str) -> None:
    import warnings
    warnings.warn(ClhWarning(message), stacklevel=2)


def make_item(cls, parent, name: str, callobj):
    """An item named ``base[params]`` built as a parametrized function would be, so its id is the
    one pytest stores for --lf and pytest-xdist (pytest >= 9.2 keys them by a structured id that
    only a call spec carries; the call-spec class is private and was renamed in 9.2)."""
    from _pytest import python
    base, _, params = name.partition("[")
    spec_cls = getattr(python, "CallSpec", None) or python.CallSpec2
    return cls.from_parent(parent, name=name, originalname=base, callobj=callobj,
                           callspec=spec_cls(_idlist=(params[:-1],)) if params else None)


class CaseItem(pytest.Function):
    case: "Case"
    case_key: str

    def reportinfo(self):
        return self.path, 0, self.case.id


class NotRegisteredItem(pytest.Function):
    message: str

    def reportinfo(self):
        return self.path, 0, self.name


def _skip_not_registered(request: pytest.FixtureRequest) -> None:
    request.node.user_properties.append((NOT_REGISTERED_PROPERTY, request.node.message))
    raise pytest.skip.Exception(request.node.message, _use_item_location=True)   # reported at the suite file


class GateItem(pytest.Function):
    gate: "Gate"
    judged: list[str]

    def reportinfo(self):
        return self.path, 0, f"gate {self.gate.text}"


def _run_gate(request: pytest.FixtureRequest) -> None:
    from .reporting.gates import judge
    item: GateItem = request.node
    clh: ClhSession = request.config.stash[session_key]
    records, missing = clh.wait_for(item.judged)
    ok, lines = judge(item.gate, records)
    if missing:
        ok = False
        lines.append(f"FAIL {len(missing)} judged case(s) have no record (not run in this session and not in "
                     f"{request.config.getoption('clh_results')}, or still running after --clh-gate-timeout)")
    item.user_properties.append((GATE_PROPERTY, "\n".join(lines)))
    if not ok:
        pytest.fail(f"gate failed: {item.gate.text}\n" + "\n".join(lines), pytrace=False)


def _run_clh_case(request: pytest.FixtureRequest) -> None:
    run_stored_case(request, request.node.case)


def run_stored_case(request: pytest.FixtureRequest, case, amend=None, divergence_expected: bool = False):
    """Run ``case`` through the results store (a stored record with the same content hash is
    reused) and turn its status into the item's outcome. ``amend(record)`` edits a fresh record
    before it is stored. ``divergence_expected``: a diverged run is an outcome the protocol counts
    (GTEP's random search), reported as an expected failure rather than failing the session."""
    from .engine.runner import case_key, run_case
    item, config = request.node, request.config
    clh: ClhSession = config.stash[session_key]
    record = None
    if not config.getoption("clh_fresh"):
        record = clh.store.reusable(case_key(case, clh.harness.methods[case.method]))
    if record is not None:
        item.user_properties.append((REUSED_PROPERTY, record.key))
    else:
        if clh.remote is not None:   # --clh-ray: the case's Ray task (submitted after collection)
            record = clh.remote.result(case_key(case, clh.harness.methods[case.method]), case)
        else:
            root = config.getoption("clh_data_root")
            progress = config.pluginmanager.get_plugin("clharness-progress")
            record = run_case(case, clh.harness, clh.device, Path(root) if root else None,
                              config.getoption("clh_download"),
                              on_task=progress.case_callback(item.nodeid) if progress else None)
        if amend is not None:
            amend(record)
        record.session = clh.session_id
        clh.store.put(record)   # one transaction per record: a crash later loses nothing
        clh.harness.run_finished(record)
    item.user_properties.append((RECORD_PROPERTY, record.to_json()))
    if record.status == "not-applicable":   # reported at the case, not at this line
        raise pytest.skip.Exception(record.message, _use_item_location=True)
    if record.status == "diverged" and divergence_expected:
        pytest.xfail(f"[diverged] {record.case_id}: {record.message}")
    if record.status != "passed":
        pytest.fail(f"[{record.status}] {record.case_id}: {record.message}", pytrace=False)
    return record
