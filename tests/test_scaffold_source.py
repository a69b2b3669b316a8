"""Issue 36 item 4: `clharness init` installs what you have. The package takes clharness from where
this copy came (its local checkout, kept editable; the git URL pinned to the installed commit; the
archive it came from), says which and why, and never falls back to an unpinned URL; a package made
by `init` installs offline into a fresh venv with clharness from a local path, and its tests pass."""
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

from clharness import scaffold
from clharness.cli import main
from clharness.scaffold import ScaffoldError, Source, source_from

REPO = Path(__file__).resolve().parents[1]


def _checkout(tmp_path: Path, name: str = "clh") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "pyproject.toml").write_text("[project]\nname = 'clharness'\n")
    return folder


# --- the choice, from what pip recorded (PEP 610 direct_url.json) ---------------------------------

def test_the_checkout_it_runs_from_is_the_source_kept_editable(tmp_path):
    checkout = _checkout(tmp_path)
    editable = {"url": checkout.as_uri(), "dir_info": {"editable": True}}
    other = {"url": "https://github.com/lab/clharness", "vcs_info": {"vcs": "git", "commit_id": "abc123"}}
    source = source_from([other, editable], checkout)
    assert source.requirement == f"clharness @ {checkout.as_uri()}" and source.folder == checkout
    assert "pip installed editable" in source.why and str(checkout) in source.why
    # a checkout on sys.path that pip never installed (PYTHONPATH): still that checkout
    bare = source_from([], checkout)
    assert bare.folder == checkout and "not installed there by pip" in bare.why


def test_a_git_install_is_pinned_to_the_installed_commit():
    direct = {"url": "https://github.com/lab/clharness", "vcs_info": {"vcs": "git", "commit_id": "9f8e7d6c",
                                                                      "requested_revision": "main"}}
    source = source_from([direct])
    assert source.requirement == "clharness @ git+https://github.com/lab/clharness@9f8e7d6c"
    assert source.folder is None and "at commit 9f8e7d6c" in source.why


def test_a_local_folder_stays_editable_only_if_pip_installed_it_editable(tmp_path):
    folder = _checkout(tmp_path)
    regular = source_from([{"url": folder.as_uri(), "dir_info": {}}])
    assert regular.requirement == f"clharness @ {folder.as_uri()}" and regular.folder is None
    assert "a regular install" in regular.why
    editable = source_from([{"url": folder.as_uri(), "dir_info": {"editable": True}}])
    assert editable.folder == folder and editable.why.endswith("installs that checkout, editable")


def test_an_archive_keeps_its_url_and_hash():
    direct = {"url": "https://files.example.org/clharness-0.1.tar.gz", "archive_info": {"hashes": {"sha256": "ab12"}}}
    assert source_from([direct]).requirement == "clharness @ https://files.example.org/clharness-0.1.tar.gz#sha256=ab12"


@pytest.mark.parametrize("records", [
    [],                                                                   # an index or wheel-file install
    [{"url": "https://github.com/lab/clharness", "vcs_info": {"vcs": "git"}}],   # no commit recorded
])
def test_no_source_is_an_error_naming_the_flag_never_an_unpinned_url(records):
    with pytest.raises(ScaffoldError) as err:
        source_from(records, None, "0.1.0")
    assert "cannot tell where this clharness came from" in str(err.value) and "--clharness" in str(err.value)


def test_a_folder_that_is_gone_is_named(tmp_path):
    gone = tmp_path / "moved"
    with pytest.raises(ScaffoldError, match=r"moved .*holds no pyproject.toml any more.*--clharness"):
        source_from([{"url": gone.as_uri(), "dir_info": {"editable": True}}])


def test_this_copy_runs_from_this_checkout():
    """Run from inside the checkout, where a build's clharness.egg-info (no direct_url.json) is found first."""
    source = scaffold.installed_source()
    assert source.folder == REPO and source.requirement == f"clharness @ {REPO.as_uri()}"


# --- the CLI says what it chose; the README keeps an editable clharness editable -------------------

