"""Cases as Ray tasks (issue 18): ``--clh-ray local|auto|ray://HOST:PORT``.

Imported only when ``--clh-ray`` (or ``clharness run --ray``) is given; the core never imports Ray.

After collection every selected case the results store does not already hold goes out as one Ray
task with ``--clh-cpus-per-run`` CPUs and ``--clh-gpus-per-run`` GPUs (fractional: 0.25 packs four
runs on a GPU; a scenario's ``gpus_per_run``/``cpus_per_run`` option is its default) and
``max_retries`` for worker or node death. The pytest items still run in collection order, each
waiting for its own case's record, and the driver alone writes the store; so progress lines, -x,
-k, --lf, --junitxml, gates and the scorecard behave as in a serial session. At the end of the
session (normal, -x or Ctrl-C) outstanding tasks are cancelled and every record that had already
come back is stored, so a rerun trains only the rest. With ``--clh-ensemble`` the members of a seed
ensemble not yet stored go as one task of the same resources (``run_remote_ensemble``: engine.ensemble
trains them as one batched model) whose records come back together, each stored under its own key; the
cases that cannot be batched go as one task each.

Plugins travel: the sources of ``conftest.py`` files and plugin files outside the installed packages go
to the object store once per session and become modules of every worker; local plugin packages go
in the job's runtime environment (``py_modules``); installed plugins are imported by name on the
workers, and a worker that cannot import one fails its case with an error naming the module, the case and the Ray node.

Data travels once: the splits of a scenario's dataset that needs no files (``needs_root = False``:
digits, synthetic, a plugin's generated data) are made on the driver and put in the object store once
per session; every task of that dataset gets the same ObjectRefs, and a worker process fetches each
split once (``clharness.data.PRELOADED``). Datasets read from files (CIFAR, ImageNet-R, ...) are read
on the workers from ``--clh-data-root``, which must exist at the same path on every node; a node
without it fails the case with an error naming the node and the path. Kinds that assemble several
datasets from their options (M2I, CLDyB pools) make them on the workers (once per worker process).
"""
from __future__ import annotations

import os
import sys
import sysconfig
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import ray

from ..results import RunRecord
from .runner import cpu_threads

MAX_RETRIES = 3          # re-executions of a case whose worker or node died
RESOURCE_OPTIONS = ("cpus_per_run", "gpus_per_run")   # per-scenario defaults (suite options)


class RayBackendError(RuntimeError):
    """A case that could not run on the cluster for a reason that is not the method's."""


# ------------------------------------------------------------------------------- plugins
@dataclass
class Shipment:
    """What the workers import to rebuild the driver's harness: module names, in registration order,
    and the local folders Ray ships with the job (``py_modules``)."""
    modules: list[str] = field(default_factory=list)
    aliases: dict[str, str] = field(default_factory=dict)   # shipped name -> the driver's module name
    sources: dict[str, tuple[str, str]] = field(default_factory=dict)   # shipped name -> (source, file)
    py_modules: list[str] = field(default_factory=list)       # local packages: the job's runtime_env


