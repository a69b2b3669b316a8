"""Hand-computed checks for clharness.metrics.

Every expected value below is worked out in the comments from the matrix entries,
not taken from the implementation.
"""
import math

import numpy as np
import pytest
from scipy import stats

from clharness import metrics as M

# R[i, j] = accuracy on task j after learning task i. Distinct values; task 0 gains
# at step 1 (0.6 -> 0.8) so max-based forgetting and AFM differ.
R3 = np.array([
    [0.6, 0.1, 0.2],
    [0.8, 0.9, 0.3],
    [0.5, 0.7, 0.4],
])
# "50 classes then 10, 10" style unequal test-set sizes.
W3 = [50, 10, 10]


def approx(x):
    return pytest.approx(x, abs=1e-12)


# --------------------------------------------------------------------- 3x3 by hand
def test_final_accuracy_unweighted_and_weighted():
    # last row 0.5, 0.7, 0.4 -> 1.6 / 3
    assert M.final_accuracy(R3) == approx(1.6 / 3)
    # (0.5*50 + 0.7*10 + 0.4*10) / 70 = (25 + 7 + 4) / 70 = 36/70
    assert M.final_accuracy(R3, W3) == approx(36 / 70)
    assert M.final_accuracy(R3, W3) != approx(M.final_accuracy(R3))
    # equal weights reproduce the plain mean
    assert M.final_accuracy(R3, [7, 7, 7]) == approx(1.6 / 3)


def test_average_incremental_accuracy_unweighted_and_weighted():
    # step 0: 0.6 ; step 1: (0.8 + 0.9)/2 = 0.85 ; step 2: 1.6/3
    assert M.average_incremental_accuracy(R3) == approx((0.6 + 0.85 + 1.6 / 3) / 3)
    # step 0: 0.6 ; step 1: (0.8*50 + 0.9*10)/60 = 49/60 ; step 2: 36/70
    expected_w = (0.6 + 49 / 60 + 36 / 70) / 3
    assert M.average_incremental_accuracy(R3, W3) == approx(expected_w)
    assert expected_w != approx(M.average_incremental_accuracy(R3))
    assert M.average_incremental_accuracy(R3, np.full(3, 3.0)) == approx((0.6 + 0.85 + 1.6 / 3) / 3)


def test_forgetting_uses_max_over_past_steps():
    # j=0: max(R00, R10) = max(0.6, 0.8) = 0.8, minus R20 = 0.5 -> 0.3
    # j=1: max(R11) = 0.9, minus R21 = 0.7 -> 0.2            mean = 0.25
    assert M.forgetting(R3) == approx(0.25)


def test_m2i_acc_bwt_fwt():
    # ACC, eq. 1: entries with i >= j: 0.6, 0.8, 0.9, 0.5, 0.7, 0.4 = 3.9 over 6 terms
    # (the printed N(N-1)/2 = 3 denominator would give 1.3 > 1).
    assert M.acc(R3) == approx(3.9 / 6)
    # BWT, eq. 2: (R10-R00) + (R20-R00) + (R21-R11) = 0.2 - 0.1 - 0.2 = -0.1 over 3
    assert M.bwt(R3) == approx(-0.1 / 3)
    # FWT, eq. 3: R01 + R02 + R12 = 0.1 + 0.2 + 0.3 = 0.6 over 3
    assert M.fwt(R3) == approx(0.2)


def test_fwt_with_baseline():
    b = [0.5, 0.05, 0.1]
    # (R01-b1) + (R02-b2) + (R12-b2) = 0.05 + 0.1 + 0.2 = 0.35 over 3
    assert M.fwt(R3, b) == approx(0.35 / 3)
    # task 0 is never a future task, so b0 must not matter
    assert M.fwt(R3, [0.0, 0.05, 0.1]) == approx(0.35 / 3)
    # a zero baseline is the paper's eq. 3
    assert M.fwt(R3, np.zeros(3)) == approx(M.fwt(R3))


def test_cldyb_afm_ala_ar():
    # AFM, eq. 1: ((R00-R20) + (R11-R21)) / 2 = (0.1 + 0.2)/2 = 0.15  (not max-based: != 0.25)
    assert M.afm(R3) == approx(0.15)
    # ALA, eq. 2: diagonal (0.6 + 0.9 + 0.4)/3
    assert M.ala(R3) == approx(1.9 / 3)
    assert M.ar(R3) == approx(-0.15)


