"""Run records: one per (suite, scenario, method, seed, hyperparameters), and the SQLite store that
holds them (``clharness.results.open(path)``).
"""
from __future__ import annotations

import builtins
import hashlib
import json
import math
import sqlite3
import time
import warnings
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterable

STATUSES = ("passed", "failed", "diverged", "error", "not-applicable")


@dataclass
class RunRecord:
    suite: str
    scenario: str
    method: str
    seed: int
    setting: str = ""
    hparams: dict[str, Any] = field(default_factory=dict)
    status: str = "error"
    message: str = ""
    failed_task: int | None = None         # task index at which a failure happened
    acc_matrix: list[list[float]] = field(default_factory=list)   # R[i][j], NaN where not reached
    # a class-incremental run's other views from the same predictions (runner.evaluate_views): R scored
    # task-incrementally (logits masked to task j's classes), top-5 R (100+ classes), and per step i the
    # T x T confusion blocks (row j: task j's test samples; column k: predicted as one of task k's classes)
    acc_matrix_task_il: list[list[float]] = field(default_factory=list)
    top5_matrix: list[list[float]] = field(default_factory=list)
    confusion: list[list[list[int]]] = field(default_factory=list)
    task_sizes: list[int] = field(default_factory=list)           # test samples per task
    class_order: list[str] = field(default_factory=list)          # class names in learning order
    metrics: dict[str, float] = field(default_factory=dict)
    train_seconds: float = 0.0
    eval_seconds: float = 0.0
    # compute the run took, machine-independent (engine/flops.py): FLOPs of matmul/conv ops, forward and
    # backward, of everything the method computed (training) and of the predictions scored (evaluation);
    # None: not counted (a record made before they were, or a count that missed work: extra["flops"] says why)
    train_gflops: float | None = None
    eval_gflops: float | None = None
    memory_mb: float = 0.0                  # CLDyB B.4 footprint (see MemoryReport)
    memory: dict[str, int] = field(default_factory=dict)           # its breakdown
    # memory_mb in three parts (MemoryReport.model_mb/buffer_mb/other_mb): parameters, the replay
    # memory's images, every other stored tensor (BatchNorm statistics, Fisher, class means, logits)
    memory_model_mb: float = 0.0
    memory_buffer_mb: float = 0.0
    memory_other_mb: float = 0.0
    parameters: int = 0
    # peaks of the process that ran the case, from the case's start (engine/peak_memory.py): allocated
    # GPU memory (0 on CPU) and resident memory (the whole process: interpreter, torch, loaded data);
    # ensemble members share one process, so each holds the ensemble's peak
    peak_cuda_mb: float = 0.0
    peak_rss_mb: float = 0.0
    device: str = ""
    # torch's CPU threads during the run: float sums are split by thread, so a chaotic method's CPU
    # result can differ between 1 and 2 threads; a count other than 1 is part of the key (engine.keys).
    cpu_threads: int = 0
    dataset: str = ""                       # dataset identity (name and options)
    # the backbone's weights: for a weights file it loaded (a checkpoint, timm's cached file) the tag the file
    # carries, else "untagged", and "sha256:<first 16>" of its content; the full timm tag of pretrained weights
    # loaded otherwise; "<model> (random init)" for an untrained timm model; "" for other backbones
    weights: str = ""
    method_version: str = ""
    versions: dict[str, str] = field(default_factory=dict)
    key: str = ""
    # the key without the code digest (the same case under any code) and the code that made the record:
    # engine.code_identity's digest and the git commit of the method's repository ("" outside one)
    base_key: str = ""
    code_digest: str = ""
    git_commit: str = ""
    session: str = ""                       # the pytest session that ran it (gates wait for these)
    budget: str = ""                        # "quick" (--clh-quick) or "full"; "" in records made before it was kept
    started_at: float = 0.0
    finished_at: float = 0.0
    selection: dict[str, Any] = field(default_factory=dict)   # hyperparameters chosen for it (hparam_selection)
    # A family's per-run data for its report section, small JSON values (STF: the training loss and
    # the information retention along the stream, and the stream's description); NaN stored as null.
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def case_id(self) -> str:
        return f"{self.suite}::{self.scenario}[{self.method}-seed{self.seed}]"

    def to_json(self) -> str:
        # NaN is not JSON: store it as null, read it back as NaN.
        return json.dumps(_nan_to_none(asdict(self)), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "RunRecord":
        data = json.loads(text)
        known = {f.name for f in fields(cls)}
        rec = cls(**{k: v for k, v in data.items() if k in known})
        rec.acc_matrix = [[math.nan if v is None else v for v in row] for row in rec.acc_matrix]
        rec.acc_matrix_task_il = [[math.nan if v is None else v for v in row] for row in rec.acc_matrix_task_il]
        rec.top5_matrix = [[math.nan if v is None else v for v in row] for row in rec.top5_matrix]
        rec.metrics = {k: math.nan if v is None else v for k, v in rec.metrics.items()}
        return rec


def run_key(definition: dict[str, Any]) -> str:
    """Content hash of a run's definition; record keys are made by ``engine.keys.record_key`` (which
    checks the definition's fields against its declared list) and only hashed here."""
    blob = json.dumps(definition, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def _nan_to_none(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _nan_to_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_nan_to_none(v) for v in obj]
    return obj


# --- configurations: the rows of every report ---------------------------------------------

# What a record's key holds except the seed (and the suite/scenario/method that name the case): records
# that agree on all of these are seeds of one configuration; any difference makes another row.
CONFIGURATION_FIELDS = ("budget", "code_digest", "hparams", "method_version", "versions", "weights",
                        "cpu_threads", "device_type", "dataset")


def configuration_fields(record: RunRecord) -> dict[str, Any]:
    """The configuration a record belongs to (``CONFIGURATION_FIELDS``), as plain JSON values."""
    return {"budget": record.budget, "code_digest": record.code_digest, "hparams": dict(record.hparams),
            "method_version": record.method_version, "versions": dict(record.versions),
            "weights": record.weights, "cpu_threads": int(record.cpu_threads or 1),
            "device_type": (record.device or "cpu").split(":")[0], "dataset": record.dataset}


def configuration_id(record: RunRecord) -> str:
    """A short id of the record's configuration (same id = seeds of one row)."""
    blob = json.dumps({"case": [record.suite, record.scenario, record.method], **configuration_fields(record)},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def configuration_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """How configuration ``a`` differs from ``b`` (``configuration_fields``), one phrase per difference:
    "budget: quick vs full", "code digest: 1a2b3c4d vs 5e6f7a8b", "hparams lr: 0.1 vs 0.01"."""
    out = []
    for name in CONFIGURATION_FIELDS:
        va, vb = a.get(name), b.get(name)
        if va == vb:
            continue
        if isinstance(va, dict) or isinstance(vb, dict):
            va, vb = va or {}, vb or {}
            for k in sorted(set(va) | set(vb)):
                if va.get(k) != vb.get(k):
                    out.append(f"{name} {k}: {_shown(va.get(k))} vs {_shown(vb.get(k))}")
        else:
            out.append(f"{name.replace('_', ' ')}: {_shown(va)} vs {_shown(vb)}")
    return out


def _shown(value: Any) -> str:
    return "(none)" if value in (None, "") else str(value)


def configuration_label(record: RunRecord, reference: dict[str, Any] | None = None,
                        current_code: str | None = None) -> str:
    """A short human label of the record's configuration: its budget when quick, its code digest
    (with "(stale)" when ``current_code`` is known and differs) when it differs from ``reference``
    (the case's main row) or is stale, and the hyperparameters that differ from ``reference``."""
    mine = configuration_fields(record)
    parts = ["quick"] if mine["budget"] == "quick" else []
    stale = bool(current_code) and mine["code_digest"] != current_code
    if stale or (reference is not None and reference.get("code_digest") != mine["code_digest"]):
        parts.append(f"code {mine['code_digest'][:6] or '?'}" + (" (stale)" if stale else ""))
    if reference is not None:
        ref_h = reference.get("hparams") or {}
        parts += [f"{k}={mine['hparams'].get(k)}" for k in sorted(set(mine["hparams"]) | set(ref_h))
                  if mine["hparams"].get(k) != ref_h.get(k)]
        for name in ("method_version", "versions", "weights", "cpu_threads", "device_type", "dataset"):
            if reference.get(name) != mine[name]:
                parts.append(name.replace("_", " ") + ("" if isinstance(mine[name], dict) else f" {mine[name]}"))
    return ", ".join(parts) or ("full" if mine["budget"] == "full" else "default")


# --- the results store ---------------------------------------------------------------------

SCHEMA_VERSION = 1
_SQLITE_MAGIC = b"SQLite format 3\x00"
# Statuses whose records are reused on a rerun; failed and error runs are tried again
# (a fixed bug or a dataset that is now in place should not need a flag).
REUSABLE = ("passed", "diverged", "not-applicable")


class StoreError(RuntimeError):
    """A results store that cannot be used as it is; the file is left untouched."""


class UnreadableRecord(UserWarning):
    """A row of the store whose payload is not a run record (skipped; its run is redone if needed)."""


def decode_record(payload: Any) -> RunRecord:
    """A stored payload -> RunRecord, or ValueError saying why it is not one. Payloads are only ever
    parsed as JSON text (UTF-8), never unpickled or evaluated."""
    if isinstance(payload, (bytes, bytearray, memoryview)):
        try:
            payload = bytes(payload).decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"binary data, not UTF-8 text (starts {bytes(payload[:8])!r}; a pickle or "
                             "another program's blob?)") from None
    if not isinstance(payload, str):
        raise ValueError(f"a {type(payload).__name__} value, not record JSON text")
    try:
        data = json.loads(payload)
    except ValueError as exc:
        raise ValueError(f"not JSON (truncated or foreign text: {exc})") from None
    try:
        if not isinstance(data, dict) or not isinstance(data.get("metrics", {}), dict):
            raise TypeError("not a JSON object with the record's fields")
        return RunRecord.from_json(payload)
    except (TypeError, AttributeError, KeyError) as exc:
        raise ValueError(f"JSON, but not a clharness run record ({exc})") from None


class ResultsStore:
    """Run records in SQLite, keyed by the run's content hash.

    WAL mode and one short ``BEGIN IMMEDIATE`` transaction per record, so pytest-xdist workers
    and concurrent sessions can write the same file; a crash (even ``kill -9``) loses at most
    the run in flight. ``close()`` checkpoints the WAL, so the .sqlite file alone holds everything.

    A row whose payload is not a run record (another program's blob, a truncated write) is
    skipped wherever records are read, reported once per key through ``on_unreadable(message)``
    (default: a ``UnreadableRecord`` warning) and listed in ``unreadable``; ``reusable`` treats it
    as absent, so its run is redone and the row replaced.
    """

    def __init__(self, path: str | Path, on_unreadable: Callable[[str], None] | None = None):
        self.path = Path(path)
        self.unreadable: dict[str, str] = {}   # key -> why its payload is not a record
        self._on_unreadable = on_unreadable or (lambda message: warnings.warn(UnreadableRecord(message), stacklevel=3))
        self._check_file()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(self.path, timeout=60, isolation_level=None)
            self._db.execute("PRAGMA busy_timeout = 60000")
            self._check_schema()   # read-only: a file we must not use stays byte-for-byte as it was
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA synchronous = NORMAL")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"results store {self.path}: {exc}. Is it a clharness results file? "
                             "Point --clh-results at another path, or move this file away") from None

    def _check_file(self) -> None:
        if self.path.is_dir():
            raise StoreError(f"results store {self.path} is a directory; give a file path such as "
                             f"{self.path / 'results.sqlite'}")
        if self.path.exists() and self.path.stat().st_size > 0:
            with builtins.open(self.path, "rb") as fh:
                if fh.read(16) != _SQLITE_MAGIC:
                    raise StoreError(f"results store {self.path} is not an SQLite file; "
                                     "give --clh-results a new path (the file was not touched)")

    def _check_schema(self) -> None:
        tables = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if tables and not {"meta", "runs"} <= tables:
            raise StoreError(f"results store {self.path} is an SQLite file of something else (tables: "
                             f"{sorted(tables)}); give --clh-results a new path (the file was not touched)")
        if "meta" in tables:
            row = self._db.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()
            if row is not None and int(row[0]) > SCHEMA_VERSION:
                raise StoreError(f"results store {self.path} has schema version {row[0]}, written by a newer "
                                 f"clharness (this one reads up to {SCHEMA_VERSION}); upgrade clharness")

    def _migrate(self) -> None:
        with self._transaction() as db:
            db.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
            db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            db.execute("""CREATE TABLE IF NOT EXISTS runs (
                key TEXT PRIMARY KEY, suite TEXT, scenario TEXT, method TEXT, seed INTEGER,
                status TEXT, finished_at REAL, record TEXT NOT NULL)""")
            db.execute("CREATE INDEX IF NOT EXISTS runs_by_case ON runs (suite, scenario, method)")
            # runs in progress: who trains which key, so a waiter can tell a dead process from a slow one
            db.execute("""CREATE TABLE IF NOT EXISTS running (key TEXT PRIMARY KEY, host TEXT, pid INTEGER,
                session TEXT, started REAL, record TEXT NOT NULL)""")

    class _Tx:
        def __init__(self, db):
            self.db = db

        def __enter__(self):
            self.db.execute("BEGIN IMMEDIATE")
            return self.db

        def __exit__(self, kind, *_):
            self.db.execute("COMMIT" if kind is None else "ROLLBACK")

    def _transaction(self):
        return self._Tx(self._db)

    def check_writable(self) -> None:
        """Fail now (before any training) when the store cannot take a write: read-only, disk full."""
        try:
            with self._transaction() as db:
                db.execute("INSERT OR REPLACE INTO meta VALUES ('last_session', ?)", (str(time.time()),))
        except sqlite3.Error as exc:
            raise StoreError(f"results store {self.path} cannot be written: {exc}. Free space or "
                             "permissions, or point --clh-results elsewhere") from None

    def mark_running(self, record: RunRecord) -> None:
        """``record`` (its case, not yet run) is being trained by this process on this host."""
        import os
        import socket
        with self._transaction() as db:
            db.execute("INSERT OR REPLACE INTO running VALUES (?, ?, ?, ?, ?, ?)",
                       (record.key, socket.gethostname(), os.getpid(), record.session, time.time(), record.to_json()))

    def dead_run(self, key: str) -> RunRecord | None:
        """A failed record for ``key`` when the process marked as training it on this host is gone
        (a segfault, an out-of-memory kill, kill -9): stored, so every waiter sees it at once."""
        import os
        import socket
        row = self._db.execute("SELECT host, pid, record FROM running WHERE key = ?", (key,)).fetchone()
        if row is None or row[0] != socket.gethostname() or row[1] == os.getpid() or _alive(row[1]):
            return None
        record = RunRecord.from_json(row[2])
        record.status, record.finished_at = "failed", time.time()
        record.message = (f"the process that ran this case (pid {row[1]} on {row[0]}) died before it finished: "
                          "a crash (segfault), an out-of-memory kill or a kill -9; no result")
        self.put(record)
        return record

    def put(self, record: RunRecord) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM running WHERE key = ?", (record.key,))
            db.execute("INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(key) DO UPDATE SET "
                       "suite=excluded.suite, scenario=excluded.scenario, method=excluded.method, "
                       "seed=excluded.seed, status=excluded.status, finished_at=excluded.finished_at, "
                       "record=excluded.record",
                       (record.key, record.suite, record.scenario, record.method, record.seed, record.status,
                        record.finished_at, record.to_json()))

    # Payloads are read as raw bytes (CAST ... AS BLOB): sqlite3 would raise on non-UTF-8 TEXT itself.
    def get(self, key: str) -> RunRecord | None:
        row = self._db.execute("SELECT key, CAST(record AS BLOB) FROM runs WHERE key = ?", (key,)).fetchone()
        return self._decode(*row) if row else None

    def _decode(self, key: str, payload: Any) -> RunRecord | None:
        try:
            return decode_record(payload)
        except ValueError as exc:
            if key not in self.unreadable:
                self.unreadable[key] = str(exc)
                self._on_unreadable(f"results store {self.path}: row {key!r} is unreadable: {exc}. Skipped; "
                                    "a case that needs it runs again")
            return None

    def reusable(self, key: str) -> RunRecord | None:
        record = self.get(key)
        return record if record is not None and record.status in REUSABLE else None

    def stale(self, base_key: str) -> RunRecord | None:
        """The newest reusable record of the same case made by other code (``RunRecord.base_key``):
        what ``--clh-reuse-stale`` reuses, and says so."""
        found = [r for r in self.records() if r.base_key == base_key and r.status in REUSABLE]
        return max(found, key=lambda r: r.finished_at) if found else None

    def records(self, suite: str | None = None, keys: Iterable[str] | None = None) -> list[RunRecord]:
        sql, args = "SELECT key, CAST(record AS BLOB) FROM runs", []
        if suite is not None:
            sql, args = sql + " WHERE suite = ?", [suite]
        rows = self._db.execute(sql + " ORDER BY rowid", args).fetchall()
        out = [r for r in (self._decode(key, payload) for key, payload in rows) if r is not None]
        if keys is not None:
            wanted = set(keys)
            out = [r for r in out if r.key in wanted]
        return out

    def __len__(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM runs").fetchone()[0]

    def delete(self, keys: Iterable[str], batch: int = 200) -> int:
        """Remove the records of ``keys``, ``batch`` keys per short transaction, so a session writing
        to the same store waits at most one batch; returns how many rows went."""
        keys, removed = list(keys), 0
        for start in range(0, len(keys), batch):
            chunk = keys[start:start + batch]
            with self._transaction() as db:
                removed += db.execute(f"DELETE FROM runs WHERE key IN ({','.join('?' * len(chunk))})",
                                      chunk).rowcount
        return removed

    def vacuum(self) -> None:
        """Give the space of removed rows back to the file system (VACUUM waits for writers' locks)."""
        self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        self._db.execute("VACUUM")

    def integrity(self) -> str:
        """SQLite's ``PRAGMA integrity_check``: "ok" for a sound file."""
        return "; ".join(row[0] for row in self._db.execute("PRAGMA integrity_check"))

    def close(self) -> None:
        """Checkpoint the WAL into the main file, then close: copying or uploading the .sqlite file
        alone then loses nothing. Where another connection (an xdist worker) still reads, the
        checkpoint stops short and the last connection to close completes it."""
        self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        self._db.close()

    def __enter__(self) -> "ResultsStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def frame(self, suite: str | None = None):
        """The stored records as a pandas DataFrame (``records_frame``)."""
        return records_frame(self.records(suite))


def _alive(pid: int) -> bool:
    import os
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # someone else's process: alive
        return True
    try:   # a zombie (exited, not yet reaped by its parent) is dead for our purpose
        with builtins.open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def open(path: str | Path) -> ResultsStore:   # noqa: A001  (clharness.results.open, like io.open)
    """The results store at ``path`` (made if absent): ``with clharness.results.open(p) as store: ...``."""
    return ResultsStore(path)


class NoRecords(ValueError):
    """A path that holds no run records to read: missing, a folder, empty, not SQLite, unreadable, or
    without runs (of the suites asked for); the message names the path and why."""


def read_records(path: str | Path, suites: Iterable[str] = ()) -> list[RunRecord]:
    """Every record of the store at ``path`` (of ``suites`` when given), reading only: the file is checked
    first, because ResultsStore would create a missing or empty one. Raises NoRecords, or StoreError for
    another SQLite file or a newer schema; a row that is not a record is skipped and named once on
    stderr (stdout stays the caller's). ``clharness report`` and the families' commands read stores so."""
    import sys
    path, suites = Path(path), list(suites)
    if not path.exists():
        raise NoRecords(f"results store {path} does not exist")
    if path.is_dir():
        raise NoRecords(f"results store {path} is a directory; give the .sqlite file")
    if path.stat().st_size == 0:
        raise NoRecords(f"results store {path} is empty (0 bytes): no runs to report")
    with builtins.open(path, "rb") as fh:
        if fh.read(16) != _SQLITE_MAGIC:
            raise NoRecords(f"results store {path} is not an SQLite file (is it a scorecard .md/.json/.csv?)")
    store = ResultsStore(path, on_unreadable=lambda message: print(f"clharness: {message}", file=sys.stderr))
    try:
        records = store.records()
    except sqlite3.DatabaseError as exc:   # a damaged file can open and still fail to read
        raise NoRecords(f"results store {path} cannot be read: {exc}") from None
    finally:
        store.close()
    if not records:
        raise NoRecords(f"results store {path} holds no runs")
    if suites:
        present = sorted({r.suite for r in records})
        records = [r for r in records if r.suite in suites]
        if not records:
            raise NoRecords(f"results store {path} holds no runs of suite {', '.join(suites)}; "
                            f"its suites: {', '.join(present)}")
    return records


def records_frame(records: Iterable[RunRecord]):
    """One row per record: its case, status, key, seconds and every metric (columns ``metric.<name>``
    are plain metric names here), as a pandas DataFrame."""
    import pandas as pd
    rows = []
    for r in records:
        rows.append({"suite": r.suite, "scenario": r.scenario, "method": r.method, "seed": r.seed,
                     "status": r.status, "key": r.key, "train_seconds": r.train_seconds,
                     "eval_seconds": r.eval_seconds, "memory_mb": r.memory_mb, **r.metrics})
    return pd.DataFrame(rows)
