"""The cldyb-pool suite (issue 15 item 10): the paper's 22-dataset pool (appendix A, table 2) read as
ImageFolder trees under the data root, N = 10 tasks of 20 classes, ViT-B/16 Sup-21K and CLIP (fig. 11),
the search and evaluation-only methods of figs. 9 and 13; fabricated trees in the real layout."""
import inspect
from pathlib import Path

import pytest

import clharness.benchmarks.cldyb.kind as kind  # loaded once: pytester's in-process runs share torch
import clharness.engine.runner  # noqa: F401
import clharness.reporting.scorecard  # noqa: F401
import clharness_methods  # noqa: F401
import huggingface_hub.constants
import sklearn.cluster  # noqa: F401
import timm  # noqa: F401
from clharness.toolkit import backbones
from clharness.toolkit.backbones import WeightsMissing
from clharness.benchmarks.cldyb.pool import KEPT_OUT, POOL_DATASETS, POOL_DIR, PoolFolder
from clharness.data import DatasetMissing, load_split
from clharness.plugins import Harness
from clharness.engine.suites import load_suite

from fakedata import write_imagefolder

SUITE = Path(__file__).parent.parent / "suites" / "cldyb-pool.toml"
SEARCHERS = ["clser", "hide_prompt", "ranpac", "pgp", "afec"]       # figs. 9 and 13: used during searching
EVALUATED_ONLY = ["er", "slca", "lae", "dualprompt"]                # reserved for evaluation only
MIN_IMAGES = 45                                                     # table 2's footnote


def write_pool(root: Path, folders=tuple(POOL_DATASETS)) -> Path:
    """Two classes of 45 tiny images per pool dataset; half the datasets with train/ and test/ folders,
    half as bare class folders (split per class by the loader); an ImageNet-R tree beside them."""
    for i, folder in enumerate(folders):
        base = root / POOL_DIR / folder
        if i % 2:
            write_imagefolder(base, classes=("a", "b"), n_per_class=MIN_IMAGES, split=False, size=(4, 4))
        else:
            write_imagefolder(base, classes=("a", "b"), n_per_class=MIN_IMAGES - 5, n_test=5, size=(4, 4))
    write_imagefolder(root / POOL_DIR / "imagenet-r", classes=("n01443537",), n_per_class=MIN_IMAGES, split=False,
                      size=(4, 4))
    write_imagefolder(root / "imagenet-r", classes=("n01443537",), n_per_class=3, split=False, size=(4, 4))
    return root


@pytest.fixture(scope="module")
def pool_root(tmp_path_factory):
    return write_pool(tmp_path_factory.mktemp("data"))


def build_pool(spec, root):
    return kind.make_pool(spec.options["pool"], kind.pool_settings(spec, 0), Harness().datasets, "cpu", root)


def test_the_suite_follows_the_paper():
    suite = load_suite(SUITE)
    assert list(suite.methods) == SEARCHERS + EVALUATED_ONLY and not suite.planned_methods
    assert [s.name for s in suite.scenarios] == ["sup21k", "clip"]
    assert [s.backbone for s in suite.scenarios] == ["vit-b16-in21k", "vit-b16-clip"]
    assert inspect.signature(backbones.vit_b16_in21k).parameters["model"].default == "vit_base_patch16_224.orig_in21k"
    assert inspect.signature(backbones.vit_b16_clip).parameters["model"].default == "vit_base_patch16_clip_224.openai"
    for spec in suite.scenarios:
        o = spec.options
        assert (o["classes_per_task"], o["steps"]) == (20, 10)       # appendix B.3: N = 10 tasks of 20 classes
        assert o["search_methods"] == SEARCHERS and o["use_cases"] == ["cc", "ic", "random"]
        assert [e["options"]["folder"] for e in o["pool"]] == list(POOL_DATASETS)
        assert all(e["dataset"] == "cldyb-pool" and e["name"] == e["options"]["folder"]
                   and e["options"]["min_images"] == MIN_IMAGES for e in o["pool"])
        assert spec.backbone_options == {}                           # pretrained weights by default
    # appendix A: 22 real-world datasets, 2,043 classes (table 2's counts add up to the text's total)
    assert len(POOL_DATASETS) == 22 and sum(n for _, n in POOL_DATASETS.values()) == 2043
    assert "imagenet-r" in KEPT_OUT and "imagenet-r" not in POOL_DATASETS
    quick = load_suite(SUITE, quick=True)
    assert all(s.backbone_options["pretrained"] is False for s in quick.scenarios)


