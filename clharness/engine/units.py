"""A unit: one test id of a session (``scenario[method-seedN]``), the work behind it, and what it
leaves behind. Families' ``collect`` and ``engine.plan.expand`` make them; front ends run them."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable


@dataclass(eq=False)
class Unit:
    """One unit of a session. ``run(session, unit)`` does the work and raises an ``outcomes``
    exception when it does not pass; what it leaves behind goes to ``properties``."""
    name: str                                   # "scenario[method-seedN]": the test id inside the suite
    run: Callable[[Any, "Unit"], Any]
    suite: str = ""
    path: Path | None = None                    # the suite file (a front end reports the unit there)
    label: str | None = None                    # how a report names it (default: "<suite>::<name>")
    case: Any = None                            # runner.Case, for units that run one case as is
    key: str | None = None                      # the record key it produces, when known before it runs
    amend: Callable | None = None               # edits its fresh record (also for a remote executor's)
    after: str | None = None                    # a record key it waits for first (a CLDyB search)
    shared: bool = False                        # several units may hold ``key``: the first trains it
    role: str = "case"                          # case | gate | search | selection | selected | eval | ...
    data: dict = field(default_factory=dict)    # the family's own payload
    properties: list = field(default_factory=list)

    @property
    def title(self) -> str:
        return self.label or f"{self.suite}::{self.name}"


def run_case_unit(session, unit: Unit) -> None:
    session.run_stored(unit, unit.case, unit.amend)


def case_unit(suite: Suite, name: str, case, method_cls, **fields) -> Unit:
    from .runner import case_key
    return Unit(name, fields.pop("run", run_case_unit), suite=suite.name, path=suite.path, case=case,
                key=case_key(case, method_cls), **fields)




def suite_hparams(suite: Suite, method_cls) -> dict:
    """The method's hyperparameters with the suite's ``[hparams.<method>]`` applied and checked."""
    from .runner import resolve_hparams
    from .suites import SuiteError
    try:
        return resolve_hparams(method_cls, suite.hparams.get(method_cls.name, {}))
    except ValueError as exc:
        raise SuiteError(f"{suite.path}: [hparams.{method_cls.name}]: {exc}") from None
