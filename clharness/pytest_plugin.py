"""The pytest plugin: a thin front end over the engine. Suite files become parametrised test cases
(one item per ``engine.units.Unit``), the session ends in a scorecard.

Active in every pytest run once clharness is installed (entry point ``pytest11``), and inert
until a suite is asked for: ``--clh-suite NAME|PATH`` or a suite file given on the command
line (``pytest suites/quickstart.toml -k er``). Each case is a ``pytest.Function`` whose id
reads ``<suite file>::<scenario>[<method>-seed<N>]``, so -k, -x, --lf, fixtures and
pytest-xdist work as on any test.
"""
from __future__ import annotations

import dataclasses
import os
import time
import uuid
from pathlib import Path

import pytest

from . import outcomes
from .engine.session import Options, Session
from .engine.suites import SuiteError, is_suite_file
from .plugins import has_hookimpls
from .results import RunRecord

# torch-backed modules (plugins.Harness, runner) load only once a suite is collected.

RECORD_PROPERTY = outcomes.RECORD
GATE_PROPERTY = outcomes.GATE
REUSED_PROPERTY = outcomes.REUSED
NOT_REGISTERED_PROPERTY = outcomes.NOT_REGISTERED
session_key = pytest.StashKey["ClhSession"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    """The ``--clh-*`` options, from the one table (engine.options.OPTIONS). ``--clh-ensemble``'s value is
    checked in pytest_configure: argparse's choices would reject a path that follows a plain --clh-ensemble
    before pytest_load_initial_conftests can tell them apart."""
    from .engine.options import add_pytest_options
    add_pytest_options(parser.getgroup("clharness", "continual-learning benchmark suites (clharness)"))


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args: list[str]) -> None:
    """A plain ``--clh-ensemble`` followed by a path (``pytest --clh-ensemble suites/x.toml``): argparse
    would take the path as the option's value (nargs="?"); the plain flag means seeds."""
    for i, arg in enumerate(args):
        if arg == "--clh-ensemble" and (i + 1 == len(args) or args[i + 1] not in ("seeds", "hparams", "off")):
            args[i] = "--clh-ensemble=seeds"


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("clh_ensemble") not in (None, "seeds", "hparams", "off"):
        raise pytest.UsageError(f"--clh-ensemble={config.getoption('clh_ensemble')}: choose seeds, hparams or off "
                                "(plain --clh-ensemble: seeds; off: every case solo, whatever a suite's ensemble key)")
    _pin_xdist_worker(config)
    _schedule_ensembles(config)
    clh = ClhSession(config)
    config.stash[session_key] = clh
    config.pluginmanager.register(clh, "clharness-session")
    active = config.getoption("clh_suite") or any(str(a).split("::")[0].endswith(".toml") for a in config.args)
    if active:
        # task i/T and ETA inside long cases, runs done under xdist/Ray; inert (unregistered) in a
        # pytest run that asks for no suite, so other projects' sessions print nothing of ours
        from .pytest_progress import ProgressPlugin
        config.pluginmanager.register(ProgressPlugin(config, remote=lambda: clh.remote is not None),
                                      "clharness-progress")
    if config.getoption("clh_ray"):
        _start_ray(config, clh)
    if config.getoption("clh_suite") and config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args[:] = []   # no explicit test paths: run only the suites, not the project's tests
    if active:
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


def _start_ray(config: pytest.Config, clh: "ClhSession") -> None:
    """--clh-ray: cases become Ray tasks (clharness.engine.ray_backend, the only module that imports Ray)."""
    if hasattr(config, "workerinput") or config.getoption("numprocesses", None):
        raise pytest.UsageError("--clh-ray and pytest-xdist (-n) do not combine: Ray spreads the cases over "
                                "its workers; drop -n")
    try:
        from .engine.ray_backend import RayExecutor
    except ImportError as exc:
        raise pytest.UsageError(f"--clh-ray needs Ray ({exc}); install it with: pip install 'clharness[ray]'") from None
    clh.engine.remote = RayExecutor(clh.engine, config.getoption("clh_ray"), [],
                                    config.getoption("clh_cpus_per_run"), config.getoption("clh_gpus_per_run"))


# pytest-xdist modes that send every item of one ensemble to one worker: loadgroup by its xdist_group marks
# (ClhSession.pytest_collection_modifyitems), loadfile and loadscope a whole suite file, each every item
GROUPING_DIST = ("loadgroup", "loadfile", "loadscope", "each")


