"""The real-data STF suites (EMNIST, CIFAR-10/100, TinyImageNet) run end to end with --clh-quick
on files written in the real on-disk formats (no downloads), with the paper's settings."""
import json
import math
from pathlib import Path

import pytest

import clharness.engine.runner  # noqa: F401  (keep torch loaded across pytester's in-process runs)
import clharness.reporting.scorecard  # noqa: F401
import clharness_methods  # noqa: F401
from clharness.benchmarks.stf.kind import mu_sigma
from clharness.engine.suites import load_suite

from fakedata import write_cifar10, write_cifar100, write_emnist, write_tinyimagenet

SUITE_DIR = Path(__file__).parent.parent / "suites"
FAKE_WNIDS = tuple(f"n{9100000 + i:08d}" for i in range(20))

# suite: (writer, equivalent tasks T, memory, backbone) as in section 4.1, table 2 and appendix D
SUITES = {
    "stf-emnist": (lambda root: write_emnist(root, n_per_class=2), 12, 2000, "cnn"),
    "stf-cifar10": (lambda root: write_cifar10(root, n_per_class=2), 5, 1000, "resnet18-reduced"),
    "stf-cifar100": (lambda root: write_cifar100(root, n_per_class=2), 10, 2000, "resnet18-reduced"),
    "stf-tinyimagenet": (lambda root: write_tinyimagenet(root, wnids=FAKE_WNIDS, n_train=2, n_val=1,
                                                         extra_wnids=()), 20, 4000, "resnet18-reduced"),
}
SCALES = {"stf": 1.0, "disjoint": 1.0, "stf-x0.5": 0.5, "stf-x2": 2.0, "stf-x4": 4.0}


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_suite_has_the_papers_settings(suite):
    _, tasks, memory, backbone = SUITES[suite]
    loaded = load_suite(SUITE_DIR / f"{suite}.toml")
    assert loaded.name == suite and loaded.methods == ("er", "mir", "cbrs", "gdumb", "gmed", "ace")
    assert {s.name: s.options["mu_sigma_scale"] for s in loaded.scenarios} == SCALES
    for spec in loaded.scenarios:
        assert spec.memory_size == memory and spec.backbone == backbone and spec.tasks == tasks
        assert spec.options["stream_batch"] == 10 and spec.batch_size == 10
        assert mu_sigma(spec) == pytest.approx(math.sqrt(1 / 12) / tasks * SCALES[spec.name])
    assert [s.options["stream"] for s in loaded.scenarios].count("disjoint") == 1


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_suite_runs_quick_on_fabricated_files(pytester, tmp_path, suite):
    SUITES[suite][0](tmp_path / "data")
    card = tmp_path / "card.json"
    result = pytester.runpytest("--clh-suite", suite, "--clh-quick", "--clh-seeds", "1", "--clh-method", "er",
                                "-k", "not x0 and not x2 and not x4 and not disjoint", "--clh-data-root", str(tmp_path / "data"),
                                "--clh-scorecard", str(card), "--clh-device", "cpu", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    records = json.loads(card.read_text())["records"]
    assert [r["scenario"] for r in records] == ["stf"]
    for r in records:
        assert r["status"] == "passed" and 0 <= r["metrics"]["final_acc"] <= 1
        assert 0 <= r["metrics"]["info_retention"] <= 1 and r["memory"]["exemplars"] > 0