def test_the_pool_reads_every_dataset_folder_and_never_imagenet_r(pool_root):
    spec = load_suite(SUITE, quick=True).scenarios[0]
    pool = build_pool(spec, pool_root)
    assert [s.name for s in pool.sources] == list(POOL_DATASETS)
    assert sorted(pool.classes) == sorted(f"{f}/{c}" for f in POOL_DATASETS for c in ("a", "b"))
    assert not any(name.startswith("imagenet-r") for name in pool.classes)   # present on disk, twice
    assert pool.files and pool.input_shape == (3, 32, 32)
    # every class has train, val and test images, at most the quick budget of each
    assert all(len(c.index["val"]) >= 1 and 1 <= len(c.index["test"]) <= 2 for c in pool.classes.values())
    # a task mixing a split tree (food-101: train/ and test/) and a bare one (eurosat-rgb: class folders)
    data = pool.data(["food-101/b", "eurosat-rgb/a"], "train")
    by_label = {lab: {str(Path(p).parent.relative_to(pool_root / POOL_DIR)) for p, l in zip(data.ds.paths, data.labels.tolist())
                      if l == lab} for lab in (0, 1)}
    assert by_label == {0: {"food-101/train/b"}, 1: {"eurosat-rgb/a"}}


def test_imagenet_r_and_unknown_folders_are_refused():
    with pytest.raises(ValueError, match="ImageNet-R is a standard benchmark .* kept out of the pool"):
        PoolFolder(folder="imagenet-r")
    with pytest.raises(ValueError, match=r"'food101' is not one of the pool's datasets \(fruits-vegetable, .*docs/cldyb-pool.md"):
        PoolFolder(folder="food101")


def test_a_missing_dataset_folder_names_the_folder_and_the_docs(tmp_path, pool_root):
    root = tmp_path
    for folder in POOL_DATASETS:   # the fabricated pool without sun397 (linked, not rewritten)
        if folder != "sun397":
            (root / POOL_DIR / folder).parent.mkdir(exist_ok=True)
            (root / POOL_DIR / folder).symlink_to(pool_root / POOL_DIR / folder, target_is_directory=True)
    spec = load_suite(SUITE, quick=True).scenarios[0]
    with pytest.raises(DatasetMissing) as err:
        build_pool(spec, root)
    message = str(err.value)
    assert "cldyb-pool/sun397 (SUN397)" in message and str(root / POOL_DIR / "sun397") in message
    assert "docs/cldyb-pool.md" in message and "--clh-data-root" in message
    (root / POOL_DIR / "rock").unlink()   # an empty folder is as missing
    (root / POOL_DIR / "rock").mkdir()
    with pytest.raises(DatasetMissing, match=r"cldyb-pool/rock \(Rock\).*docs/cldyb-pool.md"):
        load_split(PoolFolder(folder="rock"), root, True)


def test_classes_with_fewer_than_min_images_are_left_out(tmp_path):
    """Table 2's footnote: classes with fewer than 45 images are not in the pool; 44 out, 45 in, counted
    over train and test folders together; labels stay dense and in class order."""
    base = tmp_path / POOL_DIR / "rock"
    write_imagefolder(base, classes=("basalt",), n_per_class=40, n_test=4, size=(4, 4))         # 44 images
    write_imagefolder(base, classes=("granite", "marble"), n_per_class=40, n_test=5, size=(4, 4))   # 45 each
    train = load_split(PoolFolder(folder="rock", min_images=MIN_IMAGES), tmp_path, True)
    test = load_split(PoolFolder(folder="rock", min_images=MIN_IMAGES), tmp_path, False)
    assert train.classes == test.classes == ["granite", "marble"]
    assert train.labels.tolist() == [0] * 40 + [1] * 40 and test.labels.tolist() == [0] * 5 + [1] * 5
    assert all("/granite/" in p for p in train.paths[:40]) and all("/marble/" in p for p in test.paths[5:])
    everything = load_split(PoolFolder(folder="rock"), tmp_path, True)
    assert everything.classes == ["basalt", "granite", "marble"]


