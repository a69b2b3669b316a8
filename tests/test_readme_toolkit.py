"""README's "Build with the toolkit" blocks, run as written (issue 42 item 3): a replay method on
clharness.toolkit.buffers, and a dataset plugin (tensors and an image folder) with its suite file."""
from pathlib import Path

import numpy as np
import pytest

import clharness as clh
from doc_blocks import block

README = Path(__file__).resolve().parent.parent / "README.md"


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_the_replay_example_fills_its_memory_from_the_stream_and_beats_finetuning(user_dir):
    (user_dir / "my_replay.py").write_text(block(README, "# my_replay.py", "python"))
    case = clh.load_case("quickstart", "ci-5x2", "my_replay", seed=0, quick=True, plugins=["my_replay.py"])
    first = case.experience(0)
    case.method.learn(first)
    memory = case.method.memory
    assert memory.capacity == case.context.memory_size == 200
    assert len(memory) == min(200, len(first)) and memory.seen == len(first)   # the stream only, one epoch
    assert set(memory.tensors()[1].tolist()) <= set(first.classes)
    records = clh.run("quickstart", methods=["finetune", "my_replay"], seeds=1, quick=True, device="cpu",
                      results=user_dir / "r.sqlite", plugins=["my_replay.py"])
    acc = {r.method: r.metrics["final_acc"] for r in records}
    assert all(r.status == "passed" for r in records)
    assert acc["my_replay"] > acc["finetune"] + 0.2   # the memory is replayed: far less forgetting


def _photos(root: Path, per_class: int = 10) -> None:
    from PIL import Image
    rng = np.random.default_rng(0)
    for k, colour in enumerate([(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0)]):
        folder = root / "my-photos" / f"class{k}"
        folder.mkdir(parents=True)
        for i in range(per_class):
            pixels = np.clip(np.array(colour) + rng.integers(-40, 40, (16, 16, 3)), 0, 255).astype("uint8")
            Image.fromarray(pixels).save(folder / f"{i}.png")


def test_the_dataset_example_registers_tensors_and_an_image_folder_and_its_suite_runs(user_dir):
    (user_dir / "my_data.py").write_text(block(README, "# my_data.py", "python"))
    (user_dir / "my_suite.toml").write_text(block(README, "# my_suite.toml", "toml"))
    _photos(user_dir / "DATA")
    harness = clh.Harness(plugins=("my_data.py",))
    assert {"blobs", "my-photos"} <= set(harness.datasets)
    records = clh.run("my_suite.toml", plugins=["my_data.py"], data_root=user_dir / "DATA", device="cpu",
                      results=user_dir / "r.sqlite")
    assert sorted({(r.scenario, r.method, r.seed) for r in records}) == [
        (s, m, seed) for s in ("blobs", "photos") for m in ("er", "finetune") for seed in (0, 1)]
    assert all(r.status == "passed" for r in records), [r.message for r in records]
    photos = [r for r in records if r.scenario == "photos"]
    assert {r.dataset.split("(")[0] for r in photos} == {"my-photos"}
    assert all(sum(r.task_sizes) == 4 * 2 for r in photos)   # 20% of 10 photos per class held out, 4 classes
