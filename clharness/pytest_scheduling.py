"""How a pytest session's units are spread: pytest-xdist workers pinned to their share of the machine,
an ensemble's items kept on one worker, and ``--clh-ray`` making cases Ray tasks."""
from __future__ import annotations

import pytest

# pytest-xdist modes that send every item of one ensemble to one worker: loadgroup by its xdist_group marks
# (group_ensembles), loadfile and loadscope a whole suite file, each every item
GROUPING_DIST = ("loadgroup", "loadfile", "loadscope", "each")


def pin_xdist_worker(config: pytest.Config) -> None:
    """Each xdist worker takes one GPU of the caller's CUDA_VISIBLE_DEVICES (before CUDA starts)
    and its share of the CPU threads (engine.placement)."""
    workerinput = getattr(config, "workerinput", {})
    worker = workerinput.get("workerid")
    if not worker:
        return
    from .engine.placement import pin_worker
    pin_worker(int(worker.lstrip("gw")), int(workerinput.get("workercount", 1)), config.getoption("clh_device"))


def grouped(config: pytest.Config) -> bool:
    """Whether this xdist worker's --dist (the controller's) keeps an ensemble's items on one worker."""
    return getattr(config, "workerinput", {}).get("clh_dist") in GROUPING_DIST


def schedule_ensembles(config: pytest.Config) -> None:
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


def group_ensembles(engine, items: list, is_unit_item) -> None:
    """An xdist worker under --dist loadgroup: an ensemble's items go to one worker (schedule_ensembles),
    with --clh-ensemble or a suite's [suite] ensemble key (xdist_groups names only those)."""
    from .engine.ensemble import xdist_groups
    names = xdist_groups(engine, [item.unit for item in items if is_unit_item(item)])
    for item in items:
        if is_unit_item(item) and item.unit in names:
            item.add_marker(pytest.mark.xdist_group(names[item.unit]))
            _group_nodeid(item, names[item.unit])


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


def start_ray(config: pytest.Config, engine) -> None:
    """--clh-ray: cases become Ray tasks (clharness.engine.ray_backend, the only module that imports Ray)."""
    if hasattr(config, "workerinput") or config.getoption("numprocesses", None):
        raise pytest.UsageError("--clh-ray and pytest-xdist (-n) do not combine: Ray spreads the cases over "
                                "its workers; drop -n")
    try:
        from .engine.ray_backend import RayExecutor
    except ImportError as exc:
        raise pytest.UsageError(f"--clh-ray needs Ray ({exc}); install it with: pip install 'clharness[ray]'") from None
    engine.remote = RayExecutor(engine, config.getoption("clh_ray"), [],
                                config.getoption("clh_cpus_per_run"), config.getoption("clh_gpus_per_run"))


def prepare_remote(remote, plugins: list, units: list) -> None:
    """Ray: the plugin modules its workers load, and every case's task submitted up front."""
    from .engine.ray_backend import RayBackendError
    remote.plugin_modules = plugins
    try:
        remote.prepare(units)
    except (ValueError, RayBackendError) as exc:
        raise pytest.UsageError(str(exc)) from None
