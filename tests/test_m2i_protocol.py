"""M2I / I2M: the authors' protocol (issue 15 item 11), each definition pinned on a hand-made case.

The authors' public code (lifelonglab/M2I_I2M_benchmark, Avalanche 0.2.1) differs from the paper's
text: task-incremental runs share one head with labels 0-9 in every task, EWC keeps one penalty per
past task (Avalanche's mode="separate"), LwF adds distillation to plain cross-entropy over all
outputs, and their analysis code computes BWT as the mean of R[t,e] - R[t-1,e]."""
import numpy as np
import pytest

from clharness import metrics as M


# --- BWT as the authors' analysis code computes it --------------------------------------------

R3 = [[0.9, 0.1, 0.2],
      [0.6, 0.8, 0.1],
      [0.3, 0.5, 0.7]]


def test_bwt_authors_is_the_mean_of_consecutive_changes_on_earlier_tasks():
    # bwt_from_eval_results: for t in 1..2, e < t: R[t,e] - R[t-1,e]; three pairs
    by_hand = ((0.6 - 0.9) + (0.3 - 0.6) + (0.5 - 0.8)) / 3
    assert M.bwt_authors(R3) == pytest.approx(by_hand) == pytest.approx(-0.3)
    # eq. 2 compares every later step with R[j,j]: (0.6-0.9) + (0.3-0.9) + (0.5-0.8) over 3 pairs
    assert M.bwt(R3) == pytest.approx(-0.4)
    # the sum telescopes per task to R[T-1,e] - R[e,e], divided by T(T-1)/2 pairs
    R = np.random.default_rng(0).uniform(size=(6, 6))
    assert M.bwt_authors(R) == pytest.approx(sum(R[5, e] - R[e, e] for e in range(5)) / 15)
    assert M.bwt_authors([[0.4]]) == 0.0
    assert M.all_metrics(R3)["bwt_authors"] == M.bwt_authors(R3)


def test_bwt_authors_ignores_the_upper_triangle():
    R = np.array(R3)
    R[0, 1:] = np.nan
    R[1, 2] = np.nan
    assert M.bwt_authors(R) == pytest.approx(-0.3)
