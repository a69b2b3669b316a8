"""Issue 27 item 7: `clharness compare` is strict (a suite, scenario, method or metric on one side only
fails, with a did-you-mean) and judges a drop with the spread over seeds the scorecard stores (a
one-sided Welch t-test from mean, CI half-width and n), not the means alone. The expected p-values
are the Welch formula written out here on hand-made summary rows."""
import json
import math

import pytest
from scipy import stats

from clharness.cli import main
from clharness.reporting import compare as C
from clharness.reporting.scorecard import write

from test_report import record


def ci(sd, n):
    """The 95% CI half-width a scorecard stores for a sample sd over n seeds (metrics.mean_ci)."""
    return stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n) if n > 1 else 0.0


def row(method="er", mean=0.8, sd=0.02, n=5, suite="s", scenario="c", metric="final_acc", **extra):
    return {"suite": suite, "scenario": scenario, "method": method, "seeds": n,
            metric: mean, f"{metric}_ci": ci(sd, n), **extra}


def card(tmp_path, name, *rows):
    path = tmp_path / name
    path.write_text(json.dumps({"columns": ["final_acc"], "summary": list(rows), "records": []}))
    return path


def hand_welch_p(ma, sa, na, mb, sb, nb, drop):
    """H0: mu_A - mu_B <= drop vs H1: > drop; Welch's t and Welch-Satterthwaite df."""
    va, vb = sa ** 2 / na, sb ** 2 / nb
    t = ((ma - mb) - drop) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (na - 1) + vb ** 2 / (nb - 1))
    return 1 - stats.t.cdf(t, df)


