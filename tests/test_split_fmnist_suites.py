"""van de Ven et al.'s three-scenario suites (issue 40 item 2): the domain kind's "split" shift, a
scenario's own hyperparameters, and the suite files' settings pinned against
GMvandeVen/continual-learning's params/param_values.py (values typed here from that file)."""
from pathlib import Path

import numpy as np
import pytest
import torch

import clharness
from clharness.benchmarks.domains import kind as domain_kind
from clharness.data import ArrayDataset
from clharness.engine.suites import SuiteError, load_suite, spec_definition

SUITES = Path(__file__).resolve().parents[1] / "suites"


class Coded:
    """A registered-looking source: 10 classes x 3 images, every pixel of an image = 10 * class + k."""
    needs_root, system_folders, options = False, (), {}
    name = "coded"

    def __init__(self, **options):
        pass

    def identity(self):
        return "coded"

    def load(self, root, train, download=False):
        labels = torch.arange(10).repeat_interleave(3)
        images = (10 * labels + torch.arange(3).repeat(10)).to(torch.uint8).view(-1, 1, 1, 1).expand(-1, 1, 2, 2)
        return ArrayDataset(images.contiguous(), labels, [f"c{c}" for c in range(10)], "coded")


def spec(tmp_path, order):
    path = tmp_path / "d.toml"
    path.write_text('[suite]\nname = "d"\n[[scenario]]\nname = "di"\nkind = "domain"\nsetting = "domain-incremental"\n'
                    f'shift = "split"\ndataset = "coded"\ntasks = 5\nclass_order = "{order}"\nnormalize = "none"\n')
    return load_suite(path).scenarios[0]


def original_classes(data):
    """The source classes a task's images came from (pixel // 10; inputs are pixel / 255), per label."""
    pixels = torch.cat([x for x, _ in data.batches(100)])[:, 0, 0, 0].mul(255).round().long() // 10
    labels = torch.cat([y for _, y in data.batches(100)])
    return {int(y): sorted(set(pixels[labels == y].tolist())) for y in labels.unique()}


def test_split_shift_fixed_order_groups_consecutive_classes_relabelled(tmp_path):
    s = spec(tmp_path, "fixed")
    scenario = domain_kind.build(s, {"coded": Coded}, seed=0, device=torch.device("cpu"))
    assert len(scenario.tasks) == 5 and scenario.class_names == ["c0|c2|c4|c6|c8", "c1|c3|c5|c7|c9"]
    for t, task in enumerate(scenario.tasks):
        assert task.classes == (0, 1)
        # task t: class 2t as label 0, class 2t+1 as label 1 (van de Ven's y - labels[0]), 3 images each
        assert original_classes(task.train) == {0: [2 * t], 1: [2 * t + 1]}
        assert original_classes(task.test) == {0: [2 * t], 1: [2 * t + 1]}
        assert len(task.train) == 6


def test_split_shift_seed_order_is_a_partition_that_changes_with_the_seed(tmp_path):
    s = spec(tmp_path, "seed")
    pairs = {}
    for seed in (0, 1):
        scenario = domain_kind.build(s, {"coded": Coded}, seed=seed, device=torch.device("cpu"))
        groups = [original_classes(task.train) for task in scenario.tasks]
        assert all(len(g[0]) == 1 and len(g[1]) == 1 for g in groups)   # each label one source class
        pairs[seed] = [(g[0][0], g[1][0]) for g in groups]
        assert sorted(c for p in pairs[seed] for c in p) == list(range(10))   # every class once
        assert scenario.class_names == ["|".join(f"c{a}" for a, _ in pairs[seed]), "|".join(f"c{b}" for _, b in pairs[seed])]
    assert pairs[0] != pairs[1]


def test_split_shift_needs_tasks_dividing_the_classes(tmp_path):
    s = spec(tmp_path, "fixed")
    from dataclasses import replace
    with pytest.raises(domain_kind.ScenarioError, match="tasks to divide the 10 classes"):
        domain_kind.build(replace(s, tasks=3), {"coded": Coded}, seed=0, device=torch.device("cpu"))


