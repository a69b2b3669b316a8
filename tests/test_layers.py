"""The layers of issue 26, read from the source (ast; imports inside functions count too):

    front ends (pytest_plugin and the pytest_* modules it loads, cli, scaffold)
      -> engine/ (cases and sessions)      -> reporting/ (reads records)
      -> toolkit/, data/ (what methods and scenarios are built with)
      -> the contract (method, hookspecs, registry, plugins, kinds, scenario_spec, outcomes, metrics,
         hparams, results)

No import circle anywhere in the package; engine/, toolkit/ and reporting/ never import pytest, a
front end or a benchmark family; reporting never imports the engine; toolkit imports only the
contract (and toolkit itself); nothing outside benchmarks/ imports a family; a family (benchmarks/)
imports only the contract, the toolkit, the data layer and its own package: never the engine or a front
end (what a collecting family needs of the engine comes through the contract: ``kinds.FamilySession``,
the session handed to ``collect`` and to its units), never the reporting layer (its HTML sections draw
with the ``kinds.Drawing`` they are handed; a family's command reads a store by ``results.read_records``),
never another family (the split family's ``build`` is reached by ``kinds.family("split")``).
"""
import ast
from pathlib import Path

import clharness

PKG = Path(clharness.__file__).parent
CONTRACT = {f"clharness.{m}" for m in ("method", "hookspecs", "registry", "plugins", "kinds", "scenario_spec",
                                       "outcomes", "metrics", "hparams", "results")} | {"clharness"}
# the harness's own plugin (built-in datasets, backbones, recipes, suites): above the toolkit and the data
# layer it registers, loaded by name by plugins.Harness, imported by no module
BUILTIN_PLUGIN = "clharness.builtin"
# a family's import of the engine still to be handed through the contract, with why it is left
FAMILY_ENGINE_LEFT: dict[tuple[str, str], str] = {}


