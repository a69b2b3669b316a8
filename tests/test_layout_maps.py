"""README's and docs/api.md's layout maps name every package under clharness/ (issue 37 item 7).

Each package folder (one with an __init__.py) must appear in both maps as ``NAME/`` inside the
"Where things live" code block, and each module at the top of clharness/ by its name (``NAME.py``, or
``NAME`` as the pytest entry point's modules are listed), so neither can be left off the maps again.
"""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def packages() -> list[str]:
    pkg = ROOT / "clharness"
    return sorted(p.parent.relative_to(pkg).as_posix() for p in pkg.rglob("__init__.py")
                  if p.parent != pkg and "__pycache__" not in p.parts)


def layout_map(doc: Path) -> str:
    """The first code block after the heading "Where things live"."""
    text = doc.read_text()
    found = re.search(r"^## Where things live\n+```[^\n]*\n(.*?)^```", text, re.S | re.M)
    assert found, f"{doc.name} has no '## Where things live' section with a code block"
    return found.group(1)


def test_packages_are_found():
    assert {"engine", "benchmarks/domains", "reporting/loggers"} <= set(packages())


@pytest.mark.parametrize("doc", ["README.md", "docs/api.md"])
def test_layout_map_names_every_package(doc):
    text = layout_map(ROOT / doc)
    missing = [p for p in packages() if not re.search(rf"(?<![\w-]){re.escape(p.rsplit('/', 1)[-1])}/", text)]
    assert not missing, f"{doc}'s layout map does not name {missing} (as NAME/): add a line for each"


def top_level_modules() -> list[str]:
    return sorted(p.stem for p in (ROOT / "clharness").glob("*.py") if p.stem != "__init__")


def test_top_level_modules_are_found():
    assert {"kinds", "scenario_spec", "outcomes", "state_guard", "builtin", "pytest_collect"} <= set(top_level_modules())


@pytest.mark.parametrize("doc", ["README.md", "docs/api.md"])
def test_layout_map_names_every_top_level_module(doc):
    text = layout_map(ROOT / doc).replace("clharness/", "")   # a module in a subfolder (engine/plan.py) is not one
    missing = [m for m in top_level_modules() if not re.search(rf"(?<![\w/-]){re.escape(m)}(\.py)?(?![\w-])", text)]
    assert not missing, f"{doc}'s layout map does not name the modules {missing}: add them to its clharness/ lines"


def test_every_test_file_the_code_and_docs_name_exists():
    """A docstring or a doc that says which test checks something names a file that exists (the option
    table's docstring named tests/test_options.py, which never did)."""
    named = set()
    for folder, pattern in (("clharness", "*.py"), ("docs", "*.md"), ("bench", "*.py")):
        for path in (ROOT / folder).rglob(pattern):
            named |= {(m, path.relative_to(ROOT).as_posix()) for m in re.findall(r"tests/\w+\.py", path.read_text())}
    named |= {(m, "README.md") for m in re.findall(r"tests/\w+\.py", (ROOT / "README.md").read_text())}
    assert len(named) > 20
    assert sorted((m, where) for m, where in named if not (ROOT / m).exists()) == []
