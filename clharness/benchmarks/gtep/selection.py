"""GTEP's selection of H* (Alg. 1 SelectBestHyperparameter): each tuning run scored by the harmonic mean of its final
Acc and AvgAcc, a configuration by that score over its trials, the best configuration chosen."""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from ...results import RunRecord

# ----------------------------------------------------------------------------- selection
def hmean_score(record: RunRecord) -> float:
    """P_s of one trial: harmonic mean of final Acc and AvgAcc (Sec. 4.1); NaN when it did not pass."""
    from ...metrics import harmonic_mean
    if record.status != "passed":
        return math.nan
    return harmonic_mean(record.metrics.get("final_acc", math.nan), record.metrics.get("avg_inc_acc", math.nan))


# Alg. 1's criterion read two ways. The paper's default is what Alg. 2 writes out: each trial s
# scores P_s^HT (line 9), and a configuration's score is their mean,
#     "P_r^HT <- 1/S sum_{s=1}^S P_s^HT"            (Alg. 2, line 10),
# with the per-trial performance being the selection metric of Sec. 4.1: "The hyperparameters that
# yield the highest harmonic mean of Acc and AvgAcc are selected during the hyperparameter tuning
# phase". Hence "mean-of-hmeans". The other reading, "hmean-of-means", takes Acc and AvgAcc averaged
# over the S trials first and their harmonic mean after (the harmonic mean of the reported
# "Acc / AvgAcc" means of Tables 7-8); it can pick a different configuration.
SELECTION_RULES = ("mean-of-hmeans", "hmean-of-means")
DEFAULT_SELECTION = "mean-of-hmeans"


def config_score(records: list[RunRecord], rule: str = DEFAULT_SELECTION) -> float:
    """P_r^HT of one configuration from its S tuning trials under ``rule`` (see SELECTION_RULES):
    "mean-of-hmeans" = mean_s H(Acc_s, AvgAcc_s) (Alg. 2 line 10, the default); "hmean-of-means"
    = H(mean_s Acc_s, mean_s AvgAcc_s). NaN when a trial did not pass or there are no trials."""
    from ...metrics import harmonic_mean
    if rule not in SELECTION_RULES:
        raise ValueError(f"selection = {rule!r}; allowed: {', '.join(SELECTION_RULES)}")
    if not records:
        return math.nan
    if rule == "mean-of-hmeans":
        return float(np.mean([hmean_score(r) for r in records]))
    if any(r.status != "passed" for r in records):
        return math.nan
    acc = float(np.mean([r.metrics.get("final_acc", math.nan) for r in records]))
    avg = float(np.mean([r.metrics.get("avg_inc_acc", math.nan) for r in records]))
    return harmonic_mean(acc, avg)


def select_best(tuning: Mapping[int, list[RunRecord]], rule: str = DEFAULT_SELECTION
                ) -> tuple[int | None, dict[int, float]]:
    """Alg. 1 SelectBestHyperparameter: the configuration with the highest P_r (``config_score``
    under ``rule``) wins (ties: the lowest k). A configuration with a diverged or failed trial has
    P_r = NaN and cannot win; if every one has, there is no H* (the paper's BEEF NaN)."""
    scores = {k: config_score(recs, rule) for k, recs in sorted(tuning.items())}
    finite = {k: v for k, v in scores.items() if not math.isnan(v)}
    if not finite:
        return None, scores
    best = max(finite.values())
    return min(k for k, v in finite.items() if v == best), scores


