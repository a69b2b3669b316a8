"""Simulated task-free (STF) streams: the generator of "Simulating task-free continual learning
streams from existing datasets" (Algorithms 1 and 2), and the conventional disjoint-task stream
it is compared with. Pure numpy/scipy, vectorised over instances (no torch), deterministic per seed.

Algorithm 1 gives each class j a time distribution on [0, 1]:
  sigma_j ~ truncated exponential on [0, gamma = 0.5] with mean mu_sigma   (eqs. 2-3, 8-11)
  mu_j    ~ U[0.5 - r_j, 0.5 + r_j],  r_j = sqrt(1/4 - sigma_j^2)           (eq. 7)
  D_j     = Beta(alpha_j, beta_j) with that mean and standard deviation     (eq. 5)
Algorithm 2 samples one timestamp per instance from its class's Beta and orders the dataset by
argsort of the timestamps.
"""
from __future__ import annotations

import math

import numpy as np
from scipy.optimize import brentq

GAMMA = 0.5                      # truncation of the standard deviations: 0 <= sigma <= 0.5 (Popoviciu)
_SMALL_RATE = 1e-6               # |lambda * gamma| below this: the series of eq. 9 around lambda = 0


def mu_sigma_for_tasks(tasks: int, scale: float = 1.0) -> float:
    """Appendix D: the standard deviation of a uniform of support 1/T is sqrt(1/12)/T; figure 3
    scales it by 0.5, 1, 2 or 4 to make streams harder or easier."""
    if not isinstance(tasks, (int, np.integer)) or isinstance(tasks, bool) or tasks < 1:
        raise ValueError(f"equivalent number of tasks = {tasks!r}; expected an integer >= 1")
    return check_mu_sigma(math.sqrt(1 / 12) / tasks * scale)


def check_mu_sigma(mu_sigma: float) -> float:
    if not isinstance(mu_sigma, (int, float, np.floating)) or not 0 < mu_sigma <= GAMMA:
        raise ValueError(f"mu_sigma = {mu_sigma!r} is outside (0, {GAMMA}]: the mean of standard deviations "
                         f"that lie in [0, {GAMMA}]; pick a value in (0, {GAMMA}] (e.g. sqrt(1/12)/T for T tasks)")
    return float(mu_sigma)


def truncated_exponential_mean(rate: float, gamma: float = GAMMA) -> float:
    """Eq. 3 / eq. 9: gamma / (1 - exp(-lambda gamma)) - 1 / lambda; gamma/2 at lambda = 0 (uniform)."""
    z = rate * gamma
    if abs(z) < _SMALL_RATE:
        return gamma / 2 + rate * gamma ** 2 / 12          # Taylor expansion, exact in the limit
    if z > 0:
        return gamma / -math.expm1(-z) - 1 / rate
    return gamma * math.exp(z) / math.expm1(z) - 1 / rate    # same value, no overflow for z << 0


def solve_rate(mu_sigma: float, gamma: float = GAMMA) -> float:
    """Algorithm 1 line 1: the rate lambda whose truncated exponential on [0, gamma] has mean mu_sigma
    (eq. 3 solved numerically). 0 where mu_sigma = gamma/2 (the uniform); +inf at mu_sigma = gamma."""
    check_mu_sigma(mu_sigma)
    if mu_sigma >= gamma:
        return math.inf                                    # all mass at gamma
    if abs(mu_sigma - gamma / 2) < 1e-12:
        return 0.0
    # The mean rises monotonically from 0 (lambda -> -inf) to gamma (lambda -> +inf), approximately
    # -1/lambda and gamma - 1/lambda at the ends, which gives a bracket around the root.
    lo, hi = -2 / mu_sigma - 1, 2 / (gamma - mu_sigma) + 1
    return brentq(lambda r: truncated_exponential_mean(r, gamma) - mu_sigma, lo, hi, xtol=1e-12, rtol=1e-12)


def sample_truncated_exponential(rate: float, size: int, rng: np.random.Generator,
                                 gamma: float = GAMMA) -> np.ndarray:
    """Inverse-transform sampling, eq. 11: x = ln[(e^{lambda gamma} - 1) u + 1] / lambda, u ~ U[0, 1].
    For lambda > 0 the same x is computed as gamma + ln(u + (1 - u) e^{-lambda gamma}) / lambda, which
    does not overflow; lambda = 0 is the uniform on [0, gamma]."""
    u = rng.random(size)
    if math.isinf(rate):
        return np.full(size, gamma)
    if abs(rate * gamma) < _SMALL_RATE:
        return gamma * u
    if rate > 0:
        return gamma + np.log(u + (1 - u) * math.exp(-rate * gamma)) / rate
    return np.log1p(math.expm1(rate * gamma) * u) / rate


