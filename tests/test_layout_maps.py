"""README's and docs/api.md's layout maps name every package under clharness/ (issue 37 item 7).

Each package folder (one with an __init__.py) must appear in both maps as ``NAME/`` inside the
"Where things live" code block, so a new package cannot be left off the maps again.
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