@pytest.fixture
def empty_weight_caches(monkeypatch, tmp_path):
    """Empty Hugging Face and torch hub caches, downloads off (a session without --clh-download)."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setattr(backbones, "_downloads", {"allowed": False})


def test_both_backbones_need_their_pretrained_weights(empty_weight_caches):
    factories = Harness().backbones
    for spec, model in zip(load_suite(SUITE).scenarios, ["vit_base_patch16_224.orig_in21k",
                                                          "vit_base_patch16_clip_224.openai"]):
        with pytest.raises(WeightsMissing, match=f"'{model}'.*checkpoint.*--clh-download"):
            factories[spec.backbone]((3, 224, 224), **spec.backbone_options)


def test_planned_methods_skip_as_not_registered_and_the_session_passes(pytester, pool_root):
    text = SUITE.read_text().replace('seeds = 3\n', 'seeds = 3\nplanned_methods = ["ghost-method"]\n', 1)
    path = pytester.path / "pool.toml"
    path.write_text(text)
    result = pytester.runpytest("-p", "no:cacheprovider", "--clh-suite", str(path), "--clh-quick", "--clh-seeds", "1",
                                "--clh-data-root", str(pool_root), "--clh-method", "ncm", "--clh-method", "ghost-method",
                                "--clh-results", "r.sqlite", "-v", "-rs", "-k", "clip and (random or ghost)")
    result.assert_outcomes(passed=2, skipped=1)
    assert result.ret == 0
    out = result.stdout.str()
    assert "pool::clip/random[ncm-seed0] PASSED" in out
    assert "pool::clip[ghost-method-not-registered] SKIPPED" in out
    assert out.count("clharness: not registered: method 'ghost-method', named in planned_methods of suite "
                     "'cldyb-pool'") == 1


PLANNED = """
gates = ["ghost-method: final_acc beats ncm by 0.0"]

[suite]
name = "plan"
seeds = 1
methods = ["ncm"]
planned_methods = ["ghost-method", "finetune"]

[defaults]
dataset = "digits"
backbone = "mlp"
backbone_options = { hidden = 16, layers = 1 }
epochs = 1

[[scenario]]
name = "s"
tasks = 2
"""


def test_registered_planned_methods_run_and_the_others_skip(pytester):
    """Without --clh-method: the suite's methods and its registered planned ones run; an unregistered
    planned method is one skipped item per scenario, and a gate naming it is noted, not judged."""
    pytester.makefile(".toml", plan=PLANNED)
    result = pytester.runpytest("-p", "no:cacheprovider", "--clh-suite", "plan.toml", "--clh-results", "r.sqlite",
                                "-v", "-rs")
    result.assert_outcomes(passed=2, skipped=1)
    out = result.stdout.str()
    assert "plan::s[ncm-seed0] PASSED" in out and "plan::s[finetune-seed0] PASSED" in out
    assert "plan::s[ghost-method-not-registered] SKIPPED" in out
    assert "gate[" not in out and "gate 'ghost-method: final_acc beats ncm by 0.0' not judged" in out
    assert "SKIPPED [1] plan:1: not registered: method 'ghost-method'" in out   # reported at the suite, not our code
    assert "clharness: not registered: method 'ghost-method'" in out
    with pytest.raises(Exception, match=r"in both methods and planned_methods"):
        pytester.makefile(".toml", twice=PLANNED.replace('"ghost-method", "finetune"', '"ncm"'))
        load_suite(pytester.path / "twice.toml")