def class_distributions(num_classes: int, mu_sigma: float, rng: np.random.Generator
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm 1: a (mean, standard deviation) per class. Means come from the shrunk support of
    eq. 7, so sigma_j^2 <= mu_j (1 - mu_j) (eq. 6) holds for every class."""
    if num_classes < 2:
        raise ValueError(f"a stream needs at least 2 classes, got {num_classes}; a one-class dataset has "
                         "no class distribution to change")
    sigma = sample_truncated_exponential(solve_rate(mu_sigma), num_classes, rng)     # line 3
    r = np.sqrt(np.clip(0.25 - sigma ** 2, 0.0, None))                              # line 4, eq. 7
    mu = rng.uniform(0.5 - r, 0.5 + r)                                              # line 5
    return mu, sigma


def beta_parameters(mu: np.ndarray, sigma: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eq. 5 (Algorithm 1 lines 6-7): Beta shape parameters with mean mu and standard deviation sigma."""
    mu, sigma = np.asarray(mu, float), np.asarray(sigma, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        common = mu * (1 - mu) / sigma ** 2 - 1
    return mu * common, (1 - mu) * common


def sample_timestamps(labels: np.ndarray, mu: np.ndarray, sigma: np.ndarray,
                      rng: np.random.Generator) -> np.ndarray:
    """Algorithm 2 lines 1-4: t_i ~ Beta(alpha_{y_i}, beta_{y_i}), one vectorised draw. The limits
    the Beta cannot express are taken exactly: sigma_j = 0 is a point mass at mu_j (disjoint
    one-class tasks), sigma_j^2 = mu_j (1 - mu_j) (e.g. sigma_j = 0.5) the two-point distribution
    on {0, 1} with P(1) = mu_j (alpha, beta -> 0)."""
    labels = np.asarray(labels)
    alpha, beta = beta_parameters(mu, sigma)
    point = sigma <= 0
    two_point = ~point & (alpha <= 1e-12)
    regular = ~point & ~two_point
    t = np.empty(len(labels))
    a, b = alpha[labels], beta[labels]
    reg = regular[labels]
    t[reg] = rng.beta(a[reg], b[reg])
    pt = point[labels]
    t[pt] = np.asarray(mu)[labels[pt]]
    tp = two_point[labels]
    t[tp] = (rng.random(int(tp.sum())) < np.asarray(mu)[labels[tp]]).astype(float)
    return t


def order_by_timestamps(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Algorithm 2 line 5: p = argsort(t). Equal timestamps (point masses, Beta draws that round to
    0 or 1) are ordered at random rather than by dataset position, which would group them by class:
    the sort runs on a random shuffle, and a comparison sort treats equal keys alike, so tied
    instances come out in uniformly random order (and the unstable sort is ~4x faster than a stable one)."""
    shuffle = rng.permutation(len(t))
    return shuffle[np.argsort(t[shuffle])]


def check_labels(labels: np.ndarray, num_classes: int | None = None) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer) or len(labels) and labels.min() < 0:
        raise ValueError("labels must be a 1-d array of non-negative integer class ids")
    counts = np.bincount(labels, minlength=num_classes or 0)
    empty = np.flatnonzero(counts == 0)
    if len(empty):
        raise ValueError(f"class {int(empty[0])} has no instances (classes must be 0..C-1 with at least one "
                         f"instance each; empty: {empty.tolist()[:10]}); relabel or drop empty classes")
    if len(counts) < 2:
        raise ValueError(f"the dataset has {len(counts)} class; an STF stream needs at least 2 classes")
    return labels


def stf_order(labels: np.ndarray, mu_sigma: float, seed: int | np.random.Generator,
              num_classes: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Algorithms 1 and 2: the STF permutation of a dataset with these labels (classes 0..C-1).
    Returns (order, mu, sigma): ``labels[order]`` is the stream; mu/sigma the class distributions."""
    labels = check_labels(labels, num_classes)
    rng = np.random.default_rng(seed)
    mu, sigma = class_distributions(int(labels.max()) + 1 if num_classes is None else num_classes, mu_sigma, rng)
    t = sample_timestamps(labels, mu, sigma, rng)
    return order_by_timestamps(t, rng), mu, sigma


def disjoint_order(labels: np.ndarray, tasks: int, seed: int | np.random.Generator,
                   class_order: np.ndarray | None = None) -> np.ndarray:
    """The conventional stream: classes (in ``class_order``, default a seeded shuffle) cut into
    ``tasks`` groups of equal size (sizes differ by at most one where tasks does not divide the
    classes), each task's instances shuffled, tasks one after the other."""
    labels = check_labels(labels)
    rng = np.random.default_rng(seed)
    c = int(labels.max()) + 1
    if not isinstance(tasks, (int, np.integer)) or not 1 <= tasks <= c:
        raise ValueError(f"tasks = {tasks!r} must be between 1 and the number of classes ({c})")
    order = rng.permutation(c) if class_order is None else np.asarray(class_order)
    task_of_class = np.empty(c, int)
    for t, group in enumerate(np.array_split(order, tasks)):
        task_of_class[group] = t
    return order_by_timestamps(task_of_class[labels].astype(float), rng)


def chunk_frequencies(stream_labels: np.ndarray, num_classes: int, chunks: int = 200) -> np.ndarray:
    """Figure 2: relative frequency of each class in each of ``chunks`` equal parts of the stream,
    shape (chunks, num_classes), rows summing to 1."""
    if not 1 <= chunks <= len(stream_labels):
        raise ValueError(f"chunks = {chunks} must be between 1 and the stream length {len(stream_labels)}")
    parts = np.array_split(np.asarray(stream_labels), chunks)
    return np.stack([np.bincount(p, minlength=num_classes) / len(p) for p in parts])
