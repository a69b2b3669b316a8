"""Plugin discovery (entry points, -p modules), registries, `clharness list`, packaging."""
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import clharness as clh
from clharness.registry import Registry, RegistryError

REPO = Path(__file__).resolve().parents[1]

ENTRY_POINT_PLUGIN = '''
import clharness as clh

class Shipped(clh.Method):
    name = "shipped"
    def __init__(self, context, **hp):
        super().__init__(context, **hp)
        self.model = context.make_classifier()   # untrained: predictions by chance
    def learn(self, experience):
        pass

@clh.hookimpl
def clharness_add_methods(registry):
    registry.add(Shipped)
'''


@pytest.fixture
def installed_plugin(tmp_path):
    """A package exposing the `clharness` entry-point group, as `pip install` would leave it."""
    (tmp_path / "shipped_method.py").write_text(ENTRY_POINT_PLUGIN)
    info = tmp_path / "shipped_method-1.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: shipped-method\nVersion: 1.2\n")
    (info / "entry_points.txt").write_text("[clharness]\nshipped = shipped_method\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent.parent), str(tmp_path)])}


def test_entry_point_plugin_is_listed_with_its_source(installed_plugin):
    out = subprocess.run([sys.executable, "-m", "clharness.cli", "list"], env=installed_plugin,
                         capture_output=True, text=True, check=True).stdout
    line = next(line for line in out.splitlines() if line.startswith("shipped "))
    assert "entry point of shipped-method 1.2" in line
    for name in ("finetune", "joint", "er", "ewc", "lwf", "ncm", "quickstart", "split-cifar100", "digits",
                 "tinyimagenet", "resnet32", "timm"):
        assert f"\n{name} " in out, name


def test_entry_point_plugin_runs_under_pytest(installed_plugin, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pytest", "--clh-suite", "quickstart", "--clh-method", "shipped",
                           "--clh-seeds", "1", "-p", "no:cacheprovider", "--clh-quick"],
                          env=installed_plugin, cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "quickstart::ci-5x2" in proc.stdout and "shipped" in proc.stdout


def test_registry_clash_and_unknown_names():
    reg = Registry("method")
    reg.source = "plugin A"
    reg.add("er", object())
    reg.source = "plugin B"
    with pytest.raises(RegistryError, match="method 'er' is registered twice: by plugin A and by plugin B"):
        reg.add("er", object())
    with pytest.raises(RegistryError, match="unknown method 'ewc'; known: er"):
        reg["ewc"]
    with pytest.raises(RegistryError, match="must be a non-empty string without spaces"):
        reg.add("a b", object())


def test_plugin_module_that_cannot_be_imported_is_named():
    with pytest.raises(ImportError, match="clharness plugin module 'no_such_mod' could not be imported"):
        clh.Harness(plugins=("no_such_mod",))


def test_wheel_ships_methods_and_suites_without_a_generic_top_level_name(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path), str(REPO)], check=True, capture_output=True)
    names = zipfile.ZipFile(next(tmp_path.glob("clharness-*.whl"))).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"clharness", "clharness_methods", "clharness_suites"}
    assert "clharness_suites/quickstart.toml" in names and "clharness_methods/er.py" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(next(tmp_path.glob("clharness-*.whl"))).read(entry_points).decode()
    assert "[pytest11]" in text and "[clharness]" in text and "clharness = clharness.cli:main" in text


def test_clharness_run_forwards_results_fresh_and_compare_to_pytest(monkeypatch):
    import pytest as pytest_module

    from clharness.cli import main
    seen = []
    monkeypatch.setattr(pytest_module, "main", lambda args: seen.append(args) or 0)
    assert main(["run", "--results", "r.sqlite", "--fresh", "--compare", "base.json",
                 "--max-drop", "final_acc=0.1", "--", "-x"]) == 0
    args, = seen
    assert args[args.index("--clh-results") + 1] == "r.sqlite" and "--clh-fresh" in args
    assert args[args.index("--clh-compare") + 1] == "base.json"
    assert args[args.index("--clh-max-drop") + 1] == "final_acc=0.1" and args[-1] == "-x"
    assert main(["run"]) == 0 and not {"--clh-results", "--clh-fresh", "--clh-compare"} & set(seen[-1])
