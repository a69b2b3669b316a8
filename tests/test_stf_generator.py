"""The STF stream generator (Algorithms 1-2, eqs. 3/5/7/9/11): properties, extremes, bad input."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from clharness.benchmarks.stf import streams


def _labels(counts):
    return np.repeat(np.arange(len(counts)), counts)


# --- the truncated exponential of the standard deviations (eqs. 3, 9, 11) ---

@pytest.mark.parametrize("mu_sigma", [0.0144, math.sqrt(1 / 12) / 5, 0.1, 0.3, 0.45])
def test_rate_solves_eq3_and_samples_have_that_mean(mu_sigma):
    rate = streams.solve_rate(mu_sigma)
    assert streams.truncated_exponential_mean(rate) == pytest.approx(mu_sigma, abs=1e-10)
    x = streams.sample_truncated_exponential(rate, 200_000, np.random.default_rng(0))
    assert x.min() >= 0 and x.max() <= 0.5
    assert x.mean() == pytest.approx(mu_sigma, abs=4 * x.std() / math.sqrt(len(x)))
    # the samples follow the truncated exponential's CDF, eq. 10
    cdf = lambda v: np.expm1(rate * v) / math.expm1(rate * 0.5)   # noqa: E731
    assert stats.kstest(x[:5000], cdf).pvalue > 0.001


def test_rate_zero_limit_is_the_uniform():
    assert streams.solve_rate(0.25) == 0.0
    # eq. 9 is continuous through lambda = 0: the series and the closed form agree on both sides
    for r in (-1e-5, 1e-5):
        assert streams.truncated_exponential_mean(r) == pytest.approx(0.25 + r / 48, abs=1e-9)
    assert abs(streams.solve_rate(0.25 + 1e-9)) < 1e-6
    x = streams.sample_truncated_exponential(0.0, 100_000, np.random.default_rng(1))
    assert stats.kstest(x, stats.uniform(0, 0.5).cdf).pvalue > 0.001


def test_rate_sign_follows_the_mean():
    assert streams.solve_rate(0.01) < 0 < streams.solve_rate(0.4)
    assert math.isinf(streams.solve_rate(0.5))
    assert np.all(streams.sample_truncated_exponential(math.inf, 5, np.random.default_rng(0)) == 0.5)


def test_mu_sigma_from_tasks_follows_appendix_d():
    assert streams.mu_sigma_for_tasks(12) == pytest.approx(math.sqrt(1 / 12) / 12)
    assert streams.mu_sigma_for_tasks(5, scale=4) == pytest.approx(4 * math.sqrt(1 / 12) / 5)


# --- Algorithm 1 and eq. 5 ---

def test_class_distributions_keep_eq6_and_eq5_moments():
    mu, sigma = streams.class_distributions(5000, 0.1, np.random.default_rng(3))
    assert np.all(sigma ** 2 <= mu * (1 - mu) + 1e-15)             # eq. 6 via the shrunk support of eq. 7
    assert np.all(np.abs(mu - 0.5) <= np.sqrt(0.25 - sigma ** 2) + 1e-15)
    assert sigma.mean() == pytest.approx(0.1, abs=0.005)
    a, b = streams.beta_parameters(mu[:20], sigma[:20])
    assert stats.beta(a, b).mean() == pytest.approx(mu[:20])
    assert stats.beta(a, b).std() == pytest.approx(sigma[:20], rel=1e-6)


# --- Algorithm 2: permutation properties ---

@settings(max_examples=40, deadline=None, derandomize=True)
@given(counts=st.lists(st.integers(1, 60), min_size=2, max_size=12),
       mu_sigma=st.floats(1e-4, 0.5), seed=st.integers(0, 2**32 - 1))
def test_every_instance_appears_exactly_once(counts, mu_sigma, seed):
    labels = _labels(counts)
    order, mu, sigma = streams.stf_order(labels, mu_sigma, seed)
    assert np.array_equal(np.sort(order), np.arange(len(labels)))
    assert len(mu) == len(sigma) == len(counts)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(num_classes=st.integers(2, 8), mu_sigma=st.floats(0.01, 0.3), seed=st.integers(0, 2**32 - 1))
def test_per_class_mean_timestamps_match_the_sampled_means(num_classes, mu_sigma, seed):
    labels = _labels([4000] * num_classes)
    rng = np.random.default_rng(seed)
    mu, sigma = streams.class_distributions(num_classes, mu_sigma, rng)
    t = streams.sample_timestamps(labels, mu, sigma, rng)
    alpha, beta = streams.beta_parameters(mu, sigma)
    for j in range(num_classes):
        tj = t[labels == j]
        n = len(tj)
        assert tj.mean() == pytest.approx(mu[j], abs=5 * sigma[j] / math.sqrt(n) + 1e-12)
        # Standard error of a sample std: sigma * sqrt((excess kurtosis + 2) / 4n). Near-degenerate
        # Betas (a mean by the edge, alpha or beta << 1) have huge kurtosis, so their std converges slowly.
        kurt = float(stats.beta(alpha[j], beta[j]).stats(moments="k")) if alpha[j] > 1e-12 else -2.0
        assert tj.std() == pytest.approx(sigma[j], abs=5 * sigma[j] * math.sqrt((kurt + 2) / (4 * n)) + 1e-9)


def test_stream_position_follows_the_class_means():
    labels = _labels([500] * 10)
    order, mu, _ = streams.stf_order(labels, 0.02, seed=5)
    position = np.empty(len(order))
    position[order] = np.arange(len(order))
    mean_position = np.array([position[labels == j].mean() for j in range(10)])
    assert stats.spearmanr(mean_position, mu).statistic > 0.95


def test_deterministic_per_seed():
    labels = _labels([30, 50, 20, 40])
    a, mu_a, s_a = streams.stf_order(labels, 0.05, seed=7)
    b, mu_b, s_b = streams.stf_order(labels, 0.05, seed=7)
    c, _, _ = streams.stf_order(labels, 0.05, seed=8)
    assert np.array_equal(a, b) and np.array_equal(mu_a, mu_b) and np.array_equal(s_a, s_b)
    assert not np.array_equal(a, c)


# --- the two extremes of section 4.4 ---

def test_sigma_zero_gives_disjoint_one_class_tasks():
    labels = _labels([40, 25, 60, 35, 50])
    rng = np.random.default_rng(0)
    mu = rng.uniform(size=5)
    t = streams.sample_timestamps(labels, mu, np.zeros(5), rng)
    stream = labels[streams.order_by_timestamps(t, rng)]
    runs = stream[np.r_[True, stream[1:] != stream[:-1]]]
    assert np.array_equal(runs, np.argsort(mu))        # each class once, one contiguous block, by mean
    # the limit mu_sigma -> 0 of the full generator tends to the same
    order, mu, _ = streams.stf_order(labels, 1e-6, seed=1)
    s = labels[order]
    assert (s[1:] != s[:-1]).sum() == 4


def test_sigma_half_gives_an_iid_stream():
    """sigma_j = 0.5 for every class (mu_sigma = 0.5): class frequencies per chunk are what a
    uniform shuffle gives (chi-square homogeneity test of the chunk x class table)."""
    labels = _labels([300] * 10)
    order, mu, sigma = streams.stf_order(labels, 0.5, seed=11)
    assert np.all(sigma == 0.5) and np.all(mu == 0.5)
    table = np.stack([np.bincount(c, minlength=10) for c in np.array_split(labels[order], 20)])
    assert stats.chi2_contingency(table).pvalue > 0.01
    # a strongly non-stationary stream fails the same test
    order, _, _ = streams.stf_order(labels, 0.02, seed=11)
    table = np.stack([np.bincount(c, minlength=10) for c in np.array_split(labels[order], 20)])
    assert stats.chi2_contingency(table).pvalue < 1e-10


def test_disjoint_order_is_tasks_of_equal_class_groups():
    labels = _labels([20] * 6)
    order = streams.disjoint_order(labels, tasks=3, seed=0)
    assert np.array_equal(np.sort(order), np.arange(len(labels)))
    blocks = labels[order].reshape(3, 40)
    assert [len(set(b)) for b in blocks] == [2, 2, 2]
    assert len(set(blocks.ravel())) == 6
    # 47 classes in 12 tasks (EMNIST): groups of 4 and 3 classes
    labels = _labels([2] * 47)
    stream = labels[streams.disjoint_order(labels, 12, seed=0, class_order=np.arange(47))]
    task = np.searchsorted(np.cumsum([len(g) for g in np.array_split(np.arange(47), 12)]), stream, side="right")
    assert np.all(np.diff(task) >= 0) and sorted(np.bincount(task) // 2) == [3] * 1 + [4] * 11


def test_disjoint_order_shuffles_instances_within_each_task():
    """Within a task the instances come in random order, not in dataset order: the rank correlation
    between an instance's place in its task block and its place in the dataset is ~0 (1.0 when the
    task's instances keep dataset order), and a two-class task alternates between its classes."""
    labels = _labels([20] * 6)                      # dataset sorted by class
    taus, switches = [], []
    for seed in range(20):
        order = streams.disjoint_order(labels, tasks=3, seed=seed)
        for block in order.reshape(3, 40):
            taus.append(stats.kendalltau(np.arange(40), block).statistic)
            switches.append(np.count_nonzero(np.diff(labels[block])))
    # random order: tau ~ N(0, 0.11) per block, so the mean |tau| of 60 blocks is ~0.09
    assert np.mean(np.abs(taus)) < 0.2
    # 20 + 20 instances in random order: expected 2*20*20/40 = 20 class switches (sorted: 1)
    assert abs(np.mean(switches) - 20.0) < 1.5


