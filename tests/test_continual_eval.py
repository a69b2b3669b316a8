"""Continual evaluation (issue 31; De Lange et al., ICLR 2023): eval_every = N scores the seen tasks'
fixed subsamples every N iterations; the metrics are pinned on a hand-made curve; finetune on a
two-task split shows the stability gap (task 1's accuracy falls within the first iterations of task 2);
scoring never changes the training (same accuracy matrix with and without it, for a method that sets
train mode once per task and uses dropout)."""
import dataclasses
import math

import numpy as np
import pytest

import clharness as clh
from clharness import metrics

SUITE = """
[suite]
name = "ce"
seeds = 1
methods = ["{method}"]
[defaults]
dataset = "digits"
backbone = "mlp"
epochs = 3
batch_size = 32
[[scenario]]
name = "two"
setting = "class-incremental"
tasks = 2
{extra}
"""

DROPOUT = '''
import torch, torch.nn as nn, torch.nn.functional as F
import clharness as clh

class Drop(clh.Method):
    name = "drop"
    settings = {clh.Setting.CLASS_IL}

    def __init__(self, context, **hp):
        super().__init__(context, **hp)
        d = 1
        for s in context.input_shape:
            d *= s
        self.model = nn.Sequential(nn.Flatten(), nn.Linear(d, 64), nn.ReLU(), nn.Dropout(0.5),
                                   nn.Linear(64, context.num_classes))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05)

    def learn(self, experience):
        self.model.train()   # once per task: a scoring pass that left eval mode would switch dropout off
        for x, y in experience.batches(epochs=self.context.epochs):
            self.opt.zero_grad(); F.cross_entropy(self.model(x), y).backward(); self.opt.step()

    def predict(self, x, task_id=None):
        self.model.eval()
        return self.model(x)

@clh.hookimpl
def clharness_add_methods(registry):
    registry.add(Drop)
'''


def test_the_metrics_of_a_hand_made_curve():
    pts = [{"iteration": 2, "task": 0, "acc": [0.6], "boundary": False},
           {"iteration": 4, "task": 0, "acc": [0.9], "boundary": True},
           {"iteration": 6, "task": 1, "acc": [0.3, 0.5], "boundary": False},
           {"iteration": 8, "task": 1, "acc": [0.5, 0.7], "boundary": False},
           {"iteration": 8, "task": 1, "acc": [0.7, 0.8], "boundary": True}]
    m = metrics.continual_metrics(pts, tasks=2)
    assert m["min_acc"] == pytest.approx(0.3)                       # task 0's minimum after it was learned
    assert m["wc_acc"] == pytest.approx(0.8 / 2 + 0.5 * 0.3)        # (1/T) a(E_T) + (1 - 1/T) min-ACC
    assert m["stability_gap"] == pytest.approx(0.9 - 0.3)           # end of task 0 minus the low in task 1
    assert m["gap_recovery"] == pytest.approx(0.7 - 0.3)
    assert m["a_auc"] == pytest.approx(np.mean([0.6, 0.4, 0.6]))    # periodic points, mean over seen tasks
    assert all(math.isnan(v) for v in metrics.continual_metrics([], 2).values())
    # three tasks: WC-ACC weighs the last task by 1/T = 1/3 and min-ACC by 2/3 (the two differ from T = 3 on)
    three = pts + [{"iteration": 10, "task": 2, "acc": [0.2, 0.4, 0.6], "boundary": False},
                   {"iteration": 12, "task": 2, "acc": [0.3, 0.5, 0.9], "boundary": True}]
    m3 = metrics.continual_metrics(three, tasks=3)
    assert m3["min_acc"] == pytest.approx((0.2 + 0.4) / 2)          # task 0's low 0.2, task 1's 0.4
    assert m3["wc_acc"] == pytest.approx(0.9 / 3 + 2 / 3 * 0.3)


def _run(tmp_path, method, extra, plugins=()):
    path = tmp_path / f"{method}-{len(extra)}.toml"
    path.write_text(SUITE.format(method=method, extra=extra))
    record, = clh.run(path, results=tmp_path / f"{path.stem}.sqlite", device="cpu", plugins=plugins)
    assert record.status == "passed", record.message
    return record


def test_finetune_shows_the_stability_gap_at_the_task_switch(tmp_path):
    r = _run(tmp_path, "finetune", "eval_every = 2\neval_samples = 50")
    pts = r.extra["continual"]["points"]
    assert r.extra["continual"]["samples_per_task"] == [50, 50]
    end0 = next(p for p in pts if p["task"] == 0 and p["boundary"])
    first_of_task1 = [p["acc"][0] for p in pts if p["task"] == 1 and not p["boundary"]][:10]
    assert end0["acc"][0] > 0.8
    assert min(first_of_task1) < end0["acc"][0] - 0.5   # the drop comes within the first 20 iterations
    assert r.metrics["stability_gap"] > 0.5 and r.metrics["min_acc"] < 0.3


def test_scoring_never_changes_the_training(tmp_path):
    plugin = tmp_path / "drop_plugin.py"
    plugin.write_text(DROPOUT)
    off = _run(tmp_path, "drop", "", plugins=str(plugin))
    on = _run(tmp_path, "drop", "eval_every = 3\neval_samples = 20", plugins=str(plugin))
    assert on.acc_matrix == off.acc_matrix                      # bit-identical training
    assert "continual" in on.extra and "continual" not in off.extra
    assert len(on.extra["continual"]["points"]) > 10
    assert off.key != on.key   # eval_every is part of the case


def test_eval_every_is_checked_and_left_out_of_old_keys():
    from clharness.engine.suites import LATER_KEYS
    assert LATER_KEYS["eval_every"] == 0 and LATER_KEYS["eval_samples"] == 100


def test_the_report_draws_the_curve_with_the_task_boundaries(tmp_path):
    from clharness.reporting.report import build_html
    r = _run(tmp_path, "finetune", "eval_every = 4\neval_samples = 30")
    page = build_html([r], workers=1)
    assert "continual evaluation" in page and page.count("<img") >= 4   # curve, radar, heatmap and the curve
    assert "stability gap" in page


def test_the_scorecard_shows_the_continual_metrics_by_default_where_runs_have_them(tmp_path):
    from clharness.reporting import scorecard
    r = _run(tmp_path, "finetune", "eval_every = 4\neval_samples = 30")
    out = tmp_path / "card.md"
    scorecard.write(out, [r])
    header = out.read_text().splitlines()[0]
    for heading in ("min-ACC", "WC-ACC", "stability gap", "gap recovery", "A_AUC"):
        assert heading in header
    plain = dataclasses.replace(r, metrics={k: v for k, v in r.metrics.items() if k not in scorecard.CONTINUAL})
    assert not set(scorecard.CONTINUAL) & set(scorecard.default_columns([plain]))
