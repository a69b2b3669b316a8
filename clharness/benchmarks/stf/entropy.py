"""STF appendix E: how much of the truncated normal's entropy the Beta with the same moments keeps.

The paper (section 3.2 and appendix E) draws mu ~ U[0, 1] and sigma ~ U[0, 0.5], truncates N(mu, sigma^2)
to [0, 1], takes the truncated normal's own mean and standard deviation, builds the Beta with those
moments (eq. 5) and reports, over 10^5 draws, that "the Beta captures 99.84% of the entropy of the
truncated normal".

Which entropy: the appendix does not name it, and no code for it is public. Differential entropy on
[0, 1] is <= 0 (0 only for the uniform), so a "captured fraction" of it is not meaningful (the ratio
of two negative numbers is above 1 when the Beta has less entropy). We therefore use the Shannon
entropy (nats) of each density evaluated on ``grid_points`` equally spaced points of [0, 1]
(endpoints included) and normalised to a probability vector -- the discretised entropy, which is
positive -- and report the ratio of the mean entropies over the draws:
    captured = mean_i H(Beta_i) / mean_i H(TN_i).
What this reproduces, and to how many digits: the simulation (10^5 draws, the truncated normal, the
moment-matched Beta) as appendix E describes it; the figure 0.9984 only under our measure. With 1000
grid points, seed 0, it gives 0.998396, the paper's 99.84% to its 4 digits, but the grid was chosen by
us and moves the figure in the third digit: 100 points give 0.994718, 500 0.997995, 2,000 0.998633
(seed 0). So the 4-digit agreement is a match by choice of measure, not an independent confirmation;
what holds for any grid we tried is the paper's claim that the Beta keeps more than 99% of the
truncated normal's entropy. Deliberate choices the paper leaves
open, listed so they can be changed: the grid (1000 points incl. endpoints; an infinite Beta density at
an endpoint, alpha or beta < 1, is left out of the vector), the ratio of means rather than the mean of
per-draw ratios (a draw with sigma -> 0 has entropy -> 0 and would make a per-draw ratio undefined),
and entropy 0 for a density that is zero on every grid point (sigma below the grid spacing).
"""
from __future__ import annotations

import numpy as np
from scipy.special import betaln, ndtr

from .streams import GAMMA, beta_parameters

PAPER_CAPTURED = 0.9984          # appendix E / section 3.2 (4 digits; ours matches it with grid_points=1000)


def truncated_normal_moments(mu: np.ndarray, sigma: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation of N(mu, sigma^2) truncated to [0, 1] (closed form)."""
    a, b = -mu / sigma, (1.0 - mu) / sigma
    z = ndtr(b) - ndtr(a)
    pa, pb = np.exp(-a * a / 2) / np.sqrt(2 * np.pi), np.exp(-b * b / 2) / np.sqrt(2 * np.pi)
    mean = mu + sigma * (pa - pb) / z
    var = sigma ** 2 * (1 + (a * pa - b * pb) / z - ((pa - pb) / z) ** 2)
    return mean, np.sqrt(var)


def discretised_entropy(density: np.ndarray) -> np.ndarray:
    """Shannon entropy (nats) of each row of densities on a grid, normalised to sum to one; non-finite
    values (an infinite Beta density at 0 or 1) are left out. A row that is zero on every grid point
    (sigma so small that the mass falls between two points) is a point mass at this resolution: 0."""
    p = np.where(np.isfinite(density), density, 0.0)
    total = p.sum(axis=1, keepdims=True)
    p = np.divide(p, total, out=np.zeros_like(p), where=total > 0)
    logp = np.log(p, out=np.zeros_like(p), where=p > 0)
    return -(p * logp).sum(axis=1)


def _densities(mu, sigma, x):
    """Truncated normal and moment-matched Beta densities on x, one row per draw."""
    z = ndtr((1 - mu) / sigma) - ndtr(-mu / sigma)
    u = (x[None, :] - mu[:, None]) / sigma[:, None]
    tn = np.exp(-u * u / 2) / (np.sqrt(2 * np.pi) * sigma[:, None] * z[:, None])
    m, s = truncated_normal_moments(mu, sigma)
    alpha, beta = beta_parameters(m, s)
    with np.errstate(divide="ignore", invalid="ignore"):
        logb = ((alpha[:, None] - 1) * np.log(x[None, :]) + (beta[:, None] - 1) * np.log1p(-x[None, :])
                - betaln(alpha, beta)[:, None])
        beta_pdf = np.exp(logb)
    return tn, np.nan_to_num(beta_pdf, nan=0.0, posinf=np.inf)


def entropy_captured(draws: int = 100_000, grid_points: int = 1000, seed: int = 0,
                     chunk: int = 2000) -> float:
    """Appendix E: mean discretised entropy of the moment-matched Beta over that of the truncated
    normal, for ``draws`` draws of mu ~ U[0, 1], sigma ~ U[0, 0.5] (see the module docstring)."""
    if draws < 1 or grid_points < 2:
        raise ValueError(f"draws={draws!r}, grid_points={grid_points!r}; expected draws >= 1 and "
                         "grid_points >= 2")
    rng = np.random.default_rng(seed)
    mu = rng.uniform(0.0, 1.0, draws)
    sigma = rng.uniform(0.0, GAMMA, draws)
    sigma = np.maximum(sigma, np.finfo(float).tiny)        # U[0, 0.5) can return exactly 0
    x = np.linspace(0.0, 1.0, grid_points)
    h_beta = h_tn = 0.0
    for i in range(0, draws, chunk):
        tn, beta = _densities(mu[i:i + chunk], sigma[i:i + chunk], x)
        h_tn += discretised_entropy(tn).sum()
        h_beta += discretised_entropy(beta).sum()
    return float(h_beta / h_tn)
