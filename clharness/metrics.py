"""Continual-learning metrics computed from the accuracy matrix.

Conventions (shared with the rest of the harness):

* ``R`` is T x T, ``R[i, j]`` = accuracy in [0, 1] on task ``j``'s test data after
  learning task ``i`` (0-based). The whole matrix is filled, including ``j > i``
  (not-yet-learned tasks), because FWT reads the strict upper triangle.
* ``weights`` (optional, length T) are per-task test-sample counts. They are used
  only where a paper defines the metric as "accuracy on all seen test data"
  (final accuracy, the per-step accuracy inside average incremental accuracy): the
  sample-weighted mean of per-task accuracies equals the pooled accuracy, which is
  what class-incremental papers report when tasks have unequal class counts.
  Per-task averaged metrics (BWT, FWT, ACC, AA, AFM, ALA, forgetting) ignore weights.
* NaN entries of ``R`` are allowed wherever the metric does not read them (e.g. the
  upper triangle for BWT, everything but the last row for final accuracy); a NaN
  that a metric does read makes that metric NaN rather than raising.

Papers (plain text in /work/shared/papers/):

* [GTEP]  "Hyperparameters in Continual Learning: A Reality Check", Sec. 4.1 and
  Algorithm 1 (Acc, AvgAcc, harmonic mean used by SelectBestHyperparameter).
* [M2I]   Faber et al. 2024, "From MNIST to ImageNet and back: benchmarking
  continual curriculum learning", Sec. 2.3, eqs. (1)-(3) (ACC, BWT, FWT, after
  Diaz-Rodriguez et al. 2018).
* [CLDyB] "CLDyB: Towards dynamic benchmarking for continual learning with
  pre-trained models", Sec. 2 eqs. (1)-(2) (AFM, ALA), Sec. 5 (Final AA, the mean
  over tasks of the final accuracies) and Sec. 5 footnote 1 (AR).

Which accuracy each family's scorecard shows, under which name (issue 15 item 6).
Two accuracies differ when task test sizes differ: the pooled, sample-weighted one
("accuracy over all seen test samples", PyCIL's ``accy`` total) and the per-task mean.

=========  ==========================  ======================================  =========
family     paper's name                definition                              key
=========  ==========================  ======================================  =========
GTEP       Acc, AvgAcc (Sec. 4.1)      sample-weighted over all seen test      final_acc,
                                       samples (PyCIL, the paper's code)       avg_inc_acc
M2I / I2M  ACC (eq. 1), BWT, FWT       per-task mean over i >= j               acc
CLDyB      Final AA, AR, ALA (Sec. 5)  per-task mean of the last row of R      aa, ar, ala
STF        final accuracy              accuracy on the one pooled test set     final_acc
splits     final acc, avg inc acc      sample-weighted (as GTEP)               final_acc
=========  ==========================  ======================================  =========
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

__all__ = [
    "final_accuracy", "average_incremental_accuracy", "average_accuracy", "forgetting", "acc", "bwt",
    "bwt_authors", "fwt", "afm", "ala", "ar", "harmonic_mean", "mean_ci", "rank_correlation",
    "all_metrics", "METRIC_INFO", "HIGHER_IS_BETTER",
]

# Accuracies computed in float32 can land a few ulps outside [0, 1]; tolerate that
# (and clip) rather than reject a legitimate 1.0000001.
_TOL = 1e-6


# ----------------------------------------------------------------------------- checks
def _matrix(R) -> np.ndarray:
    try:
        R = np.array(R, dtype=float)
    except (TypeError, ValueError) as e:
        raise ValueError(f"R must be a numeric T x T accuracy matrix: {e}") from None
    if R.ndim != 2:
        raise ValueError(f"R must be a 2-D T x T accuracy matrix (rows = after task i, "
                         f"columns = task j); got {R.ndim}-D array of shape {R.shape}")
    if R.size == 0:
        raise ValueError(f"R is empty (shape {R.shape}); expected a T x T matrix with T >= 1")
    if R.shape[0] != R.shape[1]:
        raise ValueError(f"R must be square T x T (one row per training step, one column "
                         f"per task); got non-square shape {R.shape}")
    seen = R[~np.isnan(R)]
    if seen.size and (seen.min() < -_TOL or seen.max() > 1 + _TOL):
        raise ValueError(f"R values must be accuracies in [0, 1] (fractions, not percent); "
                         f"got range [{seen.min():g}, {seen.max():g}] in a {R.shape} matrix")
    return np.clip(R, 0.0, 1.0)  # clip keeps NaN


def _vector(v, T: int, name: str, what: str) -> np.ndarray:
    try:
        v = np.array(v, dtype=float)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name} must be a numeric length-{T} array of {what}: {e}") from None
    if v.shape != (T,):
        raise ValueError(f"{name} must be a length-T array of {what} with T={T} "
                         f"(matching R's {T} x {T}); got shape {v.shape}")
    if not np.all(np.isfinite(v)):
        raise ValueError(f"{name} must be finite; got {v.tolist()}")
    return v


def _weights(weights, T: int) -> np.ndarray:
    if weights is None:
        return np.ones(T)
    w = _vector(weights, T, "weights", "per-task test-sample counts")
    if np.any(w < 0):
        raise ValueError(f"weights must be non-negative sample counts; got {w.tolist()}")
    if not np.any(w > 0):
        raise ValueError(f"weights are all zero; at least one of the {T} tasks needs "
                         f"test samples")
    return w


# ----------------------------------------------------------------- GTEP (Acc, AvgAcc)
def final_accuracy(R, weights=None) -> float:
    """Final accuracy ``Acc`` [GTEP, Sec. 4.1]: "classification accuracy for the
    entire validation dataset after training the final task", i.e. the last row of
    ``R`` averaged over all T tasks, sample-weighted when ``weights`` is given.
    Reads only ``R[T-1, :]``."""
    R = _matrix(R)
    w = _weights(weights, R.shape[0])
    return float(R[-1] @ w / w.sum())


def average_incremental_accuracy(R, weights=None) -> float:
    """Average incremental accuracy ``AvgAcc = 1/T sum_{t=1}^T Acc_t`` [GTEP, Sec. 4.1],
    with ``Acc_t`` the accuracy "on the validation data up to task t": after step i
    the (weighted) mean of ``R[i, 0..i]``. Reads the lower triangle incl. diagonal.

    With weights, a step whose seen tasks all have zero weight has no test data, so
    leading zero weights raise ValueError."""
    R = _matrix(R)
    T = R.shape[0]
    w = _weights(weights, T)
    seen_w = np.cumsum(w)  # total weight of tasks 0..i
    if seen_w[0] == 0:
        first = int(np.argmax(seen_w > 0))
        raise ValueError(f"weights[:{first}] are zero: accuracy after step 0 covers no "
                         f"test samples; got weights {w.tolist()}")
    lower = np.tril(np.ones((T, T), dtype=bool))
    # np.where (not multiplication by the mask) so NaN above the diagonal stays out.
    step_acc = (np.where(lower, R, 0.0) * w).sum(axis=1) / seen_w
    return float(step_acc.mean())


def harmonic_mean(acc: float, avg_acc: float) -> float:
    """Harmonic mean ``2ab/(a+b)`` of final accuracy and average incremental
    accuracy: the criterion SelectBestHyperparameter maximises in [GTEP, Algorithm 1,
    described in Sec. 4.1]. Defined as 0.0 when either input is 0 (also avoids 0/0);
    NaN in, NaN out."""
    a, b = float(acc), float(avg_acc)
    if math.isnan(a) or math.isnan(b):
        return math.nan
    if a < 0 or b < 0:
        raise ValueError(f"harmonic_mean needs non-negative accuracies; got acc={a}, avg_acc={b}")
    return 0.0 if a == 0 or b == 0 else 2 * a * b / (a + b)


def average_accuracy(R) -> float:
    """Final average accuracy AA [CLDyB, Sec. 5 "Final AA", Table 1 "Final average
    accuracy"]: ``1/T sum_j R[T-1, j]``, the per-task mean of the accuracies after the
    last task. Every task counts once whatever its test size, unlike
    :func:`final_accuracy` with weights (pooled over samples). Reads ``R[T-1, :]``."""
    return float(np.mean(_matrix(R)[-1]))


# -------------------------------------------------------------- Chaudhry forgetting
def forgetting(R) -> float:
    """Average forgetting (Chaudhry et al., ECCV 2018, "Riemannian Walk"; the paper
    is not in /work/shared/papers, so the index range is the harness spec):
    ``1/(T-1) sum_{j<T-1} [max_{i in [j, T-2]} R[i,j] - R[T-1,j]]``. The max starts
    at i = j, i.e. only accuracies after task j was learned count as "knowledge"
    (future-task entries above the diagonal are ignored). 0.0 for T == 1.
    Reads the lower triangle incl. diagonal."""
    R = _matrix(R)
    T = R.shape[0]
    if T == 1:
        return 0.0
    past = R[:-1, :-1]  # rows/cols 0..T-2
    best = np.where(np.tril(np.ones((T - 1, T - 1), dtype=bool)), past, -np.inf).max(axis=0)
    return float(np.mean(best - R[-1, :-1]))


# -------------------------------------------------------------- M2I (ACC, BWT, FWT)
def acc(R) -> float:
    """Average accuracy ACC [M2I, Sec. 2.3, eq. (1)]: mean of ``R[i, j]`` over
    ``i >= j`` (every seen task at every step).

    Paper-reading note: eq. (1) prints the denominator as N(N-1)/2, but the sum over
    i >= j has N(N+1)/2 terms; with N(N-1)/2 the value can exceed 1 and is undefined
    for N = 1, contradicting the text ("the average performance over all tasks the
    model has seen so far") and the cited source (Diaz-Rodriguez et al. 2018, which
    divides by N(N+1)/2). We divide by the number of terms, N(N+1)/2."""
    R = _matrix(R)
    return float(R[np.tril(np.ones(R.shape, dtype=bool))].mean())


def bwt(R) -> float:
    """Backward transfer BWT [M2I, Sec. 2.3, eq. (2)]:
    ``sum_{i=2}^N sum_{j=1}^{i-1} (R[i,j] - R[j,j]) / (N(N-1)/2)``, i.e. the mean of
    ``R[i,j] - R[j,j]`` over all i > j (every later step, not only the last one as in
    Lopez-Paz & Ranzato 2017). Negative = forgetting. 0.0 for T == 1 (no pairs; the
    paper's 0/0 is taken as "no transfer"). Reads the lower triangle incl. diagonal."""
    R = _matrix(R)
    T = R.shape[0]
    if T == 1:
        return 0.0
    return float((R - np.diag(R))[np.tril(np.ones((T, T), dtype=bool), k=-1)].mean())


def bwt_authors(R) -> float:
    """BWT as the M2I authors' analysis code computes it (lifelonglab/M2I_I2M_benchmark,
    ``analysis/metrics/eval_results_metrics.py``, ``bwt_from_eval_results``): the mean of
    ``R[t,e] - R[t-1,e]`` over all t > e, i.e. each step's change on every earlier task, where
    eq. (2) compares with ``R[j,j]``. The sum telescopes per task to ``R[T-1,e] - R[e,e]``, so this
    is ``sum_e (R[T-1,e] - R[e,e]) / (T(T-1)/2)``. 0.0 for T == 1. Reads the lower triangle incl.
    the diagonal."""
    R = _matrix(R)
    T = R.shape[0]
    if T == 1:
        return 0.0
    steps = (R[1:] - R[:-1])[:, :-1]   # steps[t-1, e] = R[t, e] - R[t-1, e], e < T-1
    return float(steps[np.tril(np.ones((T - 1, T - 1), dtype=bool))].mean())


def fwt(R, baseline=None) -> float:
    """Forward transfer FWT [M2I, Sec. 2.3, eq. (3)]:
    ``sum_{i<j} R[i,j] / (N(N-1)/2)``, the mean accuracy on not-yet-learned tasks.

    The paper subtracts no baseline (its reported FWT "floats around the chance
    level (10%)", Sec. 5), so ``baseline=None`` reproduces eq. (3) exactly, i.e. a 0
    baseline. If ``baseline`` (length T, accuracy ``b_j`` of a randomly initialised
    model on task j, as in Lopez-Paz & Ranzato 2017) is given, ``b_j`` is subtracted
    from every term: mean over i < j of ``R[i,j] - b_j`` -- an extension, not in M2I.
    0.0 for T == 1 (no future tasks). Reads the strict upper triangle only."""
    R = _matrix(R)
    T = R.shape[0]
    b = np.zeros(T) if baseline is None else _vector(baseline, T, "baseline",
                                                     "per-task random-init accuracies")
    if baseline is not None and (b.min() < -_TOL or b.max() > 1 + _TOL):
        raise ValueError(f"baseline values must be accuracies in [0, 1]; got {b.tolist()}")
    if T == 1:
        return 0.0
    return float((R - b)[np.triu(np.ones((T, T), dtype=bool), k=1)].mean())


# -------------------------------------------------------------- CLDyB (AFM, ALA, AR)
def afm(R) -> float:
    """Average forgetting measure AFM [CLDyB, Sec. 2, eq. (1)] at the final step t = T:
    ``1/(t-1) sum_{t'=1}^{t-1} Acc(T^t', f^t') - Acc(T^t', f^t)`` =
    mean over j < T-1 of ``R[j,j] - R[T-1,j]``.

    Paper-reading notes: the 1/(t-1) is read as applying to the whole sum of
    differences (the only reading that is an average). Although CLDyB cites Chaudhry
    et al. 2018, eq. (1) compares with the accuracy right after learning task t'
    (``R[j,j]``), not the maximum over steps, so this can differ from
    :func:`forgetting`. T == 1 gives 0.0 (eq. (1)'s 1/(t-1) is undefined; nothing
    can have been forgotten). Reads the diagonal and the last row."""
    R = _matrix(R)
    if R.shape[0] == 1:
        return 0.0
    return float(np.mean(np.diag(R)[:-1] - R[-1, :-1]))


def ala(R) -> float:
    """Average learning accuracy ALA [CLDyB, Sec. 2, eq. (2)] at t = T:
    ``1/t sum_{t'=1}^t Acc(T^t', f^t')`` = mean of the diagonal ``R[j, j]`` (accuracy
    on each task right after learning it; plasticity). Reads the diagonal only."""
    return float(np.mean(np.diag(_matrix(R))))


def ar(R) -> float:
    """Average retention AR [CLDyB, Sec. 5 "Implementation details", footnote 1 (and
    App. B.3 footnote 4)]: "Equivalent to negative Average Forgetting Measure", negated
    so that higher is better; reported in Fig. 4. ``AR = -AFM``."""
    return -afm(R)


# ------------------------------------------------------------------------ statistics
def mean_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """(mean, half_width) of the two-sided Student-t confidence interval
    ``mean +- t_{(1+c)/2, n-1} * s / sqrt(n)`` (s = sample std, ddof=1).
    NaN values are dropped; one value gives half_width 0.0; none gives (nan, nan)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1); got {confidence}")
    v = np.asarray(values, dtype=float).ravel()
    v = v[~np.isnan(v)]
    if v.size == 0:
        return math.nan, math.nan
    if v.size == 1:
        return float(v[0]), 0.0
    from scipy import stats   # imported here: the runner and a name check need no scipy
    half = stats.t.ppf((1 + confidence) / 2, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size)
    return float(v.mean()), float(half)


def rank_correlation(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """Spearman rho and Kendall tau (with p-values, scipy.stats) between two score
    lists for the same items, e.g. method rankings under two protocols. Constant
    inputs give NaN (scipy's behaviour)."""
    a, b = np.asarray(a, dtype=float).ravel(), np.asarray(b, dtype=float).ravel()
    if a.size != b.size:
        raise ValueError(f"rank_correlation needs equal-length score lists for the same "
                         f"items; got lengths {a.size} and {b.size}")
    if a.size < 2:
        raise ValueError(f"rank_correlation needs at least 2 items; got {a.size}")
    from scipy import stats
    rho, rho_p = stats.spearmanr(a, b)
    tau, tau_p = stats.kendalltau(a, b)
    return {"spearman": float(rho), "spearman_p": float(rho_p),
            "kendall": float(tau), "kendall_p": float(tau_p)}


# ------------------------------------------------------------------------- views of one run
def old_new_accuracy(R, weights=None) -> tuple[float, float]:
    """(old, new) after the last task: sample-weighted accuracy on the earlier tasks' test data, and
    accuracy on the last task's (BiC and WA's old/new gap). ``old`` is NaN with one task."""
    R = _matrix(R)
    T = R.shape[0]
    w = _weights(weights, T)
    new = float(R[T - 1, T - 1])
    if T == 1:
        return math.nan, new
    return float(np.average(R[T - 1, :T - 1], weights=w[:T - 1])), new


def recency_bias(confusion) -> float:
    """Share of all test predictions after the last task that fall on the last task's classes (the bias
    towards new classes BiC and WA correct; compare with the last task's share of the test data).
    ``confusion``: the T x T block matrix of that step, row j = task j's test samples, column k = how
    many of them were predicted as one of task k's classes."""
    C = np.asarray(confusion, dtype=float)
    return float(C[:, -1].sum() / C.sum()) if C.sum() else math.nan


# ------------------------------------------------------------------------- continual evaluation
def continual_metrics(points: Sequence[dict], tasks: int) -> dict[str, float]:
    """Metrics of a continual-evaluation curve (engine.continual_eval): ``points`` in order, each
    ``{"iteration", "task" (being learned), "acc" (accuracy on tasks 0..task), "boundary" (scored at the
    task's end)}``. Definitions (De Lange et al. 2023, sec. 4):

    - ``min_acc``: average over the tasks k < T-1 of the minimum accuracy on task k over every point
      after task k was learned (points while a later task trains, and its end);
    - ``wc_acc``: worst-case accuracy, (1/T) a(last task, final) + (1 - 1/T) min_acc;
    - ``stability_gap``: per task switch k -> k+1, the accuracy on tasks 0..k at the end of task k minus
      its minimum while task k+1 trains (mean over switches); ``gap_recovery``: that accuracy at the end
      of task k+1 minus the same minimum;
    - ``a_auc``: the area under the anytime-accuracy curve (Caccia et al. 2022, Koh et al. 2022), the
      mean over the periodic points of the mean accuracy on the tasks seen so far.
    NaN where the curve does not have the points a metric needs."""
    pts = list(points)
    out = {k: math.nan for k in ("min_acc", "wc_acc", "stability_gap", "gap_recovery", "a_auc")}
    if not pts:
        return out
    mins = []
    for k in range(tasks - 1):
        later = [p["acc"][k] for p in pts if p["task"] > k]
        if later:
            mins.append(min(later))
    if mins:
        out["min_acc"] = float(np.mean(mins))
    last = [p for p in pts if p["task"] == tasks - 1]
    if last and mins:
        out["wc_acc"] = float(last[-1]["acc"][tasks - 1] / tasks + (1 - 1 / tasks) * out["min_acc"])
    drops, recoveries = [], []
    for k in range(tasks - 1):
        ends = [p for p in pts if p["task"] == k and p["boundary"]]
        during = [float(np.mean(p["acc"][:k + 1])) for p in pts if p["task"] == k + 1 and not p["boundary"]]
        after = [p for p in pts if p["task"] == k + 1 and p["boundary"]]
        if ends and during:
            low = min(during)
            drops.append(float(np.mean(ends[-1]["acc"][:k + 1])) - low)
            if after:
                recoveries.append(float(np.mean(after[-1]["acc"][:k + 1])) - low)
    if drops:
        out["stability_gap"] = float(np.mean(drops))
    if recoveries:
        out["gap_recovery"] = float(np.mean(recoveries))
    periodic = [float(np.mean(p["acc"])) for p in pts if not p["boundary"]]
    if periodic:
        out["a_auc"] = float(np.mean(periodic))
    return out


# ------------------------------------------------------------------------- summary
def all_metrics(R, weights=None, baseline=None) -> dict[str, float]:
    """Every matrix metric under the stable keys of :data:`METRIC_INFO`."""
    out = {
        "final_acc": final_accuracy(R, weights),
        "avg_inc_acc": average_incremental_accuracy(R, weights),
        "forgetting": forgetting(R),
        "bwt": bwt(R),
        "bwt_authors": bwt_authors(R),
        "fwt": fwt(R, baseline),
        "acc": acc(R),
        "afm": afm(R),
        "ala": ala(R),
        "ar": ar(R),
        "aa": average_accuracy(R),
    }
    out["hmean"] = harmonic_mean(out["final_acc"], out["avg_inc_acc"])
    return out


METRIC_INFO: dict[str, str] = {
    "final_acc": "Final accuracy over all test samples after the last task, sample-weighted (GTEP Acc, PyCIL)",
    "avg_inc_acc": "Mean over steps of sample-weighted accuracy on all tasks seen so far (GTEP AvgAcc)",
    "forgetting": "Average forgetting: best past minus final accuracy per old task (Chaudhry 2018)",
    "bwt": "Backward transfer: mean R[i,j]-R[j,j] over i>j (M2I eq. 2)",
    "bwt_authors": "Backward transfer as the M2I authors' code computes it: mean R[t,e]-R[t-1,e] over t>e",
    "fwt": "Forward transfer: mean accuracy on unseen tasks, minus baseline if given (M2I eq. 3)",
    "acc": "Mean accuracy over seen tasks at every step, i>=j (M2I eq. 1)",
    "afm": "Average forgetting measure: R[j,j]-R[T-1,j] over old tasks (CLDyB eq. 1)",
    "ala": "Average learning accuracy: mean of R[j,j], right after learning (CLDyB eq. 2)",
    "ar": "Average retention = -AFM (CLDyB footnote 1)",
    "aa": "Final average accuracy: per-task mean of the last row of R (CLDyB Final AA)",
    "hmean": "Harmonic mean of final_acc and avg_inc_acc (GTEP hyperparameter selection)",
    "final_acc_task_il": "Final accuracy of the same class-IL run scored task-incrementally (logits masked "
                         "to each task's classes): the task-IL view without a second training",
    "final_old_acc": "After the last task: sample-weighted accuracy on the earlier tasks' test data",
    "final_new_acc": "After the last task: accuracy on the last task's test data",
    "recency_bias": "After the last task: share of test predictions on the last task's classes (BiC, WA)",
    "final_top5": "Final top-5 accuracy, sample-weighted (class-IL runs with 100 or more classes)",
    "min_acc": "Continual evaluation: mean over old tasks of their minimum accuracy after being learned (De Lange 2023)",
    "wc_acc": "Continual evaluation: worst-case accuracy, last task's final accuracy and min-ACC (De Lange 2023)",
    "stability_gap": "Continual evaluation: mean drop of old-task accuracy while the next task trains (De Lange 2023)",
    "gap_recovery": "Continual evaluation: how much of the stability gap a task recovers by its end",
    "a_auc": "Continual evaluation: area under the anytime-accuracy curve (Caccia 2022, Koh 2022)",
}

HIGHER_IS_BETTER: dict[str, bool] = {k: k not in ("forgetting", "afm", "recency_bias", "stability_gap")
                                     for k in METRIC_INFO}