def test_scenario_hparams_override_the_suite_table_per_scenario(tmp_path):
    path = tmp_path / "h.toml"
    path.write_text('[suite]\nname = "h"\nmethods = ["ewc"]\n[defaults]\ndataset = "digits"\ntasks = 5\n'
                    'max_train_per_class = 4\nmax_test_per_class = 2\n'
                    '[[scenario]]\nname = "a"\nhparams = { ewc = { ewc_lambda = 1e9 } }\n'
                    '[[scenario]]\nname = "b"\n'
                    '[hparams.ewc]\newc_lambda = 50.0\nlr = 0.002\n')
    a = clharness.load_case(path, "a", "ewc")
    b = clharness.load_case(path, "b", "ewc")
    assert a.method.hp["ewc_lambda"] == 1e9 and a.method.hp["lr"] == 0.002   # scenario over suite, rest kept
    assert b.method.hp["ewc_lambda"] == 50.0
    assert a.key != clharness.load_case(path, "a", "ewc", hparams={"ewc_lambda": 50.0}).key
    # a scenario without the key keeps the record key it had before the key existed
    assert "hparams" not in spec_definition(load_suite(path).scenarios[1])
    path.write_text(path.read_text().replace("hparams = { ewc = { ewc_lambda = 1e9 } }", "hparams = { ewc = 3 }"))
    with pytest.raises(SuiteError, match="must map method names to tables"):
        load_suite(path)


# params/param_values.py, set_default_values: splitMNIST / permMNIST branches, typed by hand
VAN_DE_VEN = {"ti-5x2": (1e5, 10.0), "di-5x2": (1e10, 50000.0), "ci-5x2": (1e9, 5000.0)}


@pytest.mark.parametrize("name,dataset", [("split-fmnist", "fashion-mnist"), ("split-mnist-3s", "mnist")])
def test_three_scenario_suites_carry_the_authors_settings(name, dataset):
    suite = load_suite(SUITES / f"{name}.toml")
    specs = {s.name: s for s in suite.scenarios}
    assert set(specs) == set(VAN_DE_VEN)
    assert specs["ti-5x2"].setting == "task-incremental" and specs["ci-5x2"].setting == "class-incremental"
    assert specs["di-5x2"].kind == "domain" and specs["di-5x2"].options["shift"] == "split"
    for scenario, (ewc_lambda, si_c) in VAN_DE_VEN.items():
        s = specs[scenario]
        assert s.dataset == dataset and s.tasks == 5 and s.batch_size == 128 and s.normalize == "none"
        assert s.backbone == "mlp" and s.backbone_options == {"hidden": 400, "layers": 2}
        assert s.hparams == {"ewc": {"ewc_lambda": ewc_lambda}, "si": {"si_lambda": si_c}}
        assert 0.98 <= s.epochs * -(-12000 // 128) / 2000 <= 1.02   # 2,000 iterations of 12,000 images / 128
        assert s.class_order == "seed" and s.memory_size == 1000
    for method in suite.methods:
        assert suite.hparams[method]["optimizer"] == "adam" and suite.hparams[method]["lr"] == 0.001
    assert suite.hparams["si"]["si_epsilon"] == 0.1 and suite.hparams["ewc"]["ewc_mode"] == "separate"


def test_permuted_fmnist_carries_the_authors_settings():
    suite = load_suite(SUITES / "permuted-fmnist.toml")
    (s,) = suite.scenarios
    assert (s.kind, s.setting, s.options["shift"], s.tasks) == ("domain", "domain-incremental", "permute", 10)
    assert s.backbone_options == {"hidden": 1000, "layers": 2} and s.batch_size == 128
    assert 0.95 <= s.epochs * -(-60000 // 128) / 5000 <= 1.05
    assert suite.hparams["ewc"]["ewc_lambda"] == 100.0 and suite.hparams["si"]["si_lambda"] == 10.0
    assert all(suite.hparams[m]["lr"] == 0.0001 and suite.hparams[m]["optimizer"] == "adam" for m in suite.methods)
