"""Suites as pytest items: a suite file named on the command line, or ``--clh-suite NAME``, is collected
as one item per unit the engine expands it into (``engine.plan.expand``); running an item runs its unit."""
from __future__ import annotations

from pathlib import Path

import pytest

from . import outcomes
from .engine.suites import SuiteError, is_suite_file

session_key = pytest.StashKey["ClhSession"]()   # the session's ClhSession (pytest_session), on config.stash


def collect_file(file_path: Path, parent):
    """Suite files named on the command line (or their folder) are collected as tests."""
    session = parent.session
    if (file_path.suffix == ".toml" and (session.isinitpath(file_path) or session.isinitpath(file_path.parent))
            and is_suite_file(file_path)):
        return SuiteFile.from_parent(parent, path=file_path)
    return None


def collect_named_suites(clh, session: pytest.Session, config: pytest.Config, items: list) -> None:
    """``--clh-suite NAME``: cases under a node named after the suite, so ids read
    ``NAME::scenario[method-seedN]`` wherever the file lives (installed suites included)."""
    from _pytest.runner import collect_one_node
    for requested in config.getoption("clh_suite"):
        suite_file = suite_path(clh, requested)
        node = SuiteFile.from_parent(session, path=config.rootpath / suite_file.stem)
        node.suite_file = suite_file
        report = collect_one_node(node)
        session.ihook.pytest_collectreport(report=report)
        if report.passed:
            items.extend(report.result)


def suite_path(clh, name_or_path: str) -> Path:
    from .engine.plan import resolve_suite
    try:
        return resolve_suite(clh.engine, name_or_path)
    except SuiteError as exc:
        raise pytest.UsageError(f"--clh-suite {exc}".replace("--clh-suite suite ", "--clh-suite ")) from None


class SuiteFile(pytest.File):
    """A suite TOML file: one item per unit the engine expands it into, in order."""
    suite_file: Path | None = None   # set when the node is named after the suite, not its file

    def collect(self):
        from .engine.plan import expand
        clh = self.config.stash[session_key]
        try:
            units = expand(clh.engine, self.suite_file or self.path)
        except ValueError as exc:
            if str(exc).startswith("--clh-compare"):
                raise pytest.UsageError(str(exc)) from None
            raise
        for unit in units:
            cls = NotRegisteredItem if unit.role == "not-registered" else UnitItem
            item = make_item(cls, self, unit.name, _run_unit)
            item.unit, item.case, item.case_key = unit, unit.case, unit.key
            yield item

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, (SuiteError, LookupError, ValueError)):
            return str(excinfo.value)
        return super().repr_failure(excinfo)


def make_item(cls, parent, name: str, callobj):
    """An item named ``base[params]`` built as a parametrized function would be, so its id is the
    one pytest stores for --lf and pytest-xdist (pytest >= 9.2 keys them by a structured id that
    only a call spec carries; the call-spec class is private and was renamed in 9.2)."""
    from _pytest import python
    base, _, params = name.partition("[")
    spec_cls = getattr(python, "CallSpec", None) or python.CallSpec2
    return cls.from_parent(parent, name=name, originalname=base, callobj=callobj,
                           callspec=spec_cls(_idlist=(params[:-1],)) if params else None)


class UnitItem(pytest.Function):
    """One unit of the engine's plan: a case, a protocol step or a gate."""
    unit: "object"
    case: "object"
    case_key: str | None

    def reportinfo(self):
        return self.path, 0, self.unit.title


class NotRegisteredItem(UnitItem):
    def reportinfo(self):
        return self.path, 0, self.name


def _run_unit(request: pytest.FixtureRequest) -> None:
    """Run the item's unit through the engine; its outcome becomes the item's."""
    item: UnitItem = request.node
    clh = request.config.stash[session_key]
    try:
        clh.engine.execute(item.unit)
    except outcomes.Skipped as exc:
        raise pytest.skip.Exception(exc.message, _use_item_location=True) from None   # reported at the suite file
    except outcomes.ExpectedFailure as exc:
        pytest.xfail(exc.message)
    except outcomes.Failed as exc:   # from None: the message once, not again as "during handling of ..."
        raise pytest.fail.Exception(exc.message, pytrace=False) from None
    finally:
        item.user_properties.extend(item.unit.properties)
