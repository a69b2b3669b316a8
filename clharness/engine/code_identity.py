"""Which code made a record: a digest of the source that trains and evaluates a case, part of its key.

A record is reused only by the code that made it: editing a method (its ``learn``, a loss, a default),
a base class it inherits from, the plugin file or conftest.py that defines it, or the harness code
that trains and evaluates (the runner, the scenario builder of the case's kind, the toolkit, the
data sources, the metrics) changes the digest, so the next run retrains. Reporting, front ends and
the results store are not part of it: a new scorecard column keeps every record.

The digest hashes file contents once per process and method class (the code a process runs is the code
it imported); the git commit of the method's repository, where it has one, is recorded beside it.
"""
from __future__ import annotations

import hashlib
import inspect
import subprocess
from functools import lru_cache
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent          # clharness/
HARNESS = ("engine/runner.py", "engine/scenario.py", "engine/hparam_selection.py", "engine/suites.py",
           "method.py", "metrics.py", "hparams.py", "toolkit", "data")
# a family's presentation modules: figures and summaries, not training or evaluation
PRESENTATION = ("report", "plots", "html", "summary", "effect", "trace", "names")


def _py_files(rel: str) -> list[Path]:
    path = PKG / rel
    return sorted(path.rglob("*.py")) if path.is_dir() else [path]


def _kind_files(kind_module_file: str | None) -> list[Path]:
    if not kind_module_file:
        return []
    folder = Path(kind_module_file).resolve().parent
    return [p for p in sorted(folder.glob("*.py")) if not any(w in p.stem for w in PRESENTATION)]


def method_files(method_cls) -> list[Path]:
    """The source files of ``method_cls`` and every class it inherits from (a plugin file or a
    conftest.py when it is defined there), outside the standard library and torch."""
    out = []
    for cls in method_cls.__mro__:
        module = inspect.getmodule(cls)
        name = getattr(module, "__name__", "")
        if module is None or name.split(".")[0] in ("builtins", "torch", "abc", "typing"):
            continue
        try:
            source = inspect.getsourcefile(cls)
        except (TypeError, OSError):
            continue
        if source and Path(source).exists():
            out.append(Path(source).resolve())
    return list(dict.fromkeys(out))


@lru_cache(maxsize=4096)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _digest(files: list[Path]) -> str:
    h = hashlib.sha256()
    for path in sorted(set(files)):
        st = path.stat()
        name = path.relative_to(PKG).as_posix() if PKG in path.parents else path.name
        h.update(f"{name}\0{_file_digest(str(path), st.st_size, st.st_mtime_ns)}\0".encode())
    return h.hexdigest()[:16]


@lru_cache(maxsize=None)
def code_digest(method_cls, kind_module_file: str | None = None) -> str:
    """The digest of the code a case of ``method_cls`` runs (its classes' files, the harness's training
    and evaluation code, and the scenario kind's builder), taken once per process: the code a process
    runs is what it imported, so a file edited while a session runs neither moves the keys of the
    session's own units (they wait for one another by key) nor is mistaken for the code that ran. The
    next session (or a reloaded module, which is a new class) sees the edit."""
    return current_digest(method_cls, kind_module_file)


def current_digest(method_cls, kind_module_file: str | None = None) -> str:
    """The digest of the files as they are on disk now (``code_digest`` without the per-process memo)."""
    files = method_files(method_cls) + [p for rel in HARNESS for p in _py_files(rel)] + _kind_files(kind_module_file)
    return _digest(files)


@lru_cache(maxsize=256)
def _git_commit(folder: str) -> str:
    try:
        proc = subprocess.run(["git", "-C", folder, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout.strip() if proc.returncode == 0 else ""


def git_commit(method_cls) -> str:
    """The commit of the git repository holding ``method_cls``'s file ("" outside one)."""
    files = method_files(method_cls)
    return _git_commit(str(files[0].parent)) if files else ""
