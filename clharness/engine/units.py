"""Units that run one case (``kinds.Unit``: one test id of a session, the work behind it, and what it
leaves behind): the engine's plain cases, and a collecting family's through ``Session.case_unit``."""
from __future__ import annotations

from ..kinds import Unit


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
