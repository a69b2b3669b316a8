"""cldyb-cc / cldyb-ic on fabricated files in the real on-disk formats, tiny ViT (--clh-quick)."""
import json

import clharness.benchmarks.cldyb.kind  # noqa: F401  (loaded once: pytester's in-process runs share torch)
import clharness.engine.runner  # noqa: F401
import clharness.reporting.scorecard  # noqa: F401
import clharness_methods  # noqa: F401
import sklearn.cluster  # noqa: F401
import timm  # noqa: F401

from fakedata import write_imagefolder

from clharness.benchmarks.cldyb.pool import POOL_DATASETS, POOL_DIR

SUITE = __import__("pathlib").Path(__file__).resolve().parent.parent / "suites" / "cldyb-cc.toml"


def test_cldyb_cc_runs_on_imagefolder_trees_with_a_vit(pytester, tmp_path):
    root = tmp_path / "data"
    for i, folder in enumerate(POOL_DATASETS):   # table 1's pool: the CLDyB-pool trees (issue 30 item 8)
        write_imagefolder(root / POOL_DIR / folder, classes=("a", "b"), n_per_class=45, split=bool(i % 2), n_test=5,
                          size=(12, 10))
    write_imagefolder(root / "cldyb-heldout", classes=("a", "b", "c", "d"), n_per_class=3, n_test=1)
    # the suite as shipped, but searched by ncm alone (its five searchers would each train a ViT per
    # candidate); what is under test is the wiring on real on-disk formats
    text = SUITE.read_text()
    searchers = next(line for line in text.splitlines() if line.startswith("search_methods = "))
    pytester.path.joinpath("cldyb-cc.toml").write_text(text.replace(searchers, 'search_methods = ["ncm"]'))
    result = pytester.runpytest("-p", "no:cacheprovider", "--clh-suite", "cldyb-cc.toml", "--clh-quick", "--clh-seeds", "1",
                                "--clh-data-root", str(root), "--clh-method", "ncm",
                                "--clh-results", "r.sqlite", "-v")
    result.assert_outcomes(passed=6)   # 3 searches (cc, random, heldout) + 3 replays
    seq = json.loads((pytester.path / ".clharness/sequences/cldyb-cc-cc-cc-seed0.json").read_text())
    classes = [c for s in seq["steps"] for c in s["classes"]]
    assert len(classes) == 4 and all(c.split("/")[0] in POOL_DATASETS for c in classes)
    assert seq["backbone"] == "timm" and seq["backbone_options"]["model"] == "vit_tiny_patch16_224"
    assert seq["methods"] == ["ncm"] and len(seq["steps"][1]["candidates"]) == 2
    assert "::cc/heldout[ncm-seed0] PASSED" in result.stdout.str()
