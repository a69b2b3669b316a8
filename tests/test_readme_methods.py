"""README lists every registered method (issue 31): its table between the methods markers is exactly
what `clharness list --markdown` prints for the installed registry, so it cannot go stale again."""
import re
from pathlib import Path

from clharness.cli import methods_markdown
from clharness.plugins import Harness

README = Path(__file__).parent.parent / "README.md"


def readme_table() -> str:
    match = re.search(r"<!-- methods:start -->\n(.*?)<!-- methods:end -->", README.read_text(), re.S)
    assert match, "README.md lost its <!-- methods:start --> ... <!-- methods:end --> table"
    return match.group(1)


def test_readme_lists_every_registered_method_as_clharness_list_prints_it():
    harness = Harness(entry_points=False)
    expected = methods_markdown(harness)
    assert readme_table() == expected, "README's method table is stale: paste `clharness list --markdown`"
    for name in harness.methods:
        assert f"| `{name}` |" in readme_table()


def test_the_markdown_table_names_each_method_its_settings_and_paper():
    harness = Harness(entry_points=False)
    rows = methods_markdown(harness).splitlines()
    assert rows[:2] == ["| method | settings | paper |", "|---|---|---|"]
    assert len(rows) == 2 + len(harness.methods)
    er = next(r for r in rows if r.startswith("| `er` |"))
    assert "class-incremental" in er and "Chaudhry" in er
