"""Issue 36 item 2, what was left, and `clharness report --all`: figures, pairwise Welch tests and gates
group records by configuration (``results.configuration_id``) and never pool them; a report shows per
case the configuration the current code would run, the others only with --all. Expectations are
computed by hand from the planted values."""
from __future__ import annotations

import math
import re

import pytest

from clharness.cli import main
from clharness.reporting.gates import judge, parse_gate
from clharness.reporting.report import build_html, render_text
from clharness.reporting.scorecard import pairwise_welch
from clharness.results import ResultsStore, RunRecord

CURRENT = {("s", "sc", "er"): "cur0001", ("s", "sc", "finetune"): "cur0001"}


def rec(method, seed, acc, train_s=1.0, *, budget="full", code="cur0001", hparams=None, finished=100.0):
    key = f"{method}-{seed}-{budget}-{code}-{sorted((hparams or {}).items())}"
    return RunRecord(suite="s", scenario="sc", method=method, seed=seed, status="passed", budget=budget,
                     code_digest=code, hparams=dict(hparams or {}), key=key, base_key=key, finished_at=finished,
                     metrics={"final_acc": acc}, train_seconds=train_s)


def store_of_one_case():
    """er and finetune, each: 3 full seeds of the current code, 2 quick seeds, 1 full seed of stale code
    (the newest record). er full 0.5/0.6/0.7 (train 1/2/3 s), finetune full 0.1/0.2/0.3 (train 2/3/4 s)."""
    out = []
    for method, full, quick, stale, secs in (("er", (0.5, 0.6, 0.7), (0.2, 0.4), 0.9, (1.0, 2.0, 3.0)),
                                             ("finetune", (0.1, 0.2, 0.3), (0.05, 0.15), 0.8, (2.0, 3.0, 4.0))):
        out += [rec(method, s, a, t, finished=100.0 + s) for s, (a, t) in enumerate(zip(full, secs))]
        out += [rec(method, s, a, 50.0, budget="quick", finished=200.0 + s) for s, a in enumerate(quick)]
        out.append(rec(method, 0, stale, 99.0, code="old9999", finished=300.0))
    return out


# Welch between the main rows by hand: a = (.5, .6, .7), b = (.1, .2, .3): both s^2 = 0.01, n = 3,
# difference 0.4, SE = sqrt(0.01/3 + 0.01/3), t = 4.89898, Welch-Satterthwaite df = 4.
T_MAIN = 0.4 / math.sqrt(0.02 / 3)


def test_pairwise_welch_compares_the_main_configurations_n_3_vs_3():
    from scipy import stats
    (row,) = pairwise_welch(store_of_one_case(), current=CURRENT).itertuples()
    assert (row.best, row.method, row.n_best, row.n) == ("er", "finetune", 3, 3)
    assert row.diff == pytest.approx(0.4) and row.t == pytest.approx(T_MAIN)
    assert row.p == pytest.approx(2 * stats.t.sf(T_MAIN, 4))
    # without the current code the newest full configuration is the main one: the stale single seeds
    (row,) = pairwise_welch(store_of_one_case()).itertuples()
    assert (row.n_best, row.n, round(row.diff, 6)) == (1, 1, 0.1) and math.isnan(row.p)


def test_html_figures_and_welch_use_the_main_configuration_only():
    html = build_html(store_of_one_case(), ["final_acc"], current=CURRENT)
    # the radar's caption: training time over the figure's seeds (pooled: n=6, 1+2+3+50+50+99 s)
    assert "er 2 ± 1 s (n=3)" in html and "finetune 3 ± 1 s (n=3)" in html and "n=6" not in html
    assert re.search(r"<td>3 vs 3\s*</td>", html) and "6 vs 6" not in html   # the Welch table's n (seeds)
    assert "4 row(s) of other configurations of the same cases (quick, code old999 (stale)) are not shown" in html
    assert "<td>quick" not in html
    every = build_html(store_of_one_case(), ["final_acc"], current=CURRENT, every=True)
    assert "<td>quick" in every and "<td>code old999 (stale)" in every   # rows apart, labelled
    assert "er 2 ± 1 s (n=3)" in every and re.search(r"<td>3 vs 3\s*</td>", every)   # figures, tests: main


def _table_rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| s::sc")]


