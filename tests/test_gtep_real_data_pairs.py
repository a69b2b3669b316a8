"""Table 2's and fig. 5's other GTEP scenario pairs as suites on real data, under --clh-quick on tiny
files in the real on-disk formats: whole CUB-200 / ImageNet-R as D^HT with ImageNet-R / ImageNet-A
as D^E (gtep-vit-200, 200 classes), the cross 100-class pairs of gtep-vit, and ImageNet-50-1 as D^HT
(gtep-imagenet50). Scenarios with one D^HT and task configuration share their tuning run."""
import pytest
import clharness.engine.runner  # noqa: F401  (loaded once: pytester runs share one torch)
import clharness.reporting.scorecard  # noqa: F401
import clharness_methods  # noqa: F401
import sklearn.datasets  # noqa: F401

from clharness.benchmarks.gtep import kind  # noqa: F401  (loads torchvision once: it registers torch ops)
from clharness.results import ResultsStore
from fakedata import write_cifar100, write_cub200, write_imagefolder, write_imagenet_r
from clharness.benchmarks.gtep import phases as gtep_phases

WNIDS = [f"n{i:08d}" for i in range(200)]


def write_all(root):
    write_cifar100(root, n_per_class=4)
    write_imagefolder(root / "imagenet", classes=WNIDS[:100], n_per_class=4, n_test=1, size=(8, 8))
    write_cub200(root, classes=[f"Bird_{i:03d}" for i in range(200)], n_train=4, n_test=1, size=(8, 8))
    write_imagenet_r(root, wnids=WNIDS, n_per_class=5, size=(8, 8))
    write_imagefolder(root / "imagenet-a", classes=WNIDS, n_per_class=5, split=False, size=(8, 8))


@pytest.mark.slow   # > 45 s on 2 cores (CI stays under 15 min); python -m pytest -m slow
def test_missing_scenario_pairs_run_quick_on_files_in_the_real_formats(pytester):
    import pathlib
    pytester.syspathinsert(pathlib.Path(__file__).parent)
    root = pytester.path / "data"
    write_all(root)
    store = pytester.path / "r.sqlite"
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--clh-quick", "--clh-data-root", str(root), "--clh-results", str(store),
        "--clh-suite", "gtep-vit-200", "--clh-suite", "gtep-vit", "--clh-suite", "gtep-imagenet50",
        "--clh-method", "finetune",
        "-k", "(gtep-vit-200 and (cub-imr-10 or cub-ima-10)) or (imr-cub-10 and not gtep-vit-200) or (gtep-imagenet50 and -6)")
    # 2 + 1 + 2 scenarios, each 1 tuning item (quick: R = S = 1) and 1 evaluation item
    result.assert_outcomes(passed=10)
    records = ResultsStore(store).records()
    evals = {r.scenario.split(":eval@")[0]: r for r in records if ":eval@" in r.scenario}
    tunes = {r.scenario.split(":tune-c")[0]: r for r in records if ":tune-c" in r.scenario}
    # one tuning run per D^HT and task configuration: cub-imr-10 and cub-ima-10 share CUB-200's,
    # high-6 and low-6 share ImageNet-50-1's
    assert len(tunes) == 3 and len(evals) == 5
    tuned = {name: gtep_phases.tuning_of(r.scenario) for name, r in evals.items()}
    assert tuned["cub-imr-10"] == tuned["cub-ima-10"] and tuned["high-6"] == tuned["low-6"]
    assert evals["cub-imr-10"].hparams == evals["cub-ima-10"].hparams

    cub200 = tunes[tuned["cub-imr-10"]]           # all 200 CUB classes, 10 tasks of 20
    assert cub200.dataset.startswith("cub200") and len(cub200.class_order) == 200 and len(cub200.acc_matrix) == 10
    imr, ima = evals["cub-imr-10"], evals["cub-ima-10"]
    assert imr.dataset.startswith("imagenet-r") and len(imr.class_order) == 200 and len(imr.acc_matrix) == 10
    assert ima.dataset.startswith("imagefolder") and len(ima.class_order) == 200
    cross = evals["imr-cub-10"]                   # ImageNet-R-1 -> CUB-100-2, 10 tasks of 10
    assert cross.dataset.startswith("cub200") and cross.dataset.endswith("[100:200]") and len(cross.acc_matrix) == 10
    assert tunes[tuned["imr-cub-10"]].dataset.startswith("imagenet-r") and len(cross.class_order) == 100
    inet = tunes[tuned["high-6"]]                 # ImageNet-50-1: classes [0, 50) of the fixed order
    assert inet.dataset.startswith("imagefolder") and inet.dataset.endswith("[0:50]")
    assert inet.task_sizes == [50, 10, 10, 10, 10, 10]           # validation: 2 of 4 train images per class
    high, low = evals["high-6"], evals["low-6"]
    assert high.dataset.endswith("[50:100]") and not set(high.class_order) & set(inet.class_order)
    assert low.dataset.startswith("cifar100") and low.dataset.endswith("[50:100]")
    assert low.task_sizes == [25, 5, 5, 5, 5, 5]


def test_pair_suites_collect_their_full_protocol(pytester):
    result = pytester.runpytest("-p", "no:cacheprovider", "--collect-only", "-q", "--clh-suite", "gtep-vit-200",
                                "--clh-suite", "gtep-imagenet50", "--clh-method", "ncm")
    ids = [line for line in result.outlines if "::" in line]
    # (8 + 4) scenarios x (30 configurations x 5 trials + 5 evaluation trials)
    assert len(ids) == 12 * (30 * 5 + 5)
    assert "gtep-vit-200::imr-ima-20[ncm-tune-c29-t4]" in ids and "gtep-imagenet50::low-10[ncm-eval-t4]" in ids
