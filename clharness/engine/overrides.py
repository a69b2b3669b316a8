"""Hyperparameters set from outside a suite (``--clh-hparam METHOD.NAME=V1,V2``, ``clharness.run(hparams=)``):
checked against the method's declared space before anything runs, applied on top of the suite's
``[hparams.METHOD]``, and expanded into one case per combination of the listed values."""
from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from ..hparams import HParamError, resolve
from .suites import Suite, SuiteError, did_you_mean


def check(session, suite: Suite, running: set[str]) -> None:
    """Every overridden method is registered and runs in ``suite``, every name is declared and every
    value in range; errors name the option, with a did-you-mean."""
    harness = session.harness
    for method, table in session.options.hparams.items():
        where = f"--clh-hparam {method}.*"
        if method not in harness.methods:
            raise SuiteError(f"{where}: unknown method {method!r}{did_you_mean(method, list(harness.methods))}")
        if method not in running:
            raise SuiteError(f"{where}: method {method!r} does not run in suite {suite.name!r} "
                             f"(it runs {', '.join(sorted(running)) or 'nothing'}); add --clh-add-method {method}")
        space = harness.methods[method].hparams
        for name, values in table.items():
            if name not in space:
                raise SuiteError(f"--clh-hparam {method}.{name}: {method} has no hyperparameter {name!r}"
                                 f"{did_you_mean(name, space)}; declared: {', '.join(sorted(space)) or 'none'}")
            for value in values:
                try:
                    resolve(method, space, {name: value})
                except HParamError as exc:
                    raise SuiteError(f"--clh-hparam {method}.{name}={value}: {exc}") from None


def with_first_values(suite: Suite, overrides: dict[str, dict[str, list]]) -> Suite:
    """``suite`` with each override's first value in its ``[hparams.METHOD]``: what every family sees."""
    if not overrides:
        return suite
    merged = {m: dict(t) for m, t in suite.hparams.items()}
    for method, table in overrides.items():
        merged.setdefault(method, {}).update({name: values[0] for name, values in table.items()})
    return dataclasses.replace(suite, hparams=merged)


def variants(overrides: dict[str, dict[str, list]], method: str) -> list[tuple[str, dict[str, Any]]]:
    """(tag, values) per combination of ``method``'s listed values, in the order given; tag reads
    ``lr=0.01,momentum=0.9`` (part of the case's id). [("", {})] when nothing is overridden."""
    table = overrides.get(method, {})
    if not table:
        return [("", {})]
    names = list(table)
    out = []
    for combo in itertools.product(*(table[n] for n in names)):
        values = dict(zip(names, combo))
        out.append((",".join(f"{n}={v}" for n, v in values.items()), values))
    return out


def varied(overrides: dict[str, dict[str, list]], methods) -> list[str]:
    """The methods given more than one value for some hyperparameter."""
    return [m for m in methods if any(len(v) > 1 for v in overrides.get(m, {}).values())]
