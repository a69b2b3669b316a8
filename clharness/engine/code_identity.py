"""Which code made a record: a digest of the source that trains and evaluates a case, part of its key.

A record is reused only by the code that made it: editing a method (its ``learn``, a loss, a default),
a base class it inherits from, the plugin file or conftest.py that defines it, any module of the
plugin's own folder or package that those import (transitively: ``from helper import lr``), or the
harness code that trains and evaluates (the runner, the scenario builder of the case's kind, the
toolkit, the data sources, the metrics) changes the digest, so the next run retrains. Installed
distributions a method imports (anything outside its own folder or package and the standard library)
enter by name and version. Reporting, front ends and the results store are not part of it: a new
scorecard column keeps every record.

A file enters by its normalised syntax tree (``ast.dump`` without line numbers, docstrings dropped):
comments, docstrings and formatting never retrain; any change of the code does.

The digest is taken once per process and method class (the code a process runs is the code it
imported); the git commit of the method's repository, where it has one, is recorded beside it.
"""
from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent          # clharness/
# engine/flops.py counts a record's train_gflops/eval_gflops (numbers of the record, gateable): in every digest
HARNESS = ("engine/runner.py", "engine/scenario.py", "engine/hparam_selection.py", "engine/suites.py",
           "engine/keys.py", "engine/flops.py", "method.py", "metrics.py", "hparams.py", "toolkit", "data")
# a family's presentation modules: figures and summaries, not training or evaluation
PRESENTATION = ("report", "plots", "html", "summary", "effect", "trace", "names")
# top-level names never followed nor versioned: the interpreter's own (python's version is in every key)
_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ())) | {"__future__", "builtins"}


def _py_files(rel: str) -> list[Path]:
    path = PKG / rel
    return sorted(path.rglob("*.py")) if path.is_dir() else [path]


def _kind_files(kind_module_file: str | None) -> list[Path]:
    if not kind_module_file:
        return []
    folder = Path(kind_module_file).resolve().parent
    return [p for p in sorted(folder.glob("*.py")) if not any(w in p.stem for w in PRESENTATION)]


def _class_files(method_cls) -> list[tuple[Path, str]]:
    """(file, module name) of ``method_cls`` and of every class it inherits from, outside the
    standard library and torch."""
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
            out.append((Path(source).resolve(), name))
    return list(dict.fromkeys(out))


def _own_root(path: Path, module: str) -> Path:
    """The folder a plugin module's own imports may come from: its package's top folder
    (``pkg.sub.mod`` -> the folder of ``pkg``), else its own folder. A module installed at the top of
    site-packages has no folder of its own (what it imports enters by distribution)."""
    depth = module.count(".") if module and module != "__main__" else 0
    root = path.parent
    for _ in range(depth - (path.name != "__init__.py")):
        root = root.parent
    return path if root.name in ("site-packages", "dist-packages") else root


def _imported_names(tree: ast.AST, module: str, is_package: bool) -> list[str]:
    """Every module name an import statement of ``tree`` (at any depth) may bind, relative ones made
    absolute against ``module``; for ``from m import a`` both ``m`` and ``m.a`` (a may be a submodule)."""
    package = module if is_package else module.rpartition(".")[0]
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".") if package else []
                if node.level - 1 > len(parts):
                    continue
                base = ".".join(parts[:len(parts) - node.level + 1])
                full = ".".join(p for p in (base, node.module) if p)
            else:
                full = node.module or ""
            if full:
                names.append(full)
                names += [f"{full}.{a.name}" for a in node.names if a.name != "*"]
    return names


@lru_cache(maxsize=4096)
def _imports(path: str, size: int, mtime_ns: int, module: str) -> tuple[str, ...]:
    """``_imported_names`` of a file, once per path, size, modification time and module name."""
    tree = _tree(path, size, mtime_ns)
    return tuple(_imported_names(tree, module, Path(path).name == "__init__.py")) if tree is not None else ()


def _locate(name: str) -> Path | None:
    """The source file of module ``name``: the imported module's, else where the import system
    would find it (None: not a module, a built-in, or not findable)."""
    module = sys.modules.get(name)
    origin = getattr(module, "__file__", None) if module is not None else None
    if origin is None:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError, AttributeError):   # a parent that is not a package, a bad name
            spec = None
        origin = spec.origin if spec is not None and spec.has_location else None
    if not origin or not origin.endswith(".py"):
        return None
    path = Path(origin).resolve()
    return path if path.is_file() else None


