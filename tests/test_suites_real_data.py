"""Every shipped real-data suite runs end to end with --clh-quick on files written in the
real on-disk formats (no downloads): this proves the wiring from suite file to scorecard."""
import json

import pytest

import clharness.engine.runner  # noqa: F401  (keep torch loaded across pytester's in-process runs)
import clharness.reporting.scorecard  # noqa: F401
import clharness_methods  # noqa: F401
import timm  # noqa: F401

from fakedata import (write_cifar10, write_cifar100, write_imagenet_r, write_mnist,
                      write_tinyimagenet)

FAKE_WNIDS = tuple(f"n{9000000 + i:08d}" for i in range(20))

SUITES = {
    # suite: (writer, expected tasks per scenario)
    "split-mnist": (lambda root: write_mnist(root, n_per_class=3), {"ci-5x2": 5, "ti-5x2": 5}),
    "split-cifar10": (lambda root: write_cifar10(root, n_per_class=2), {"ci-5x2": 5, "ti-5x2": 5}),
    "split-cifar100": (lambda root: write_cifar100(root, n_per_class=2), {"ci-10x10": 10, "ci-50+5x10": 6}),
    "split-tinyimagenet": (lambda root: write_tinyimagenet(root, wnids=FAKE_WNIDS, n_train=2, n_val=1,
                                                           extra_wnids=()), {"ci-10x20": 10}),
    "imagenet-r-vit": (lambda root: write_imagenet_r(root, wnids=FAKE_WNIDS, n_per_class=5, size=(40, 36)),
                       {"ci-10x20": 10}),
}


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_real_data_suite_runs_quick_on_fabricated_files(pytester, tmp_path, suite):
    writer, tasks = SUITES[suite]
    writer(tmp_path / "data")
    card = tmp_path / "card.json"
    result = pytester.runpytest("--clh-suite", suite, "--clh-quick", "--clh-seeds", "1",
                                "--clh-method", "finetune", "--clh-method", "er",
                                "--clh-data-root", str(tmp_path / "data"), "--clh-scorecard", str(card),
                                "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2 * len(tasks))
    records = json.loads(card.read_text())["records"]
    for record in records:
        assert len(record["acc_matrix"]) == tasks[record["scenario"]]
        assert record["status"] == "passed" and 0 <= record["metrics"]["final_acc"] <= 1
        assert record["parameters"] > 0 and record["train_seconds"] > 0
    er = [r for r in records if r["method"] == "er"]
    assert all(r["memory"]["exemplars"] > 0 for r in er)
