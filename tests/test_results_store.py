"""The results store: durable, resumable, safe to share, and strict about files it cannot use."""
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clharness.results import ResultsStore, RunRecord, StoreError

HERE = Path(__file__).parent

SLOW = """
[suite]
name = "slow"
seeds = 6

[defaults]
dataset = "digits"
backbone = "mlp"
backbone_options = { hidden = 16, layers = 1 }
epochs = 1
tasks = 5

[[scenario]]
name = "ci"
"""


def record(key, status="passed", **kw):
    return RunRecord("s", "sc", "m", 0, status=status, key=key, **kw)


def test_put_get_and_reuse_rules(tmp_path):
    store = ResultsStore(tmp_path / "r.sqlite")
    store.put(record("a", metrics={"final_acc": 0.5}, acc_matrix=[[0.5, float("nan")], [0.4, 0.6]]))
    store.put(record("b", status="failed"))
    store.put(record("a", metrics={"final_acc": 0.7}))          # same key: replaced, not duplicated
    assert len(store) == 2 and store.get("a").metrics["final_acc"] == 0.7
    assert store.reusable("a") is not None and store.reusable("b") is None and store.reusable("zz") is None
    again = ResultsStore(tmp_path / "r.sqlite")
    assert [r.key for r in again.records()] == ["a", "b"]
    assert again._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_not_sqlite_newer_schema_and_truncated_files_are_refused_untouched(tmp_path):
    text = tmp_path / "notes.sqlite"
    text.write_text("these are my notes")
    with pytest.raises(StoreError, match="is not an SQLite file"):
        ResultsStore(text)
    assert text.read_text() == "these are my notes"

    newer = tmp_path / "newer.sqlite"
    db = sqlite3.connect(newer)
    db.execute("CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT)")
    db.execute("CREATE TABLE runs (key TEXT)")
    db.execute("INSERT INTO meta VALUES ('schema_version', '99')")
    db.commit()
    db.close()
    before = newer.read_bytes()
    with pytest.raises(StoreError, match="schema version 99, written by a newer clharness"):
        ResultsStore(newer)
    assert newer.read_bytes() == before

    good = tmp_path / "good.sqlite"
    store = ResultsStore(good)
    for i in range(200):
        store.put(record(f"k{i}", message="x" * 500))
    store.close()
    cut = tmp_path / "cut.sqlite"
    cut.write_bytes(good.read_bytes()[:8192])
    before = cut.read_bytes()
    with pytest.raises(StoreError, match="cut.sqlite"):
        ResultsStore(cut).records()
    assert cut.read_bytes() == before


def test_store_that_refuses_writes_is_reported(tmp_path):
    path = tmp_path / "r.sqlite"
    store = ResultsStore(path)
    store._db.close()
    store._db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)   # as on a read-only disk
    with pytest.raises(StoreError, match="cannot be written: attempt to write a readonly database"):
        store.check_writable()


def test_read_only_location_fails_before_training(pytester, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    store = locked / "r.sqlite"
    ResultsStore(store).close()
    os.chmod(store, 0o444)
    os.chmod(locked, 0o555)
    try:
        if os.access(store, os.W_OK):
            pytest.skip("running as a user that ignores file permissions (root)")
        result = pytester.runpytest("--clh-suite", "quickstart", "--clh-results", str(store))
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines(["*cannot be written*--clh-results elsewhere*"])
    finally:
        os.chmod(locked, 0o755)
        os.chmod(store, 0o644)


def test_a_directory_as_store_path_is_a_clear_error(pytester, tmp_path):
    result = pytester.runpytest("--clh-suite", "quickstart", "--clh-results", str(tmp_path))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*results store {tmp_path}*"])


def _session(tmp_path, store, *extra):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE)])}   # this checkout first
    return subprocess.Popen([sys.executable, "-m", "pytest", "slow.toml", "-p", "plugin_methods", "-p",
                             "no:cacheprovider", "--clh-method", "tiny", "--clh-results", str(store), "-q", *extra],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_kill_dash_nine_then_rerun_reuses_finished_runs(tmp_path):
    (tmp_path / "slow.toml").write_text(SLOW)
    store_path = tmp_path / "runs.sqlite"
    proc = _session(tmp_path, store_path)
    deadline = time.time() + 120
    while time.time() < deadline:   # wait until some, not all, runs are stored
        if store_path.exists() and 2 <= len(ResultsStore(store_path)) < 6:
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = {r.key for r in ResultsStore(store_path).records()}
    assert 2 <= len(done) < 6

    out, _ = _session(tmp_path, store_path).communicate(timeout=300)
    assert f"clharness: 6 runs, {len(done)} reused from {store_path}, {6 - len(done)} run now" in out, out
    records = ResultsStore(store_path).records()
    assert len(records) == 6 and len({r.key for r in records}) == 6
    assert all(r.status == "passed" for r in records)


def test_two_sessions_writing_one_store_lose_and_duplicate_nothing(tmp_path):
    (tmp_path / "slow.toml").write_text(SLOW)
    store_path = tmp_path / "shared.sqlite"
    a = _session(tmp_path, store_path, "-k", "seed0 or seed1 or seed2", "--clh-fresh")
    b = _session(tmp_path, store_path, "-k", "seed3 or seed4 or seed5", "--clh-fresh")
    assert a.wait(timeout=300) == 0 and b.wait(timeout=300) == 0
    records = ResultsStore(store_path).records()
    assert sorted(r.seed for r in records) == [0, 1, 2, 3, 4, 5]


def test_read_records_reads_only_and_says_why_a_path_holds_none(tmp_path, capsys):
    """results.read_records (what a family's command and `clharness report` read stores with) never
    creates a store, and names the path and the reason it holds no records."""
    from clharness.results import NoRecords, read_records
    missing = tmp_path / "none.sqlite"
    with pytest.raises(NoRecords, match=f"results store {missing} does not exist"):
        read_records(missing)
    assert not missing.exists()
    (tmp_path / "empty.sqlite").write_bytes(b"")
    with pytest.raises(NoRecords, match="is empty \\(0 bytes\\)"):
        read_records(tmp_path / "empty.sqlite")
    (tmp_path / "card.json").write_text("{}")
    with pytest.raises(NoRecords, match="is not an SQLite file"):
        read_records(tmp_path / "card.json")
    with pytest.raises(NoRecords, match="is a directory"):
        read_records(tmp_path)
    store = ResultsStore(tmp_path / "r.sqlite")
    store.put(record("k1"))
    store.put(RunRecord("t", "sc", "m", 1, key="k2"))
    store.close()
    assert [r.key for r in read_records(tmp_path / "r.sqlite", ["t"])] == ["k2"]
    assert sorted(r.key for r in read_records(tmp_path / "r.sqlite")) == ["k1", "k2"]
    with pytest.raises(NoRecords, match="holds no runs of suite u; its suites: s, t"):
        read_records(tmp_path / "r.sqlite", ["u"])
