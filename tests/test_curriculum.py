"""M2I / I2M curriculum scenarios on tiny copies of the six datasets in their real formats."""
import dataclasses
import json

import numpy as np
import pytest
import torch

import clharness.engine.runner  # noqa: F401  (keep torch loaded across pytester's in-process runs)
import clharness_methods  # noqa: F401
from clharness.data import BUILTIN_SOURCES
from clharness.engine.scenario import ScenarioError, build_scenario
from clharness.benchmarks.m2i.kind import MAGI_CHARACTERS, TINYIMAGENET_CLASSES
from clharness.engine.suites import SuiteError, load_suite, with_overrides

from curriculum_fakedata import write_six

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return write_six(tmp_path_factory.mktemp("six"))


def _spec(suite="m2i", setting="class-incremental", **overrides):
    spec = next(s for s in load_suite(f"suites/{suite}.toml").scenarios if s.setting == setting)
    return with_overrides(spec, **overrides) if overrides else spec


def test_m2i_builds_six_balanced_tasks_of_ten_classes_in_order(root):
    sc = build_scenario(_spec(), BUILTIN_SOURCES, 0, CPU, root)
    assert sc.extra["task_names"] == ["mnist", "omniglot", "fashion-mnist", "svhn", "cifar10", "tinyimagenet"]
    assert sc.num_classes == 60 and sc.input_shape == (3, 64, 64)
    assert [t.classes for t in sc.tasks] == [tuple(range(10 * t, 10 * t + 10)) for t in range(6)]
    # MNIST's class 0 had 6 train images, the others 3: balanced down to the minority size.
    assert sc.extra["task_counts"] == {"mnist": {"train": 30, "test": 10}, "omniglot": {"train": 160, "test": 40},
                                       "fashion-mnist": {"train": 30, "test": 10}, "svhn": {"train": 30, "test": 10},
                                       "cifar10": {"train": 30, "test": 10}, "tinyimagenet": {"train": 30, "test": 20}}
    for t, task in enumerate(sc.tasks):
        for data in (task.train, task.test):
            counts = np.bincount(data.labels.numpy() - 10 * t, minlength=10)
            assert counts.min() == counts.max() and len(counts) == 10
            x, _ = next(data.batches(64))
            assert x.shape[1:] == (3, 64, 64) and torch.isfinite(x).all()
    x, _ = next(sc.tasks[0].train.batches(8))   # grey MNIST replicated to three equal channels
    assert torch.equal(x[:, 0], x[:, 1]) and torch.equal(x[:, 1], x[:, 2])
    # Omniglot: characters 1-10 of the Alphabet of the Magi by name (not character11, not Latin).
    assert sc.class_names[10:20] == [f"omniglot/{c}" for c in MAGI_CHARACTERS]
    # Tiny ImageNet: the ten classes by wnid, named from words.txt (the two other listed wnids are not used)
    tiny = sc.class_names[50:]
    assert len(tiny) == 10 and "tinyimagenet/bullfrog, Rana catesbeiana" in tiny
    assert not any("n01443537" in n or "goldfish" in n for n in tiny)


def test_i2m_is_the_reverse_order_with_the_same_images_per_dataset(root):
    m2i = build_scenario(_spec(), BUILTIN_SOURCES, 1, CPU, root)
    i2m = build_scenario(_spec("i2m"), BUILTIN_SOURCES, 1, CPU, root)
    assert i2m.extra["task_names"] == m2i.extra["task_names"][::-1]
    for t in range(6):
        a, b = m2i.tasks[t], i2m.tasks[5 - t]
        assert torch.equal(a.train.images, b.train.images) and torch.equal(a.test.images, b.test.images)
        assert torch.equal(a.train.labels - 10 * t, b.train.labels - 10 * (5 - t))
    assert i2m.class_names[:10] == m2i.class_names[50:]


def test_per_class_cap_and_no_balancing(root):
    capped = build_scenario(_spec(max_train_per_class=2), BUILTIN_SOURCES, 0, CPU, root)
    assert capped.extra["task_counts"]["mnist"]["train"] == 20
    spec = _spec()
    unbalanced = with_overrides(spec, options={**spec.options, "balance": False})
    sc = build_scenario(unbalanced, BUILTIN_SOURCES, 0, CPU, root)
    assert np.bincount(sc.tasks[0].train.labels.numpy())[:2].tolist() == [6, 3]


def test_tinyimagenet_tree_missing_one_of_the_ten_wnids_names_it(tmp_path):
    wnids = [w for w in TINYIMAGENET_CLASSES if w != "n04067472"]
    write_six(tmp_path, skip=("omniglot",), tiny_wnids=wnids)
    spec = _spec()
    only_tiny = with_overrides(spec, options={**spec.options, "curriculum": ["tinyimagenet"]})
    with pytest.raises(ScenarioError, match=r"task 1 of 1 \(tinyimagenet\).*n04067472 \(reel\)"):
        build_scenario(only_tiny, BUILTIN_SOURCES, 0, CPU, tmp_path)


