"""The pytest plugin: a thin front end over the engine. Suite files become parametrised test cases
(one item per ``kinds.Unit`` the engine plans), the session ends in a scorecard.

Active in every pytest run once clharness is installed (entry point ``pytest11``), and inert
until a suite is asked for: ``--clh-suite NAME|PATH`` or a suite file given on the command
line (``pytest suites/quickstart.toml -k er``). Each case is a ``pytest.Function`` whose id
reads ``<suite file>::<scenario>[<method>-seed<N>]``, so -k, -x, --lf, fixtures and
pytest-xdist work as on any test.

This module is the entry point pytest loads: the options, and at configure time the session's
plugin objects. The work is in modules by job:
    pytest_options     the --clh-* options, and the engine's Options built from them
    pytest_scheduling  pytest-xdist workers pinned, an ensemble's items kept together, Ray started
    pytest_session     ClhSession: the engine session, the plugins found, the records as they arrive
    pytest_collect     suite files and --clh-suite as items (one per unit), and running an item
    pytest_summary     each case's status line, the scorecard at the end, the files written
    pytest_progress    task i/T and ETA inside long cases
"""
from __future__ import annotations

import pytest

from .pytest_collect import session_key
from .pytest_options import add_options, check_ensemble, plain_ensemble_flag
from .pytest_scheduling import pin_xdist_worker, schedule_ensembles, start_ray
from .pytest_session import ClhSession


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args: list[str]) -> None:
    plain_ensemble_flag(args)


def pytest_configure(config: pytest.Config) -> None:
    check_ensemble(config)
    pin_xdist_worker(config)
    schedule_ensembles(config)
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
        start_ray(config, clh.engine)
    if config.getoption("clh_suite") and config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args[:] = []   # no explicit test paths: run only the suites, not the project's tests
    if active:
        clh.activate()
