"""Issue 15 item 6: each family's accuracy under its paper's definition when task test
sizes differ (CLDyB Final AA and M2I ACC are per-task means; GTEP's Acc is pooled)."""
import numpy as np
from pytest import approx

from clharness import metrics as M

# Two tasks: 10 test images for task 0, 90 for task 1.
R = np.array([[0.8, 0.0],
              [0.2, 0.9]])
SIZES = [10, 90]


def test_cldyb_final_aa_is_the_per_task_mean_of_the_last_row():
    # (0.2 + 0.9) / 2, not (0.2*10 + 0.9*90) / 100 = 0.83
    assert M.average_accuracy(R) == approx(0.55)
    out = M.all_metrics(R, weights=SIZES)
    assert out["aa"] == approx(0.55)
    assert out["final_acc"] == approx(0.83)   # GTEP/PyCIL: over all seen test samples


def test_m2i_acc_is_per_task_whatever_the_sizes():
    # eq. (1): mean of R[i, j] over i >= j = (0.8 + 0.2 + 0.9) / 3
    assert M.all_metrics(R, weights=SIZES)["acc"] == approx(1.9 / 3)
    assert M.all_metrics(R, weights=[50, 50])["acc"] == approx(1.9 / 3)


def test_gtep_avg_inc_acc_pools_seen_samples_per_step():
    # step 0: 0.8 on task 0 alone; step 1: pooled 0.83
    assert M.all_metrics(R, weights=SIZES)["avg_inc_acc"] == approx((0.8 + 0.83) / 2)


def test_equal_sizes_make_the_two_readings_agree():
    out = M.all_metrics(R, weights=[40, 40])
    assert out["aa"] == approx(out["final_acc"])


def test_docstring_table_names_every_family_key():
    doc = M.__doc__
    for family, key in [("GTEP", "final_acc"), ("M2I", "acc"), ("CLDyB", "aa"), ("STF", "final_acc")]:
        line = next(ln for ln in doc.splitlines() if ln.startswith(family))
        assert key in line
        assert key in M.METRIC_INFO