def test_harmonic_mean():
    # 2*0.5*0.8/1.3 = 0.8/1.3
    assert M.harmonic_mean(0.5, 0.8) == approx(0.8 / 1.3)
    assert M.harmonic_mean(0.0, 0.8) == 0.0
    assert M.harmonic_mean(0.8, 0.0) == 0.0
    assert M.harmonic_mean(0.0, 0.0) == 0.0
    assert math.isnan(M.harmonic_mean(math.nan, 0.5))


def test_all_metrics_and_tables():
    out = M.all_metrics(R3, W3, baseline=[0.5, 0.05, 0.1])
    a, b = 36 / 70, (0.6 + 49 / 60 + 36 / 70) / 3
    expected = {
        "final_acc": a, "avg_inc_acc": b, "forgetting": 0.25, "bwt": -0.1 / 3,
        "bwt_authors": ((0.8 - 0.6) + (0.5 - 0.8) + (0.7 - 0.9)) / 3,   # M2I authors' code
        "fwt": 0.35 / 3, "acc": 0.65, "afm": 0.15, "ala": 1.9 / 3, "ar": -0.15,
        "hmean": 2 * a * b / (a + b), "aa": 1.6 / 3,
    }
    assert set(out) == set(expected)
    for k, v in expected.items():
        assert out[k] == approx(v), k
        assert isinstance(out[k], float), k
    # METRIC_INFO also names the metrics of a run's other views (task-IL, old/new, recency, top-5) and of
    # continual evaluation, which need more than R
    views = {"final_acc_task_il", "final_old_acc", "final_new_acc", "recency_bias", "final_top5",
             "min_acc", "wc_acc", "stability_gap", "gap_recovery", "a_auc"}
    assert set(M.METRIC_INFO) == set(out) | views and set(M.METRIC_INFO) == set(M.HIGHER_IS_BETTER)
    assert all(isinstance(s, str) and s for s in M.METRIC_INFO.values())
    lower_better = {k for k, up in M.HIGHER_IS_BETTER.items() if not up}
    assert lower_better == {"forgetting", "afm", "recency_bias", "stability_gap"}


# ------------------------------------------------------------------- edge cases
def test_single_task():
    R = [[0.7]]
    out = M.all_metrics(R)
    assert out["final_acc"] == approx(0.7)
    assert out["avg_inc_acc"] == approx(0.7)
    assert out["acc"] == approx(0.7)
    assert out["ala"] == approx(0.7)
    assert out["hmean"] == approx(0.7)
    for k in ("forgetting", "bwt", "fwt", "afm", "ar"):
        assert out[k] == 0.0, k
    assert M.all_metrics(R, weights=[5])["final_acc"] == approx(0.7)
    assert M.fwt(R, baseline=[0.1]) == 0.0


def test_nan_only_where_metric_reads_it():
    # Upper triangle unknown: every metric except FWT ignores it.
    R = R3.copy()
    R[np.triu_indices(3, k=1)] = np.nan
    out = M.all_metrics(R, W3)
    assert math.isnan(out["fwt"])
    assert out["forgetting"] == approx(0.25)  # max starts at i = j: no future entries
    assert out["bwt"] == approx(-0.1 / 3)
    assert out["avg_inc_acc"] == approx((0.6 + 49 / 60 + 36 / 70) / 3)
    # A NaN on the diagonal is read by ALA/BWT/AFM but not by final accuracy or FWT.
    R = R3.copy()
    R[0, 0] = np.nan
    assert M.final_accuracy(R) == approx(1.6 / 3)
    assert M.fwt(R) == approx(0.2)
    assert math.isnan(M.ala(R)) and math.isnan(M.bwt(R)) and math.isnan(M.afm(R))


def test_tiny_float_excursion_is_tolerated():
    R = np.array([[1.0 + 1e-9, 0.0], [1.0, -1e-9]])
    assert M.final_accuracy(R) == approx(0.5)
    assert M.ala(R) == approx(0.5)


# ------------------------------------------------------------------ statistics
def test_mean_ci_known_interval():
    m, h = M.mean_ci([1, 2, 3])
    # s = 1, t_{0.975, 2} = 4.302653 -> 4.302653 / sqrt(3) = 2.48414
    assert m == approx(2.0)
    assert h == pytest.approx(2.48414, abs=1e-5)
    # NaN dropped
    assert M.mean_ci([1, float("nan"), 2, 3]) == pytest.approx((2.0, 2.48414), abs=1e-5)
    # 90%: t_{0.95, 2} = 2.919986 -> 1.685855
    assert M.mean_ci([1, 2, 3], 0.90)[1] == pytest.approx(1.685855, abs=1e-5)
    assert M.mean_ci([0.4]) == (0.4, 0.0)
    m, h = M.mean_ci([])
    assert math.isnan(m) and math.isnan(h)
    m, h = M.mean_ci([float("nan")])
    assert math.isnan(m) and math.isnan(h)


