"""Issue 31: class-IL and task-IL from one run, top-5, old/new accuracy, recency bias and the task x
task confusion blocks, pinned on a hand-made case (fixed logits, written out by hand) and on a real run
(task-IL accuracy >= class-IL accuracy in every cell: masking can only remove wrong answers)."""
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from clharness import metrics
from clharness.engine.runner import evaluate_views


class Data:
    def __init__(self, y):
        self.y = torch.tensor(y)

    def __len__(self):
        return len(self.y)

    def batches(self, batch_size):
        for i in range(0, len(self.y), batch_size):
            y = self.y[i:i + batch_size]
            yield y.float()[:, None], y   # x carries the label: the fake method reads it


class Fixed:
    """Logits by hand: each label's row of TABLE (6 classes, tasks {0,1}, {2,3}, {4,5})."""
    TABLE = torch.tensor([
        [5., 1., 0., 0., 6., 0.],   # y=0: class-IL says 4 (task 2), task-IL (0 vs 1) says 0 (right)
        [0., 3., 0., 0., 0., 0.],   # y=1: right both ways
        [0., 0., 1., 2., 0., 0.],   # y=2: says 3 both ways (wrong)
        [0., 0., 0., 4., 0., 0.],   # y=3: right
        [0., 0., 0., 0., 0., 7.],   # y=4: says 5 (wrong both ways), 4 is second: right at top-2
        [0., 0., 0., 0., 0., 2.],   # y=5: right
    ])

    def predict(self, x, task_id=None):
        return self.TABLE[x[:, 0].long()]


def scenario():
    tasks = [SimpleNamespace(classes=[0, 1], test=Data([0, 1, 1])), SimpleNamespace(classes=[2, 3], test=Data([2, 3])),
             SimpleNamespace(classes=[4, 5], test=Data([4, 5, 5, 5]))]
    return SimpleNamespace(tasks=tasks, num_classes=6, spec=SimpleNamespace(eval_batch_size=2))


def test_both_views_top5_and_confusion_by_hand():
    rows = evaluate_views(Fixed(), scenario(), torch.device("cpu"), after=2)
    assert rows["class_il"].tolist() == pytest.approx([2 / 3, 1 / 2, 3 / 4])
    assert rows["task_il"].tolist() == pytest.approx([3 / 3, 1 / 2, 3 / 4])
    assert rows["top5"].tolist() == pytest.approx([1.0, 1.0, 1.0])    # 6 classes: top-5 holds nearly all
    # task 0's samples: y=0 predicted 4 (task 2), y=1 twice right -> [2, 0, 1]
    assert rows["confusion"] == [[2, 0, 1], [0, 2, 0], [0, 0, 4]]


def test_old_new_and_recency_by_hand():
    R = [[0.9, 0.0], [0.2, 0.8]]
    old, new = metrics.old_new_accuracy(R, weights=[10, 30])
    assert (old, new) == (pytest.approx(0.2), pytest.approx(0.8))
    assert math.isnan(metrics.old_new_accuracy([[0.5]])[0])
    assert metrics.recency_bias([[2, 0, 1], [0, 2, 0], [0, 0, 4]]) == pytest.approx(5 / 9)
    assert metrics.recency_bias([[0, 3], [0, 3]]) == 1.0          # finetune's pure recency


def test_a_class_il_run_stores_its_task_il_view_and_it_is_never_lower(tmp_path):
    import clharness as clh
    records = clh.run("quickstart", methods=["finetune", "er"], seeds=1, quick=True, results=tmp_path / "r.sqlite",
                      device="cpu")
    for r in records:
        R, R_til = np.array(r.acc_matrix), np.array(r.acc_matrix_task_il)
        assert R.shape == R_til.shape == (5, 5)
        assert (R_til >= R - 1e-12).all(), r.method
        assert r.metrics["final_acc_task_il"] >= r.metrics["final_acc"]
        assert len(r.confusion) == 5 and np.array(r.confusion[-1]).sum() == sum(r.task_sizes)
        assert 0 <= r.metrics["recency_bias"] <= 1
        assert r.top5_matrix == []   # 10 classes: no top-5
    finetune = next(r for r in records if r.method == "finetune")
    assert finetune.metrics["recency_bias"] > 0.9 and finetune.metrics["final_old_acc"] < 0.05


def test_top5_is_stored_from_100_classes_on_and_never_below_top1(tmp_path):
    import clharness as clh
    suite = tmp_path / "hundred.toml"
    suite.write_text('[suite]\nname = "hundred"\nmethods = ["finetune"]\n[[scenario]]\nname = "ci"\n'
                     'dataset = "synthetic"\ndataset_options = { num_classes = 100, train_per_class = 4, '
                     'test_per_class = 2, image_size = 4, channels = 1 }\ntasks = 2\nepochs = 1\n'
                     'backbone = "mlp"\nbackbone_options = { hidden = 16, layers = 1 }\n')
    (r,) = clh.run(str(suite), seeds=1, results=tmp_path / "r.sqlite", device="cpu")
    R, top5 = np.array(r.acc_matrix), np.array(r.top5_matrix)
    assert top5.shape == R.shape == (2, 2)
    assert (top5 >= R - 1e-12).all() and r.metrics["final_top5"] >= r.metrics["final_acc"]
    assert (top5 > R).any()   # 100 classes, near chance: the top five catch more than the top one


def test_the_scorecard_shows_both_views_when_asked():
    from clharness.reporting.report import render_text
    from clharness.results import RunRecord
    records = [RunRecord(suite="s", scenario="ci", method="er", seed=seed, status="passed",
                         metrics={"final_acc": 0.5 + seed / 10, "final_acc_task_il": 0.9}) for seed in (0, 1)]
    text = render_text(records, ["final_acc", "final_acc_task_il"])
    head = next(line for line in text.splitlines() if "final acc" in line)
    assert "final acc (task-IL)" in head                  # a second column, the task-IL view, named
    assert "0.550" in text and "0.900" in text
