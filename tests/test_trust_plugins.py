"""Issue 27 item 4: a broken installed plugin is skipped with one warning line (distribution, entry
point, exception, fix) and `clharness list` / a pytest session go on without it; a -p/--clh-plugin
name found both installed and in the current directory says which copy it loaded. Also: pytester's
in-process runs keep torch's modules (tests/conftest.py)."""
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import clharness as clh
from clharness import plugins

REPO = Path(__file__).resolve().parents[1]

GOOD = '''
import clharness as clh

class Shipped(clh.Method):
    name = "shipped"
    def __init__(self, context, **hp):
        super().__init__(context, **hp)
        self.model = context.make_classifier()
    def learn(self, experience):
        pass

@clh.hookimpl
def clharness_add_methods(registry):
    registry.add(Shipped)
'''


def _dist(site: Path, dist: str, version: str, entry_points: str) -> None:
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[clharness]\n{entry_points}\n")


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A folder on sys.path holding a stale distribution (its module is gone), one whose module
    raises on import, and a working one."""
    site = tmp_path / "site"
    site.mkdir()
    _dist(site, "stale-plugin", "0.3", "stale = stale_plugin_gone")
    (site / "raising_plugin.py").write_text("raise RuntimeError('boom at import\\nsecond line')\n")
    _dist(site, "raising-plugin", "1.0", "raising = raising_plugin")
    (site / "shipped_ok.py").write_text(GOOD)
    _dist(site, "shipped-ok", "2.0", "shipped = shipped_ok")
    monkeypatch.syspath_prepend(str(site))
    return site


def _env(site: Path) -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}


def test_broken_entry_points_are_skipped_with_one_warning_each(site):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        harness = clh.Harness()
        methods = harness.methods
    lines = [str(w.message) for w in caught if issubclass(w.category, plugins.PluginWarning)]
    assert len(lines) == 2, lines
    stale, = [line for line in lines if "stale-plugin" in line]
    raising, = [line for line in lines if "raising-plugin" in line]
    assert "'stale' (stale_plugin_gone)" in stale and "stale-plugin 0.3" in stale
    assert "ModuleNotFoundError: No module named 'stale_plugin_gone'" in stale
    assert "`pip uninstall stale-plugin`" in stale and "reinstall" in stale
    assert "RuntimeError: boom at import second line" in raising and "\n" not in raising
    # the session goes on: the working entry point and the reference methods are registered
    assert "shipped" in methods and "er" in methods
    assert methods.entry("shipped").source == "entry point of shipped-ok 2.0 (shipped)"


def test_a_hook_that_fails_validation_is_skipped_not_half_registered(site):
    (site / "bad_hook.py").write_text("import clharness as clh\n\n@clh.hookimpl\n"
                                      "def clharness_add_methods(registry, extra):\n    pass\n")
    _dist(site, "bad-hook", "0.1", "bad = bad_hook")
    with pytest.warns(plugins.PluginWarning, match=r"'bad' \(bad_hook\) of the installed distribution bad-hook 0.1"):
        harness = clh.Harness()
    assert not harness.pm.has_plugin("bad") and "er" in harness.methods


def test_clharness_list_prints_one_warning_line_and_lists_the_rest(site):
    proc = subprocess.run([sys.executable, "-m", "clharness.cli", "list"], env=_env(site),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    warned = [line for line in proc.stderr.splitlines() if "skipped the plugin entry point" in line]
    assert len(warned) == 2 and all(line.startswith("clharness list: warning: clharness: skipped") for line in warned)
    assert "Traceback" not in proc.stderr and "boom at import" in proc.stderr
    assert "\nshipped " in proc.stdout and "\ner " in proc.stdout


def test_a_pytest_session_goes_on_and_reports_the_warning(site, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pytest", "--clh-suite", "quickstart", "--clh-method", "shipped",
                           "--collect-only", "-q", "-p", "no:cacheprovider"],
                          env=_env(site), cwd=tmp_path, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "INTERNALERROR" not in out and "quickstart::ci-5x2[shipped-seed0]" in out
    assert "PluginWarning: clharness: skipped the plugin entry point 'stale'" in out
    assert "`pip uninstall stale-plugin`" in out


@pytest.fixture
def two_copies(tmp_path, monkeypatch):
    """`twin_method` installed (on sys.path) and a file of that name in the current directory."""
    installed, here = tmp_path / "installed", tmp_path / "here"
    installed.mkdir()
    here.mkdir()
    (installed / "twin_method.py").write_text("WHERE = 'installed'\n")
    (here / "twin_method.py").write_text("WHERE = 'here'\n")
    monkeypatch.syspath_prepend(str(installed))
    monkeypatch.chdir(here)
    monkeypatch.delitem(sys.modules, "twin_method", raising=False)
    yield installed, here
    sys.modules.pop("twin_method", None)


def test_a_plugin_name_found_installed_and_here_says_which_it_loaded(two_copies):
    installed, here = two_copies
    with pytest.warns(plugins.PluginWarning) as record:
        module = plugins.import_plugin("twin_method")
    assert module.WHERE == "installed"
    message = str(record[0].message)
    assert f"loaded twin_method from {(installed / 'twin_method.py').resolve()}" in message
    assert str((here / "twin_method.py").resolve()) in message and "(not loaded)" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # the file path is unambiguous: no warning
        assert plugins.import_plugin("./twin_method.py").WHERE == "here"


def test_a_plugin_name_found_once_loads_quietly(tmp_path, monkeypatch):
    (tmp_path / "single_method.py").write_text("WHERE = 'only'\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "single_method", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert plugins.import_plugin("single_method").WHERE == "only"
    sys.modules.pop("single_method", None)


def test_pytester_runs_keep_torch_modules_first_imported_in_the_run(pytester):
    """A module first imported inside an in-process pytester run is dropped afterwards, except torch's
    (re-executing a torch module that registers an operator library raises 'Only a single TORCH_LIBRARY')."""
    name = next((n for n in ("torch.utils.show_pickle", "torch.utils.bundled_inputs", "torch.utils.mkldnn")
                 if n not in sys.modules), None)
    if name is None:
        pytest.skip("every candidate torch module is already imported")
    pytester.makepyfile(test_inner=f"def test_imports():\n    import {name}\n")
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
    assert name in sys.modules
