"""M2I/I2M Tables 5-8: the EfficientNet-B1 and ResNet-34 suites are the Wide-VGG9 suites with only the
backbone changed (and the quick wiring image size, and PNN's depth, matched to the backbone's), and run end to end (--clh-quick) on fabricated
copies of the six datasets."""
import copy
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

import clharness.engine.runner  # noqa: F401  (keep torch loaded across pytester's in-process runs)
import clharness_methods  # noqa: F401
from clharness.engine.suites import load_suite

from curriculum_fakedata import write_six

SUITES = Path(__file__).resolve().parents[1] / "suites"
# (base suite, variant suffix, backbone, its options: the authors' models' defaults, PNN's depth: section
# 4.1, "we matched the number of fully connected layers with those of our adopted CNN model architectures,
# i.e., 9, 24, and 34 layers")
VARIANTS = [("m2i", "efficientnet", "efficientnet-b1", {"drop_rate": 0.2, "drop_path_rate": 0.2}, 24),
            ("i2m", "efficientnet", "efficientnet-b1", {"drop_rate": 0.2, "drop_path_rate": 0.2}, 24),
            ("m2i", "resnet34", "resnet34", {"zero_init_last": False}, 34),
            ("i2m", "resnet34", "resnet34", {"zero_init_last": False}, 34)]


@pytest.mark.parametrize("quick", [False, True])
@pytest.mark.parametrize("base, short, backbone, options, pnn_layers", VARIANTS)
def test_variant_differs_from_the_wide_vgg9_suite_only_in_the_backbone(base, short, backbone, options, pnn_layers,
                                                                        quick):
    ref, var = load_suite(SUITES / f"{base}.toml", quick), load_suite(SUITES / f"{base}-{short}.toml", quick)
    assert var.name == f"{base}-{short}" and var.seeds == ref.seeds and var.methods == ref.methods
    ref_hp, var_hp = copy.deepcopy(ref.hparams), copy.deepcopy(var.hparams)
    assert (ref_hp["pnn"].pop("layers"), var_hp["pnn"].pop("layers")) == (9, pnn_layers)
    assert var_hp == ref_hp and var.gates == ref.gates
    assert len(var.scenarios) == len(ref.scenarios) == 2
    for a, b in zip(ref.scenarios, var.scenarios):
        da, db = dataclasses.asdict(a), dataclasses.asdict(b)
        assert (da.pop("backbone"), da.pop("backbone_options")) == ("wide-vgg9", {})
        assert (db.pop("backbone"), db.pop("backbone_options")) == (backbone, options)
        assert db["options"]["protocol"] == "authors"
        if quick:   # 32x32 wiring inputs: both backbones downsample 32x
            assert (da.pop("image_size"), db.pop("image_size")) == ([16, 16], [32, 32])
        assert da == db


def test_backbone_suites_run_end_to_end_quick(pytester, tmp_path):
    root = write_six(tmp_path / "six")
    card = tmp_path / "card.json"
    # one suite per backbone, one per direction (each backbone's other direction differs only in the order)
    run = [("m2i", "efficientnet"), ("i2m", "resnet34")]
    suites = [a for base, short in run for a in ("--clh-suite", f"{base}-{short}")]
    result = pytester.runpytest(*suites, "--clh-quick", "--clh-seeds", "1", "--clh-method", "finetune",
                                "--clh-device", "cpu", "--clh-data-root", str(root), "-k", "not ti",
                                "--clh-results", str(tmp_path / "r.sqlite"), "--clh-scorecard", str(card),
                                "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    records = json.loads(card.read_text())["records"]
    assert sorted(r["suite"] for r in records) == sorted(f"{b}-{s}" for b, s in run)
    for r in records:
        R = np.array(r["acc_matrix"])
        assert R.shape == (6, 6) and np.isfinite(R).all() and r["status"] == "passed"
        first = "mnist" if r["suite"].startswith("m2i") else "tinyimagenet"
        assert r["class_order"][0].startswith(first + "/") and len(r["class_order"]) == 60