def test_missing_dataset_names_which_of_the_six_and_where(tmp_path):
    write_six(tmp_path, skip=("svhn", "omniglot"))
    with pytest.raises(ScenarioError) as info:
        build_scenario(_spec(), BUILTIN_SOURCES, 0, CPU, tmp_path)
    message = str(info.value)
    assert "curriculum task 2 of 6 (omniglot)" in message and str(tmp_path / "omniglot-py") in message
    spec = _spec("i2m")
    no_omniglot = with_overrides(spec, options={**spec.options, "curriculum": ["tinyimagenet", "svhn"]})
    with pytest.raises(ScenarioError, match=r"task 2 of 2 \(svhn\): dataset 'svhn' not found at .*svhn"):
        build_scenario(no_omniglot, BUILTIN_SOURCES, 0, CPU, tmp_path)


def test_omniglot_character_not_in_the_tree_is_named(tmp_path):
    write_six(tmp_path, omniglot_characters=9)   # character10 of the Magi is missing
    spec = _spec()
    only = with_overrides(spec, options={**spec.options, "curriculum": ["omniglot"]})
    with pytest.raises(ScenarioError, match="Alphabet_of_the_Magi/character10"):
        build_scenario(only, BUILTIN_SOURCES, 0, CPU, tmp_path)


def test_task_without_ten_classes_is_refused(tmp_path):
    spec = _spec()
    bad = with_overrides(spec, options={**spec.options, "curriculum": ["five"],
                                        "sources": {"five": {"dataset": "synthetic", "num_classes": 5}}})
    with pytest.raises(ScenarioError, match="has 5 classes.*exactly 10"):
        build_scenario(bad, BUILTIN_SOURCES, 0, CPU, tmp_path)


@pytest.mark.parametrize("line, error", [
    ('curriculum = "m2x"', "curriculum = 'm2x'; allowed: 'm2i', 'i2m'"),
    ('curriculum = ["mnist", "imagenet"]', r"task\(s\) \['imagenet'\] have no source"),
    ('sources = { mnist = { classes = 3 } }', "sources.mnist .* must be a table with dataset"),
    ('curriculm = "m2i"', "unknown key.*'curriculm'"),
])
def test_suite_file_errors(tmp_path, line, error):
    path = tmp_path / "bad.toml"
    path.write_text(f'[suite]\nname = "bad"\n[[scenario]]\nname = "x"\nkind = "curriculum"\n{line}\n')
    with pytest.raises(SuiteError, match=error):
        load_suite(path)


def test_both_curricula_run_end_to_end_quick(pytester, root, tmp_path):
    card = tmp_path / "card.json"
    result = pytester.runpytest("--clh-suite", "m2i", "--clh-suite", "i2m", "--clh-quick", "--clh-seeds", "1",
                                "--clh-method", "finetune", "--clh-device", "cpu", "--clh-data-root", str(root),
                                "--clh-scorecard", str(card), "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4)
    records = json.loads(card.read_text())["records"]
    assert sorted((r["suite"], r["scenario"]) for r in records) == [("i2m", "ci"), ("i2m", "ti"), ("m2i", "ci"),
                                                                    ("m2i", "ti")]
    for r in records:
        R = np.array(r["acc_matrix"])
        assert R.shape == (6, 6) and np.isfinite(R).all()
        assert {"acc", "bwt", "fwt"} <= set(r["metrics"]) and r["status"] == "passed"
        first = "mnist" if r["suite"] == "m2i" else "tinyimagenet"
        assert r["class_order"][0].startswith(first + "/")
        # the authors' protocol (the suites' default): task-incremental runs share one 10-way head
        assert len(r["class_order"]) == (10 if r["scenario"] == "ti" else 60)
    ti = [np.array(r["acc_matrix"]) for r in records if r["scenario"] == "ti"]
    # task-incremental: ten competing logits per task, so accuracy on tasks never trained is not 0
    assert all(R[np.triu_indices(6, 1)].max() > 0 for R in ti)


def test_missing_dataset_is_a_case_error_naming_it(pytester, tmp_path):
    write_six(tmp_path, skip=("cifar10",))
    result = pytester.runpytest("--clh-suite", "i2m", "--clh-quick", "--clh-seeds", "1", "--clh-method", "finetune",
                                "--clh-device", "cpu", "--clh-data-root", str(tmp_path), "-k", "ci",
                                "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*curriculum task 2 of 6 (cifar10): dataset 'cifar10' not found at*"])


def test_scenario_spec_round_trips_through_the_case_hash():
    from clharness.plugins import Harness
    from clharness.results import run_key
    from clharness.engine.runner import Case, case_key, versions
    spec = _spec()
    assert dataclasses.asdict(spec)["options"]["curriculum"] == "m2i"
    method = Harness().methods["finetune"]
    m2i, i2m = Case("m2i", spec, "finetune", 0), Case("m2i", _spec("i2m"), "finetune", 0)
    definition = json.loads(json.dumps(m2i.definition(method, versions()), sort_keys=True, default=str))
    assert definition["scenario"]["options"]["curriculum"] == "m2i"   # the curriculum is part of the key
    assert run_key(definition) == case_key(m2i, method)                 # the JSON form hashes to the same key
    assert case_key(Case("m2i", _spec(), "finetune", 0), method) == case_key(m2i, method)
    assert case_key(i2m, method) != case_key(m2i, method)
    reversed_only = with_overrides(spec, options={**spec.options, "curriculum": "i2m"})
    assert case_key(Case("m2i", reversed_only, "finetune", 0), method) != case_key(m2i, method)