def _schedule_ensembles(config: pytest.Config) -> None:
    """--clh-ensemble under pytest-xdist: an ensemble is one unit of work. Its items get one
    ``xdist_group`` mark and ``--dist loadgroup`` sends them to one worker, which trains them together;
    plain ``-n N`` (``--dist load``, which would split them) becomes loadgroup here. The worker is told
    the controller's mode (``pytest_configure_node``): xdist sets its own from the command line only."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:   # also without the option: a suite's [suite] ensemble key groups too
        if workerinput.get("clh_dist") == "loadgroup":
            config.option.loadgroup = True   # the worker suffixes its node ids with the group (xdist.remote)
        return
    if config.getoption("clh_ensemble") in (None, "off"):
        return
    dist = config.getoption("dist", "no")
    if dist == "load":   # -n's default: loadgroup is load for the items without a group
        config.option.dist = "loadgroup"
    elif dist not in ("no", *GROUPING_DIST):
        raise pytest.UsageError(f"--clh-ensemble with --dist {dist}: an ensemble's items must run on one worker; "
                                "use --dist loadgroup (the default with -n)")


def _group_nodeid(item: pytest.Item, group: str) -> None:
    """The node id ``<id>@<group>`` that xdist's loadgroup scheduler groups by. xdist's worker makes it
    (xdist.remote) by setting ``item._nodeid``, which pytest >= 9.2 no longer reads (its node id is the
    structured ``item._id``), so the group was silently split over the workers: there, it is set here."""
    try:
        from _pytest.nodeid import NodeId
    except ImportError:   # pytest < 9.2: xdist's own suffix takes
        return
    if isinstance(getattr(item, "_id", None), NodeId) and "@" not in item.nodeid.rpartition("]")[2]:
        item._id = NodeId.parse(f"{item.nodeid}@{group}")


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


def session_options(config: pytest.Config) -> Options:
    """The engine's options from the ``--clh-*`` command line."""
    drops, baseline = {}, config.getoption("clh_compare")
    if baseline:
        import json

        from .reporting.compare import parse_drops, scorecard_metrics
        try:   # every --clh-max-drop metric must be one the saved scorecard carries (a typo judges nothing)
            rows = json.loads(Path(baseline).read_text())["summary"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise pytest.UsageError(f"--clh-compare {baseline}: not a clharness scorecard JSON ({exc}); "
                                    "write one with --clh-scorecard FILE.json") from None
        try:
            drops = parse_drops(config.getoption("clh_max_drop"), known=scorecard_metrics(rows))
        except ValueError as exc:
            raise pytest.UsageError(f"--clh-max-drop: {exc}") from None
    from .engine.options import OPTIONS, PYTEST, parse_hparams
    fields = {f.name for f in dataclasses.fields(Options)}
    given = {o.argument: config.getoption(o.dest) for o in OPTIONS if PYTEST in o.where and o.argument in fields}
    given.pop("max_drops")   # parsed above, against the saved scorecard's metrics
    try:
        hparams = parse_hparams(given.pop("hparams"))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    lists = {name: tuple(value) for name, value in given.items() if isinstance(value, list)}
    return Options(**{**given, **lists}, hparams=hparams, max_drops=drops, xdist_worker=hasattr(config, "workerinput"),
                   xdist_grouped=getattr(config, "workerinput", {}).get("clh_dist") in GROUPING_DIST)


class ClhSession:
    """The pytest side of a session: the engine's ``Session``, the plugins pytest found, and the
    finished records in collection order (under xdist, as the workers report them)."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self._arrived: list[tuple[int, RunRecord]] = []   # (collection position, record)
        self._position: dict[str, int] = {}                # node id -> position in collection order
        self._plugins: list[tuple[object, str]] = []
        self._harness = None
        self._engine: Session | None = None
        self.reused = 0
        self.not_registered: dict[str, None] = {}   # one line per planned method skipped as not registered
        self.stale: dict[str, None] = {}            # one line per record reused under --clh-reuse-stale
        # what the session noted (a gate it cannot judge, a --clh-compare row it does not run): said once,
        # in the summary; an xdist worker's notes reach the controller in its workeroutput
        self.notes: dict[str, None] = {}
        self.session_id = getattr(config, "workerinput", {}).get("clh_session") or uuid.uuid4().hex

    @property
    def engine(self) -> Session:
        if self._engine is None:
            self._engine = Session(session_options(self.config), harness=_LazyHarness(self),
                                   session_id=self.session_id, warn=self.note)
        return self._engine

    def note(self, message: str) -> None:
        self.notes[message] = None

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        """pytest-xdist: a worker's notes join the controller's (every worker plans the same suites)."""
        for message in getattr(node, "workeroutput", {}).get("clh_notes", ()):
            self.notes[message] = None

    @property
    def remote(self):
        return self._engine.remote if self._engine is not None else None

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        """pytest-xdist: workers share the controller's session id (gates wait for its records)."""
        node.workerinput["clh_session"] = self.session_id
        node.workerinput["clh_dist"] = self.config.getoption("dist", "no")   # --clh-ensemble: grouped or not

    def pytest_collection_finish(self, session) -> None:
        self._position = {item.nodeid: i for i, item in enumerate(session.items)}
        units = [item.unit for item in session.items if isinstance(item, UnitItem)]
        if not units and self._engine is None:
            return
        self.engine.schedule(units)
        labels = {id(item.unit): item.nodeid for item in session.items if isinstance(item, UnitItem)}
        progress = self.config.pluginmanager.get_plugin("clharness-progress")
        if progress is not None:
            self.engine.progress = lambda unit: progress.case_callback(labels.get(id(unit), unit.title))
        if self.remote is not None:
            from .engine.ray_backend import RayBackendError
            self.remote.plugin_modules = [p for p, _ in self._plugins]
            try:
                self.remote.prepare(units)
            except (ValueError, RayBackendError) as exc:
                raise pytest.UsageError(str(exc)) from None

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids) -> None:
        """pytest-xdist: the controller collects nothing itself; every worker reports the same ids."""
        self._position = self._position or {nodeid: i for i, nodeid in enumerate(ids)}

    @property
    def records(self) -> list[RunRecord]:
        """Finished records in collection order, however the workers interleaved them."""
        return [r for _, r in sorted(self._arrived, key=lambda pair: pair[0])]

    @property
    def store(self):
        return self.engine.store

    @property
    def device(self):
        return self.engine.device

    def pytest_unconfigure(self, config) -> None:
        """Close the store (checkpointing its WAL): the .sqlite file alone then holds every record.
        The hub's offline setting goes back to what it was before the session."""
        if self._engine is not None:
            if self._engine.remote is not None:
                self._engine.remote.close()
            self._engine.close()
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

    def suite_path(self, name_or_path: str) -> Path:
        from .engine.plan import resolve_suite
        try:
            return resolve_suite(self.engine, name_or_path)
        except SuiteError as exc:
            raise pytest.UsageError(f"--clh-suite {exc}".replace("--clh-suite suite ", "--clh-suite ")) from None

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
        if config.getoption("loadgroup", False):
            # an xdist worker under --dist loadgroup: an ensemble's items go to one worker (_schedule_ensembles),
            # with --clh-ensemble or a suite's [suite] ensemble key (xdist_groups names only those)
            from .engine.ensemble import xdist_groups
            names = xdist_groups(self.engine, [item.unit for item in items if isinstance(item, UnitItem)])
            for item in items:
                if isinstance(item, UnitItem) and item.unit in names:
                    item.add_marker(pytest.mark.xdist_group(names[item.unit]))
                    _group_nodeid(item, names[item.unit])

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
                elif name == outcomes.REUSED_STALE:
                    self.stale[value] = None

    def pytest_report_teststatus(self, report, config):
        if report.when != "call":
            return None
        record = next((RunRecord.from_json(v) for n, v in report.user_properties if n == RECORD_PROPERTY), None)
        if record is None:
            return None
        stored = ""
        if any(n == REUSED_PROPERTY for n, _ in report.user_properties):
            import datetime
            when = datetime.datetime.fromtimestamp(record.finished_at).strftime("%Y-%m-%d %H:%M") \
                if record.finished_at else "?"
            stored = f" (reused: stored {when}, key {record.key})"
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
        for message in self.notes:
            terminalreporter.write_line(f"clharness: {message}", yellow=True)
        for line in self.not_registered:
            terminalreporter.write_line(f"clharness: {line}", yellow=True)
        if self.stale:
            terminalreporter.write_line(f"clharness: --clh-reuse-stale reused {len(self.stale)} record(s) made by other "
                                        "code:", yellow=True)
            for line in self.stale:
                terminalreporter.write_line(f"  {line}", yellow=True)
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
        for fam in _families():   # kinds with an end-of-session section (GTEP, CLDyB)
            fam.terminal_summary(self, terminalreporter)

        path = config.getoption("clh_scorecard")
        if path and not hasattr(config, "workerinput"):
            terminalreporter.write_line(f"scorecard written to {path}")

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session, exitstatus) -> None:
        if hasattr(self.config, "workeroutput"):   # pytest-xdist worker: the controller says them
            self.config.workeroutput["clh_notes"] = list(self.notes)
        if self.remote is not None:   # keep what Ray finished unasked, cancel the rest
            self.remote.finish()
        # Interrupted or not, every finished record makes it into the file.
        path = self.config.getoption("clh_scorecard")
        if path and not hasattr(self.config, "workerinput"):
            from .reporting.scorecard import write
            write(path, self.records)
            for fam in _families():
                fam.write_scorecard(path, self.records, self.harness)
        figures = self.config.getoption("clh_figures")
        if figures and self.records and not hasattr(self.config, "workerinput"):
            from .reporting.report import write_figures
            from .reporting.scorecard import default_columns
            write_figures(figures, self.records, default_columns(self.records), make_harness=lambda: self.harness)