def test_rank_correlation():
    up = M.rank_correlation([1, 2, 3, 4], [10, 20, 30, 40])
    assert up["spearman"] == approx(1.0) and up["kendall"] == approx(1.0)
    down = M.rank_correlation([1, 2, 3, 4], [40, 30, 20, 10])
    assert down["spearman"] == approx(-1.0) and down["kendall"] == approx(-1.0)
    a, b = [1, 2, 3, 4, 5], [2, 1, 4, 3, 5]
    mixed = M.rank_correlation(a, b)
    # rank differences -1, 1, -1, 1, 0: rho = 1 - 6*4/(5*24) = 0.8
    assert mixed["spearman"] == approx(0.8)
    # pairs (1,2) and (3,4) discordant, 8 concordant: tau = (8-2)/10 = 0.6
    assert mixed["kendall"] == approx(0.6)
    assert mixed["spearman_p"] == approx(stats.spearmanr(a, b)[1])
    assert mixed["kendall_p"] == approx(stats.kendalltau(a, b)[1])
    assert set(mixed) == {"spearman", "spearman_p", "kendall", "kendall_p"}


# ------------------------------------------------------------------ error paths
@pytest.mark.parametrize("bad, words", [
    ([0.1, 0.2, 0.3], ["2-D", "(3,)"]),
    (np.zeros((2, 2, 2)), ["2-D", "(2, 2, 2)"]),
    (np.zeros((0, 0)), ["empty", "T x T"]),
    (np.zeros((2, 3)), ["non-square", "(2, 3)"]),
    ([[65.0, 10.0], [50.0, 70.0]], ["[0, 1]", "70"]),
    ([[0.5, 0.1], [-0.2, 0.4]], ["[0, 1]", "-0.2"]),
    ([["a", "b"], ["c", "d"]], ["numeric"]),
])
def test_bad_matrix(bad, words):
    for fn in (M.final_accuracy, M.average_incremental_accuracy, M.forgetting, M.acc,
               M.bwt, M.fwt, M.afm, M.ala, M.ar, M.all_metrics):
        with pytest.raises(ValueError) as e:
            fn(bad)
        for w in words:
            assert w in str(e.value), (fn.__name__, str(e.value))


@pytest.mark.parametrize("w, words", [
    ([1, 2], ["weights", "length-T", "T=3", "(2,)"]),
    ([[1, 2, 3]], ["weights", "(1, 3)"]),
    ([5, -1, 5], ["weights", "non-negative"]),
    ([0, 0, 0], ["weights", "all zero"]),
    ([1, np.nan, 1], ["weights", "finite"]),
])
def test_bad_weights(w, words):
    for fn in (M.final_accuracy, M.average_incremental_accuracy, M.all_metrics):
        with pytest.raises(ValueError) as e:
            fn(R3, w)
        for word in words:
            assert word in str(e.value), (fn.__name__, str(e.value))


def test_leading_zero_weight_has_no_step0_data():
    # final accuracy is still defined: (0.7*1 + 0.4*1)/2
    assert M.final_accuracy(R3, [0, 1, 1]) == approx(0.55)
    with pytest.raises(ValueError, match=r"weights\[:1\] are zero"):
        M.average_incremental_accuracy(R3, [0, 1, 1])


@pytest.mark.parametrize("b, words", [
    ([0.1, 0.1], ["baseline", "T=3", "(2,)"]),
    ([0.1, 1.5, 0.1], ["baseline", "[0, 1]"]),
])
def test_bad_baseline(b, words):
    with pytest.raises(ValueError) as e:
        M.fwt(R3, b)
    for w in words:
        assert w in str(e.value)


def test_bad_statistics_inputs():
    with pytest.raises(ValueError, match="lengths 3 and 2"):
        M.rank_correlation([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="at least 2 items"):
        M.rank_correlation([1], [1])
    with pytest.raises(ValueError, match="confidence"):
        M.mean_ci([1, 2, 3], confidence=1.5)
    with pytest.raises(ValueError, match="non-negative"):
        M.harmonic_mean(-0.1, 0.5)
