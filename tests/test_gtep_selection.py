"""GTEP Alg. 1's selection rule read two ways, on hand-made tuning records where they disagree:
the mean over trials of each trial's harmonic mean of Acc and AvgAcc (Alg. 2 line 10, the default)
vs the harmonic mean of the trial-mean Acc and AvgAcc. The suite key, and the GTEP table's note."""
import math

import pytest

from clharness.results import RunRecord
from clharness.benchmarks.gtep import kind
from clharness.engine.suites import ScenarioSpec
from clharness.benchmarks.gtep import selection as gtep_selection, summary as gtep_summary


def rec(scenario, seed, acc, avg, lr, status="passed"):
    return RunRecord("g", scenario, "m", seed, status=status, hparams={"lr": lr},
                     metrics={"final_acc": acc, "avg_inc_acc": avg})


# c0: trials (0.9, 0.1) and (0.1, 0.9): each trial's H = 2*0.09/1.0 = 0.18, mean 0.18; trial means
#     (0.5, 0.5): H = 0.5.   c1: both trials (0.4, 0.4): H = 0.4 either way.
TUNING = {0: [rec("s:tune-c0", 0, 0.9, 0.1, 0.01), rec("s:tune-c0", 1, 0.1, 0.9, 0.01)],
          1: [rec("s:tune-c1", 0, 0.4, 0.4, 0.1), rec("s:tune-c1", 1, 0.4, 0.4, 0.1)]}


def test_the_two_readings_score_and_pick_as_computed_by_hand():
    best, scores = gtep_selection.select_best(TUNING)                       # default: Alg. 2 line 10
    assert gtep_selection.DEFAULT_SELECTION == "mean-of-hmeans"
    assert best == 1 and scores[0] == pytest.approx(0.18) and scores[1] == pytest.approx(0.4)
    best, scores = gtep_selection.select_best(TUNING, "hmean-of-means")
    assert best == 0 and scores[0] == pytest.approx(0.5) and scores[1] == pytest.approx(0.4)
    # a trial that did not pass makes the configuration NaN under both readings
    broken = [rec("s:tune-c0", 0, 0.9, 0.9, 0.01), rec("s:tune-c0", 1, 0.0, 0.0, 0.01, status="diverged")]
    assert all(math.isnan(gtep_selection.config_score(broken, r)) for r in gtep_selection.SELECTION_RULES)
    with pytest.raises(ValueError, match="selection = 'median'; allowed: mean-of-hmeans, hmean-of-means"):
        gtep_selection.select_best(TUNING, "median")


@pytest.mark.parametrize("rule, chosen, other", [("mean-of-hmeans", 1, 0), ("hmean-of-means", 0, 1)])
def test_table_names_the_rule_the_evaluation_ran_and_what_the_other_reading_would_choose(rule, chosen, other):
    lr = {0: 0.01, 1: 0.1}
    evals = [rec("s:eval", s, 0.5, 0.6, lr[chosen]) for s in (0, 1)]   # ran the H* of ``rule``
    frame = gtep_summary.summarize([r for recs in TUNING.values() for r in recs] + evals)
    row = frame.iloc[0]
    assert (row.selection, row.config, row.other_selection, row.other_config) == \
        (rule, chosen, next(r for r in gtep_selection.SELECTION_RULES if r != rule), other)
    assert bool(row.readings_differ) and row.tune_acc == pytest.approx(0.5 if chosen == 0 else 0.4)
    text = gtep_summary.render(frame)
    assert f"{row.other_selection} would choose c{other}: lr={lr[other]:g}" in text


def test_agreeing_readings_leave_no_note():
    same = {0: TUNING[1], 1: [rec("s:tune-c1", s, 0.2, 0.2, 0.3) for s in (0, 1)]}
    frame = gtep_summary.summarize([r for recs in same.values() for r in recs])
    assert not frame.iloc[0].readings_differ and "would choose" not in gtep_summary.render(frame)


def test_selection_is_a_checked_suite_key():
    base = {k: d for k, (_, d) in kind.OPTIONS.items()}
    base.update(tune_dataset="synthetic", eval_dataset="digits", task_config="2-equal")
    assert base["selection"] == gtep_selection.DEFAULT_SELECTION
    kind.check(ScenarioSpec(name="s", kind="gtep", validation=0.25, options={**base, "selection": "hmean-of-means"}))
    with pytest.raises(ValueError, match="selection = 'mean'; allowed: mean-of-hmeans, hmean-of-means"):
        kind.check(ScenarioSpec(name="s", kind="gtep", validation=0.25, options={**base, "selection": "mean"}))
