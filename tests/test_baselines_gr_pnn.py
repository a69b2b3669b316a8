"""Progressive Neural Networks and Generative Replay (issue 16, the M2I baselines) on the
quickstart digits split: the property each paper states, and the comparison with finetune."""
import numpy as np
import pytest
import torch

import clharness as clh
from test_methods_reference import METHODS, accuracy, context, digits, run, split  # noqa: F401

TASK_IL = clh.Setting.TASK_IL
SEEDS = (0, 1, 2)


# --- PNN -----------------------------------------------------------------------------------------

def test_pnn_earlier_columns_are_frozen_bit_identical(digits):  # noqa: F811
    """Rusu et al. 2016, section 2: earlier columns are frozen when a task arrives, so their
    weights, and the predictions for their tasks, never change."""
    tasks, exps, tests = split(digits, 0, TASK_IL)
    torch.manual_seed(0)
    pnn = METHODS["pnn"](context(0, TASK_IL, tasks, epochs=1))
    pnn.learn(exps[0])
    first = {k: v.clone() for k, v in pnn.model.columns[0].state_dict().items()}
    x0 = next(iter(tests[0].batches(256)))[0]
    logits0 = pnn.predict(x0, task_id=0)
    per_column = sum(p.numel() for p in pnn.model.columns[0].parameters())
    for exp in exps[1:]:
        pnn.learn(exp)
    assert len(pnn.model.columns) == 5
    assert all(torch.equal(v, first[k]) for k, v in pnn.model.columns[0].state_dict().items())
    assert torch.equal(pnn.predict(x0, task_id=0), logits0)
    # later columns carry lateral adapters from every earlier column
    assert [len(c.adapters) for c in pnn.model.columns] == [0] + [2] * 4      # 2 hidden layers -> 2 adapters
    assert pnn.model.columns[4].adapters[0].V.in_features == 4 * 200
    assert pnn.memory_report().parameters == sum(p.numel() for p in pnn.model.parameters()) > 5 * per_column


def test_pnn_beats_finetune_task_incremental(digits):  # noqa: F811
    pnn = [run("pnn", digits, s, TASK_IL) for s in SEEDS]
    finetune = [run("finetune", digits, s, TASK_IL) for s in SEEDS]
    print("\ntask-IL final accuracy pnn", np.round(pnn, 3), "finetune", np.round(finetune, 3))
    assert min(pnn) > 0.98
    assert np.mean(pnn) > np.mean(finetune) + 0.01


def test_pnn_is_task_incremental_only():
    assert METHODS["pnn"].settings == {TASK_IL}
