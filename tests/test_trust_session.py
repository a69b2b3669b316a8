"""Issue 27 items 3 and 8: bad names stop the session at collection, all at once, with the file, the
line and a did-you-mean; a case whose process dies, or that fails before training, is a failed record
at once, and the gates waiting on it say so instead of waiting out their timeout."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import clharness.engine.api  # noqa: F401  (loaded once: pytester's in-process runs drop what they import)
import clharness.engine.runner  # noqa: F401
import clharness_methods  # noqa: F401

ROOT = Path(__file__).parent.parent
QUICKSTART = (ROOT / "suites" / "quickstart.toml").read_text()


def test_a_backbone_typo_stops_the_session_before_training_with_a_did_you_mean(pytester):
    suite = pytester.path / "typo.toml"
    suite.write_text(QUICKSTART.replace('backbone = "mlp"', 'backbone = "mpl"').replace('"lwf"', '"lfw"')
                     + '\n[hparams.ewc]\nlamda = 3.0\n')
    t0 = time.perf_counter()
    result = pytester.runpytest(str(suite), "-p", "no:cacheprovider", "--clh-results", "r.sqlite")
    checked = time.perf_counter() - t0
    out = result.stdout.str()
    assert result.ret != 0 and "nothing was run" in out
    lines = suite.read_text().splitlines()
    mpl = next(i for i, t in enumerate(lines, 1) if 'backbone = "mpl"' in t)
    assert f"typo.toml:{mpl}: backbone 'mpl' is not registered (did you mean 'mlp'?)" in out
    assert "method 'lfw' is not registered (did you mean 'lwf'?)" in out
    assert "[hparams.ewc] 'lamda': 'ewc' has no hyperparameter 'lamda' (did you mean 'lambda'" in out or \
        "[hparams.ewc] 'lamda'" in out
    assert "passed" not in out.splitlines()[-1]
    assert checked < 60   # collection only (the check itself takes milliseconds; the rest is imports)


def test_a_bad_dataset_name_in_a_scenario_is_named_with_its_line(pytester):
    suite = pytester.path / "data.toml"
    suite.write_text(QUICKSTART.replace('dataset = "digits"', 'dataset = "digit"'))
    out = pytester.runpytest(str(suite), "-p", "no:cacheprovider").stdout.str()
    assert "dataset 'digit' is not registered (did you mean 'digits'?)" in out


SUICIDE = '''
import os, signal
import clharness as clh
from clharness_methods.finetune import Finetune

class Suicide(Finetune):
    name = "suicide"

    def learn(self, experience):
        os.kill(os.getpid(), signal.SIGKILL)   # a segfault or an OOM kill, as the kernel would do it

@clh.hookimpl
def clharness_add_methods(registry):
    registry.add(Suicide)
'''


def test_a_worker_that_dies_under_xdist_fails_its_case_and_the_gate_does_not_wait(tmp_path):
    (tmp_path / "suicide_plugin.py").write_text(SUICIDE)
    suite = QUICKSTART.replace('methods = ["finetune", "joint", "er", "ewc", "lwf", "ncm"]',
                               'methods = ["finetune", "suicide"]')
    suite = suite.replace('    "joint: final_acc beats er by 0.0",\n    "er: final_acc beats finetune by 0.3 welch 0.05",',
                          '    "suicide: final_acc >= 0.0",')
    (tmp_path / "dies.toml").write_text(suite)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "dies.toml", "-p", "suicide_plugin", "-n", "2",
                           "--clh-quick", "--clh-seeds", "1", "--clh-gate-timeout", "3600", "-p", "no:cacheprovider",
                           "--clh-results", "r.sqlite", "-v"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:]
    assert time.monotonic() - t0 < 900
    assert "died before it finished" in out, out[-3000:]   # the gate names the cause, at once
    assert "gate[suicide: final_acc >= 0.0] FAILED" in out or "gate[suicide: final_acc >= 0.0]" in out


def test_a_setup_error_is_a_stored_record_not_a_raw_traceback(tmp_path, monkeypatch):
    import clharness as clh
    from clharness.engine import runner

    def broken(*args, **kwargs):
        raise KeyError("backbone 'mpl' vanished")
    monkeypatch.setattr(runner, "make_context", broken)
    records = clh.run("quickstart", methods="finetune", seeds=1, quick=True, results=tmp_path / "r.sqlite",
                      device="cpu")
    assert records[0].status == "error" and "setting up the case failed" in records[0].message
    assert [u.outcome for u in records.units if u.role == "case"] == ["failed"]
    with clh.results.open(tmp_path / "r.sqlite") as store:
        assert store.get(records[0].key).status == "error"   # stored: a gate reads it at once
