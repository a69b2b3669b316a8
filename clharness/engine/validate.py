"""Every name a suite uses, checked against the registries before anything trains.

A typo (``backbone = "mpl"``, a misspelled dataset, method, augmentation recipe or hyperparameter) is
one error line naming the suite file and line, the registered choices and the closest one, all at
once, at collection: the session stops in seconds instead of failing every case an hour later. Values
are checked there too: backbone options against the backbone factory's signature, hyperparameters of
``[hparams.<method>]`` (and a scenario's ``hparams``) against their declared ranges, each with its line.
"""
from __future__ import annotations

import inspect
import re
from pathlib import Path

from ..hparams import HParamError
from .suites import Suite, SuiteError, did_you_mean


def _line(text: list[str], key: str, value=None) -> int | None:
    """The first line setting ``key`` to ``value`` (``key = "value"``, or inside an inline table); with no
    value, the first line setting ``key``."""
    written = "" if value is None else rf"""\s*["']?{re.escape(str(value))}\b"""
    pattern = re.compile(rf"""(^|[\s{{,]){re.escape(key)}\s*={written}""")
    for i, line in enumerate(text, 1):
        if pattern.search(line.split("#", 1)[0]):
            return i
    return None


def _where(path: Path, text: list[str], key: str, value) -> str:
    line = _line(text, key, value) or _line(text, key)   # the value as written (1e9 is 1000000000.0): the key's line
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


def backbone_options(backbone: str, factory, options: dict) -> tuple[list[str], list[str]]:
    """(options ``factory`` does not accept, the options it accepts) from its signature: every parameter
    after the input shape; a factory taking ``**options`` (timm's, which passes them to timm's model)
    accepts any name."""
    params = list(inspect.signature(factory).parameters.values())[1:]   # the first is the input shape
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return [], []
    accepted = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return [k for k in options if k not in accepted], accepted


def _hparam_errors(path: Path, text: list[str], table_name: str, method: str, table: dict, declared) -> list[str]:
    """Unknown names (did-you-mean) and out-of-range values of one method's hyperparameter table."""
    out = []
    for key, value in table.items():
        where = _where(path, text, key, value)
        if key not in declared:
            out.append(f"{where}: {table_name} {key!r}: {method!r} has no hyperparameter {key!r}"
                       f"{did_you_mean(key, declared)}; declared: {', '.join(declared)}")
            continue
        try:
            declared[key].check(key, value)
        except HParamError as exc:
            out.append(f"{where}: {table_name}: {exc}")
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
        elif spec.backbone:
            bad, accepted = backbone_options(spec.backbone, harness.backbones[spec.backbone], spec.backbone_options)
            for key in bad:
                out.append(f"{_where(path, text, key, spec.backbone_options[key])}: backbone_options: backbone "
                           f"{spec.backbone!r} has no option {key!r}{did_you_mean(key, accepted)}; it accepts: "
                           f"{', '.join(accepted) or 'none'}")
        for method, table in (getattr(spec, "hparams", None) or {}).items():
            if method in harness.methods:
                out += _hparam_errors(path, text, f"scenario {spec.name!r} hparams.{method}", method, table,
                                      harness.methods[method].hparams)
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
        out += _hparam_errors(path, text, f"[hparams.{method}]", method, table, harness.methods[method].hparams)
    return out


def check(session, suite: Suite) -> None:
    """Raise SuiteError listing every bad name of ``suite``."""
    found = errors(session, suite)
    if found:
        raise SuiteError(f"{len(found)} problem(s) in suite {suite.name!r}; nothing was run:\n" + "\n".join(found))