def module_names() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        parts = ("clharness", *path.relative_to(PKG).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = module_names()
FRONT_ENDS = {m for m in MODULES if m.startswith("clharness.pytest_")} | {"clharness.cli", "clharness.scaffold"}


def imports(name: str) -> set[str]:
    """Every module ``name`` imports, at any depth (module level and inside functions): clharness
    modules by their full name, others by their top-level package (``pytest``, ``torch``)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1])
                full = f"{base}.{node.module}" if node.module else base
            else:
                full = node.module or ""
            targets = [f"{full}.{a.name}" if f"{full}.{a.name}" in MODULES else full for a in node.names]
        else:
            continue
        for t in targets:
            if t.startswith("clharness"):
                while t not in MODULES and "." in t:   # clharness.engine.runner.Case -> the module
                    t = t.rsplit(".", 1)[0]
                out.add(t)
            else:
                out.add(t.split(".")[0])
    out.discard(name)
    return out


GRAPH = {m: imports(m) for m in MODULES}


def layer(name: str) -> str:
    if name in FRONT_ENDS:
        return "front end"
    if name == BUILTIN_PLUGIN:
        return "built-in plugin"
    for sub in ("engine", "toolkit", "reporting", "benchmarks", "data"):
        if name == f"clharness.{sub}" or name.startswith(f"clharness.{sub}."):
            return sub
    return "contract"


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt in graph and nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def family_package(name: str) -> str:
    """The package of a family module (clharness.benchmarks.gtep.kind -> clharness.benchmarks.gtep)."""
    return ".".join(name.split(".")[:3])


def violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for m, targets in sorted(graph.items()):
        lm = layer(m)
        for t in sorted(targets):
            lt = layer(t) if t.startswith("clharness") else None
            if lm in ("engine", "toolkit", "reporting", "data", "contract") and (
                    t in ("pytest", "_pytest", "xdist") or lt in ("front end", "benchmarks")):
                bad.append(f"{m} ({lm}) imports {t}")
            elif lm == "reporting" and lt == "engine":
                bad.append(f"{m} (reporting) imports the engine: {t}")
            elif lm == "toolkit" and lt not in (None, "contract", "toolkit"):
                bad.append(f"{m} (toolkit) imports {t} ({lt}): the toolkit depends on the contract only")
            elif lm == "contract" and lt in ("engine", "reporting", "toolkit", "built-in plugin"):
                bad.append(f"{m} (contract) imports {t} ({lt})")
            elif lm == "built-in plugin" and lt not in (None, "contract", "toolkit", "data"):
                bad.append(f"{m} (the built-in plugin) imports {t} ({lt}): it registers the toolkit's and the data "
                           "layer's pieces only")
            elif lt == "built-in plugin":
                bad.append(f"{m} imports {t}: the built-in plugin is loaded by name (plugins.BUILTIN), never imported")
            elif lm == "benchmarks" and lt in ("engine", "front end") and (m, t) not in FAMILY_ENGINE_LEFT:
                bad.append(f"{m} (a family) imports {t} ({lt}): families reach the engine through the contract "
                           "(clharness.kinds.FamilySession, the session handed to collect and to its units)")
            elif lm == "benchmarks" and lt == "reporting":
                bad.append(f"{m} (a family) imports {t} (reporting): a family draws with the clharness.kinds.Drawing "
                           "its html_sections are handed, and reads a store by clharness.results.read_records")
            elif lm == "benchmarks" and lt == "benchmarks" and family_package(m) != family_package(t):
                bad.append(f"{m} (a family) imports {t}, another family's module: reach a family through the "
                           "contract (clharness.kinds.family(kind)), or move what two families share to a public module")
    return bad


def test_no_import_circle_anywhere_lazy_imports_included():
    found = cycle(GRAPH)
    assert found is None, f"import circle: {' -> '.join(found)}"


def test_every_module_imports_only_downward():
    assert violations(GRAPH) == []


def test_the_checks_catch_what_they_guard_against():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    planted = {"clharness.engine.runner": {"pytest"},
               "clharness.reporting.scorecard": {"clharness.engine.runner"},
               "clharness.toolkit.buffers": {"clharness.engine.session"},
               "clharness.engine.ray_backend": {"clharness.benchmarks.cldyb.search"},
               "clharness.engine.plan": {"clharness.pytest_plugin"},
               "clharness.benchmarks.gtep.protocol": {"clharness.engine.units", "clharness.scenario_spec"},
               "clharness.benchmarks.cldyb.kind": {"clharness.pytest_collect", "clharness.kinds"}}
    assert violations(planted) == [
        "clharness.benchmarks.cldyb.kind (a family) imports clharness.pytest_collect (front end): families reach "
        "the engine through the contract (clharness.kinds.FamilySession, the session handed to collect and to its "
        "units)",
        "clharness.benchmarks.gtep.protocol (a family) imports clharness.engine.units (engine): families reach "
        "the engine through the contract (clharness.kinds.FamilySession, the session handed to collect and to its "
        "units)",
        "clharness.engine.plan (engine) imports clharness.pytest_plugin",
        "clharness.engine.ray_backend (engine) imports clharness.benchmarks.cldyb.search",
        "clharness.engine.runner (engine) imports pytest",
        "clharness.reporting.scorecard (reporting) imports the engine: clharness.engine.runner",
        "clharness.toolkit.buffers (toolkit) imports clharness.engine.session (engine): the toolkit depends on "
        "the contract only"]
    # the walk sees imports inside functions, not only at module level
    assert "clharness.engine.plan" in GRAPH["clharness.engine.api"]


def test_a_reader_finds_each_concern_by_folder_name():
    for module in ("engine.plan", "engine.session", "engine.runner", "engine.suites", "engine.api",
                   "reporting.scorecard", "reporting.report", "reporting.gates", "toolkit.buffers",
                   "toolkit.training", "toolkit.backbones", "metrics", "results"):
        assert f"clharness.{module}" in MODULES, module
    for gone in ("gtep", "streams", "curriculum_effect", "scenarios", "progress"):
        assert f"clharness.{gone}" not in MODULES, gone


def test_families_import_no_engine_module_but_those_left_with_a_reason():
    found = {(m, t) for m, ts in GRAPH.items() if layer(m) == "benchmarks"
             for t in ts if t.startswith("clharness") and layer(t) in ("engine", "front end")}
    assert found - set(FAMILY_ENGINE_LEFT) == set()
    assert set(FAMILY_ENGINE_LEFT) <= found, "a left import is gone: drop it from FAMILY_ENGINE_LEFT"
    # the two collecting families reach the engine only through the session they are handed
    for family in ("gtep", "cldyb"):
        for m in MODULES:
            if m.startswith(f"clharness.benchmarks.{family}"):
                assert not {t for t in GRAPH[m] if layer(t) in ("engine", "front end")}, m


def test_families_import_only_the_contract_toolkit_data_and_their_own_package():
    """Issue 37: no family imports the reporting layer, the engine, a front end or another family; the
    checker names each kind of arrow (planted) and the tree has none."""
    planted = {"clharness.benchmarks.stf.report": {"clharness.reporting.plots", "clharness.benchmarks.stf.plots",
                                                   "clharness.kinds", "clharness.toolkit.training", "clharness.data"},
               "clharness.benchmarks.m2i.effect": {"clharness.reporting.report", "clharness.results"},
               "clharness.benchmarks.gtep.kind": {"clharness.benchmarks.splits.kind", "clharness.benchmarks.gtep.phases"}}
    assert violations(planted) == [
        "clharness.benchmarks.gtep.kind (a family) imports clharness.benchmarks.splits.kind, another family's "
        "module: reach a family through the contract (clharness.kinds.family(kind)), or move what two families "
        "share to a public module",
        "clharness.benchmarks.m2i.effect (a family) imports clharness.reporting.report (reporting): a family draws "
        "with the clharness.kinds.Drawing its html_sections are handed, and reads a store by "
        "clharness.results.read_records",
        "clharness.benchmarks.stf.report (a family) imports clharness.reporting.plots (reporting): a family draws "
        "with the clharness.kinds.Drawing its html_sections are handed, and reads a store by "
        "clharness.results.read_records"]
    found = {(m, t, layer(t)) for m, ts in GRAPH.items() if layer(m) == "benchmarks"
             for t in ts if t.startswith("clharness") and layer(t) not in ("contract", "toolkit", "data")
             and family_package(t) != family_package(m)}
    assert found == set()


def test_the_report_drawing_is_the_drawing_the_contract_writes_down():
    """Every member of kinds.Drawing (what a family's HTML sections draw with) exists on the report's
    DRAWING, each method with the parameters (and defaults) the contract names, in its order; it draws
    the page's own way (its colours, its PNG embedding)."""
    import inspect

    from clharness.kinds import Drawing
    from clharness.reporting import plots, report_svg
    from clharness.reporting.drawing import DRAWING
    members = {n for n in vars(Drawing) if not n.startswith("_")} | set(Drawing.__annotations__)
    assert {"DPI", "Bar", "method_colors", "to_img", "bar_chart", "mean_band", "spread_labels"} <= members
    for name in sorted(members):
        missing = object()
        assert inspect.getattr_static(DRAWING, name, missing) is not missing, f"DRAWING lacks Drawing.{name}"
        wanted = vars(Drawing).get(name)
        if inspect.isfunction(wanted):
            params = lambda f: [(p.name, p.default) for p in inspect.signature(f).parameters.values()  # noqa: E731
                                if p.name != "self"]
            assert params(getattr(type(DRAWING), name)) == params(wanted), name
    assert DRAWING.DPI == plots.DPI and DRAWING.Bar is report_svg.Bar
    assert DRAWING.hex_color((1.0, 0.5, 0.0, 1.0)) == "#ff8000"
    assert DRAWING.spread_labels([10.0, 11.0], 5, 0) == [8.0, 13.0]


def test_html_sections_without_a_drawing_are_refused_by_name():
    """The HTML format needs the page's Drawing: asked without one, report_sections says so (a family
    would otherwise fail deep in its section on None)."""
    import pytest

    from clharness.kinds import report_sections
    with pytest.raises(TypeError, match=r"needs drawing=.*clharness\.reporting\.drawing\.DRAWING"):
        report_sections([], "html", lambda: None)
    assert report_sections([], "md", lambda: None) == []   # the text formats draw nothing


def test_the_pytest_entry_point_is_thin():
    """The module pytest loads (pyproject's pytest11 entry point) holds pytest's hooks only; the work
    is in the pytest_* modules by job."""
    path = MODULES["clharness.pytest_plugin"]
    tree = ast.parse(path.read_text())
    defined = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    assert defined and all(name.startswith("pytest_") for name in defined), defined
    assert len(path.read_text().splitlines()) < 80
    assert 'clharness = "clharness.pytest_plugin"' in (PKG.parent / "pyproject.toml").read_text()


def test_the_engine_session_is_the_family_session_the_contract_writes_down(tmp_path):
    """Every member of kinds.FamilySession (what a collecting family may use) exists on the engine's
    Session, and every method takes the parameters the contract names, in its order."""
    import inspect

    from clharness.engine.session import Options, Session
    from clharness.kinds import FamilySession
    session = Session(Options(results=str(tmp_path / "r.sqlite")))
    members = {n for n in vars(FamilySession) if not n.startswith("_")} | set(FamilySession.__annotations__)
    assert {"case", "case_unit", "run_stored", "wait_for", "harness", "options"} <= members
    for name in sorted(members):
        missing = object()
        assert inspect.getattr_static(session, name, missing) is not missing, f"Session lacks FamilySession.{name}"
        wanted = vars(FamilySession).get(name)
        if inspect.isfunction(wanted):
            params = lambda f: [p for p in inspect.signature(f).parameters if p != "self"]
            assert params(getattr(Session, name)) == params(wanted), name


def test_the_built_in_plugin_registers_exactly_the_data_layers_sources():
    """The data layer's table (classes) and the built-in plugin's (module paths, registered lazily) name
    the same sources, each the same class: the plugin sits above the data layer, so neither imports
    the other's table."""
    import importlib

    from clharness.builtin import BUILTIN_DATASETS
    from clharness.data import BUILTIN_SOURCES

    resolved = {name: getattr(importlib.import_module(where.partition(":")[0]), where.partition(":")[2])
                for name, where in BUILTIN_DATASETS.items()}
    assert resolved == BUILTIN_SOURCES
