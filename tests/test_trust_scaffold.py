"""Issue 27 item 6: `clharness init` writes a package that can install. clharness is not on PyPI, so
the package's pyproject, README and CI install it from its git repository (clharness's own metadata
URL by default) or a local path; the generated package installs into a fresh venv, and its README's
test and report commands run green there."""
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
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


class _Dist:
    def __init__(self, direct):
        self.direct = direct

    def read_text(self, name):
        return None if self.direct is None else json.dumps(self.direct)


@pytest.mark.parametrize("direct", [None, {"url": "file:///home/me/clharness", "dir_info": {"editable": True}}])
def test_default_requirement_is_the_git_repository_not_pypi(monkeypatch, direct):
    from importlib import metadata
    monkeypatch.setattr(metadata, "distribution", lambda name: _Dist(direct))
    monkeypatch.setattr(metadata, "metadata", lambda name: _Meta(["Homepage, https://x.org", f"Repository, {URL}"]))
    assert scaffold.default_requirement() == f"clharness @ git+{URL}"
    # the URL is the one the installed metadata carries
    monkeypatch.setattr(metadata, "metadata", lambda name: _Meta(["Repository, https://example.org/lab/clharness"]))
    assert scaffold.default_requirement() == "clharness @ git+https://example.org/lab/clharness"
    # metadata without it (a copy installed before pyproject named it): the project's URL
    monkeypatch.setattr(metadata, "metadata", lambda name: _Meta([]))
    assert scaffold.default_requirement() == f"clharness @ git+{URL}"


class _Meta:
    def __init__(self, urls):
        self.urls = urls

    def get_all(self, key):
        return self.urls if key == "Project-URL" else None


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
    assert main(["init", "git_m", "--dir", str(tmp_path)]) == 0
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


def _venv_on_top_of_this_one(where: Path) -> Path:
    """A fresh venv whose site-packages also reads this interpreter's (torch, the editable clharness),
    as `python -m venv --system-site-packages` would with this venv as the system."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120)
    python = where / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    here = sysconfig.get_paths()["purelib"]
    (Path(purelib) / "_clh_project_venv.pth").write_text(f"import site; site.addsitedir({here!r})\n")
    return python


@pytest.mark.slow
def test_generated_package_installs_in_a_fresh_venv_and_its_readme_commands_run_green(tmp_path, capsys):
    assert main(["init", "fresh_m", "--dir", str(tmp_path), "--clharness", str(REPO)]) == 0
    package, venv = tmp_path / "fresh_m", tmp_path / "venv"
    try:
        python = _venv_on_top_of_this_one(venv)
        env = {**os.environ, "PATH": os.pathsep.join([str(venv / "bin"), str(Path(sys.executable).parent),
                                                      os.environ["PATH"]])}
        env.pop("PYTHONPATH", None)
        env.pop("CLH_ARTIFACTS", None)
        proc = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                               "--no-index", "-e", str(package)], env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        found = subprocess.run([str(python), "-c", "import fresh_m.plugin, clharness; print(clharness.__file__)"],
                               env=env, cwd=tmp_path, capture_output=True, text=True)
        assert found.returncode == 0 and Path(found.stdout.strip()).is_relative_to(REPO), found.stderr
        # README: (clharness is this checkout; the package is installed above) the test, then the report
        commands = _readme_commands(package)
        test = next(c for c in commands if c.endswith("python -m pytest"))
        report = next(c for c in commands if c.startswith("clharness report"))
        for command in (test, report):
            proc = subprocess.run(["bash", "-c", command], cwd=package, env=env, capture_output=True, text=True,
                                  timeout=1200)
            assert proc.returncode == 0, f"{command}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        rows = json.loads((package / "clharness-artifacts/scorecard.json").read_text())["summary"]
        assert {"fresh_m", "finetune", "er"} <= {r["method"] for r in rows}
        assert "fresh_m" in (package / "clharness-artifacts/report.html").read_text()
    finally:
        shutil.rmtree(venv, ignore_errors=True)
        shutil.rmtree(package, ignore_errors=True)
    assert not venv.exists() and not package.exists()
