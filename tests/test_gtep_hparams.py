"""GTEP hyperparameter spaces: the general space (paper tables 4-5), the milestone rule,
conditional sampling, collection-time errors, and the LR schedules they drive."""
import random
from collections import Counter

import pytest
import torch

from clharness.hparams import (TABLE4, TABLE5, Choice, HParamError, Int, check_space, choice_from_values,
                               general_space, milestones, sample)
from clharness.method import Context, Setting
from clharness.toolkit.training import Trainer


@pytest.mark.parametrize("epochs, n, expected", [
    (30, 2, [12, 24]),            # 30 * [2/5, 4/5]
    (70, 3, [20, 40, 60]),        # 70 * [2/7, 4/7, 6/7]
    (90, 4, [20, 40, 60, 80]),    # 90 * [2/9, 4/9, 6/9, 8/9]
    (160, 3, [45, 91, 137]),      # floored: 45.7, 91.4, 137.1
])
def test_milestones_follow_the_papers_rule(epochs, n, expected):
    assert milestones(epochs, n) == expected


def test_general_space_has_table4_sets_and_steplr_only_parameters():
    space = general_space()
    assert list(space) == ["epochs", "lr", "num_milestones", "lr_decay", "batch_size", "weight_decay",
                           "scheduler", "optimizer"]
    assert space["epochs"].values == (30, 70, 120, 160, 200)
    assert space["num_milestones"].when == {"scheduler": ["steplr"]}
    assert general_space(TABLE5)["optimizer"].values == ("sgd", "adam", "adamw")
    assert general_space(epochs=[1, 2])["epochs"].values == (1, 2)
    draws = [sample(space, random.Random(i)) for i in range(400)]
    for d in draws:
        assert ("num_milestones" in d) == ("lr_decay" in d) == (d["scheduler"] == "steplr")
        assert d["lr"] in TABLE4["lr"] and d["batch_size"] in TABLE4["batch_size"]
    counts = Counter(d["scheduler"] for d in draws)
    assert 150 < counts["steplr"] < 250                      # uniform over the two schedulers
    assert sample(space, random.Random(7)) == sample(space, random.Random(7))   # seeded, no global state


def test_conditional_sampling_draws_parents_first_whatever_the_declaration_order():
    space = {"decay": Choice([0.1, 0.5], when={"sched": ["step"]}), "sched": Choice(["step", "cos"])}
    draws = [sample(space, random.Random(i)) for i in range(100)]
    assert all(("decay" in d) == (d["sched"] == "step") for d in draws)
    assert {d["sched"] for d in draws} == {"step", "cos"}


@pytest.mark.parametrize("space, message", [
    ({"lr": "emptied"}, "'lr' has an empty choice list"),
    ({"num_milestones": Int(2, 4, when={"scheduler": ["steplr"]})},
     "'num_milestones' is conditional on 'scheduler', which the space does not declare"),
    ({"a": Choice([1], when={"b": [1]}), "b": Choice([1], when={"a": [1]})}, "conditional on itself"),
    ({"s": Choice(["x"]), "d": Choice([1], when={"s": []})}, "empty list of values"),
])
def test_empty_or_contradictory_spaces_are_errors(space, message):
    if space.get("lr") == "emptied":   # a choice list emptied after construction (Choice([]) raises itself)
        space["lr"] = Choice([0.1])
        object.__setattr__(space["lr"], "values", ())
    with pytest.raises(HParamError, match=message):
        check_space("method 'm'", space)


def test_search_sets_from_suite_files_must_be_non_empty_lists():
    with pytest.raises(HParamError, match=r"search set lr = \[\] must be a non-empty list"):
        choice_from_values("gtep", "lr", [])
    assert choice_from_values("gtep", "lr", [0.1, 0.2]).values == (0.1, 0.2)


def _lrs(kind, epochs=10, epoch_steps=3, **kw):
    w = torch.nn.Parameter(torch.zeros(1))
    ctx = Context(setting=Setting.CLASS_IL, num_classes=2, input_shape=(1,), epochs=epochs)
    trainer = Trainer("m", torch.optim.SGD([w], lr=1.0), ctx)
    trainer.schedule(kind, epochs, epoch_steps, **kw)
    lrs = []
    for _ in range(epochs * epoch_steps):
        lrs.append(trainer.optimizer.param_groups[0]["lr"])
        trainer.step(lambda: (w * 1.0).sum())
    return lrs[::epoch_steps]   # the lr of each epoch


def test_steplr_decays_at_the_rule_milestones_and_cosine_anneals_per_epoch():
    step = _lrs("steplr", epochs=10, num_milestones=2, lr_decay=0.5)   # milestones [4, 8]
    assert step == pytest.approx([1, 1, 1, 1, 0.5, 0.5, 0.5, 0.5, 0.25, 0.25])
    cos = _lrs("cosine", epochs=4)
    assert cos == pytest.approx([1.0, (1 + 2 ** -0.5) / 2, 0.5, (1 - 2 ** -0.5) / 2])
