"""`clharness init NAME`: the generated package's own tests run green, a failed gate fails them,
its workflow reads as GitHub Actions YAML and uploads the scorecard and the report."""
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from clharness.cli import main
from clharness.scaffold import METHOD_TEMPLATE, render_method

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"


def test_method_template_is_readmes_example_verbatim():
    match = re.search(r"```python\n(# my_method\.py\n.*?)```", README.read_text(), re.S)
    assert match, "README.md lost its ```python block starting with '# my_method.py'"
    assert METHOD_TEMPLATE == match.group(1)


def test_rendered_method_renames_file_class_and_registry_key():
    text = render_method("slow_drift")
    assert text.startswith("# slow_drift/method.py\n")
    assert "class SlowDrift(clh.Method):" in text and 'name = "slow_drift"' in text
    assert "registry.add(SlowDrift)" in text and "Mine" not in text and '"mine"' not in text


@pytest.mark.parametrize("name", ["my-method", "2fast", "class", "os"])
def test_bad_names_are_refused_with_the_reason(tmp_path, capsys, name):
    assert main(["init", name, "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert repr(name) in err and ("identifier" in err or "already importable" in err)
    assert list(tmp_path.iterdir()) == []


def test_an_existing_folder_is_not_overwritten(tmp_path, capsys):
    (tmp_path / "mine2").mkdir()
    (tmp_path / "mine2" / "keep.txt").write_text("x")
    assert main(["init", "mine2", "--dir", str(tmp_path)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "mine2").iterdir()] == ["keep.txt"]


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    parent = tmp_path_factory.mktemp("init")
    assert main(["init", "drift_ok", "--dir", str(parent)]) == 0
    return parent / "drift_ok"


def test_pyproject_declares_the_entry_point_and_ships_the_suite(package):
    meta = tomllib.loads((package / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"]["clharness"] == {"drift_ok": "drift_ok.plugin"}
    assert "suites/*.toml" in meta["tool"]["setuptools"]["package-data"]["drift_ok"]
    suite = tomllib.loads((package / "drift_ok/suites/drift_ok.toml").read_text())
    assert suite["suite"]["methods"] == ["drift_ok", "finetune", "er"]
    assert any("beats finetune" in g for g in suite["gates"]) and any("of er" in g for g in suite["gates"])


def test_workflow_installs_runs_pytest_and_uploads_scorecard_and_report(package):
    flow = yaml.safe_load((package / ".github/workflows/clharness.yml").read_text())
    assert set(flow[True]) == {"push", "pull_request"}   # YAML 1.1 reads the key `on` as True
    steps = flow["jobs"]["benchmark"]["steps"]
    runs = [s.get("run", "") for s in steps]
    assert any("pip install -e" in r for r in runs)
    pytest_step = next(i for i, r in enumerate(runs) if "python -m pytest" in r)
    assert "if" not in steps[pytest_step]   # a failing gate fails the job here
    uploads = {s["with"]["name"]: s["with"]["path"] for s in steps if s.get("uses", "").startswith("actions/upload-artifact")}
    assert uploads == {"clharness-scorecard": "clharness-artifacts/scorecard.json",
                       "clharness-report": "clharness-artifacts/report.html"}
    assert all(s.get("if") == "always()" for s in steps[pytest_step + 1:])   # artifacts even when a gate fails


def test_clharness_requirement_reaches_pyproject_and_ci(tmp_path, capsys):
    spec = "clharness @ git+https://example.org/lab/clharness@0123abc"
    assert main(["init", "pinned", "--dir", str(tmp_path), "--clharness", spec]) == 0
    meta = tomllib.loads((tmp_path / "pinned/pyproject.toml").read_text())
    assert meta["project"]["dependencies"] == [spec]
    flow = yaml.safe_load((tmp_path / "pinned/.github/workflows/clharness.yml").read_text())
    install = next(s["run"] for s in flow["jobs"]["benchmark"]["steps"] if s.get("name") == "Install")
    assert f'python -m pip install "{spec}"' in install   # before the package itself


@pytest.mark.parametrize("spec, why", [("numpy>=1", "must install the clharness"), ("clharness >>> 1", "not a pip requirement")])
def test_a_bad_clharness_requirement_is_refused(tmp_path, capsys, spec, why):
    assert main(["init", "pinned", "--dir", str(tmp_path), "--clharness", spec]) == 2
    assert why in capsys.readouterr().err and list(tmp_path.iterdir()) == []


def _run_generated_tests(package, artifacts):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(package), str(REPO)]), CLH_ARTIFACTS=str(artifacts))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=package, env=env,
                          capture_output=True, text=True, timeout=900)


def test_generated_tests_pass_then_fail_on_a_broken_gate_and_the_report_step_works(package, tmp_path):
    artifacts = tmp_path / "clharness-artifacts"
    green = _run_generated_tests(package, artifacts)
    assert green.returncode == 0, green.stdout + green.stderr
    assert (artifacts / "scorecard.json").is_file()

    flow = yaml.safe_load((package / ".github/workflows/clharness.yml").read_text())
    report, = [s["run"] for s in flow["jobs"]["benchmark"]["steps"] if s.get("name") == "HTML report"]
    env = dict(os.environ, CLH_ARTIFACTS=str(artifacts), PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(["bash", "-c", report], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "drift_ok" in (artifacts / "report.html").read_text()

    suite = package / "drift_ok/suites/drift_ok.toml"
    suite.write_text(suite.read_text().replace("gates = [", 'gates = [\n    "finetune: final_acc >= 0.99",', 1))
    red = _run_generated_tests(package, artifacts)   # the stored runs are reused; only the gates run again
    assert red.returncode == 1, red.stdout + red.stderr
    assert "gate failed: finetune: final_acc >= 0.99" in red.stdout
