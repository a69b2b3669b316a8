"""FLOPs in reports (issue 41 items 1 and 3): scorecard columns in every format, gates on FLOPs (an
absolute bound and a ratio to another method), with hand-made records and hand-computed expectations."""
import json
import math

import pytest

from clharness.reporting.gates import GateError, judge, parse_gate
from clharness.reporting.report import render_text
from clharness.results import RunRecord


def rec(method, seed, acc, train, evalf=0.5, scenario="s"):
    return RunRecord("suite", scenario, method, seed, status="passed", metrics={"final_acc": acc},
                     train_gflops=train, eval_gflops=evalf)


# finetune: 10 GFLOPs a seed; er: 18 and 22 (mean 20 = 2.0x); ewc: 24 and 26 (mean 25 = 2.5x)
RECORDS = [rec("finetune", 0, 0.20, 10.0), rec("finetune", 1, 0.22, 10.0),
           rec("er", 0, 0.60, 18.0), rec("er", 1, 0.62, 22.0),
           rec("ewc", 0, 0.30, 24.0), rec("ewc", 1, 0.32, 26.0)]


@pytest.mark.parametrize("text, ok, needle", [
    ("er: train_gflops <= 20", True, "er on s: train_gflops = 20.0000 (mean of 2 seeds) <= 20"),
    ("er: train_gflops <= 19.9", False, "not <= 19.9"),
    ("*: eval_gflops <= 0.5", True, "ewc on s: eval_gflops = 0.5000"),
    ("er: train_gflops <= 2x finetune", True, "er on s: train_gflops = 20 (mean of 2 seeds) vs finetune 10: ratio 2x, <= 2x"),
    ("ewc: train_gflops <= 2x finetune", False, "ratio 2.5x, not <= 2x"),
    ("ewc: train_gflops <= 2.5x finetune", True, "ratio 2.5x, <= 2.5x"),
    ("ewc: train_gflops >= 1.2x er", True, "vs er 20: ratio 1.25x, >= 1.2x"),
    ("er: train_gflops >= 1.3x ewc", False, "vs ewc 25: ratio 0.8x, not >= 1.3x"),
])
def test_flop_gates_pass_and_fail_as_computed_by_hand(text, ok, needle):
    verdict, lines = judge(parse_gate(text), RECORDS)
    assert verdict is ok, lines
    assert any(needle in line for line in lines), lines


def test_a_ratio_gate_reads_the_other_method_and_parses_its_factor():
    gate = parse_gate("s/er: train_gflops <= 1.5e0x finetune")
    assert (gate.method, gate.metric, gate.kind, gate.value, gate.other, gate.scenario) == \
        ("er", "train_gflops", "<=x", 1.5, "finetune", "s")
    # against ewc (25) er's 20 is 0.8x: passes at 0.9x; against finetune (10) it would be 2x and fail
    ok, lines = judge(parse_gate("er: train_gflops <= 0.9x ewc"), RECORDS)
    assert ok and "ratio 0.8x" in lines[0]
    with pytest.raises(GateError, match="unknown metric 'train_flops'"):
        parse_gate("er: train_flops <= 2x finetune")


def test_a_gate_on_flops_that_were_not_counted_fails_and_says_so():
    records = [RunRecord("suite", "s", "er", 0, status="passed", train_gflops=None)]
    ok, lines = judge(parse_gate("er: train_gflops <= 100"), records)
    assert not ok and "no passed run has train_gflops" in lines[0]


def test_the_scorecard_shows_flop_columns_in_every_format():
    # er: mean of 18 and 22 = 20.000, half-width t(0.975, 1) * sd / sqrt(2) = 12.706 * 2.828 / 1.414 = 25.412
    md = render_text(RECORDS, fmt="md")
    header = next(line for line in md.splitlines() if "train GFLOPs" in line)
    assert "eval GFLOPs" in header
    er_row = next(line for line in md.splitlines() if "| er " in line)
    assert "20.000 ± 25.412" in er_row and "0.500" in er_row
    latex = render_text(RECORDS, fmt="latex")
    assert "train GFLOPs" in latex and "20.000 ± 25.412" in latex
    csv_rows = render_text(RECORDS, fmt="csv").splitlines()
    head = csv_rows[0].split(",")
    er = dict(zip(head, next(r for r in csv_rows[1:] if ",er," in r).split(",")))
    assert float(er["train_gflops"]) == 20.0 and float(er["eval_gflops"]) == 0.5
    summary = json.loads(render_text(RECORDS, fmt="json"))["summary"]
    assert {r["method"]: r["train_gflops"] for r in summary} == {"finetune": 10.0, "er": 20.0, "ewc": 25.0}