def test_chunk_frequencies_rows_sum_to_one():
    f = streams.chunk_frequencies(np.array([0, 0, 1, 1, 2, 2, 2, 0]), 3, chunks=4)
    assert f.shape == (4, 3)
    assert np.allclose(f.sum(1), 1)
    assert np.allclose(f[1], [0, 1, 0])


# --- bad input ---

@pytest.mark.parametrize("bad", [0, -0.1, 0.5000001, 1.0, math.nan])
def test_mu_sigma_outside_range_is_refused(bad):
    with pytest.raises(ValueError, match=r"mu_sigma = .* outside \(0, 0.5\]"):
        streams.stf_order(_labels([5, 5]), bad, seed=0)


def test_empty_class_and_single_class_are_refused():
    with pytest.raises(ValueError, match="class 1 has no instances"):
        streams.stf_order(np.array([0, 0, 2, 2]), 0.1, seed=0)
    with pytest.raises(ValueError, match="class 2 has no instances"):
        streams.stf_order(np.array([0, 1]), 0.1, seed=0, num_classes=3)
    with pytest.raises(ValueError, match="1 class; an STF stream needs at least 2"):
        streams.stf_order(np.zeros(10, int), 0.1, seed=0)


def test_bad_disjoint_tasks_and_chunks_are_refused():
    with pytest.raises(ValueError, match=r"tasks = 7 must be between 1 and the number of classes \(6\)"):
        streams.disjoint_order(_labels([3] * 6), 7, seed=0)
    with pytest.raises(ValueError, match="chunks = 9 must be between 1 and the stream length 8"):
        streams.chunk_frequencies(np.zeros(8, int), 2, chunks=9)
    with pytest.raises(ValueError, match="expected an integer >= 1"):
        streams.mu_sigma_for_tasks(0)


def test_tied_timestamps_come_out_in_random_order():
    """Equal timestamps (here every instance at t = 0.5) are not left in dataset (class) order."""
    labels = _labels([500, 500])
    rng = np.random.default_rng(0)
    t = streams.sample_timestamps(labels, np.array([0.5, 0.5]), np.zeros(2), rng)
    first_half = labels[streams.order_by_timestamps(t, rng)][:500]
    assert stats.binomtest(int((first_half == 0).sum()), 500, 0.5).pvalue > 0.001
