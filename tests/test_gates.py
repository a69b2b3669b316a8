"""Gates: verdicts on seed means, as pytest items that run after the cases they judge."""
import json
import os
from pathlib import Path

import pytest

import clharness.engine.runner  # noqa: F401  (keep torch loaded across pytester's in-process runs)
import clharness.reporting.scorecard  # noqa: F401
import sklearn.datasets  # noqa: F401
import sklearn.model_selection  # noqa: F401
from clharness.reporting.gates import GateError, judge, parse_gate, welch_p
from clharness.results import RunRecord

HERE = Path(__file__).parent


def recs(method, accs, scenario="s", **fields):
    return [RunRecord("suite", scenario, method, i, status="passed", metrics={"final_acc": a, "forgetting": 1 - a},
                      **fields) for i, a in enumerate(accs)]


RECORDS = recs("er", [0.80, 0.82, 0.84]) + recs("ft", [0.20, 0.21, 0.22]) + recs("lwf", [0.81, 0.80, 0.79])


@pytest.mark.parametrize("text, ok, needle", [
    ("er: final_acc >= 0.8", True, "er on s: final_acc = 0.8200 (mean of 3 seeds) >= 0.8"),
    ("er: final_acc >= 0.83", False, "er on s: final_acc = 0.8200 (mean of 3 seeds) not >= 0.83"),
    ("ft: forgetting <= 0.7", False, "ft on s: forgetting = 0.7900 (mean of 3 seeds) not <= 0.7"),
    ("er: final_acc beats ft by 0.5", True, "better by 0.6100, margin 0.5"),
    ("er: final_acc beats ft by 0.7", False, "better by 0.6100, margin 0.7"),
    ("ft: forgetting beats er by 0.5", False, "worse by 0.6100"),   # lower forgetting is better
    ("er: forgetting beats ft by 0.5", True, "better by 0.6100"),
    ("lwf: final_acc within 0.02 of er", True, "apart by 0.0200, within 0.02"),
    ("lwf: final_acc within 0.01 of er", False, "apart by 0.0200, beyond 0.01"),
    ("*: final_acc >= 0.5", False, "FAIL ft on s: final_acc = 0.2100"),
])
def test_verdicts_and_messages(text, ok, needle):
    verdict, lines = judge(parse_gate(text), RECORDS)
    assert verdict is ok
    assert any(needle in line for line in lines), lines


def test_welch_test_needs_significance_not_just_a_margin():
    # Means differ by 0.02 > margin 0, but the seeds overlap: not significant at 0.05.
    noisy = recs("a", [0.5, 0.9, 0.7]) + recs("b", [0.48, 0.88, 0.68])
    ok, lines = judge(parse_gate("a: final_acc beats b by 0.0 welch 0.05"), noisy)
    assert not ok and "one-sided Welch t-test p = " in lines[0]
    ok, _ = judge(parse_gate("a: final_acc beats b by 0.0"), noisy)
    assert ok
    # Against scipy: H1 mu_a - mu_b > 0.1 on clearly separated samples.
    from scipy import stats
    a, b = [0.80, 0.82, 0.84], [0.20, 0.21, 0.22]
    expected = stats.ttest_ind([x - 0.1 for x in a], b, equal_var=False, alternative="greater").pvalue
    assert welch_p(a, b, 0.1) == pytest.approx(expected) and expected < 1e-4


def test_failed_runs_do_not_count_and_missing_methods_fail():
    records = recs("er", [0.9]) + [RunRecord("suite", "s", "er", 1, status="diverged")]
    ok, lines = judge(parse_gate("er: final_acc >= 0.5"), records)
    assert ok and "(mean of 1 seed)" in lines[0]
    ok, lines = judge(parse_gate("er: final_acc beats nobody by 0.1"), records)
    assert not ok and "nobody has no passed run" in lines[0]


def test_bad_gate_lines_are_rejected():
    with pytest.raises(GateError, match="not understood; write one of: 'METHOD: METRIC >= VALUE'"):
        parse_gate("er final_acc at least 3")
    with pytest.raises(GateError, match="unknown metric 'acuracy'"):
        parse_gate("er: acuracy >= 0.3")


