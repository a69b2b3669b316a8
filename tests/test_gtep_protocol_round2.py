"""GTEP protocol points of issue 30 (items 1-6), each pinned against the paper's text
("Hyperparameters in continual learning: a reality check", appendix A.1-A.2)."""
import math
from pathlib import Path

import pytest
import torch

import clharness as clh
from clharness.toolkit.backbones import MLP

ROOT = Path(__file__).resolve().parent.parent
SUITES = ROOT / "suites"
DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="module")
def harness():
    return clh.Harness()


# --- item 1: Table 3's first task follows the sampled scheduler kind, for exemplar methods too ---------
TABLE3_SMALL = {"epochs": 8, "lr": 0.1, "milestones": [3, 6], "lr_decay": 0.1, "weight_decay": 5e-4}


def first_task_lrs(harness, method, scheduler):
    """lr factor of each of the first task's epochs, read from the trainer ``task_trainer`` builds."""
    from clharness.method import Experience
    ctx = clh.Context(clh.Setting.CLASS_IL, 4, (1, 2, 2), seed=0, epochs=2, batch_size=2, memory_size=4,
                      backbone_factory=lambda: MLP((1, 2, 2), hidden=6, layers=1), first_task_train=TABLE3_SMALL)
    m = harness.methods[method](ctx, scheduler=scheduler, lr=0.03, weight_decay=1e-3)
    exp = type("E", (), {"classes": (0, 1), "task_id": None, "batch_size": 2, "__len__": lambda self: 6})()
    m.labels.add(exp)
    trainer, epochs = m.task_trainer()
    group = trainer.optimizer.param_groups[0]
    if trainer.scheduler is None:
        return epochs, group["weight_decay"], [group["lr"]] * epochs
    base = group["initial_lr"]
    return epochs, group["weight_decay"], [base * trainer.scheduler.lr_lambdas[0](e) for e in range(epochs)]


@pytest.mark.parametrize("method", ["icarl", "bic", "wa", "podnet"])
def test_first_task_of_exemplar_methods_follows_table3_with_the_sampled_scheduler(harness, method):
    # Table 3: init epochs / lr / weight decay always; init milestones "only applied when 'StepLR' is selected"
    epochs, wd, cosine = first_task_lrs(harness, method, "cosine")
    assert (epochs, wd) == (8, 5e-4)
    assert cosine == pytest.approx([0.1 * (1 + math.cos(math.pi * e / 8)) / 2 for e in range(8)])
    _, _, step = first_task_lrs(harness, method, "steplr")
    assert step == pytest.approx([0.1, 0.1, 0.1, 0.01, 0.01, 0.01, 0.001, 0.001])
    _, _, constant = first_task_lrs(harness, method, "constant")
    assert constant == pytest.approx([0.1] * 8)
