"""The Python API (docs/api.md): every example on the page runs as written, in an empty folder, and
a case run from Python is reused by the pytest plugin and the reverse (the same keys and store)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import clharness as clh

DOC = Path(__file__).parent.parent / "docs" / "api.md"


def doc_blocks() -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) >= 4, "docs/api.md lost its python examples"
    return blocks


def test_every_example_in_docs_api_runs_as_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for block in doc_blocks():   # in page order, sharing names, as a reader pastes them
        exec(compile(block, str(DOC), "exec"), namespace)
    out = capsys.readouterr().out
    assert "6 records; all passed" in out and "6 of 6 reused" in out
    assert "would pytest pass? True" in out   # the first example ends as a newcomer expects
    assert "records stored" in out and "task 0 classes:" in out


def _pytest(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


QUICK = ("--clh-suite", "quickstart", "--clh-method", "finetune", "--clh-seeds", "1", "--clh-quick",
         "--clh-device", "cpu")


def test_a_case_run_from_python_is_reused_by_pytest(tmp_path):
    store = tmp_path / "r.sqlite"
    records = clh.run("quickstart", methods="finetune", seeds=1, quick=True, results=store, device="cpu")
    assert [r.status for r in records] == ["passed"]
    proc = _pytest(tmp_path, *QUICK, "--clh-results", str(store))
    assert "clharness: 1 runs, 1 reused" in proc.stdout, proc.stdout + proc.stderr


def test_a_case_run_by_pytest_is_reused_from_python(tmp_path):
    store = tmp_path / "r.sqlite"
    proc = _pytest(tmp_path, *QUICK, "--clh-results", str(store))
    assert "clharness: 1 runs, 0 reused" in proc.stdout, proc.stdout + proc.stderr
    again = clh.run("quickstart", methods="finetune", seeds=1, quick=True, results=store, device="cpu")
    assert [u.reused for u in again.units if u.role == "case"] == [True]
    with clh.results.open(store) as s:
        assert [r.key for r in s.records()] == [r.key for r in again]


def test_run_refuses_a_bad_suite_before_training(tmp_path):
    with pytest.raises(Exception, match="quickstrat.*did you mean 'quickstart'"):
        clh.run("quickstrat", results=tmp_path / "r.sqlite")
    with pytest.raises(Exception, match="method 'nosuch' is not registered"):
        clh.run("quickstart", methods="nosuch", results=tmp_path / "r.sqlite")
    assert not (tmp_path / "r.sqlite").exists() or len(clh.results.open(tmp_path / "r.sqlite")) == 0


def test_load_case_builds_what_a_run_builds(tmp_path):
    case = clh.load_case("quickstart", "ci-5x2", "er", seed=1, quick=True)
    records = clh.run("quickstart", methods="er", seeds=2, quick=True, results=tmp_path / "r.sqlite", device="cpu")
    assert case.key == records[1].key                  # the same case, hence the same record key
    assert case.context.seed == 1 and case.context.epochs == 1 and case.model is not None
    with pytest.raises(Exception, match="ci-5x3.*did you mean 'ci-5x2'"):
        clh.load_case("quickstart", "ci-5x3", "er")
