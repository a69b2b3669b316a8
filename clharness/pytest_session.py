"""The pytest side of a session (``ClhSession``, a plugin object the entry point registers): the engine's
``Session``, the plugins pytest found, the records in collection order, and pytest's hooks handed to the
modules that do the work (pytest_collect, pytest_scheduling, pytest_summary)."""
from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from . import outcomes
from .engine.session import Session
from .plugins import has_hookimpls
from .pytest_collect import UnitItem, collect_file, collect_named_suites
from .pytest_options import session_options
from .pytest_scheduling import grouped, group_ensembles, prepare_remote
from .pytest_summary import teststatus, terminal_summary, write_files
from .results import RunRecord

# torch-backed modules (plugins.Harness, runner) load only once a suite is collected.


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
            self._engine = Session(session_options(self.config, grouped(self.config)), harness=_LazyHarness(self),
                                   session_id=self.session_id, warn=self.note)
        return self._engine

    def note(self, message: str) -> None:
        self.notes[message] = None

    @property
    def remote(self):
        return self._engine.remote if self._engine is not None else None

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

    def activate(self) -> None:
        """A suite is asked for: what cannot work fails now, as a usage error, before any training."""
        from .results import StoreError
        try:   # a store that cannot take writes fails the session before any training
            self.store.check_writable()
        except StoreError as exc:
            raise pytest.UsageError(str(exc)) from None
        self.harness   # two plugins claiming one name: a usage error now, not an INTERNALERROR later
        from .toolkit.backbones import allow_downloads
        allow_downloads(self.config.getoption("clh_download"))   # off: no hub traffic, cached weights only
        if self.config.getoption("clh_device") not in ("auto", "cpu"):
            try:   # an unusable device fails up front, even when every run is stored and none trains
                self.device
            except RuntimeError as exc:
                raise pytest.UsageError(str(exc)) from None

    # --- pytest-xdist ---
    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        """pytest-xdist: a worker's notes join the controller's (every worker plans the same suites)."""
        for message in getattr(node, "workeroutput", {}).get("clh_notes", ()):
            self.notes[message] = None

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        """pytest-xdist: workers share the controller's session id (gates wait for its records)."""
        node.workerinput["clh_session"] = self.session_id
        node.workerinput["clh_dist"] = self.config.getoption("dist", "no")   # --clh-ensemble: grouped or not

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids) -> None:
        """pytest-xdist: the controller collects nothing itself; every worker reports the same ids."""
        self._position = self._position or {nodeid: i for i, nodeid in enumerate(ids)}

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

    # --- collection ---
    def pytest_collect_file(self, file_path: Path, parent):
        return collect_file(file_path, parent)

    @pytest.hookimpl(tryfirst=True)   # before -k/-m deselection and --lf filtering see the items
    def pytest_collection_modifyitems(self, session, config, items) -> None:
        collect_named_suites(self, session, config, items)
        if config.getoption("loadgroup", False):   # an xdist worker under --dist loadgroup
            group_ensembles(self.engine, items, lambda item: isinstance(item, UnitItem))

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
            prepare_remote(self.remote, [p for p, _ in self._plugins], units)

    # --- outcomes ---
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call":
            for name, value in report.user_properties:
                if name == outcomes.RECORD:
                    position = self._position.get(report.nodeid, len(self._position) + len(self._arrived))
                    self._arrived.append((position, RunRecord.from_json(value)))
                elif name == outcomes.REUSED:
                    self.reused += 1
                elif name == outcomes.NOT_REGISTERED:
                    self.not_registered[value] = None
                elif name == outcomes.REUSED_STALE:
                    self.stale[value] = None

    def pytest_report_teststatus(self, report, config):
        return teststatus(report)

    def pytest_terminal_summary(self, terminalreporter, exitstatus, config) -> None:
        terminal_summary(self, terminalreporter, config)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session, exitstatus) -> None:
        if hasattr(self.config, "workeroutput"):   # pytest-xdist worker: the controller says them
            self.config.workeroutput["clh_notes"] = list(self.notes)
        if self.remote is not None:   # keep what Ray finished unasked, cancel the rest
            self.remote.finish()
        write_files(self, self.config)   # interrupted or not, every finished record makes it into the files

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


class _LazyHarness:
    """The engine's view of the pytest session's harness: built on first use, with every plugin
    pytest registered (conftest.py files register late, so it is looked up each time)."""

    def __init__(self, clh: ClhSession):
        self._clh = clh

    def __getattr__(self, name):
        return getattr(self._clh.harness, name)


def _plugin_source(plugin, plugin_name: str) -> str:
    where = getattr(plugin, "__file__", None)
    if where and Path(where).name == "conftest.py":
        return f"conftest {where}"
    return f"{getattr(plugin, '__name__', plugin_name)} ({where})" if where else str(plugin_name)