class _LazyHarness:
    """The engine's view of the pytest session's harness: built on first use, with every plugin
    pytest registered (conftest.py files register late, so it is looked up each time)."""

    def __init__(self, clh: ClhSession):
        self._clh = clh

    def __getattr__(self, name):
        return getattr(self._clh.harness, name)


def _families():
    from .kinds import families
    return families()


def _plugin_source(plugin, plugin_name: str) -> str:
    where = getattr(plugin, "__file__", None)
    if where and Path(where).name == "conftest.py":
        return f"conftest {where}"
    return f"{getattr(plugin, '__name__', plugin_name)} ({where})" if where else str(plugin_name)


class SuiteFile(pytest.File):
    """A suite TOML file: one item per unit the engine expands it into, in order."""
    suite_file: Path | None = None   # set when the node is named after the suite, not its file

    def collect(self):
        from .engine.plan import expand
        clh: ClhSession = self.config.stash[session_key]
        try:
            units = expand(clh.engine, self.suite_file or self.path)
        except ValueError as exc:
            if str(exc).startswith("--clh-compare"):
                raise pytest.UsageError(str(exc)) from None
            raise
        for unit in units:
            cls = NotRegisteredItem if unit.role == "not-registered" else UnitItem
            item = make_item(cls, self, unit.name, _run_unit)
            item.unit, item.case, item.case_key = unit, unit.case, unit.key
            yield item

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, (SuiteError, LookupError, ValueError)):
            return str(excinfo.value)
        return super().repr_failure(excinfo)


