"""The wheel users install holds every module and data file, and runs from outside the checkout.

Issue 36 item 1: a hand-kept package list once left `clharness.benchmarks.domains` out of the
wheel, and CI's editable install hid it. Here the wheel is built, its contents are compared with
the source tree (computed from the tree, never a list), and `clharness list` plus one quick suite
of every family run from the unpacked wheel with the checkout off sys.path.
"""
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# import name -> source folder, as pyproject's package-dir and setup.py map them
ROOTS = {"clharness": "clharness", "clharness_methods": "methods", "clharness_suites": "suites"}
# one quick suite of every family: split, STF, M2I/curriculum, GTEP, CLDyB, domain-incremental
FAMILY_SUITES = ["quickstart", "stf-digits", "m2i-mini", "gtep-digits", "cldyb-mini", "domain-digits"]


def source_package_files():
    """Every file under the package folders (bytecode aside), as its path inside the wheel.

    Walked, not asked of git, so the check also holds in scripts/mutate.py's plain copy."""
    files = set()
    for name, folder in ROOTS.items():
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                files.add(f"{name}/{path.relative_to(ROOT / folder).as_posix()}")
    return files


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    dest, source = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("source") / "src"
    # Built from a clean copy: a stale build/lib in the checkout would put back what the
    # packaging forgot (and building in place would write into a tree other runs share).
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".clharness", "*.sqlite*"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                            "--no-index", "-q", "-w", str(dest), str(source)],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    (path,) = dest.glob("clharness-*.whl")
    return path


def test_wheel_holds_every_module_and_data_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = source_package_files()
    assert any(p.startswith("clharness/benchmarks/domains/") for p in expected)  # the one once lost
    missing = sorted(expected - names)
    assert not missing, f"the wheel lacks {missing}: declare them in pyproject.toml / setup.py"
    assert not any(n.startswith("methods/") for n in names), "no top-level `methods` package"


def test_wheel_runs_every_family_off_the_checkout(wheel, tmp_path):
    unpacked, work = tmp_path / "site", tmp_path / "work"
    work.mkdir()
    zipfile.ZipFile(wheel).extractall(unpacked)
    # The unpacked wheel comes first on sys.path and the checkout is absent, so the editable
    # install's finder (which sits after the path finder) never answers; the launcher checks it.
    launcher = (
        "import sys, os, importlib.util\n"
        f"sys.path = [p for p in sys.path if p and os.path.realpath(p) != {str(ROOT)!r}]\n"
        f"sys.path.insert(0, {str(unpacked)!r})\n"
        "import clharness, clharness_methods, clharness_suites\n"
        "for m in (clharness, clharness_methods, clharness_suites):\n"
        f"    assert m.__file__.startswith({str(unpacked)!r}), m.__file__\n"
        "assert importlib.util.find_spec('methods') is None\n"
        "from clharness.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n")

    def clharness(*args):
        return subprocess.run([sys.executable, "-c", launcher, *args], cwd=work,
                              capture_output=True, text=True, timeout=600)

    listed = clharness("list")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    for suite in FAMILY_SUITES:
        assert suite in listed.stdout, f"`clharness list` from the wheel does not name {suite}"
    suites = [a for s in FAMILY_SUITES for a in ("--suite", s)]
    ran = clharness("run", *suites, "--quick", "--method", "finetune", "--seeds", "1",
                    "--results", str(work / "r.sqlite"))
    assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-4000:]
    assert " failed" not in ran.stdout and " passed" in ran.stdout, ran.stdout[-2000:]
    for family_table in ("STF Table 1", "GTEP", "M2I / I2M"):
        assert family_table in ran.stdout, f"no {family_table} report from the wheel's run"
