"""The curriculum effect (M2I minus I2M per method, CI over seeds) and the offline m2i-mini suite."""
import math

import pytest
from scipy import stats

import clharness.engine.runner  # noqa: F401
import clharness_methods  # noqa: F401
from clharness.benchmarks.m2i.effect import curriculum_effect, direction, main
from clharness.results import RunRecord
from clharness.benchmarks.m2i.kind import CURRICULA


def _record(order, method, seed, acc, suite="m2i-mini", status="passed"):
    scenario = f"ci-{order}"
    names = [f"{task}/c{k}" for task in CURRICULA[order] for k in range(10)]
    return RunRecord(suite=suite, scenario=scenario, method=method, seed=seed, setting="class-incremental",
                     status=status, class_order=names, metrics={"acc": acc, "bwt": -acc / 2})


def test_effect_is_the_mean_paired_difference_with_a_t_interval():
    m2i, i2m = [0.60, 0.70, 0.65], [0.40, 0.45, 0.50]
    records = [_record("m2i", "er", s, a) for s, a in enumerate(m2i)] + \
              [_record("i2m", "er", s, a) for s, a in enumerate(i2m)] + \
              [_record("i2m", "er", 7, 0.1)] + [_record("m2i", "er", 8, 0.9, status="failed")]   # unpaired, failed
    rows = curriculum_effect(records, metrics=("acc",))
    assert len(rows) == 1
    row = rows[0]
    diffs = [a - b for a, b in zip(m2i, i2m)]
    half = stats.t.ppf(0.975, 2) * stats.tstd(diffs) / math.sqrt(3)
    assert row["seeds"] == 3 and row["method"] == "er" and row["scenario"] == "ci-*"
    assert row["effect"] == pytest.approx(sum(diffs) / 3) and row["effect_ci"] == pytest.approx(half)
    assert row["m2i"] == pytest.approx(0.65) and row["i2m"] == pytest.approx(0.45)


def test_direction_is_read_from_the_class_order():
    assert direction(_record("m2i", "er", 0, 0.5)) == "m2i"
    assert direction(_record("i2m", "er", 0, 0.5)) == "i2m"
    other = _record("m2i", "er", 0, 0.5)
    other.class_order = other.class_order[10:]
    assert direction(other) is None


def test_m2i_mini_runs_offline_and_reports_the_effect(pytester, tmp_path, capsys):
    store = tmp_path / "mini.sqlite"
    result = pytester.runpytest("--clh-suite", "m2i-mini", "--clh-quick", "--clh-seeds", "2", "--clh-device", "cpu",
                                "--clh-results", str(store), "-p", "no:cacheprovider")
    result.assert_outcomes(passed=12)   # 3 methods x 2 orders x 2 seeds
    capsys.readouterr()   # the session's own summary (it has an M2I section of its own) is not the table
    assert main([str(store), "--metric", "acc"]) == 0
    table = capsys.readouterr().out
    for method in ("finetune", "er", "joint"):
        assert f"| {method}" in table
    assert "M2I - I2M" in table and table.count("|       2 |") == 3
    # the per-task heatmaps of the paper's figures 2-13: the HTML report draws one per scenario
    from clharness.reporting.report import build_html, load_records
    html = build_html(load_records(store))
    for scenario in ("ci-m2i", "ci-i2m"):
        assert f'alt="m2i-mini::{scenario}: accuracy matrices"' in html


def test_cli_errors_without_paired_runs(tmp_path, capsys):
    assert main([str(tmp_path / "none.sqlite")]) == 2
    assert "does not exist" in capsys.readouterr().err
