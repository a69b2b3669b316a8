"""One quick split-fmnist session through the real Fashion-MNIST files and the real loader (issue 40
item 5): from the data root ($CLH_DATA_ROOT) or Debian's dataset-fashion-mnist, with an empty home.
Skipped with the reason where the files are absent, except under CLH_REQUIRE_FASHION_MNIST=1 (.ci/run
sets it once it has installed the package): there absence fails."""
import os
from pathlib import Path

import pytest
import torch

import clharness
from clharness.data.torchvision_sources import FashionMNIST

pytestmark = pytest.mark.realdata
REQUIRE = "CLH_REQUIRE_FASHION_MNIST"


def real_copy():
    source = FashionMNIST()
    source.name = "fashion-mnist"
    root = os.environ.get("CLH_DATA_ROOT")
    found = source.locate(Path(root) if root else None)
    if found is None:
        places = ", ".join(f"{label} {folder}" for label, folder in source.copies(Path(root) if root else None))
        message = (f"Fashion-MNIST's files are not here (looked in {places}): apt-get install dataset-fashion-mnist, "
                   "or clharness data fetch fashion-mnist --root DIR and set CLH_DATA_ROOT")
        if os.environ.get(REQUIRE) == "1":
            pytest.fail(f"{REQUIRE}=1 but {message}")
        pytest.skip(message)
    return found


def test_the_real_files_read_as_published():
    real_copy()
    source = FashionMNIST()
    source.name = "fashion-mnist"
    root = os.environ.get("CLH_DATA_ROOT")
    train, test = source.load(root, True), source.load(root, False)
    # Xiao et al. 2017: 60,000 train / 10,000 test 28x28 grey images, 6,000 / 1,000 per class
    assert train.images.shape == (60000, 1, 28, 28) and train.images.dtype == torch.uint8
    assert train.labels.bincount().tolist() == [6000] * 10 and test.labels.bincount().tolist() == [1000] * 10
    assert test.labels[:10].tolist() == [9, 2, 1, 1, 6, 1, 4, 6, 5, 7]   # the t10k file's first labels
    assert train.classes[0] == "T-shirt/top" and train.classes[9] == "Ankle boot"


def test_quick_split_fmnist_session_from_the_real_files(tmp_path, monkeypatch):
    label, _ = real_copy()
    monkeypatch.setenv("HOME", str(tmp_path / "empty-home"))
    (tmp_path / "empty-home").mkdir()
    records = clharness.run("split-fmnist", methods=["er"], seeds=1, quick=True, device="cpu",
                            results=str(tmp_path / "results.sqlite"))
    by_scenario = {r.scenario: r for r in records}
    assert set(by_scenario) == {"ti-5x2", "di-5x2", "ci-5x2"}
    assert all(r.status == "passed" for r in records), [(r.scenario, r.status, r.message) for r in records]
    for name, record in by_scenario.items():
        matrix = record.acc_matrix   # R[i][j]: every task evaluated after every task, in [0, 1]
        assert len(matrix) == 5 and all(len(row) == 5 and all(0 <= a <= 1 for a in row[:i + 1])
                                        for i, row in enumerate(matrix)), name
    # the data stays uint8 on the device until a batch is drawn
    case = clharness.load_case("split-fmnist", "ci-5x2", "er", quick=True)
    task = case.scenario.tasks[0]
    assert task.train.images.dtype == torch.uint8 and len(task.train) == 2 * 64
    assert label in ("data root", "system copy")


def test_absent_files_skip_with_the_reason_or_fail_when_required(tmp_path, monkeypatch):
    monkeypatch.setattr(FashionMNIST, "system_folders", (str(tmp_path / "no-package"),))
    monkeypatch.delenv("CLH_DATA_ROOT", raising=False)
    monkeypatch.delenv(REQUIRE, raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install dataset-fashion-mnist") as skipped:
        real_copy()
    assert str(tmp_path / "no-package") in str(skipped.value)
    monkeypatch.setenv(REQUIRE, "1")
    with pytest.raises(pytest.fail.Exception, match=f"{REQUIRE}=1 but Fashion-MNIST's files are not here"):
        real_copy()