def cmp(capsys, *argv):
    code = main(["compare", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_noisy_drop_beyond_the_allowance_is_not_significant(tmp_path, capsys):
    # means drop by 0.04 > 0.02, but with sd 0.02 (n=5) and 0.04 (n=4) the seeds do not show it
    a = card(tmp_path, "a.json", row(mean=0.80, sd=0.02, n=5))
    b = card(tmp_path, "b.json", row(mean=0.76, sd=0.04, n=4))
    p = hand_welch_p(0.80, 0.02, 5, 0.76, 0.04, 4, 0.02)
    assert 0.2 < p < 0.21
    code, out, _ = cmp(capsys, a, b, "--max-drop", "final_acc=0.02")
    assert code == 0, out
    assert f"one-sided Welch t-test p = {p:.3g} >= 0.05" in out and "not significant" in out
    assert "A sd 0.0200 n=5, B sd 0.0400 n=4" in out
    # the same drop on the means alone is a regression
    code, out, _ = cmp(capsys, a, b, "--max-drop", "final_acc=0.02", "--means-only")
    assert code == 1 and "REGRESSION c/er: final_acc 0.8000 -> 0.7600, worse by 0.0400" in out


def test_a_tight_drop_is_a_regression_with_its_p_value(tmp_path, capsys):
    a = card(tmp_path, "a.json", row(mean=0.80, sd=0.01, n=5))
    b = card(tmp_path, "b.json", row(mean=0.70, sd=0.01, n=5))
    p = hand_welch_p(0.80, 0.01, 5, 0.70, 0.01, 5, 0.02)
    code, out, _ = cmp(capsys, a, b, "--max-drop", "final_acc=0.02")
    assert code == 1
    assert f"REGRESSION c/er: final_acc 0.8000 -> 0.7000, worse by 0.1000 > allowed drop 0.02; " \
           f"one-sided Welch t-test p = {p:.3g} < 0.05" in out
    # a larger allowance: H0 (worse by at most 0.2) is not rejected
    assert cmp(capsys, a, b, "--max-drop", "final_acc=0.2")[0] == 0


def test_alpha_sets_the_level_of_the_test(tmp_path, capsys):
    a = card(tmp_path, "a.json", row(mean=0.80, sd=0.02, n=5))
    b = card(tmp_path, "b.json", row(mean=0.75, sd=0.02, n=5))
    p = hand_welch_p(0.80, 0.02, 5, 0.75, 0.02, 5, 0.02)
    assert 0.01 < p < 0.05
    assert cmp(capsys, a, b, "--max-drop", "final_acc=0.02")[0] == 1
    code, out, _ = cmp(capsys, a, b, "--max-drop", "final_acc=0.02", "--alpha", "0.01")
    assert code == 0 and f"p = {p:.3g} >= 0.01" in out


def test_the_p_value_matches_scipy_from_summary_statistics():
    a, b = row(mean=0.81, sd=0.03, n=6), row(mean=0.77, sd=0.015, n=3)
    sa, sb = C.spread(a, "final_acc"), C.spread(b, "final_acc")
    assert sa == pytest.approx((0.81, 0.03, 6)) and sb == pytest.approx((0.77, 0.015, 3))
    ref = stats.ttest_ind_from_stats(0.81 - 0.01, 0.03, 6, 0.77, 0.015, 3, equal_var=False, alternative="greater")
    assert C.welch_drop_p(sa, sb, 0.01) == pytest.approx(ref.pvalue)
    assert C.welch_drop_p(sa, sb, 0.01) == pytest.approx(hand_welch_p(0.81, 0.03, 6, 0.77, 0.015, 3, 0.01))


def test_lower_is_better_metrics_are_tested_upwards(tmp_path, capsys):
    a = card(tmp_path, "a.json", row(metric="forgetting", mean=0.10, sd=0.01, n=4))
    b = card(tmp_path, "b.json", row(metric="forgetting", mean=0.20, sd=0.01, n=4))
    p = hand_welch_p(0.20, 0.01, 4, 0.10, 0.01, 4, 0.05)   # worse = B - A
    code, out, _ = cmp(capsys, a, b, "--max-drop", "forgetting=0.05")
    assert code == 1 and f"p = {p:.3g} < 0.05" in out
    assert cmp(capsys, b, a, "--max-drop", "forgetting=0.05")[0] == 0   # less forgetting: no regression


def test_a_single_seed_is_judged_on_the_means_with_a_note(tmp_path, capsys):
    a = card(tmp_path, "a.json", row(mean=0.80, n=1))
    b = card(tmp_path, "b.json", row(mean=0.75, sd=0.05, n=5))
    code, out, _ = cmp(capsys, a, b, "--max-drop", "final_acc=0.02")
    assert code == 1 and "no spread on the A side (n = 1): judged on the means alone" in out


def test_the_spread_comes_from_a_written_scorecard(tmp_path):
    # er, split over seeds 0..2: final_acc 0.775, 0.785, 0.795 -> sd 0.01 (test_report.py)
    path = write(tmp_path / "s.json", [record("split", "er", s) for s in range(3)])
    rows = C.load_summary(path)
    assert C.spread(rows[("toy", "split", "er")], "final_acc") == pytest.approx((0.785, 0.01, 3))


@pytest.mark.parametrize("a_rows, b_rows, expected", [
    ([row(method="lwf")], [row(method="lwf_")],
     ["method 'lwf' in s::c is in A only (did you mean 'lwf_'?)", "method 'lwf_' in s::c is in B only (did you mean 'lwf'?)"]),
    ([row(method="er"), row(method="ewc")], [row(method="er")], ["method 'ewc' in s::c is in A only"]),
    ([row(suite="quickstart")], [row(suite="quickstrat")],
     ["suite 'quickstart' is in A only (did you mean 'quickstrat'?)"]),
    ([row(scenario="ci-5x2")], [row(scenario="ci-5x2"), row(scenario="ti-5x2")], ["scenario 'ti-5x2' of suite s is in B only"]),
])
def test_a_row_on_one_side_only_fails(tmp_path, capsys, a_rows, b_rows, expected):
    code, out, _ = cmp(capsys, card(tmp_path, "a.json", *a_rows), card(tmp_path, "b.json", *b_rows))
    assert code == 1, out
    for line in expected:
        assert f"MISMATCH {line}" in out


def test_a_method_that_failed_every_seed_in_b_fails(tmp_path, capsys):
    a = card(tmp_path, "a.json", row())
    b = card(tmp_path, "b.json", {**row(n=0), "final_acc": None, "final_acc_ci": None})
    code, out, _ = cmp(capsys, a, b)
    assert code == 1 and "MISMATCH c/er: final_acc missing on the B side (0 passed seeds)" in out


def test_a_misspelled_metric_exits_2_with_a_did_you_mean(tmp_path, capsys):
    a = card(tmp_path, "a.json", row())
    code, out, err = cmp(capsys, a, a, "--max-drop", "final_ac=0.02")
    assert code == 2 and out == ""
    assert "max drop metric 'final_ac' is not in the scorecard(s) (did you mean 'final_acc'?)" in err


def test_a_metric_on_one_side_only_fails(tmp_path, capsys):
    a = card(tmp_path, "a.json", row(info_retention=0.9, info_retention_ci=0.0))
    b = card(tmp_path, "b.json", row())
    code, out, _ = cmp(capsys, a, b, "--max-drop", "info_retention=0.05")
    assert code == 1 and "MISMATCH metric 'info_retention' is not in B" in out


def test_strict_drop_parsing_for_pytest_max_drop():
    """What pytest's --clh-max-drop calls with the baseline's rows: a metric the baseline lacks is an
    error naming the closest one, not a gate silently never made."""
    rows = [row(), row(method="ewc", forgetting=0.1, forgetting_ci=0.01)]
    known = C.scorecard_metrics(rows)
    assert known == {"final_acc", "forgetting"}
    assert C.parse_drops(["final_acc=0.02", "forgetting=0.1"], known) == {"final_acc": 0.02, "forgetting": 0.1}
    with pytest.raises(ValueError, match=r"'final_ac' is not in the scorecard\(s\) \(did you mean 'final_acc'\?\)"):
        C.parse_drops(["final_ac=0.02"], known)
    with pytest.raises(ValueError, match=r"'avg_inc_acc' is not in the scorecard"):
        C.parse_drops(["avg_inc_acc=0.02"], known)   # a real metric, absent from this baseline
    with pytest.raises(ValueError, match="VALUE >= 0"):
        C.parse_drops(["final_acc=-0.1"])
    assert C.parse_drops(["nosuch=1"]) == {"nosuch": 1.0}   # without `known`: syntax only