def make_item(cls, parent, name: str, callobj):
    """An item named ``base[params]`` built as a parametrized function would be, so its id is the
    one pytest stores for --lf and pytest-xdist (pytest >= 9.2 keys them by a structured id that
    only a call spec carries; the call-spec class is private and was renamed in 9.2)."""
    from _pytest import python
    base, _, params = name.partition("[")
    spec_cls = getattr(python, "CallSpec", None) or python.CallSpec2
    return cls.from_parent(parent, name=name, originalname=base, callobj=callobj,
                           callspec=spec_cls(_idlist=(params[:-1],)) if params else None)


class UnitItem(pytest.Function):
    """One unit of the engine's plan: a case, a protocol step or a gate."""
    unit: "object"
    case: "object"
    case_key: str | None

    def reportinfo(self):
        return self.path, 0, self.unit.title


class NotRegisteredItem(UnitItem):
    def reportinfo(self):
        return self.path, 0, self.name


def _run_unit(request: pytest.FixtureRequest) -> None:
    """Run the item's unit through the engine; its outcome becomes the item's."""
    item: UnitItem = request.node
    clh: ClhSession = request.config.stash[session_key]
    try:
        clh.engine.execute(item.unit)
    except outcomes.Skipped as exc:
        raise pytest.skip.Exception(exc.message, _use_item_location=True) from None   # reported at the suite file
    except outcomes.ExpectedFailure as exc:
        pytest.xfail(exc.message)
    except outcomes.Failed as exc:
        raise pytest.fail.Exception(exc.message, pytrace=False) from None   # the message once, not chained
    finally:
        item.user_properties.extend(item.unit.properties)