def _installed(path: Path) -> bool:
    roots = {sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib", "platstdlib")}
    return any(Path(r) in path.parents for r in roots)


def ship_plugins(plugin_modules: list[Any], named: list[str]) -> Shipment:
    """``plugin_modules``: the plugin objects pytest registered (conftest and -p modules with clharness
    hooks); ``named``: the --clh-plugin specs. Files that are not installed packages are copied into
    one package shipped with the job; installed ones travel by name (they must be installed there too)."""
    from ..plugins import import_plugin
    shipment = Shipment()
    modules = list(plugin_modules) + [import_plugin(spec) for spec in named]
    seen = set()
    for module in modules:
        if id(module) in seen:
            continue
        seen.add(id(module))
        name = getattr(module, "__name__", None)
        where = getattr(module, "__file__", None)
        if name is None or not isinstance(name, str) or not hasattr(module, "__spec__"):
            raise RayBackendError(f"clharness plugin {module!r} is not a module; --clh-ray ships plugin modules "
                                  "(conftest.py, -p/--clh-plugin files) to the workers, not objects")
        path = Path(where).resolve() if where else None
        if path is None or _installed(path):
            shipment.modules.append(name)   # installed: the workers import it by name
            continue
        if path.name == "__init__.py":      # a local package: shipped as it is, imported by its name
            shipment.py_modules.append(str(path.parent))
            shipment.modules.append(name)
            continue
        shipped = f"clh_shipped_{len(shipment.modules)}_{uuid.uuid4().hex[:8]}_{path.stem.replace('-', '_')}"
        shipment.sources[shipped] = (path.read_text(), str(path))
        shipment.modules.append(shipped)
        shipment.aliases[shipped] = name
    return shipment


_HARNESSES: dict[tuple[str, ...], Any] = {}   # per worker process: one harness per plugin set


def load_sources(sources: dict[str, tuple[str, str]]) -> None:
    """Plugin files sent by the driver become modules of this worker (once per process)."""
    import types
    for name, (source, filename) in sources.items():
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__file__ = filename
            sys.modules[name] = module
            exec(compile(source, filename, "exec"), module.__dict__)


def worker_harness(modules: tuple[str, ...], case_id: str, aliases: tuple[tuple[str, str], ...] = (),
                   sources: dict[str, tuple[str, str]] | None = None):
    """The harness on a worker: the built-ins, the installed entry points and the shipped plugins."""
    if modules not in _HARNESSES:
        import importlib

        from ..plugins import Harness
        load_sources(sources or {})
        for name in modules:
            try:
                importlib.import_module(name)
            except ImportError as exc:
                raise RayBackendError(
                    f"clharness plugin module {name!r} cannot be imported on Ray node {_node()} (case {case_id}): "
                    f"{exc}. Install the plugin's package on every node of the cluster (pip install ...), or "
                    "give it as a .py file (-p path/to/file.py) so that it travels with the job") from None
        for shipped, original in aliases:   # objects pickled on the driver name the driver's module
            sys.modules.setdefault(original, sys.modules[shipped])
        _HARNESSES[modules] = Harness(plugins=modules)
    return _HARNESSES[modules]


def _node() -> str:
    try:
        return ray.util.get_node_ip_address()
    except Exception:   # outside a Ray worker (unit tests): the host name is the node
        import socket
        return socket.gethostname()


# ------------------------------------------------------------------------------- the task
def run_remote(case, modules: tuple[str, ...], device: str, data_root: str | None, download: bool,
               aliases: tuple[tuple[str, str], ...] = (), sources: dict | None = None,
               splits: dict | None = None, threads: int = 1) -> str:
    """One case on a worker; returns its record as JSON (the driver stores it). ``splits``: the
    session's (identity, train) -> ObjectRef of the case's in-memory dataset splits."""
    from .runner import pick_device, run_case
    harness = _worker_setup(case.id, modules, data_root, aliases, sources, splits, threads)
    record = run_case(case, harness, pick_device(device), Path(data_root) if data_root else None, download)
    return _node_said(record).to_json()


def run_remote_ensemble(cases: list, modules: tuple[str, ...], device: str, data_root: str | None, download: bool,
                        aliases: tuple[tuple[str, str], ...] = (), sources: dict | None = None,
                        splits: dict | None = None, threads: int = 1) -> list[str]:
    """``--clh-ensemble``: the members of one seed ensemble (the same case but for the seed) trained
    together in one task (engine.ensemble.run_ensemble); their records as JSON, in order."""
    from .ensemble import run_ensemble
    from .runner import pick_device
    harness = _worker_setup(cases[0].id, modules, data_root, aliases, sources, splits, threads)
    records = run_ensemble(list(cases), harness, pick_device(device), Path(data_root) if data_root else None, download)
    return [_node_said(record).to_json() for record in records]


def _worker_setup(case_id: str, modules, data_root, aliases, sources, splits, threads: int):
    """The worker's side of a task: the driver's thread rule, the data root checked, the plugins and the
    in-memory splits loaded; returns the harness."""
    from .runner import set_cpu_threads
    set_cpu_threads(threads)   # the driver's rule, so the record (and its key) is the serial one
    if data_root and not Path(data_root).is_dir():
        raise RayBackendError(f"--clh-data-root {data_root} does not exist on Ray node {_node()} (case {case_id}); "
                              "the data root must exist, at the same path, on every node")
    harness = worker_harness(modules, case_id, aliases, sources)
    receive_splits(splits or {})   # after the plugins: a plugin's dataset classes must resolve
    return harness


def _node_said(record: RunRecord) -> RunRecord:
    if record.status == "error" and record.message.startswith("DatasetMissing"):   # which node lacks it
        record.message += (f" (on Ray node {_node()}: the data root must hold the dataset, at the same path, "
                           "on every node)")
    return record


def receive_splits(splits: dict) -> None:
    """Fetch the splits this worker process does not hold yet from the object store (once each)."""
    from ..data import PRELOADED
    missing = [key for key in splits if key not in PRELOADED]
    for key, split in zip(missing, ray.get([splits[key] for key in missing])):
        PRELOADED[key] = split


def run_function(fn: Callable, *args, **kwargs):
    """Any picklable call as a Ray task of this session's resources (used by the multi-run protocols)."""
    return fn(*args, **kwargs)


def call_method(blob: bytes, method: str, args: tuple, modules: tuple[str, ...], aliases, sources):
    """``obj.<method>(*args)`` on a worker, ``obj`` pickled on the driver (a family's state, e.g. a CLDyB
    search). Unpickled here, after the plugin modules are imported, so plugin methods' classes resolve.
    Returns (its result, (training FLOPs, evaluation FLOPs, why incomplete)): the driver adds them to the
    run that asked (``map_method``), so a search counts the same on any executor (engine.flops)."""
    import cloudpickle

    from . import flops
    worker_harness(modules, f"remote {method}", aliases, sources)
    with flops.RunMeter() as meter:
        out = getattr(cloudpickle.loads(blob), method)(*args)
    return out, (meter.train_flops, meter.eval_flops, meter.incomplete)


_remote_case = ray.remote(run_remote)
_remote_ensemble = ray.remote(run_remote_ensemble)
_remote_call = ray.remote(run_function)


# ------------------------------------------------------------------------------- the driver
def init(address: str, shipment: Shipment) -> bool:
    """``local``: a Ray runtime on this machine (its CPUs, or $CLH_RAY_NUM_CPUS); ``auto``: the
    cluster ``ray start`` made (RAY_ADDRESS); ``ray://host:port``: Ray Client. Returns whether this
    call connected (False: the process already had Ray initialised, and keeps it after the session)."""
    if ray.is_initialized():
        if shipment.py_modules:
            raise RayBackendError(f"plugin package(s) {shipment.py_modules} must travel in the job's runtime "
                                  "environment, but this process had joined Ray before the session; let --clh-ray "
                                  "connect, or install the package(s) on every node")
        return False
    runtime_env = {"py_modules": shipment.py_modules} if shipment.py_modules else None
    common = dict(log_to_driver=False, logging_level="ERROR", include_dashboard=False, runtime_env=runtime_env)
    if address != "local" and not (address == "auto" or address.startswith("ray://") or ":" in address):
        raise ValueError(f"--clh-ray {address!r}: give local, auto or ray://HOST:PORT")
    try:
        if address == "local":
            cpus = os.environ.get("CLH_RAY_NUM_CPUS")
            # address="local": always a runtime of its own, never a cluster `ray start` left running here
            ray.init(address="local", num_cpus=int(cpus) if cpus else None, **common)
        else:
            common.pop("include_dashboard")
            ray.init(address=address, **common)
    except (ConnectionError, RuntimeError, ray.exceptions.RayError) as exc:
        raise RayBackendError(f"--clh-ray {address}: could not start or join Ray: {type(exc).__name__}: {exc}") from None
    return True


@dataclass
class Pending:
    ref: Any
    case: Any
    amend: Callable | None
    member: int | None = None   # its place in an ensemble task's list of records (None: a task of its own)

    def record(self) -> RunRecord:
        out = ray.get(self.ref)
        return RunRecord.from_json(out if self.member is None else out[self.member])


class RayRunner:
    """Submits cases, hands their records back in whatever order the items ask, cancels the rest."""

    def __init__(self, shipment: Shipment, device: str, data_root: str | None, download: bool,
                 cpus_per_run: float | None, gpus_per_run: float | None,
                 suite_resources: dict[tuple[str, str], dict] | None = None, datasets=None):
        self.shipment = shipment
        self.datasets = datasets if datasets is not None else {}   # the driver's dataset registry
        self.suite_resources = suite_resources if suite_resources is not None else {}
        self.device, self.download = device, download
        self.data_root = str(Path(data_root).resolve()) if data_root else None
        self.cpus, self.gpus = cpus_per_run, gpus_per_run
        self.pending: dict[str, Pending] = {}
        self.sources = ray.put(shipment.sources)   # the plugin files: in the object store once per session
        self.splits: dict[tuple[str, bool], Any] = {}   # in-memory dataset splits: in the object store once
        self.submitted = 0

    def resources(self, case, scenario: str | None = None) -> dict[str, float]:
        """--clh-cpus/gpus-per-run, else the scenario's ``cpus_per_run``/``gpus_per_run``, else 1 CPU.
        ``scenario``: the suite scenario whose item asked for the case (a GTEP tuning run is named by
        its tuning id, ``<tuning>:tune-c3``, not by its scenario); without it, phase runs (GTEP
        ``name:eval@tuning``, CLDyB ``name/cc``) take the scenario their name starts with."""
        base = case.scenario.name.split(":")[0].split("/")[0]
        options = self.suite_resources.get((case.suite, scenario), None) if scenario else None
        options = options if options is not None else self.suite_resources.get((case.suite, base), {})
        cpus = self.cpus if self.cpus is not None else options.get("cpus_per_run", 1)
        gpus = self.gpus if self.gpus is not None else options.get("gpus_per_run", 0)
        return {"num_cpus": float(cpus), "num_gpus": float(gpus)}

    def case_splits(self, case) -> dict[tuple[str, bool], Any]:
        """ObjectRefs of the case's dataset splits when its scenario's dataset needs no files (made
        here and put in the object store on first use); {} for datasets read from --clh-data-root and
        for kinds that name their datasets in their options."""
        from ..data import ArrayDataset, load_split
        name = case.scenario.dataset
        if not name or name not in self.datasets or self.datasets[name].needs_root:
            return {}
        out = {}
        try:
            source = self.datasets[name](**case.scenario.dataset_options)
        except Exception:   # bad options: the worker builds the scenario and records the error, as serially
            return out
        source.name = name
        for train in (True, False):
            key = (source.identity(), train)
            if key not in self.splits:
                try:
                    split = load_split(source, None, train, False)
                except Exception:   # the same: the case's record on the worker says what went wrong
                    split = None
                self.splits[key] = ray.put(split) if isinstance(split, ArrayDataset) else None
            if self.splits[key] is not None:
                out[key] = self.splits[key]
        return out

    def submit(self, key: str, case, amend: Callable | None = None, scenario: str | None = None) -> None:
        if key in self.pending:
            return
        ref = _remote_case.options(max_retries=MAX_RETRIES, retry_exceptions=False,
                                   **self.resources(case, scenario)).remote(
            case, tuple(self.shipment.modules), self.device, self.data_root, self.download,
            tuple(self.shipment.aliases.items()), self.sources, self.case_splits(case), cpu_threads())
        self.pending[key] = Pending(ref, case, amend)
        self.submitted += 1

    def submit_ensemble(self, units, scenario: str | None = None) -> None:
        """``units`` (one seed ensemble, none submitted yet) as one task with the resources of one run
        (``resources``): every member's record comes back from it, each kept under its own key."""
        cases = [u.case for u in units]
        splits = {}
        for case in cases:   # one scenario, one dataset: the same splits, unless a member's seed picks others
            splits.update(self.case_splits(case))
        ref = _remote_ensemble.options(max_retries=MAX_RETRIES, retry_exceptions=False,
                                       **self.resources(cases[0], scenario)).remote(
            cases, tuple(self.shipment.modules), self.device, self.data_root, self.download,
            tuple(self.shipment.aliases.items()), self.sources, splits, cpu_threads())
        for i, unit in enumerate(units):
            self.pending[unit.key] = Pending(ref, unit.case, unit.amend, i)
        self.submitted += 1

    def map_method(self, obj, method: str, calls: list[tuple]) -> list:
        """``obj.<method>(*args)`` for every ``args`` in ``calls``, each as its own task with the case
        resources; ``obj`` goes to the object store once. Results in the order of ``calls``."""
        import cloudpickle

        from . import flops
        blob = ray.put(cloudpickle.dumps(obj))
        modules, aliases = tuple(self.shipment.modules), tuple(self.shipment.aliases.items())
        out = ray.get([self.call(call_method, blob, method, tuple(args), modules, aliases, self.sources)
                       for args in calls])
        for _, counted in out:   # their FLOPs are the asking run's, as if computed here
            flops.add_here(*counted)
        return [result for result, _ in out]

    def call(self, fn: Callable, *args, resources: dict | None = None, **kwargs):
        """An arbitrary call as a task with the case resources (e.g. CLDyB look-ahead rollouts)."""
        options = resources or {"num_cpus": float(self.cpus or 1), "num_gpus": float(self.gpus or 0)}
        return _remote_call.options(max_retries=MAX_RETRIES, retry_exceptions=False, **options).remote(
            fn, *args, **kwargs)

    def result(self, key: str, case) -> RunRecord:
        """The case's record: waits for its task (submitting it first when it was not pre-submitted)."""
        self.submit(key, case)
        try:
            record = self.pending[key].record()
        except ray.exceptions.RayTaskError as exc:
            del self.pending[key]
            if isinstance(getattr(exc, "cause", None), RayBackendError):
                raise RayBackendError(_last_line(exc.cause)) from None
            raise
        # only now: a Ctrl-C while waiting leaves the task pending, for the session's end to cancel
        del self.pending[key]
        return record

    def finished(self) -> list[tuple[str, RunRecord, Callable | None]]:
        """Records whose tasks already returned but whose items never asked (-x, Ctrl-C)."""
        if not self.pending:
            return []
        refs = list({p.ref: None for p in self.pending.values()})   # an ensemble's members share one task
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        ready = set(ready)
        out = []
        for key, p in list(self.pending.items()):
            if p.ref in ready:
                try:
                    out.append((key, p.record(), p.amend))
                except Exception:   # a task that ended in an error has no record to keep
                    continue
                finally:
                    self.pending.pop(key)
        return out

    def cancel_all(self, settle_s: float = 10.0) -> None:
        """Cancel every outstanding task and wait (up to ``settle_s``) until each has settled, so no
        case of this session is still training, or about to start, once the session has ended."""
        import time
        left = list({p.ref: None for p in self.pending.values()})   # an ensemble's members share one task
        self.pending.clear()
        deadline = time.monotonic() + settle_s
        while left and time.monotonic() < deadline:
            # again for the tasks not settled yet: a cancel that reached a task between its lease and its
            # start (a loaded machine) can be lost, and the task would then run after the session
            for ref in left:
                ray.cancel(ref, force=True)
            _, left = ray.wait(left, num_returns=len(left), timeout=1.0)


def _last_line(exc: BaseException) -> str:
    text = str(exc)
    for line in reversed(text.splitlines()):
        if "RayBackendError" in line or line.startswith("clharness") or "--clh-data-root" in line:
            return line.split("RayBackendError: ", 1)[-1]
    return text


# ------------------------------------------------------------------------------- the session's executor
class RayExecutor:
    """A session's remote executor (``Session.remote``): cases become Ray tasks, submitted up front
    (``prepare``) or when a unit asks (``result``); what came back unasked is kept at the end."""

    def __init__(self, session, address: str, plugin_modules: list[Any] = (), cpus_per_run: float | None = None,
                 gpus_per_run: float | None = None):
        self.session, self.address = session, address
        self.plugin_modules = list(plugin_modules)
        self.cpus, self.gpus = cpus_per_run, gpus_per_run
        self.runner: RayRunner | None = None
        self.connected = False   # this session started or joined Ray (and so leaves it at the end)

    def start(self) -> RayRunner:
        """Connect (raises RayBackendError or ValueError on a bad address or an unusable cluster)."""
        if self.runner is None:
            o = self.session.options
            shipment = ship_plugins(self.plugin_modules, list(o.plugins))
            self.connected = init(self.address, shipment)
            self.runner = RayRunner(shipment, o.device, o.data_root, o.download, self.cpus, self.gpus,
                                    self.session.resources, self.session.harness.datasets)
        return self.runner

    def prepare(self, units) -> None:
        """Submit every unit that runs one known case and waits for nothing, in order (Ray starts
        them roughly in the order the units ask), unless its record is stored. ``--clh-ensemble`` (or the
        suite's ``ensemble`` key): the members of one ensemble not stored go as one task, at the place of the first."""
        units = [u for u in units if u.case is not None and u.key and u.after is None]
        if not units:
            return
        runner = self.start()
        units = [u for u in units if self.session.reuse_case(u.case) is None]   # the session's one reuse rule
        together = {}   # unit -> its ensemble (two or more members, batchable)
        from .ensemble import batchable, ensembles
        for group in ensembles(units, self.session):   # --clh-ensemble or the suite's key, per unit (ensemble.mode)
            if len(group) >= 2 and batchable(self.session, group):
                together.update((u, group) for u in group)
        for unit in units:
            if unit in together:
                if unit.key not in runner.pending:
                    runner.submit_ensemble(together[unit], unit.name.split("[")[0])
            else:
                runner.submit(unit.key, unit.case, unit.amend, unit.name.split("[")[0])

    def result(self, key: str, case) -> RunRecord:
        from ..outcomes import Failed
        try:
            record = self.start().result(key, case)
        except RayBackendError as exc:
            raise Failed(str(exc)) from None
        if record.key != key:   # a worker with other library versions or other code hashes the case differently
            from .code_identity import code_digest
            from .runner import _kind_file, device_type, versions
            mine = code_digest(self.session.harness.methods[case.method], _kind_file(case.scenario.kind))
            if record.versions != dict(versions()):
                why = (f"the worker's library versions differ ({record.versions}, the driver's {dict(versions())}); "
                       "install the same versions on every node")
            elif record.code_digest != mine:
                why = (f"the worker ran other code (digest {record.code_digest}, the driver's {mine}): a file of the "
                       "method or of the harness changed on disk since the session started, or differs on that node; "
                       "rerun the session (the same code everywhere)")
            elif record.device.split(":")[0] != device_type():
                why = (f"the worker ran on {record.device}, the driver keys its runs for {device_type()} (the device "
                       "type enters the key); give --clh-device the type the workers run on")
            else:
                why = "the worker's run definition differs from the driver's"
            raise Failed(f"{case.id}: the Ray worker computed record key {record.key}, the driver {key}: {why}")
        return record

    def map_method(self, obj, method: str, calls: list[tuple]) -> list:
        return self.start().map_method(obj, method, calls)

    def finish(self) -> None:
        """Keep every record that came back, cancel the rest (-x, Ctrl-C, or units that never ran)."""
        if self.runner is None:
            return
        for key, record, amend in self.runner.finished():
            if amend is not None:
                amend(record)
            self.session.keep(record)
        self.runner.cancel_all()

    def close(self) -> None:
        if self.connected and ray.is_initialized():
            ray.shutdown()
