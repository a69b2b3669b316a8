"""Functional task clustering (CLDyB section 3.1, algorithm 2).

Each candidate task gets an M-dim functional vector: G[i, m] = mean negative log-likelihood of
the task's samples under a k-NN classifier built on model m's features (alg. 2 line 6). The
k-NN classifier is leave-one-out over the task's own probe samples with cosine similarity, and
p(y|x) = (neighbours labelled y + 1) / (k + K) (Laplace smoothing keeps the log finite). k-means
(scikit-learn) splits the candidates into clusters; ancestral sampling (a uniform cluster, then a
uniform task from it, without replacement) fills the search space (alg. 2 lines 13-17).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F


def knn_nll(features: torch.Tensor, labels: torch.Tensor, num_classes: int, k: int) -> float:
    """Mean -log p(y|x) of leave-one-out k-NN (cosine) over one task's samples."""
    n = len(labels)
    if n < 2:
        raise ValueError(f"k-NN NLL needs at least 2 samples, got {n}")
    k = min(k, n - 1)
    unit = F.normalize(features.float(), dim=1)
    sim = unit @ unit.T
    sim.fill_diagonal_(-np.inf)                     # leave one out
    nn_idx = sim.topk(k, dim=1).indices
    hits = (labels[nn_idx] == labels[:, None]).sum(1).float()
    p = (hits + 1) / (k + num_classes)
    return float(-p.log().mean())


def functional_vectors(tasks: np.ndarray, features: Sequence[torch.Tensor], sample_class: torch.Tensor,
                       k: int = 5) -> np.ndarray:
    """Alg. 2 lines 3-8: the (J x M) matrix G. ``tasks``: (J x K) class positions; ``features[m]``:
    model m's features of every probe sample; ``sample_class``: each probe sample's class position."""
    sample_class = sample_class.to(features[0].device)
    G = np.empty((len(tasks), len(features)))
    for i, task in enumerate(tasks):
        t = torch.as_tensor(task, device=sample_class.device)
        member = (sample_class[:, None] == t[None, :])
        rows = member.any(1).nonzero().squeeze(1)
        labels = member[rows].float().argmax(1)     # position of the class within the task
        for m, feats in enumerate(features):
            G[i, m] = knn_nll(feats[rows], labels, len(task), k)
    return G


def cluster_tasks(G: np.ndarray, n_clusters: int, seed: int) -> np.ndarray:
    """Alg. 2 line 10: k-means on the functional vectors; a cluster label per task."""
    from sklearn.cluster import KMeans
    distinct = len(np.unique(np.round(G, 12), axis=0))
    n = max(1, min(n_clusters, distinct))
    if n == 1:
        return np.zeros(len(G), dtype=np.int64)
    return KMeans(n_clusters=n, n_init=10, random_state=seed).fit_predict(G)


def ancestral_sample(labels: np.ndarray, size: int, rng: np.random.Generator) -> list[int]:
    """Alg. 2 lines 13-17: ``size`` task indices, each from a uniformly drawn non-empty cluster,
    uniformly within it, without replacement."""
    clusters = {c: list(np.flatnonzero(labels == c)) for c in np.unique(labels)}
    out = []
    while len(out) < min(size, len(labels)):
        live = [c for c, members in clusters.items() if members]
        members = clusters[live[rng.integers(len(live))]]
        out.append(int(members.pop(rng.integers(len(members)))))
    return out