def _own(path: Path | None, root: Path) -> bool:
    """Whether ``path`` is a module of the plugin's own folder or package (the harness's own files are
    in the digest already, by HARNESS)."""
    return path is not None and root in path.parents and PKG not in path.parents


@lru_cache(maxsize=None)
def _distributions() -> dict[str, list[str]]:
    from importlib.metadata import packages_distributions
    return packages_distributions()


@lru_cache(maxsize=None)
def _distribution(top: str) -> str | None:
    """``name==version`` of the installed distribution providing top-level module ``top``."""
    from importlib.metadata import PackageNotFoundError, version
    for dist in _distributions().get(top, ()):
        try:
            return f"{dist}=={version(dist)}"
        except PackageNotFoundError:
            continue
    return None


def import_closure(method_cls) -> tuple[list[Path], list[str]]:
    """The files of ``method_cls``'s classes and every module they import, transitively, that lives in
    the plugin's own folder or package; and the installed distributions (``name==version``) they import
    from outside it (the standard library left out)."""
    files: dict[Path, None] = {}
    dists: set[str] = set()
    todo = [(path, module, _own_root(path, module)) for path, module in _class_files(method_cls)]
    while todo:
        path, module, root = todo.pop()
        if path in files:
            continue
        files[path] = None
        for name in _imports(str(path), *_stat(path), module):
            top = name.split(".")[0]
            if top in _STDLIB:
                continue
            if _own(_locate(top), root):   # only then look deeper: finding a submodule imports its parents
                found = _locate(name)
                if _own(found, root):
                    todo.append((found, name, root))
            else:
                dist = _distribution(top)
                if dist:
                    dists.add(dist)
    return list(files), sorted(dists)


def method_files(method_cls) -> list[Path]:
    """The source files whose code ``method_cls`` runs: its classes' files (a plugin file or a
    conftest.py when it is defined there) and the modules of its own folder or package they import."""
    return import_closure(method_cls)[0]


def _stat(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


@lru_cache(maxsize=4096)
def _tree(path: str, size: int, mtime_ns: int) -> ast.Module | None:
    """The file's syntax tree without docstrings; None for a file that does not parse (hashed as bytes)."""
    try:
        tree = ast.parse(Path(path).read_bytes())
    except (SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                node.body = node.body[1:] or [ast.Pass()]
    return tree


@lru_cache(maxsize=4096)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    """The digest of a source file's code: its normalised syntax tree (no line numbers, comments or
    docstrings), so formatting and prose never change it; cached by path, size and mtime."""
    tree = _tree(path, size, mtime_ns)
    data = ast.dump(tree).encode() if tree is not None else Path(path).read_bytes()
    return hashlib.sha256(data).hexdigest()


def _digest(files: list[Path], dists: list[str] = ()) -> str:
    h = hashlib.sha256()
    for path in sorted(set(files)):
        name = path.relative_to(PKG).as_posix() if PKG in path.parents else path.name
        h.update(f"{name}\0{_file_digest(str(path), *_stat(path))}\0".encode())
    for dist in sorted(dists):
        h.update(f"dist\0{dist}\0".encode())
    return h.hexdigest()[:16]


@lru_cache(maxsize=None)
def code_digest(method_cls, kind_module_file: str | None = None) -> str:
    """The digest of the code a case of ``method_cls`` runs (its classes' files and their own imports,
    the distributions they import, the harness's training and evaluation code, and the scenario kind's
    builder), taken once per process: the code a process runs is what it imported, so a file edited
    while a session runs neither moves the keys of the session's own units (they wait for one another
    by key) nor is mistaken for the code that ran. The next session (or a reloaded module, which is a
    new class) sees the edit."""
    return current_digest(method_cls, kind_module_file)


def current_digest(method_cls, kind_module_file: str | None = None) -> str:
    """The digest of the files as they are on disk now (``code_digest`` without the per-process memo)."""
    own, dists = import_closure(method_cls)
    files = own + [p for rel in HARNESS for p in _py_files(rel)] + _kind_files(kind_module_file)
    return _digest(files, dists)


@lru_cache(maxsize=256)
def _git_commit(folder: str) -> str:
    try:
        proc = subprocess.run(["git", "-C", folder, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout.strip() if proc.returncode == 0 else ""


def git_commit(method_cls) -> str:
    """The commit of the git repository holding ``method_cls``'s file ("" outside one)."""
    files = [path for path, _ in _class_files(method_cls)]
    return _git_commit(str(files[0].parent)) if files else ""