def test_flops_not_counted_show_as_a_dash_never_as_zero():
    records = [RunRecord("suite", "s", "er", 0, status="passed", metrics={"final_acc": 0.5}, train_gflops=None,
                         eval_gflops=0.25), rec("finetune", 0, 0.2, 10.0)]
    md = render_text(records, fmt="md")
    row = next(line for line in md.splitlines() if "| er " in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    header = [c.strip() for c in next(l for l in md.splitlines() if "train GFLOPs" in l).strip("|").split("|")]
    assert cells[header.index("train GFLOPs")] == "-" and cells[header.index("eval GFLOPs")] == "0.250"


def test_flop_gates_in_a_suite(tmp_path):
    """Gates on FLOPs written in a suite file judge the session's records. finetune on the mini suite:
    one epoch over digits' 1,257 training images, an MLP 64-32-10: per image 2*(64*32 + 32*10) forward and
    2*64*32 + 4*32*10 backward = 10,112 FLOPs, so 12,710,784 in all; ER adds its replay batches on top."""
    import sys
    from pathlib import Path
    import clharness
    sys.path.insert(0, str(Path(__file__).parent))
    from mini_suite import mini_suite
    gates = ['"finetune: train_gflops <= 0.012711"', '"finetune: train_gflops <= 0.012710"',
             '"er: train_gflops >= 1.1x finetune"', '"er: train_gflops <= 1x finetune"']
    suite = tmp_path / "mini.toml"
    suite.write_text(f"gates = [{', '.join(gates)}]\n" + mini_suite(seeds=1).replace(
        "[defaults]", "[defaults]\nmemory_size = 200"))
    out = clharness.run(str(suite), methods=["finetune", "er"], results=str(tmp_path / "r.sqlite"))
    assert [r.train_gflops for r in out if r.method == "finetune"] == [1257 * 10112 / 1e9]
    verdicts = [u.outcome for u in out.gates]
    assert verdicts == ["passed", "failed", "passed", "failed"], [u.message for u in out.gates]


# --- equal-budget views: the Pareto front and the ranking at equal compute ------------------------
from clharness.reporting import budget  # noqa: E402

# (train GFLOPs, final acc): B is cheaper and more accurate than C, so C is dominated (by B only: A and D
# are cheaper but less accurate); A, B and D are each best at their cost. E's training was not counted.
POINTS = {"A": (10.0, 0.20), "B": (20.0, 0.60), "C": (25.0, 0.30), "D": (5.0, 0.10), "E": (None, 0.90)}


def _budget_records():
    return [rec(m, seed, acc, train, scenario="s") for m, (train, acc) in POINTS.items() for seed in (0, 1)]


def test_the_pareto_front_excludes_a_dominated_point():
    pts = {p.method: p for p in budget.points(_budget_records())}
    assert {m for m, p in pts.items() if p.pareto} == {"A", "B", "D"}
    assert pts["C"].dominated_by == ["B"] and not pts["C"].pareto
    assert not pts["E"].placed and pts["E"].why_not_placed == "training FLOPs not counted"
    # equal on one axis, better on the other: dominated; equal on both: neither dominates
    tie = budget.front([budget.Point("x", 10.0, 0.5, 1), budget.Point("y", 10.0, 0.4, 1),
                        budget.Point("z", 10.0, 0.5, 1)])
    assert [p.pareto for p in tie] == [True, False, True] and tie[1].dominated_by == ["x", "z"]


def test_a_partly_counted_method_has_no_point():
    records = _budget_records() + [rec("A", 2, 0.2, None)]   # a third seed of A, not counted
    pts = {p.method: p for p in budget.points(records)}
    assert not pts["A"].placed and {m for m, p in pts.items() if p.pareto} == {"B", "D"}


def test_the_ranking_at_equal_compute_as_computed_by_hand():
    # accuracy per GFLOP: A 0.2/10 = 0.02, B 0.6/20 = 0.03, C 0.3/25 = 0.012, D 0.1/5 = 0.02 (tie with A:
    # the more accurate first); E unplaced, last
    ranked = budget.ranking(budget.points(_budget_records()))
    assert [p.method for p in ranked] == ["B", "A", "D", "C", "E"]
    assert [round(p.per_gflop, 6) for p in ranked[:4]] == [0.03, 0.02, 0.02, 0.012]


def test_report_per_gflop_prints_the_ranking(tmp_path, capsys):
    from clharness.cli import main
    from clharness.results import ResultsStore
    path = tmp_path / "r.sqlite"
    store = ResultsStore(path)
    for r in _budget_records():
        r.key = f"{r.method}-{r.seed}"   # the store keeps one record per key
        store.put(r)
    store.close()
    assert main(["report", str(path), "--per-gflop"]) == 0
    out = capsys.readouterr().out
    table = out[out.index("At equal compute"):]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()
            if line.startswith("|") and not set(line) <= set("|:- ")][1:]
    assert [r[:2] for r in rows] == [["1", "B"], ["2", "A"], ["3", "D"], ["4", "C"], ["-", "E"]]
    assert rows[0][2:] == ["20", "0.600", "0.03", "yes"] and rows[3][5] == "no (dominated by B)"
    assert rows[4][5] == "training FLOPs not counted"
    assert main(["report", str(path), "--per-gflop", "--format", "csv"]) == 2
    assert "--per-gflop prints a table" in capsys.readouterr().err


def test_the_html_report_draws_accuracy_against_training_flops():
    from clharness.reporting.report import build_html
    page = build_html(_budget_records())
    assert "s: accuracy vs training FLOPs" in page and "Not placed: E (training FLOPs not counted)" in page
