"""The suite key ``select_hparams``: its options and their load-time check (engine.suites reads it
before anything runs; engine.hparam_selection runs the selection it asks for)."""
from __future__ import annotations

from typing import Any, Mapping

KEY = "select_hparams"
OPTION_TYPES = {"tasks": int, "metric": str, "configurations": int, "search": dict}
DEFAULTS = {"tasks": 3, "metric": "aa", "configurations": 0, "search": {}}
EXAMPLE = 'select_hparams = { tasks = 3, metric = "aa", search = { "*" = { lr = [0.01, 0.1] } } }'


def options(value: Mapping[str, Any] | None) -> dict[str, Any]:
    """The key's table with its defaults filled in."""
    return {**DEFAULTS, **(value or {})}


def check_option(value: Any, kind: str, setting: str = "class-incremental", validation: float = 0.0,
                 tasks: int | None = None) -> dict[str, Any]:
    """Load-time check of ``select_hparams``; raises ValueError naming the key, the value and the fix."""
    if not isinstance(value, dict):
        raise ValueError(f"{KEY} = {value!r} must be a table, e.g. {EXAMPLE}")
    unknown = [k for k in value if k not in OPTION_TYPES]
    if unknown:
        raise ValueError(f"{KEY}: unknown key(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(OPTION_TYPES)}")
    for key, typ in OPTION_TYPES.items():
        if key in value and (isinstance(value[key], bool) or not isinstance(value[key], typ)):
            raise ValueError(f"{KEY}.{key} = {value[key]!r} must be of type {typ.__name__}")
    o = options(value)
    from ..metrics import METRIC_INFO
    if o["metric"] not in METRIC_INFO:
        raise ValueError(f"{KEY}.metric = {o['metric']!r}; allowed: {', '.join(METRIC_INFO)}")
    if o["tasks"] < 1 or o["configurations"] < 0:
        raise ValueError(f"{KEY}: tasks = {o['tasks']} must be >= 1 and configurations = {o['configurations']} >= 0 "
                         "(0: the full grid of the search sets)")
    if tasks is not None and o["tasks"] > tasks:
        raise ValueError(f"{KEY}.tasks = {o['tasks']} exceeds the scenario's {tasks} tasks; select on fewer tasks")
    for owner, table in o["search"].items():
        if not isinstance(table, dict) or not all(isinstance(v, list) and v for v in table.values()):
            raise ValueError(f"{KEY}.search.{owner} = {table!r} must be a table of non-empty lists, "
                             "e.g. { lr = [0.01, 0.1] }")
    if setting == "online":
        raise ValueError(f"{KEY} selects on the first tasks of a task sequence; setting = \"online\" has no tasks")
    if kind != "cldyb" and not 0 < validation < 1:   # CLDyB requires it of its own (kind.check)
        raise ValueError(f"{KEY} scores on the first tasks' validation splits: set validation to a fraction in "
                         "(0, 1), e.g. validation = 0.2")
    from ..kinds import family
    fam = family(kind)
    if fam.collect is not None and not fam.SELECTS_HPARAMS:
        raise ValueError(f"{KEY}: kind {kind!r} makes its own items and does not apply {KEY}"
                         + (" (GTEP tunes in its own phase: use its configurations and search keys)" if kind == "gtep"
                            else " (its module would declare SELECTS_HPARAMS = True)"))
    return o
