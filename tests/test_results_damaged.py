"""A results store with foreign or damaged rows: every reader skips them (named once, by key), a case
that needs one reruns and replaces it, payloads are only ever parsed as JSON; and after a session the
.sqlite file alone (no -wal) holds every record."""
import os
import pickle
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

# pytester's in-process runs drop modules first imported during a run; importing the harness (and
# torch) here keeps them loaded, as in test_pytest_plugin.py.
import clharness.engine.runner  # noqa: F401
import clharness.reporting.scorecard  # noqa: F401
import clharness_methods  # noqa: F401
from clharness.results import ResultsStore, RunRecord, UnreadableRecord

HERE = Path(__file__).parent
MINI = """
[suite]
name = "mini"
seeds = 2

[defaults]
dataset = "digits"
backbone = "mlp"
backbone_options = { hidden = 16, layers = 1 }
epochs = 1
tasks = 5

[[scenario]]
name = "ci"
"""


class Trap:
    """Unpickling this touches a file: proof that a reader unpickled a payload."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return Path.touch, (self.path,)


def damage(path: Path, tmp_path: Path, key: str | None = None) -> dict[str, bytes | str]:
    """Overwrite ``key``'s payload with a pickle (when given) and add three foreign rows."""
    db = sqlite3.connect(path)
    bad = {"blob-row": pickle.dumps(Trap(tmp_path / "unpickled")),
           "cut-row": '{"suite": "mini", "scenario": "ci", "method": "ti',
           "list-row": "[1, 2, 3]"}
    for k, payload in bad.items():
        db.execute("INSERT INTO runs VALUES (?, 'mini', 'ci', 'tiny', 9, 'passed', 0, ?)", (k, payload))
    db.execute("INSERT INTO runs VALUES ('latin1-row', 'mini', 'ci', 'tiny', 9, 'passed', 0, CAST(X'7B22E9' AS TEXT))")
    if key is not None:
        db.execute("UPDATE runs SET record = ? WHERE key = ?", (bad["blob-row"], key))
    db.commit()
    db.close()
    return bad


def test_store_skips_each_unreadable_row_once_and_a_put_replaces_it(tmp_path):
    path = tmp_path / "r.sqlite"
    store = ResultsStore(path)
    for key in ("a", "b"):
        store.put(RunRecord("mini", "ci", "tiny", 0, status="passed", key=key, metrics={"final_acc": 0.5}))
    store.close()
    damage(path, tmp_path, key="b")

    messages = []
    store = ResultsStore(path, on_unreadable=messages.append)
    assert [r.key for r in store.records()] == ["a"]
    assert [r.key for r in store.records("mini")] == ["a"] and store.get("b") is None and store.reusable("b") is None
    assert sorted(store.unreadable) == ["b", "blob-row", "cut-row", "latin1-row", "list-row"]
    assert len(messages) == 5 and all("is unreadable: " in m and "Skipped; " in m for m in messages)
    assert any("row 'b' is unreadable: binary data, not UTF-8 text" in m for m in messages)
    assert any("row 'cut-row' is unreadable: not JSON (truncated or foreign text" in m for m in messages)
    assert any("row 'list-row' is unreadable: JSON, but not a clharness run record" in m for m in messages)
    assert not (tmp_path / "unpickled").exists()   # parsed as JSON only, never unpickled

    store.put(RunRecord("mini", "ci", "tiny", 1, status="passed", key="b"))   # the rerun replaces the row
    assert store.get("b").seed == 1 and [r.key for r in store.records()] == ["a", "b"]

    with pytest.warns(UnreadableRecord) as caught:   # the default: one warning per row
        ResultsStore(path).records()
    assert sorted(str(w.message).split("row ")[1].split(" ")[0] for w in caught) == \
        ["'blob-row'", "'cut-row'", "'latin1-row'", "'list-row'"]


@pytest.fixture
def session(pytester):
    pytester.syspathinsert(HERE)
    pytester.makefile(".toml", mini=MINI)
    return lambda *args: pytester.runpytest("-p", "plugin_methods", "-p", "no:cacheprovider", "mini.toml",
                                            "--clh-method", "tiny", "--clh-results", "r.sqlite", *args)


def test_session_reruns_a_damaged_case_keeps_the_others_and_report_and_compare_skip_it(session, pytester, tmp_path):
    session().assert_outcomes(passed=2)
    path = pytester.path / "r.sqlite"
    records = ResultsStore(path).records()
    damage(path, tmp_path, key=records[1].key)

    result = session("-W", "always")
    result.assert_outcomes(passed=2)
    out = result.stdout.str()
    assert "clharness: 2 runs, 1 reused from r.sqlite, 1 run now" in out
    assert f"row {records[1].key!r} is unreadable: binary data" in out and "Traceback" not in out
    again = ResultsStore(path, on_unreadable=lambda message: None)
    assert [r.key for r in again.records()] == [r.key for r in records]   # the damaged row was replaced
    assert sorted(again.unreadable) == ["blob-row", "cut-row", "latin1-row", "list-row"]
    again.close()

    for command in (["report", str(path)], ["compare", str(path), str(path)]):
        proc = subprocess.run([sys.executable, "-m", "clharness.cli", *command], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr and "| mini" in proc.stdout and "tiny" in proc.stdout
        for key in ("blob-row", "cut-row", "latin1-row", "list-row"):
            assert proc.stderr.count(f"row {key!r} is unreadable") == (1 if command[0] == "report" else 2)
    assert not (tmp_path / "unpickled").exists()


def test_after_a_session_the_sqlite_file_alone_holds_every_record(tmp_path):
    (tmp_path / "mini.toml").write_text(MINI)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE)])}   # this checkout first
    proc = subprocess.run([sys.executable, "-m", "pytest", "mini.toml", "-p", "plugin_methods", "-p", "no:cacheprovider",
                           "--clh-method", "tiny", "--clh-results", "r.sqlite", "-q"], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:]
    copy = tmp_path / "copied.sqlite"
    shutil.copyfile(tmp_path / "r.sqlite", copy)   # the main file only, as a user would upload it
    db = sqlite3.connect(copy)
    assert db.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 2
    assert {s for (s,) in db.execute("SELECT status FROM runs")} == {"passed"}
