"""The pytest plugin's options: the ``--clh-*`` options declared from the one table (engine.options.OPTIONS),
and the engine's ``Options`` built from a pytest command line."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from .engine.session import Options

ENSEMBLE_VALUES = ("seeds", "hparams", "off")


def add_options(parser: pytest.Parser) -> None:
    """The ``--clh-*`` options, from the one table. ``--clh-ensemble``'s value is checked in
    ``check_ensemble``: argparse's choices would reject a path that follows a plain --clh-ensemble
    before ``plain_ensemble_flag`` can tell them apart."""
    from .engine.options import add_pytest_options
    add_pytest_options(parser.getgroup("clharness", "continual-learning benchmark suites (clharness)"))


def plain_ensemble_flag(args: list[str]) -> None:
    """A plain ``--clh-ensemble`` followed by a path (``pytest --clh-ensemble suites/x.toml``): argparse
    would take the path as the option's value (nargs="?"); the plain flag means seeds."""
    for i, arg in enumerate(args):
        if arg == "--clh-ensemble" and (i + 1 == len(args) or args[i + 1] not in ENSEMBLE_VALUES):
            args[i] = "--clh-ensemble=seeds"


def check_ensemble(config: pytest.Config) -> None:
    if config.getoption("clh_ensemble") not in (None, *ENSEMBLE_VALUES):
        raise pytest.UsageError(f"--clh-ensemble={config.getoption('clh_ensemble')}: choose seeds, hparams or off "
                                "(plain --clh-ensemble: seeds; off: every case solo, whatever a suite's ensemble key)")


def session_options(config: pytest.Config, grouped: bool) -> Options:
    """The engine's options from the ``--clh-*`` command line; ``grouped``: this xdist worker's --dist
    keeps an ensemble's units on one worker."""
    drops = _max_drops(config)   # first: a bad baseline is said before a bad --clh-hparam
    from .engine.options import OPTIONS, PYTEST, parse_hparams
    fields = {f.name for f in dataclasses.fields(Options)}
    given = {o.argument: config.getoption(o.dest) for o in OPTIONS if PYTEST in o.where and o.argument in fields}
    given.pop("max_drops")   # parsed against the saved scorecard's metrics
    try:
        hparams = parse_hparams(given.pop("hparams"))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    lists = {name: tuple(value) for name, value in given.items() if isinstance(value, list)}
    return Options(**{**given, **lists}, hparams=hparams, max_drops=drops,
                   xdist_worker=hasattr(config, "workerinput"), xdist_grouped=grouped)


def _max_drops(config: pytest.Config) -> dict[str, float]:
    """``--clh-max-drop`` against the ``--clh-compare`` scorecard: every metric must be one it carries
    (a typo judges nothing). No baseline: none."""
    baseline = config.getoption("clh_compare")
    if not baseline:
        return {}
    import json

    from .reporting.compare import parse_drops, scorecard_metrics
    try:
        rows = json.loads(Path(baseline).read_text())["summary"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise pytest.UsageError(f"--clh-compare {baseline}: not a clharness scorecard JSON ({exc}); "
                                "write one with --clh-scorecard FILE.json") from None
    try:
        return parse_drops(config.getoption("clh_max_drop"), known=scorecard_metrics(rows))
    except ValueError as exc:
        raise pytest.UsageError(f"--clh-max-drop: {exc}") from None
