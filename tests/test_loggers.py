"""--clh-log loggers, each read back from its offline form: TensorBoard event files, a W&B offline run's
transaction log, an MLflow file store. wandb and mlflow are heavy (about 85 MB each, installed by
their extras, not by [test]): their tests need the package and say so when it is missing."""
import glob
import json
import math
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clharness.reporting.loggers import LoggerError, final_metrics, make_logger, task_rows
from clharness.results import RunRecord

NAN = math.nan


def record(**kw) -> RunRecord:
    base = dict(suite="quickstart", scenario="ci-3", method="er", seed=1, status="passed", setting="class-incremental",
                hparams={"lr": 0.05}, acc_matrix=[[0.9, 0.1, NAN], [0.5, 0.8, NAN], [0.4, 0.6, 0.7]],
                task_sizes=[10, 10, 20], metrics={"final_acc": 0.6, "bwt": NAN}, train_seconds=1.5)
    base.update(kw)
    return RunRecord(**base)


def test_task_rows_hold_each_evaluated_task_and_the_pooled_seen_accuracy():
    rows = task_rows(record())
    assert [sorted(r) for r in rows] == [["seen", "task_0", "task_1"]] * 2 + [["seen", "task_0", "task_1", "task_2"]]
    assert [r["task_0"] for r in rows] == [0.9, 0.5, 0.4]
    # seen = test-size-weighted accuracy on tasks 0..i: 0.9; (5+8)/20; (4+6+14)/40
    assert [r["seen"] for r in rows] == pytest.approx([0.9, 0.65, 0.6])
    assert "bwt" not in final_metrics(record()) and final_metrics(record())["final_acc"] == 0.6


@pytest.mark.parametrize("spec", ["tensorboard", "tensorboard:", "neptune:proj", "wandb"])
def test_a_bad_spec_names_the_accepted_forms(spec):
    with pytest.raises(LoggerError, match=r"expected tensorboard:DIR\|wandb:PROJECT\|mlflow:URI"):
        make_logger(spec)


@pytest.mark.parametrize("kind, package", [("tensorboard", "tensorboard"), ("wandb", "wandb"), ("mlflow", "mlflow")])
def test_a_missing_package_names_the_extra(monkeypatch, tmp_path, kind, package):
    monkeypatch.setitem(sys.modules, package, None)   # import raises ImportError
    with pytest.raises(LoggerError, match=rf"pip install 'clharness\[{kind}\]'"):
        make_logger(f"{kind}:{tmp_path}")


def _tensorboard(run_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(run_dir), size_guidance={"images": 0, "scalars": 0})
    acc.Reload()
    return acc


def test_tensorboard_writes_task_rows_metrics_and_the_matrix_image(tmp_path):
    logger = make_logger(f"tensorboard:{tmp_path}")
    logger.clharness_run_finished(record())
    acc = _tensorboard(tmp_path / "quickstart" / "ci-3" / "er" / "seed1")
    scalars = lambda tag: [(e.step, round(e.value, 6)) for e in acc.Scalars(tag)]
    assert scalars("accuracy/task_0") == [(0, 0.9), (1, 0.5), (2, 0.4)]
    assert scalars("accuracy/task_2") == [(2, 0.7)]
    assert scalars("accuracy/seen") == [(0, 0.9), (1, 0.65), (2, 0.6)]
    assert scalars("metrics/final_acc") == [(2, 0.6)] and scalars("metrics/train_seconds") == [(2, 1.5)]
    assert "metrics/bwt" not in acc.Tags()["scalars"]
    image, = acc.Images("accuracy_matrix")
    assert image.width > 100 and image.height > 100 and image.encoded_image_string[:4] == b"\x89PNG"

    logger.clharness_run_finished(record(seed=2, status="failed", acc_matrix=[[0.9, 0.1, NAN]], metrics={}))
    failed = _tensorboard(tmp_path / "quickstart" / "ci-3" / "er" / "seed2")   # a failed run's matrix is one row
    assert [e.value for e in failed.Scalars("accuracy/task_1")] == [pytest.approx(0.1)] and failed.Images("accuracy_matrix")


def test_clh_log_tensorboard_logs_each_run_a_session_trains(tmp_path):
    logs = tmp_path / "tb"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--clh-suite", "quickstart",
                           "--clh-quick", "--clh-method", "finetune", "--clh-seeds", "2", "--clh-device", "cpu",
                           "--clh-results", str(tmp_path / "r.sqlite"), "--clh-log", f"tensorboard:{logs}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = sorted(p.relative_to(logs).as_posix() for p in logs.glob("*/*/*/*"))
    assert runs == ["quickstart/ci-5x2/finetune/seed0", "quickstart/ci-5x2/finetune/seed1"]
    assert [e.step for e in _tensorboard(logs / runs[0]).Scalars("accuracy/seen")] == [0, 1, 2, 3, 4]
    losses = _tensorboard(logs / runs[0]).Scalars("train/loss")   # written live, one per training step
    assert [e.step for e in losses] == list(range(1, len(losses) + 1)) and len(losses) >= 5

    bad = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--clh-suite", "quickstart",
                          "--clh-log", "tensorboards:x"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 4 and "--clh-log tensorboards:x: expected tensorboard:DIR" in bad.stderr


