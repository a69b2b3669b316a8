"""Each paper's training recipe: GTEP's fixed first task (appendix A.1, Table 3) then the sampled
configuration, read back from the optimizers; offline suites keep their results and record keys."""
import json
from pathlib import Path

import pytest
import torch

import clharness as clh
from clharness.engine.family_session import FamilyServices
from clharness.benchmarks.gtep import protocol as gtep
from clharness.results import run_key
from clharness.engine.runner import Case, run_case
from clharness.benchmarks.gtep import kind
from clharness.engine.suites import ScenarioSpec, load_suite, with_overrides
from clharness.toolkit.training import SupervisedMethod, Trainer
from clharness.benchmarks.gtep import search as gtep_search

SUITES = Path(__file__).resolve().parent.parent / "suites"
TABLE3 = {"epochs": 200, "lr": 0.1, "milestones": [60, 120, 170], "lr_decay": 0.1, "weight_decay": 5e-4}


class OptimizerLog(SupervisedMethod):
    """Fine-tuning that logs, per task, its optimizer's settings and the lr of every step."""
    name = "optimizer-log"
    log = []

    def fit(self, batches, loss_fn=None, params=None, trainer=None):
        trainer = trainer or Trainer.for_method(self, params)
        group, lrs = trainer.optimizer.param_groups[0], []

        def loss(x, y):
            lrs.append(group["lr"])
            return self.loss(x, y)
        super().fit(batches, loss, params, trainer)
        self.log.append({"weight_decay": group["weight_decay"], "momentum": group["momentum"], "lrs": lrs,
                         "epoch_steps": self.labels.epoch_steps})
        return trainer


class Plugin:
    @clh.hookimpl
    def clharness_add_methods(self, registry):
        registry.add(OptimizerLog)


@pytest.fixture(scope="module")
def harness():
    h = clh.Harness()
    h.register(Plugin())
    return h


def test_gtep_suites_set_table_3():
    for name in ("gtep-cifar50", "gtep-imagenet100"):
        suite = load_suite(SUITES / f"{name}.toml")
        assert all(s.first_task_train == TABLE3 for s in suite.scenarios)
    assert all(s.first_task_train is None for s in load_suite(SUITES / "gtep-digits.toml").scenarios)


def test_gtep_first_task_trains_with_table_3_then_the_sampled_configuration(harness):
    syn = {"num_classes": 12, "image_size": 4, "train_per_class": 20, "test_per_class": 6}
    options = {k: d for k, (_, d) in kind.OPTIONS.items()}
    options.update(tune_dataset="synthetic", eval_dataset="synthetic", tune_classes=[0, 6], eval_classes=[6, 12],
                   tune_dataset_options=syn, eval_dataset_options=syn, task_config="2-equal")
    spec = ScenarioSpec(name="s", kind="gtep", validation=0.25, backbone_options={"hidden": 8, "layers": 1},
                        options=options, first_task_train=load_suite(SUITES / "gtep-cifar50.toml").scenarios[0].first_task_train)
    space = gtep_search.method_space(OptimizerLog, {"general": "table4", "fixed": {"momentum": 0.9}, "search": {}})
    config = {"epochs": 5, "batch_size": 16, "lr": 0.03, "weight_decay": 1e-4, "scheduler": "steplr",
              "num_milestones": 2, "lr_decay": 0.5}
    Suite = type("Suite", (), {"name": "g", "hparams": {}})
    case = gtep.make_case(FamilyServices(), Suite, spec, OptimizerLog, {}, space, config, "eval", 0)
    OptimizerLog.log.clear()
    record = run_case(case, harness, torch.device("cpu"))
    assert record.status == "passed", record.message
    first, second = OptimizerLog.log
    steps = first["epoch_steps"]   # 3 classes x 20 images (no validation in the evaluation phase), batch 16
    assert steps == 4
    # task 1: Table 3 (200 epochs, lr 0.1 decayed x0.1 at epochs 60, 120, 170, weight decay 5e-4); momentum fixed
    assert (first["weight_decay"], first["momentum"]) == (5e-4, 0.9) and len(first["lrs"]) == 200 * steps
    by_epoch = first["lrs"][::steps]
    for epoch, lr in [(0, 0.1), (59, 0.1), (60, 0.01), (119, 0.01), (120, 1e-3), (169, 1e-3), (170, 1e-4), (199, 1e-4)]:
        assert by_epoch[epoch] == pytest.approx(lr), epoch
    # task 2: the sampled configuration (5 epochs, lr 0.03, milestones by the GTEP rule [2, 4], decay 0.5)
    assert (second["weight_decay"], second["momentum"]) == (1e-4, 0.9) and len(second["lrs"]) == 5 * steps
    assert second["lrs"][::steps] == pytest.approx([0.03, 0.03, 0.015, 0.015, 0.0075])


def test_quickstart_results_and_record_keys_are_unchanged(harness):
    """Values recorded on main before augmentation and first_task_train existed (ER, seed 0)."""
    spec = load_suite(SUITES / "quickstart.toml").scenarios[0]
    case = Case("quickstart", spec, "er", 0)

    def pinned(case):   # the definition without the code digest (it moves with every edit of the harness)
        definition = case.definition(harness.methods["er"], {"pinned": "1"})
        definition.pop("code")
        return run_key(definition)
    assert pinned(case) == "130b3b13059204a1e488"
    assert pinned(Case("quickstart", with_overrides(spec, augment="cifar"), "er", 0)) != "130b3b13059204a1e488"
    record = run_case(case, harness, torch.device("cpu"))
    assert record.acc_matrix == json.loads(PINNED_ER_SEED0)


PINNED_ER_SEED0 = """[[1.0, 0.0, 0.0, 0.0, 0.0], [0.9814814814814815, 0.9906542056074766, 0.0, 0.0, 0.0],
[0.9537037037037037, 0.9906542056074766, 0.9727272727272728, 0.0, 0.0],
[0.9722222222222222, 0.9906542056074766, 0.9090909090909091, 0.9907407407407407, 0.0],
[0.9537037037037037, 0.9532710280373832, 0.9363636363636364, 0.8981481481481481, 0.9252336448598131]]"""
