"""Issue 27 item 6: `clharness init` writes a package that can install. clharness is not on PyPI, so
the package's pyproject, README and CI install it from a git URL or a local path, never by bare name
(where it comes from by default: tests/test_scaffold_source.py, issue 36 item 4)."""
import re
import tomllib
from pathlib import Path

import pytest
import yaml

from clharness import scaffold
from clharness.cli import main

REPO = Path(__file__).resolve().parents[1]
URL = "https://github.com/clharness/clharness"


def test_pyproject_names_the_repository_url():
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert meta["project"]["urls"]["Repository"] == URL == scaffold.REPOSITORY


@pytest.mark.parametrize("spec, expected", [
    (str(REPO), f"clharness @ {REPO.resolve().as_uri()}"),                       # a local checkout
    ("git+https://example.org/lab/clharness@v1", "clharness @ git+https://example.org/lab/clharness@v1"),
    ("https://example.org/lab/clharness", "clharness @ git+https://example.org/lab/clharness"),
    ("https://example.org/clharness-0.1-py3-none-any.whl", "clharness @ https://example.org/clharness-0.1-py3-none-any.whl"),
    ("clharness @ git+https://example.org/x/clharness", "clharness @ git+https://example.org/x/clharness"),
    ("clharness[ray] @ git+https://example.org/x/clharness", "clharness[ray] @ git+https://example.org/x/clharness"),
])
def test_clharness_option_takes_a_requirement_a_url_or_a_path(spec, expected):
    assert scaffold.requirement_from(spec) == expected


def _install_lines(package: Path) -> list[str]:
    flow = yaml.safe_load((package / ".github/workflows/clharness.yml").read_text())
    install = next(s["run"] for s in flow["jobs"]["benchmark"]["steps"] if s.get("name") == "Install")
    return [line.strip() for line in install.splitlines() if "pip install" in line]


def _readme_commands(package: Path) -> list[str]:
    block = re.search(r"```bash\n(.*?)```", (package / "README.md").read_text(), re.S).group(1)
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def test_generated_readme_and_ci_install_clharness_from_git_never_pypi(tmp_path, capsys):
    pinned = "git+https://example.org/lab/clharness@0123abc"
    assert main(["init", "git_m", "--dir", str(tmp_path), "--clharness", pinned]) == 0
    package = tmp_path / "git_m"
    meta = tomllib.loads((package / "pyproject.toml").read_text())
    requirement = meta["project"]["dependencies"][0]
    assert re.fullmatch(r"clharness @ git\+https://\S+", requirement), requirement
    assert f'python -m pip install "{requirement}"' in _install_lines(package)
    assert f'python -m pip install "{requirement}"' in _readme_commands(package)
    text = (package / "README.md").read_text() + (package / ".github/workflows/clharness.yml").read_text()
    assert "pypi.org" not in text.lower() and not re.search(r"pip install \"?clharness(\[\w+\])?\"?\s*$", text, re.M)
    # the README's report reads the store its test command writes
    commands = _readme_commands(package)
    test = next(c for c in commands if c.endswith("python -m pytest"))
    report = next(c for c in commands if c.startswith("clharness report"))
    artifacts = re.match(r"CLH_ARTIFACTS=(\S+) ", test).group(1)
    assert report.split()[2] == f"{artifacts}/results.sqlite"


def test_a_local_path_reaches_pyproject_readme_and_ci_with_a_note(tmp_path, capsys):
    assert main(["init", "loc_m", "--dir", str(tmp_path), "--clharness", str(REPO)]) == 0
    package = tmp_path / "loc_m"
    requirement = f"clharness @ {REPO.resolve().as_uri()}"
    assert tomllib.loads((package / "pyproject.toml").read_text())["project"]["dependencies"] == [requirement]
    assert f'python -m pip install "{requirement}"' in _install_lines(package)
    assert "which CI cannot reach" in (package / ".github/workflows/clharness.yml").read_text()


def test_main_readme_installs_extras_from_a_checkout_or_git_never_pypi():
    text = (REPO / "README.md").read_text()
    extras = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    installs = re.findall(r'pip install (?:-\S+ )*("[^"]*"|\S+)', text)
    assert installs
    for arg in installs:
        if "clharness" in arg:   # by name: with a URL (a bare name would look it up on PyPI)
            assert re.match(r'"clharness(\[[\w,]+\])? @ (git\+https|file):', arg), arg
        for extra in re.findall(r"\[([\w,]+)\]", arg):
            assert set(extra.split(",")) <= extras, arg
    assert "pypi.org" not in text.lower()
    assert "from PyPI" not in text
