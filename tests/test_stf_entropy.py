"""STF appendix E: the Beta keeps 99.84% of the truncated normal's entropy (clharness.benchmarks.stf.entropy)."""
import numpy as np
import pytest
from scipy import stats

from clharness.benchmarks.stf.entropy import (PAPER_CAPTURED, discretised_entropy, entropy_captured,
                                              truncated_normal_moments)


def test_truncated_normal_moments_match_scipy():
    mu, sigma = np.array([0.1, 0.5, 0.93]), np.array([0.05, 0.4, 0.3])
    mean, sd = truncated_normal_moments(mu, sigma)
    for i in range(3):
        ref = stats.truncnorm(-mu[i] / sigma[i], (1 - mu[i]) / sigma[i], loc=mu[i], scale=sigma[i])
        assert mean[i] == pytest.approx(ref.mean(), abs=1e-12)
        assert sd[i] == pytest.approx(ref.std(), abs=1e-12)


def test_discretised_entropy_hand_cases():
    rows = np.array([[1.0, 1.0, 1.0, 1.0],          # uniform on 4 points: log 4
                     [0.0, 3.0, 0.0, 0.0],          # point mass: 0
                     [np.inf, 1.0, 1.0, 0.0],       # infinite endpoint left out: uniform on 2 points
                     [0.0, 0.0, 0.0, 0.0]])         # mass between grid points: point mass, 0
    assert discretised_entropy(rows) == pytest.approx([np.log(4), 0.0, np.log(2), 0.0])


def test_reproduces_paper_9984():
    # Appendix E: 10^5 draws of mu ~ U[0, 1], sigma ~ U[0, 0.5]; "the Beta captures 99.84%".
    assert entropy_captured(100_000, seed=0) == pytest.approx(PAPER_CAPTURED, abs=0.001)


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="grid_points"):
        entropy_captured(10, grid_points=1)