def _wandb_records(path: str):
    """Records of a W&B transaction log (.wandb): a 7-byte header, then LevelDB-log style 32 KiB blocks
    of chunks (crc32 u32, length u16, type u8: 1 full, 2 first, 3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2 as pb
    data, pos, chunk, block = Path(path).read_bytes(), 7, b"", 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:   # block trailer too short for a chunk header
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if pos + 7 + length > len(data):   # a chunk still being written
            return
        chunk += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(chunk)
            chunk = b""
            yield rec


def test_wandb_offline_run_per_case_grouped_by_suite(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is the [wandb] extra (~85 MB), not in [test]")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    make_logger("wandb:clh-test").clharness_run_finished(record())
    logs = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert len(logs) == 1
    deadline = time.monotonic() + 60
    while True:   # wandb's service process writes the log; finish() can return before it has flushed
        records = list(_wandb_records(logs[0]))
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    run, = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.project, run.run_group, run.job_type, run.display_name) == ("clh-test", "quickstart", "ci-3",
                                                                       "quickstart::ci-3[er-seed1]")
    config = {u.key: json.loads(u.value_json) for u in run.config.update}
    assert config["method"] == "er" and config["seed"] == 1 and config["hp.lr"] == 0.05
    history = [{"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    assert [h["accuracy/seen"] for h in history] == pytest.approx([0.9, 0.65, 0.6])
    assert history[-1]["accuracy_matrix/format"] == "png"
    summary = {u.key: json.loads(u.value_json) for r in records if r.WhichOneof("record_type") == "summary"
               for u in r.summary.update if u.key}
    assert summary["final_acc"] == 0.6 and "bwt" not in summary
    assert glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "files" / "media" / "images" / "accuracy_matrix*.png"))


def test_mlflow_file_store_run_per_case_in_the_suites_experiment(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="mlflow is the [mlflow] extra (~85 MB), not in [test]")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")   # MLflow 3 asks for this opt-in to file stores
    uri = (tmp_path / "mlruns").as_uri()
    logger = make_logger(f"mlflow:{uri}")
    logger.clharness_run_finished(record())
    logger.clharness_run_finished(record(seed=2, status="failed", acc_matrix=[[0.9, 0.1, NAN]], metrics={}))
    import mlflow
    client = mlflow.MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("quickstart")
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    assert set(runs) == {"quickstart::ci-3[er-seed1]", "quickstart::ci-3[er-seed2]"}
    good = runs["quickstart::ci-3[er-seed1]"]
    assert good.info.status == "FINISHED" and runs["quickstart::ci-3[er-seed2]"].info.status == "FAILED"
    assert good.data.params["hp.lr"] == "0.05" and good.data.tags["clharness.method"] == "er"
    assert good.data.metrics["final_acc"] == 0.6 and "bwt" not in good.data.metrics
    history = client.get_metric_history(good.info.run_id, "accuracy/seen")
    assert sorted((m.step, round(m.value, 6)) for m in history) == [(0, 0.9), (1, 0.65), (2, 0.6)]
    art = json.loads(Path(mlflow.artifacts.download_artifacts(run_id=good.info.run_id, artifact_path="accuracy_matrix.json",
                                                              dst_path=str(tmp_path / "dl"), tracking_uri=uri)).read_text())
    assert art["acc_matrix"] == [[0.9, 0.1, None], [0.5, 0.8, None], [0.4, 0.6, 0.7]]


def test_mlflow_unusable_local_store_is_a_usage_error(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="mlflow is the [mlflow] extra (~85 MB), not in [test]")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    (tmp_path / "f").write_text("a file, not a store")
    with pytest.raises(LoggerError, match=r"--clh-log mlflow:.*MLflow cannot use this tracking store"):
        make_logger(f"mlflow:{(tmp_path / 'f').as_uri()}")


def test_loggers_get_the_training_loss_live_while_a_run_trains(tmp_path):
    import clharness as clh
    from clharness.engine import runner

    class Live:
        def __init__(self):
            self.losses, self.finished_after = [], None

        @clh.hookimpl
        def clharness_training_loss(self, record, step, loss):
            assert record.status == "error" and not record.finished_at   # the run is still training
            self.losses.append((record.method, step, loss))

        @clh.hookimpl
        def clharness_run_finished(self, record):
            self.finished_after = len(self.losses)

    live = Live()
    harness = clh.Harness(entry_points=False)
    harness.register(live, source="test")
    case = clh.load_case("quickstart", "ci-5x2", "finetune", seed=0, quick=True)
    record = runner.run_case(case.case, harness, runner.pick_device("cpu"))
    harness.run_finished(record)
    steps = [s for _, s, _ in live.losses]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= 5   # every step, in order, live
    assert live.finished_after == len(steps) and all(isinstance(v, float) for _, _, v in live.losses)
    assert not clh.Harness(entry_points=False).wants_training_loss        # nobody listening: nothing read
