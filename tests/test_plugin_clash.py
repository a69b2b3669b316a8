"""Two plugins registering one name: one clean line naming both and the fix, never a traceback
(pytest: exit 4, a usage error; ``clharness list``: exit 2)."""
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLUGIN = '''
import clharness as clh

class Mine(clh.Method):
    name = "{name}"

@clh.hookimpl
def clharness_add_methods(registry):
    registry.add(Mine)
'''
FIX = "Fix: rename one of them (its registry name), or uninstall one"


def _plugins(path: Path, **modules):
    for module, name in modules.items():
        (path / f"{module}.py").write_text(PLUGIN.format(name=name))
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(path), str(REPO)])}


def _one_clean_line(text: str, *needles: str) -> str:
    lines = [line for line in text.splitlines() if "registered twice" in line]
    assert len(lines) == 1, text[-3000:]
    assert all(n in lines[0] for n in needles), lines[0]
    assert "Traceback" not in text and "INTERNALERROR" not in text, text[-3000:]
    return lines[0]


def test_pytest_exits_4_with_one_line_naming_both_plugins_and_the_fix(tmp_path):
    env = _plugins(tmp_path, plugin_a="er", plugin_b="er")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "plugin_a", "-p", "plugin_b", "--clh-suite",
                           "quickstart", "--clh-quick", "-p", "no:cacheprovider", "--collect-only"],
                          cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    line = _one_clean_line(proc.stdout + proc.stderr, "method 'er' is registered twice", "plugin_a", FIX)
    assert line.startswith("ERROR: ")
    # a suite file named on the command line goes the same way
    (tmp_path / "mini.toml").write_text('[suite]\nname = "mini"\n[[scenario]]\nname = "s"\ndataset = "digits"\n'
                                        'tasks = 5\n')
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "plugin_a", "-p", "plugin_b", "mini.toml",
                           "-p", "no:cacheprovider", "--collect-only"], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    _one_clean_line(proc.stdout + proc.stderr, "registered twice", FIX)


def test_clharness_list_exits_2_with_the_same_line(tmp_path):
    env = _plugins(tmp_path, plugin_a="twin", plugin_b="twin")
    proc = subprocess.run([sys.executable, "-m", "clharness.cli", "list", "-p", "plugin_a", "-p", "plugin_b"],
                          cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    line = _one_clean_line(proc.stderr, "method 'twin' is registered twice: by plugin_a (", "and by plugin_b (",
                           FIX, "pip uninstall", "-p/--clh-plugin")
    assert line.startswith("clharness list: ") and proc.stdout == ""
