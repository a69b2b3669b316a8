"""scripts/device_check.py (issue 41 item 5): the GPU check's own code, run on a CPU with --quick so it
never rots, and its isolation (a failing, slow or impossible step is its own entry; the others run)."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "device_check.py"


def _module():
    spec = importlib.util.spec_from_file_location("device_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_quick_cpu_run_passes_every_step(tmp_path):
    dc = _module()
    steps = [s for s in dc.STEPS if s != "ray_packing"]   # Ray's start-up: tests/test_device_check.py's slow test
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--device", "cpu", "--quick",
                           "--only", ",".join(steps)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "device_check.json").read_text())
    entries = {e["step"]: e for e in report["steps"]}
    assert list(entries) == steps
    assert {e["status"] for e in entries.values()} == {"ok"}, {k: e.get("error") for k, e in entries.items()}
    assert all(e["seconds"] >= 0 for e in entries.values())
    # every family's quick suite made records; the memory columns of the method runs are filled (CPU: no CUDA peak)
    assert all(entries[f"suite:{s}"]["result"]["records"] > 0 for s in dc.FAMILY_SUITES)
    memory = entries["peak_memory"]["result"]
    assert memory["records"] > 0 and memory["max_peak_cuda_mb"] == 0.0 and memory["max_peak_rss_mb"] > 0
    # fp32 ensemble members equal their solo runs; bf16 rows are there (with and without autocast)
    rows = entries["ensemble"]["result"]["rows"]
    assert [r["bf16"] for r in rows] == [False, True] and rows[0]["equal"] and rows[0]["max_diff"] == 0.0
    assert entries["deterministic"]["result"]["bit_identical"] is True
    vit = entries["vit_throughput"]["result"]
    assert vit["identical"] and vit["images_per_s_plain"] > 0 and vit["images_per_s_cached"] > 0
    assert entries["er_overhead"]["result"]["ratio"] > 0
    # bf16 autocast trains (its weight-cast cache off): both precisions learn the first tasks alike
    for row in entries["bf16_quickstart"]["result"]["rows"]:
        assert abs(row["difference"]) < 0.1, row
    summary = (tmp_path / "device_check.md").read_text()
    assert summary.startswith("# Device check: cpu (quick)") and f"{len(steps)} ok, 0 failed, 0 skipped" in summary
    assert all(f"| {s} | ok |" in summary for s in steps)


def test_a_failing_a_slow_and_an_impossible_step_do_not_stop_the_others(tmp_path, monkeypatch):
    dc = _module()

    def fake(check, name):
        if name == "ensemble":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        if name == "deterministic":
            import time
            time.sleep(5)
        if name == "ray_packing":
            raise dc.Skip("ray is not installed")
        return {"value": 1}

    monkeypatch.setattr(dc, "run_step", fake)
    rc = dc.main(["--out", str(tmp_path), "--device", "cpu", "--no-isolate", "--step-limit", "1",
                  "--only", "ensemble,deterministic,ray_packing,vit_throughput"])
    entries = {e["step"]: e for e in json.loads((tmp_path / "device_check.json").read_text())["steps"]}
    assert rc == 1
    assert entries["ensemble"]["status"] == "failed" and "illegal memory access" in entries["ensemble"]["error"]
    assert entries["deterministic"]["status"] == "failed" and "limit of 1 s" in entries["deterministic"]["error"]
    assert entries["deterministic"]["seconds"] < 4
    assert entries["ray_packing"] == {**entries["ray_packing"], "status": "skipped", "reason": "ray is not installed"}
    assert entries["vit_throughput"]["status"] == "ok" and entries["vit_throughput"]["result"] == {"value": 1}
    summary = (tmp_path / "device_check.md").read_text()
    assert "1 ok, 2 failed, 1 skipped." in summary


def test_budget_and_isolated_steps(tmp_path):
    # a step in its own process: peak_memory without suite records is skipped, with its reason
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--device", "cpu", "--isolate",
                           "--only", "peak_memory"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    (entry,) = json.loads((tmp_path / "device_check.json").read_text())["steps"]
    assert entry["status"] == "skipped" and "run the suite:* steps first" in entry["reason"]
    # past the budget no step starts
    dc = _module()
    assert dc.main(["--out", str(tmp_path), "--device", "cpu", "--budget", "-1", "--only", "deterministic"]) == 0
    (entry,) = json.loads((tmp_path / "device_check.json").read_text())["steps"]
    assert entry["status"] == "skipped" and "out of time" in entry["reason"]


@pytest.mark.slow
def test_ray_packing_quick(tmp_path):
    if importlib.util.find_spec("ray") is None:
        pytest.skip("ray is not installed")
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--device", "cpu", "--quick",
                           "--only", "ray_packing", "--step-limit", "400"], capture_output=True, text=True, timeout=600,
                          cwd=ROOT)
    (entry,) = json.loads((tmp_path / "device_check.json").read_text())["steps"]
    assert entry["status"] == "ok", entry
    assert entry["result"]["runs"] == 4 and entry["result"]["ratio_serial_over_ray"] > 0
