"""Greedy hard-task sampling (CLDyB section 3.1, eq. 3, algorithm 1), vectorised.

Psi(p, q) = 1/M sum_m z(cos(mu_{m,p}, mu_{m,q})) over the M models' class prototypes, z = min-max
normalisation to [0, 1]. A task's sampling probability is proportional to the product of its pairwise
potentials; each of the J candidates starts from a uniformly drawn class and adds, K-1 times, the
class maximising the product of potentials with the classes chosen so far (alg. 1 lines 7-16).
Products are taken as sums of logs (K up to 20+ factors in [0, 1] would underflow); all J candidates
grow in parallel, one (J x C) step per class.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

_EPS = 1e-12


class SamplingError(ValueError):
    """K or J out of range for the classes left in the pool."""


def check_task_counts(available: int, k: int, j: int) -> None:
    if k < 2:
        raise SamplingError(f"classes_per_task K = {k}: a classification task needs K >= 2 classes")
    if j < 1:
        raise SamplingError(f"candidates J = {j}: sample at least one candidate task")
    if available < k:
        raise SamplingError(f"the pool has {available} unused classes left, fewer than classes_per_task "
                            f"K = {k}; add datasets to the pool, lower K or shorten the sequence (steps)")


def potentials(prototypes: Sequence[torch.Tensor]) -> torch.Tensor:
    """Eq. 3: the (C x C) pairwise potential from M (C x D_m) prototype matrices. z() runs over the
    pairs p != q (the diagonal, cos = 1, would otherwise always be the maximum) of the classes given:
    for alg. 1 line 4 pass the candidate classes C = D minus C^{<t} only, since min and max change with
    the class set (and with them the greedy products)."""
    if not prototypes:
        raise SamplingError("potentials need the prototypes of at least one model (M >= 1)")
    c = prototypes[0].shape[0]
    off = ~torch.eye(c, dtype=torch.bool, device=prototypes[0].device)
    psi = torch.zeros(c, c, device=prototypes[0].device)
    for mu in prototypes:
        if mu.shape[0] != c:
            raise SamplingError(f"prototype matrices disagree on the number of classes: {mu.shape[0]} vs {c}")
        unit = F.normalize(mu.float(), dim=1)
        cos = unit @ unit.T
        lo, hi = cos[off].min(), cos[off].max()
        psi += (cos - lo) / (hi - lo).clamp_min(_EPS)
    psi /= len(prototypes)
    return psi.clamp_(0, 1).masked_fill_(~off, 1.0)


def greedy_tasks(psi: torch.Tensor, k: int, j: int, rng: np.random.Generator) -> np.ndarray:
    """Alg. 1: J candidate tasks (a (J x K) array of class positions) from the (C x C) potential."""
    c = psi.shape[0]
    check_task_counts(c, k, j)
    log_psi = psi.clamp_min(_EPS).log()
    first = torch.from_numpy(rng.choice(c, j, replace=j > c)).to(psi.device)   # line 10: uniform first class
    chosen = torch.empty(j, k, dtype=torch.long, device=psi.device)
    chosen[:, 0] = first
    score = log_psi[first].clone()                         # (J, C): log prod of potentials with chosen
    taken = torch.zeros(j, c, dtype=torch.bool, device=psi.device)
    taken[torch.arange(j), first] = True
    for step in range(1, k):                               # line 12: argmax_i prod_q Psi(C_i, C_q)
        nxt = score.masked_fill(taken, -np.inf).argmax(1)
        chosen[:, step] = nxt
        taken[torch.arange(j), nxt] = True
        score += log_psi[nxt]
    return chosen.cpu().numpy()


def uniform_tasks(groups: Sequence[Sequence[int]], k: int, j: int, rng: np.random.Generator) -> np.ndarray:
    """Ablation (b) of figure 7: K classes uniformly from one dataset (drawn uniformly among those
    with K classes left), or from the whole pool when no single dataset has K left."""
    total = sum(len(g) for g in groups)
    check_task_counts(total, k, j)
    big = [g for g in groups if len(g) >= k]
    everything = [c for g in groups for c in g]
    out = np.empty((j, k), dtype=np.int64)
    for i in range(j):
        group = big[rng.integers(len(big))] if big else everything
        out[i] = rng.choice(np.asarray(group), k, replace=False)
    return out


def unique_tasks(tasks: np.ndarray) -> np.ndarray:
    """Candidates as class sets, duplicates dropped (greedy runs from different starts often meet)."""
    seen, keep = set(), []
    for row in tasks:
        key = frozenset(row.tolist())
        if key not in seen:
            seen.add(key)
            keep.append(np.sort(row))
    return np.stack(keep)


def task_similarity(psi: torch.Tensor, tasks: np.ndarray, previous: Sequence[int]) -> np.ndarray:
    """Mean potential between each candidate's classes and the ``previous`` classes (those of every
    previously encountered task; tasks have K classes each, so each task weighs the same): ablation
    (d) of figure 7 picks the task most similar to all previous tasks instead of searching."""
    prev = torch.as_tensor(list(previous), device=psi.device)
    t = torch.from_numpy(tasks).to(psi.device)
    return psi[t][:, :, prev].mean(dim=(1, 2)).cpu().numpy()
