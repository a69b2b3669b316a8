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


# --- item 2: every D^HT -> D^E pair the paper reports for pretrained models, in 20 and 10 tasks --------
SIDES = {"CUB-200": ("cub200", {}, []), "ImageNet-R": ("imagenet-r", {}, []),   # paper name -> dataset, options, classes
         "ImageNet-A": ("imagefolder", {"path": "imagenet-a"}, []),
         "CUB-100-1": ("cub200", {}, [0, 100]), "CUB-100-2": ("cub200", {}, [100, 200]),
         "ImageNet-R-1": ("imagenet-r", {}, [0, 100]), "ImageNet-R-2": ("imagenet-r", {}, [100, 200]),
         "ImageNet-A-2": ("imagefolder", {"path": "imagenet-a"}, [100, 200])}


def paper_pairs():
    """{(D^HT, D^E, tasks)} from the captions and column headings of Tables 15-22 (tests/data)."""
    import re
    pairs, dht = set(), None
    for line in (DATA / "gtep_pretrained_pairs.txt").read_text().splitlines():
        caption = re.match(r"^Table (1[5-9]|2[0-2]):.*D\^\{HT\} = \\text\{([^}]+)\}", line)
        if caption:
            dht = caption.group(2)
            continue
        heading = re.match(r"^(10|20) Tasks \(Acc / AvgAcc\)\t(.*)$", line)
        if heading and dht:
            for cell in heading.group(2).split("\t"):
                name = re.search(r"([A-Za-z]+-[A-Za-z0-9-]+?)(?:\}\$)?$", cell.strip()).group(1)
                pairs.add((dht, name, int(heading.group(1))))
            dht = None
    return pairs


def suite_pairs(name):
    from clharness.engine.suites import load_suite
    out = set()
    for s in load_suite(SUITES / f"{name}.toml").scenarios:
        o = s.options
        tasks = int(o["task_config"].split("-")[0])
        out.add(repr(((o["tune_dataset"], dict(o["tune_dataset_options"]), list(o["tune_classes"])),
                      (o["eval_dataset"], dict(o["eval_dataset_options"]), list(o["eval_classes"])), tasks)))
    return sorted(out)


def as_suite(pairs):
    return sorted({repr((SIDES[a], SIDES[b], t)) for a, b, t in pairs})


def test_pretrained_suites_ship_every_pair_of_tables_15_to_22():
    pairs = paper_pairs()
    assert len(pairs) == 2 * 2 * 2 + 2 * 3 * 2            # 200-class: 2 D^HT x 2 D^E x 2; 100-class: 2 x 3 x 2
    assert ("ImageNet-R", "CUB-200", 20) in pairs and ("ImageNet-R", "CUB-200", 10) in pairs   # Tables 17-18
    whole = {p for p in pairs if p[0] in ("CUB-200", "ImageNet-R")}   # Table 2 rows 1-2: whole datasets
    halves = pairs - whole
    assert suite_pairs("gtep-vit-200") == as_suite(whole)
    assert suite_pairs("gtep-vit") == as_suite(halves)