def _readme_commands(package: Path) -> list[str]:
    block = re.search(r"```bash\n(.*?)```", (package / "README.md").read_text(), re.S).group(1)
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def test_init_prints_the_source_and_the_readme_installs_the_checkout_editable(tmp_path, capsys, monkeypatch):
    checkout = _checkout(tmp_path)
    chosen = Source(f"clharness @ {checkout.as_uri()}", "because of the test", checkout)
    monkeypatch.setattr(scaffold, "installed_source", lambda: chosen)
    assert main(["init", "src_m", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"clharness source: clharness @ {checkout.as_uri()}\n  why: because of the test" in out
    package = tmp_path / "src_m"
    commands = _readme_commands(package)
    assert commands[:2] == [f"python -m pip install -e {checkout}", 'python -m pip install -e ".[test]" --no-deps']
    assert "because of the test" in (package / "README.md").read_text()
    meta = tomllib.loads((package / "pyproject.toml").read_text())
    assert meta["project"]["dependencies"] == [chosen.requirement]


def test_override_is_said_and_a_non_local_source_is_installed_by_requirement(tmp_path, capsys):
    pinned = "git+https://example.org/lab/clharness@0123abc"
    assert main(["init", "ovr_m", "--dir", str(tmp_path), "--clharness", pinned]) == 0
    assert f"clharness source: clharness @ {pinned}\n  why: --clharness {pinned}" in capsys.readouterr().out
    assert _readme_commands(tmp_path / "ovr_m")[:2] == [f'python -m pip install "clharness @ {pinned}"',
                                                        'python -m pip install -e ".[test]" --no-deps']


def test_override_with_this_checkout_keeps_it_editable(tmp_path, capsys):
    assert main(["init", "same_m", "--dir", str(tmp_path), "--clharness", str(REPO)]) == 0
    assert "kept editable" in capsys.readouterr().out
    assert _readme_commands(tmp_path / "same_m")[0] == f"python -m pip install -e {REPO}"


def test_no_source_found_writes_nothing_and_names_the_flag(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(scaffold, "installed_source", lambda: source_from([], None, "0.1.0"))
    assert main(["init", "none_m", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "cannot tell where this clharness came from" in err and "--clharness" in err
    assert list(tmp_path.iterdir()) == []


# --- offline: a fresh venv, clharness from a local checkout, the package's README and tests ---------

def _deps_without_clharness(where: Path) -> Path:
    """This venv's site-packages as links, clharness's own entries left out: a fresh venv that adds
    this folder (a .pth) imports torch & co. without a download or a 5 GB copy, and has no clharness
    until pip installs it from the local path (an addsitedir of the whole site-packages would bring
    this venv's editable clharness along, and the test would prove nothing)."""
    where.mkdir()
    sites = [Path(sysconfig.get_paths()["purelib"])] + [Path(p) for p in sys.path   # a venv over system packages
                                                         if p.endswith(("site-packages", "dist-packages"))]
    for site in dict.fromkeys(s for s in sites if s.is_dir()):
        for entry in site.iterdir():   # the first site holding a name wins, as on sys.path
            if "clharness" not in entry.name.lower() and not (where / entry.name).is_symlink():
                (where / entry.name).symlink_to(entry)
    return where


def test_init_package_installs_offline_from_a_local_checkout_and_its_tests_pass(tmp_path):
    checkout = tmp_path / "clharness-src"   # a clean copy: pip writes its egg-info there, not in this tree
    shutil.copytree(REPO, checkout, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".clharness", "*.sqlite*", "tests"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    deps = _deps_without_clharness(tmp_path / "deps")
    (Path(purelib) / "_clh_test_deps.pth").write_text(f"import site; site.addsitedir({str(deps)!r})\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CLH_ARTIFACTS", "VIRTUAL_ENV")}
    env.update(PATH=os.pathsep.join([str(venv / "bin"), env["PATH"]]), PIP_DISABLE_PIP_VERSION_CHECK="1")

    def sh(command: str, cwd: Path) -> str:
        # offline: pip finds nothing but the local folders and what is installed (--no-index), and
        # builds with the setuptools it sees (--no-build-isolation would otherwise download one)
        command = command.replace("pip install", "pip install --no-index --no-build-isolation -q")
        proc = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return proc.stdout

    assert "No module named" in subprocess.run([str(python), "-c", "import clharness"], env=env, cwd=tmp_path,
                                               capture_output=True, text=True).stderr
    sh(f"python -m pip install -e {checkout}", tmp_path)              # the user's clharness: a checkout, editable
    out = sh("python -m clharness.cli init off_m", tmp_path)
    assert f"clharness source: clharness @ {checkout.as_uri()}" in out and "pip installed editable" in out, out
    package = tmp_path / "off_m"
    commands = _readme_commands(package)
    installs = [c for c in commands if c.startswith("python -m pip install")]
    assert installs == [f"python -m pip install -e {checkout}", 'python -m pip install -e ".[test]" --no-deps']
    for command in installs:
        sh(command, package)
    where = json.loads(sh("python -c \"import clharness, json; from importlib import metadata; print(json.dumps("
                          "[clharness.__file__, json.loads(metadata.distribution('clharness')"
                          ".read_text('direct_url.json'))]))\"", tmp_path))
    assert Path(where[0]).is_relative_to(checkout) and where[1]["dir_info"] == {"editable": True}   # still editable
    test = next(c for c in commands if c.endswith("python -m pytest"))
    sh(test, package)
    rows = json.loads((package / "clharness-artifacts/scorecard.json").read_text())["summary"]
    assert {"off_m", "finetune", "er"} <= {r["method"] for r in rows}
