"""README's "Write a method" section, run as a new user runs it: my_method.py copied verbatim from
README.md into an empty folder, the commands README shows typed into the installed `pytest` and
`clharness` console scripts there, no PYTHONPATH. A README edit that breaks them fails here."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).parent.parent / "README.md"
BIN = Path(sys.executable).parent   # the environment's console scripts, next to its python


def readme_method_file() -> str:
    match = re.search(r"```python\n(# my_method\.py\n.*?)```", README.read_text(), re.S)
    assert match, "README.md lost its ```python block starting with '# my_method.py'"
    return match.group(1)


def readme_run_commands() -> list[str]:
    """The commands after 'Run it' in README: `pytest ...` and `clharness run ...`."""
    text = README.read_text()
    start = text.index("Run it")
    commands = re.findall(r"`((?:pytest|clharness run) [^`]*)`", text[start:start + 800])
    assert commands, "README.md's 'Run it' sentence shows no `pytest ...` or `clharness run ...` command"
    return commands


@pytest.fixture
def user_dir(tmp_path):
    (tmp_path / "my_method.py").write_text(readme_method_file())
    return tmp_path


def user_run(command: str, cwd: Path) -> subprocess.CompletedProcess:
    argv = command.split()
    script = BIN / argv[0]
    assert script.exists(), f"console script {script} is not installed (pip install -e .)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}   # a user's shell sets none
    return subprocess.run([str(script), *argv[1:]], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_readme_run_commands_work_as_written_in_an_empty_folder(user_dir):
    pytest_cmd, = [c for c in readme_run_commands() if c.startswith("pytest ")]
    first = user_run(pytest_cmd, user_dir)
    assert first.returncode == 0, first.stdout + first.stderr
    assert re.search(r"quickstart::ci-5x2 \| mine +\| 3 ", first.stdout), first.stdout   # three seeds trained
    assert "clharness: 3 runs, 0 reused" in first.stdout

    clh_cmd, = [c for c in readme_run_commands() if c.startswith("clharness run ")]
    second = user_run(clh_cmd, user_dir)   # the same cases, through the other front end: all stored
    assert second.returncode == 0, second.stdout + second.stderr
    assert "clharness: 3 runs, 3 reused" in second.stdout, second.stdout


@pytest.mark.parametrize("plugin", ["my_method", "./my_method.py"])
def test_clharness_list_finds_a_method_module_or_file_in_the_current_folder(user_dir, plugin):
    proc = user_run(f"clharness list -p {plugin}", user_dir)
    assert proc.returncode == 0, proc.stderr
    line, = [ln for ln in proc.stdout.splitlines() if ln.startswith("mine ")]
    assert "lr=0.05" in line and "my_method (" in line
    assert str(user_dir / "my_method.py") in "".join(proc.stdout.split())   # the source column wraps


def test_a_plugin_that_is_nowhere_names_the_forms_it_accepts(tmp_path):
    proc = user_run("clharness list -p not_here", tmp_path)
    assert proc.returncode != 0
    assert "clharness plugin module 'not_here' could not be imported" in proc.stderr
    assert "a module in the current directory or a path to a .py file" in proc.stderr
    proc = user_run("clharness list -p sub/missing.py", tmp_path)
    assert "clharness plugin file 'sub/missing.py' does not exist" in proc.stderr


def test_readme_documents_every_clh_option_of_the_plugin():
    """Every --clh-* option the pytest plugin adds is documented in README (a table row or a `--clh-...` in
    the text, as --clh-ray's section has them)."""
    from clharness.engine.options import OPTIONS, PYTEST
    options = [f"--clh-{o.name}" for o in OPTIONS if PYTEST in o.where]
    text = README.read_text()
    assert options and [o for o in options if f"`{o}" not in text] == []
