"""Issue 13's layout, checked from the source (ast): the core imports no benchmark family at any
depth (module level or inside functions), the families import each other only without cycles, no
module-level import cycle exists anywhere in the package, and the five built-in families come
through the ``clharness_add_kinds`` hook with their sources."""
import ast
from pathlib import Path

import clharness
from clharness.plugins import Harness

PKG = Path(clharness.__file__).parent
# the families, and the old paths of their modules (deprecated re-exports, or gone)
OLD = ("streams", "gtep", "curriculum_effect", "stream_plots", "cldyb", "scenarios")
FAMILY = ("clharness.benchmarks", *(f"clharness.{name}" for name in OLD))


def module_names() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        parts = ("clharness", *path.relative_to(PKG).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = module_names()


def imports(name: str) -> list[tuple[str, bool]]:
    """(imported clharness module, imported at module level?) for every import in module ``name``."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1])
                full = f"{base}.{node.module}" if node.module else base
            else:
                full = node.module or ""
            targets = [full] + [f"{full}.{a.name}" for a in node.names]
        else:
            continue
        out += [(t, id(node) in top) for t in targets if t in MODULES]
    return out


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_core_imports_no_benchmark_family():
    core = [m for m in MODULES if not m.startswith("clharness.benchmarks")]
    assert len(core) > 30
    bad = {m: sorted({t for t, _ in imports(m) if t.startswith(FAMILY)}) for m in core}
    assert not {m: t for m, t in bad.items() if t}


def test_no_import_cycles():
    top = {m: {t for t, at_top in imports(m) if at_top and t != m} for m in MODULES}
    assert _cycle(top) is None, f"module-level import cycle: {' -> '.join(_cycle(top))}"
    families = {m: {t for t, _ in imports(m) if t.startswith("clharness.benchmarks.") and t != m}
                for m in MODULES if m.startswith("clharness.benchmarks.")}
    assert _cycle(families) is None, f"families import each other in a cycle: {' -> '.join(_cycle(families))}"


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}}) is None


def test_every_family_lives_in_its_own_folder():
    for family in ("splits", "stf", "m2i", "gtep", "cldyb"):
        assert f"clharness.benchmarks.{family}.kind" in MODULES
    for gone in ("scenarios", "cldyb", "stream_plots"):
        assert f"clharness.{gone}" not in MODULES


def test_builtin_kinds_register_through_the_hook():
    harness = Harness(entry_points=False)
    entries = {e.name: e for e in harness.kinds.entries()}
    assert set(entries) == {"split", "stf", "curriculum", "gtep", "cldyb"}
    assert all(e.source.startswith("clharness.benchmarks") for e in entries.values())
    assert entries["gtep"].obj.load().__name__ == "clharness.benchmarks.gtep.kind"
    impls = [i.plugin_name for i in harness.pm.hook.clharness_add_kinds.get_hookimpls()]
    assert any(name.startswith("clharness.benchmarks") for name in impls)