SUITE = """
gates = [
    "tiny: final_acc >= 0.05",
    "tiny: avg_inc_acc beats raiser by 0.0",
    "ci/tiny: final_acc >= 0.99",
]

[suite]
name = "judged"
seeds = 2
methods = ["tiny", "raiser"]

[defaults]
dataset = "digits"
backbone = "mlp"
backbone_options = { hidden = 16, layers = 1 }
epochs = 1
tasks = 5

[[scenario]]
name = "ci"
"""


@pytest.fixture
def judged(pytester):
    pytester.syspathinsert(HERE)
    pytester.makefile(".toml", judged=SUITE)
    return pytester


def test_gates_are_items_after_the_cases_with_clear_failures(judged):
    result = judged.runpytest("judged.toml", "-p", "plugin_methods", "-v", "--junitxml=junit.xml")
    out = result.stdout.str()
    order = [line.split(" ")[0] for line in result.outlines if line.startswith("judged.toml::")]
    assert order[-3:] == ["judged.toml::gate[tiny:", "judged.toml::gate[tiny:", "judged.toml::gate[ci/tiny:"]
    assert all("::gate[" not in name for name in order[:4]), order
    # raiser fails its cases, so "beats raiser" fails for want of a comparison; the 0.99 bound fails.
    result.assert_outcomes(passed=3, failed=4)
    assert "gate failed: ci/tiny: final_acc >= 0.99" in out and "not >= 0.99" in out
    assert "raiser has no passed run with avg_inc_acc to compare with" in out
    junit = (judged.path / "junit.xml").read_text()
    assert junit.count('name="gate[') == 3


def test_k_selects_gates_which_judge_stored_records(judged):
    judged.runpytest("judged.toml", "-p", "plugin_methods", "-k", "not gate").assert_outcomes(passed=2, failed=2)
    result = judged.runpytest("judged.toml", "-p", "plugin_methods", "-k", "gate and not ci/", "-v")
    # the raiser's failed runs are not reusable, so that gate lacks records and fails
    result.assert_outcomes(passed=1, failed=1, deselected=5)


def test_gates_wait_for_cases_on_other_xdist_workers(judged, monkeypatch):
    # the checkout under test first (not an installed clharness), then tests/ for plugin_methods
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE.parent), str(HERE)]))
    result = judged.runpytest_subprocess("judged.toml", "-p", "plugin_methods", "-n", "2", "-k", "tiny and not ci/ and not raiser")
    result.assert_outcomes(passed=3)


def test_regression_against_a_saved_scorecard(judged, tmp_path):
    base = tmp_path / "base.json"
    judged.runpytest("judged.toml", "-p", "plugin_methods", "-k", "tiny and not gate",
                    "--clh-scorecard", str(base)).assert_outcomes(passed=2)
    saved = json.loads(base.read_text())
    saved["summary"][0]["final_acc"] += 0.5           # pretend the baseline was far better
    saved["summary"].append({**saved["summary"][0], "method": "ghost"})
    base.write_text(json.dumps(saved))
    result = judged.runpytest("judged.toml", "-p", "plugin_methods", "-k", "tiny and not gate",
                             "--clh-compare", str(base), "--clh-max-drop", "final_acc=0.02",
                             "--clh-max-drop", "avg_inc_acc=0.5", "-v")
    result.assert_outcomes(passed=3, failed=1)
    out = result.stdout.str()
    assert "compare[ci/tiny-final_acc] FAILED" in out and "compare[ci/tiny-avg_inc_acc] PASSED" in out
    assert "allowed drop 0.02" in out and "worse by 0.5000" in out
    assert "baseline has judged::ci[ghost], not run in this session" in out
    typo = judged.runpytest("judged.toml", "-p", "plugin_methods", "-k", "tiny and not gate", "--clh-compare", str(base),
                            "--clh-max-drop", "final_ac=0.02")   # issue 27: a typo is an error, not a note
    assert typo.ret == pytest.ExitCode.USAGE_ERROR and "final_ac" in typo.stderr.str() and \
        "did you mean 'final_acc'" in typo.stderr.str()
