"""Every name a suite uses, checked against the registries before anything trains.

A typo (``backbone = "mpl"``, a misspelled dataset, method, augmentation recipe or hyperparameter) is
one error line naming the suite file and line, the registered choices and the closest one, all at
once, at collection: the session stops in seconds instead of failing every case an hour later.
"""
from __future__ import annotations

import re
from pathlib import Path

from .suites import Suite, SuiteError, did_you_mean


def _line(text: list[str], key: str, value) -> int | None:
    """The first line setting ``key`` to ``value`` (``key = "value"``, or inside an inline table)."""
    pattern = re.compile(rf"""(^|[\s{{,]){re.escape(key)}\s*=\s*["']?{re.escape(str(value))}\b""")
    for i, line in enumerate(text, 1):
        if pattern.search(line.split("#", 1)[0]):
            return i
    return None


def _where(path: Path, text: list[str], key: str, value) -> str:
    line = _line(text, key, value)
    return f"{path}:{line}" if line else str(path)


def unknown(path: Path, text: list[str], what: str, key: str, value, registry) -> str:
    names = list(registry)
    return (f"{_where(path, text, key, value)}: {what} {value!r} is not registered{did_you_mean(value, names)}; "
            f"registered: {', '.join(names)}")


def _datasets_in(value) -> list[str]:
    """Dataset names inside a kind's options (lists of tables with a ``dataset`` key: pools, curricula)."""
    out = []
    if isinstance(value, dict):
        if isinstance(value.get("dataset"), str):
            out.append(value["dataset"])
        for v in value.values():
            if isinstance(v, (list, dict)):
                out += _datasets_in(v)
    elif isinstance(value, list):
        for v in value:
            out += _datasets_in(v)
    return out


def errors(session, suite: Suite) -> list[str]:
    """One line per bad name in ``suite`` (empty: every name is registered)."""
    harness = session.harness
    path = Path(suite.path)
    try:
        text = path.read_text().splitlines()
    except OSError:
        text = []
    out = []
    for spec in suite.scenarios:
        if spec.backbone and spec.backbone not in harness.backbones:
            out.append(unknown(path, text, "backbone", "backbone", spec.backbone, harness.backbones))
        for name in ([spec.dataset] if spec.dataset else []) + _datasets_in(spec.options):
            if name not in harness.datasets:
                out.append(unknown(path, text, "dataset", "dataset", name, harness.datasets))
        augment = getattr(spec, "augment", "none")
        if augment and augment not in harness.augmentations:
            out.append(unknown(path, text, "augmentation recipe", "augment", augment, harness.augmentations))
    planned = set(suite.planned_methods)
    named = [*suite.methods, *session.options.methods, *(m for g in suite.gates for m in g.methods if m != "*")]
    for name in dict.fromkeys(named):
        if name not in harness.methods and name not in planned:
            line = next((f"{path}:{i}" for i, t in enumerate(text, 1) if f'"{name}"' in t or f"'{name}'" in t), None)
            where = line or ("--clh-method" if name in session.options.methods else str(path))
            out.append(f"{where}: method {name!r} is not registered{did_you_mean(name, list(harness.methods))}; "
                       f"registered: {', '.join(harness.methods)}")
    for method, table in suite.hparams.items():
        if method not in harness.methods:
            if method not in planned:
                line = next((i for i, t in enumerate(text, 1) if t.strip() == f"[hparams.{method}]"), None)
                out.append(f"{path}:{line or '?'}: [hparams.{method}]: method {method!r} is not registered"
                           f"{did_you_mean(method, list(harness.methods))}")
            continue
        declared = harness.methods[method].hparams
        for key in table:
            if key not in declared:
                out.append(f"{_where(path, text, key, table[key])}: [hparams.{method}] {key!r}: {method!r} has no "
                           f"hyperparameter {key!r}{did_you_mean(key, declared)}; declared: {', '.join(declared)}")
    return out


def check(session, suite: Suite) -> None:
    """Raise SuiteError listing every bad name of ``suite``."""
    found = errors(session, suite)
    if found:
        raise SuiteError(f"{len(found)} unknown name(s) in suite {suite.name!r}; nothing was run:\n" + "\n".join(found))
