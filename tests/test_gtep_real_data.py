"""The real-data GTEP suites (gtep-cifar50, gtep-imagenet100, gtep-vit) under --clh-quick on tiny
files written in the real on-disk formats: CIFAR-100 pickles, ImageNet ImageFolder trees, CUB-200,
ImageNet-R and ImageNet-A folders. One pytest session runs one scenario of each suite."""
import clharness.engine.runner  # noqa: F401  (loaded once: pytester runs share one torch)
import clharness.reporting.scorecard  # noqa: F401
import clharness_methods  # noqa: F401
import sklearn.datasets  # noqa: F401

from clharness.results import ResultsStore
from fakedata import write_cifar100, write_cub200, write_imagefolder, write_imagenet_r
from clharness.benchmarks.gtep import phases as gtep_phases

WNIDS = [f"n{i:08d}" for i in range(200)]


def write_all(root):
    write_cifar100(root, n_per_class=4)
    write_imagefolder(root / "imagenet", classes=WNIDS, n_per_class=4, n_test=1, size=(8, 8))
    write_cub200(root, classes=[f"Bird_{i:03d}" for i in range(200)], n_train=4, n_test=1, size=(8, 8))
    write_imagenet_r(root, wnids=WNIDS[:200], n_per_class=2, size=(8, 8))
    write_imagefolder(root / "imagenet-a", classes=WNIDS, n_per_class=5, split=False, size=(8, 8))


def by_phase(records):
    """(suite, "<scenario>:tune-c<k>" | "<scenario>:eval") -> record: a tuning run is named by its
    tuning id (shared by the scenarios with its D^HT), which the scenario's evaluation runs name."""
    tuned = {gtep_phases.tuning_of(r.scenario): r.scenario.split(":")[0] for r in records if ":eval@" in r.scenario}
    out = {}
    for r in records:
        base, phase, k = gtep_phases.split_scenario(r.scenario)
        out[(r.suite, f"{tuned[base]}:tune-c{k}" if phase == "tune" else f"{base}:eval")] = r
    return out


def test_real_data_gtep_suites_run_quick_on_files_in_the_real_formats(pytester):
    import pathlib
    pytester.syspathinsert(pathlib.Path(__file__).parent)
    root = pytester.path / "data"
    write_all(root)
    store = pytester.path / "r.sqlite"
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--clh-quick", "--clh-data-root", str(root), "--clh-results", str(store),
        "--clh-suite", "gtep-cifar50", "--clh-suite", "gtep-imagenet100", "--clh-suite", "gtep-vit",
        "--clh-method", "finetune",
        "-k", "(gtep-cifar50 and (high-6 or low-10)) or (gtep-imagenet100 and high-10) or cub-low-10")
    result.assert_outcomes(passed=8)
    records = by_phase(ResultsStore(store).records())
    assert set(records) == {("gtep-cifar50", "high-6:tune-c0"), ("gtep-cifar50", "high-6:eval"),
                            ("gtep-cifar50", "low-10:tune-c0"), ("gtep-cifar50", "low-10:eval"),
                            ("gtep-imagenet100", "high-10:tune-c0"), ("gtep-imagenet100", "high-10:eval"),
                            ("gtep-vit", "cub-low-10:tune-c0"), ("gtep-vit", "cub-low-10:eval")}
    six = records[("gtep-cifar50", "high-6:eval")]
    assert six.dataset.startswith("cifar100") and six.dataset.endswith("[50:100]")
    assert len(six.acc_matrix) == 6 and six.task_sizes == [25, 5, 5, 5, 5, 5]    # 25 classes, then 5 x 5 (1 test image each)
    tune = records[("gtep-cifar50", "high-6:tune-c0")]
    assert tune.task_sizes == [50, 10, 10, 10, 10, 10]                            # validation: 2 of 4 train images per class
    low = records[("gtep-cifar50", "low-10:eval")]
    assert low.dataset.startswith("imagefolder") and len(low.acc_matrix) == 10
    assert not set(low.class_order) & set(tune.class_order)
    inet = [records[("gtep-imagenet100", f"high-10:{p}")] for p in ("tune-c0", "eval")]
    assert [len(r.class_order) for r in inet] == [100, 100] and not set(inet[0].class_order) & set(inet[1].class_order)
    vit = records[("gtep-vit", "cub-low-10:eval")]
    assert len(vit.acc_matrix) == 10 and len(vit.class_order) == 100 and vit.dataset.startswith("imagefolder")
    assert records[("gtep-vit", "cub-low-10:tune-c0")].dataset.startswith("cub200")
    assert "clharness GTEP" in result.stdout.str()


def test_real_data_suites_collect_every_phase_item(pytester):
    result = pytester.runpytest("-p", "no:cacheprovider", "--collect-only", "-q", "--clh-suite", "gtep-vit",
                                "--clh-method", "ncm")
    ids = [line for line in result.outlines if "::" in line]
    # 12 scenarios x (30 configurations x 5 trials + 5 evaluation trials)
    assert len(ids) == 12 * (30 * 5 + 5)
    assert "gtep-vit::imr-low-20[ncm-tune-c29-t4]" in ids and "gtep-vit::cub-high-10[ncm-eval-t0]" in ids