def test_text_report_shows_the_current_configuration_and_says_what_it_left_out():
    text = render_text(store_of_one_case(), ["final_acc"], "md", current=CURRENT)
    assert [row[:3] for row in _table_rows(text)] == [["s::sc", "er", "3"], ["s::sc", "finetune", "3"]]
    assert "0.600 ± 0.248" in text   # t_{0.975,2} = 4.303 · 0.1 / sqrt(3)
    assert "4 row(s) of other configurations" in text and "--all shows every configuration" in text
    every = render_text(store_of_one_case(), ["final_acc"], "md", current=CURRENT, every=True)
    assert [row[:4] for row in _table_rows(every)] == [
        ["s::sc", "er", "full", "3"], ["s::sc", "er", "quick", "2"], ["s::sc", "er", "code old999 (stale)", "1"],
        ["s::sc", "finetune", "full", "3"], ["s::sc", "finetune", "quick", "2"],
        ["s::sc", "finetune", "code old999 (stale)", "1"]]
    assert "not shown" not in every


def test_report_cli_all_flag(tmp_path, capsys, monkeypatch):
    import clharness.cli as cli
    monkeypatch.setattr(cli, "current_codes", lambda records: CURRENT)   # suite "s" is not registered here
    path = tmp_path / "r.sqlite"
    with ResultsStore(path) as store:
        for r in store_of_one_case():
            store.put(r)
    assert main(["report", str(path), "--columns", "final_acc"]) == 0
    assert len(_table_rows(capsys.readouterr().out)) == 2
    assert main(["report", str(path), "--columns", "final_acc", "--all"]) == 0
    assert len(_table_rows(capsys.readouterr().out)) == 6
    assert main(["report", str(path), "--columns", "final_acc", "--format", "csv"]) == 0
    out, err = capsys.readouterr()
    assert len(out.strip().splitlines()) == 1 + 2 and "4 row(s) of other configurations" in err


# --- gates --------------------------------------------------------------------------------------

def test_a_bound_gate_judges_each_configuration_with_its_own_seeds():
    ok, lines = judge(parse_gate("er: final_acc >= 0.55"), store_of_one_case())
    assert not ok
    assert lines == [
        "PASS er [full, code cur000] on sc: final_acc = 0.6000 (mean of 3 seeds) >= 0.55",
        "FAIL er [quick, code cur000] on sc: final_acc = 0.3000 (mean of 2 seeds) not >= 0.55",
        "PASS er [full, code old999] on sc: final_acc = 0.9000 (mean of 1 seed) >= 0.55"]


def test_a_welch_gate_pairs_configurations_of_the_same_budget():
    from scipy import stats
    current = [r for r in store_of_one_case() if r.code_digest == "cur0001"]
    ok, lines = judge(parse_gate("er: final_acc beats finetune by 0.1 welch 0.05"), current)
    full, quick = lines
    # full: er 0.6 vs finetune 0.2, H0 lead <= 0.1: t = (0.4 - 0.1) / SE, df 4, one-sided
    p_full = stats.t.sf(0.3 / math.sqrt(0.02 / 3), 4)
    assert full.startswith("PASS er [full] on sc: final_acc = 0.6000 vs finetune [full] 0.2000")
    assert f"p = {p_full:.4g}" in full and "n = 3 vs 3 seeds" in full
    # quick: er (.2, .4) vs finetune (.05, .15): lead 0.2, t = 0.1 / sqrt(.02/2 + .005/2) = 0.894, df 1.47
    assert quick.startswith("FAIL er [quick] on sc: final_acc = 0.3000 vs finetune [quick] 0.1000")
    assert "n = 2 vs 2 seeds" in quick and not ok


def test_a_hyperparameter_sweep_is_judged_per_value_not_pooled():
    records = [rec("er", s, a, hparams={"lr": 0.01}) for s, a in enumerate((0.5, 0.6, 0.7))]
    records += [rec("er", s, a, hparams={"lr": 0.1}) for s, a in enumerate((0.2, 0.3, 0.4))]
    records += [rec("finetune", s, a) for s, a in enumerate((0.1, 0.2, 0.3))]
    ok, lines = judge(parse_gate("er: final_acc beats finetune by 0.15"), records)   # pooled: lead 0.25, a pass
    assert not ok and [line.split(":")[0] for line in lines] == ["PASS er [lr=0.01] on sc", "FAIL er [lr=0.1] on sc"]
    assert "better by 0.4000" in lines[0] and "better by 0.1000" in lines[1]


def test_no_comparison_across_budgets():
    records = [rec("er", s, 0.6) for s in range(2)] + [rec("finetune", s, 0.1, budget="quick") for s in range(2)]
    ok, lines = judge(parse_gate("er: final_acc beats finetune by 0.1"), records)
    assert not ok and lines == ["FAIL er on sc: finetune has no run of the same budget, data and hardware to compare with"]
