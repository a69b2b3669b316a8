"""cldyb-cc / cldyb-ic on fabricated files in the real on-disk formats, tiny ViT (--clh-quick)."""
import json

import clharness.benchmarks.cldyb.kind  # noqa: F401  (loaded once: pytester's in-process runs share torch)
import clharness.engine.runner  # noqa: F401
import clharness.reporting.scorecard  # noqa: F401
import clharness_methods  # noqa: F401
import sklearn.cluster  # noqa: F401
import timm  # noqa: F401

from fakedata import WNIDS, write_cub200, write_imagefolder, write_imagenet_r


def test_cldyb_cc_runs_on_imagefolder_trees_with_a_vit(pytester, tmp_path):
    root = tmp_path / "data"
    write_imagenet_r(root, WNIDS[:3], n_per_class=5, size=(12, 10))
    write_cub200(root, n_train=2, n_test=2)
    write_imagefolder(root / "cldyb-heldout", classes=("a", "b", "c", "d"), n_per_class=3, n_test=1)
    result = pytester.runpytest("-p", "no:cacheprovider", "--clh-suite", "cldyb-cc", "--clh-quick", "--clh-seeds", "1",
                                "--clh-data-root", str(root), "--clh-method", "ncm",
                                "--clh-results", "r.sqlite", "-v")
    result.assert_outcomes(passed=6)   # 3 searches (cc, random, heldout) + 3 replays
    seq = json.loads((pytester.path / ".clharness/sequences/cldyb-cc-cc-cc-seed0.json").read_text())
    classes = [c for s in seq["steps"] for c in s["classes"]]
    assert len(classes) == 4 and all(c.split("/")[0] in ("imagenet-r", "cub200") for c in classes)
    assert seq["backbone"] == "timm" and seq["backbone_options"]["model"] == "vit_tiny_patch16_224"
    assert seq["methods"] == ["ncm"] and len(seq["steps"][1]["candidates"]) == 2
    assert "cldyb-cc::cc/heldout[ncm-seed0] PASSED" in result.stdout.str()
