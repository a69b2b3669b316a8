"""`clharness compare A B` (side-by-side diff, exit 1 on a regression) and the ranking agreement
between scenarios shown with every scorecard."""
import json
import math

import pytest
from scipy import stats

from clharness.cli import main
from clharness.results import ResultsStore
from clharness.reporting.scorecard import rank_agreement, summarize, write

from test_report import BASE, ER_FINAL_MEAN, record


@pytest.fixture
def baseline(tmp_path):
    """A scorecard JSON of the toy records (3 methods x 2 scenarios x 3 seeds)."""
    records = [record(sc, m, seed) for sc in ("split", "perm") for m in BASE for seed in range(3)]
    return write(tmp_path / "a.json", records), records


def shifted(tmp_path, path, method, metric, delta, name="b.json"):
    card = json.loads(path.read_text())
    for row in card["summary"]:
        if row["method"] == method:
            row[metric] += delta
    out = tmp_path / name
    out.write_text(json.dumps(card))
    return out


def cmp(capsys, *argv):
    code = main(["compare", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_identical_scorecards_pass_and_show_every_row(baseline, capsys):
    path, _ = baseline
    code, out, _ = cmp(capsys, path, path)
    assert code == 0 and out.rstrip().endswith("no regression")
    assert out.count("toy::split") == 3 and out.count("toy::perm") == 3
    assert f"{ER_FINAL_MEAN:.3f} → {ER_FINAL_MEAN:.3f} (=)" in out


def test_a_drop_beyond_the_allowance_fails_with_numbers(baseline, tmp_path, capsys):
    path, _ = baseline
    worse = shifted(tmp_path, path, "er", "final_acc", -0.05)
    code, out, _ = cmp(capsys, path, worse, "--max-drop", "final_acc=0.02")
    assert code == 1
    assert f"REGRESSION split/er: final_acc {ER_FINAL_MEAN:.4f} -> {ER_FINAL_MEAN - 0.05:.4f}, worse by 0.0500 " \
           "> allowed drop 0.02" in out
    assert "2 regression(s)" in out   # er is worse in both scenarios
    # within a larger allowance it passes; a gain is never a regression
    assert cmp(capsys, path, worse, "--max-drop", "final_acc=0.06")[0] == 0
    assert cmp(capsys, worse, path)[0] == 0


def test_lower_is_better_metrics_regress_upwards(baseline, tmp_path, capsys):
    path, _ = baseline
    more_forgetting = shifted(tmp_path, path, "ewc", "forgetting", +0.1)
    code, out, _ = cmp(capsys, path, more_forgetting, "--max-drop", "forgetting=0.05")
    assert code == 1 and "ewc: forgetting" in out and "▼" in out
    less = shifted(tmp_path, path, "ewc", "forgetting", -0.1, name="c.json")
    assert cmp(capsys, path, less, "--max-drop", "forgetting=0.05")[0] == 0


def test_unknown_methods_and_metrics_are_fatal_with_a_did_you_mean(baseline, tmp_path, capsys):
    """Issue 27 item 7 (deliberate change): a row on one side only is a mismatch (exit 1), a
    --max-drop metric in neither scorecard is unusable input (exit 2); more in test_trust_compare.py."""
    path, _ = baseline
    card = json.loads(path.read_text())
    card["summary"].append({**card["summary"][0], "method": "ghost"})
    other = tmp_path / "ghost.json"
    other.write_text(json.dumps(card))
    code, out, _ = cmp(capsys, path, other, "--max-drop", "final_acc=0.02")
    assert code == 1
    assert "MISMATCH method 'ghost' in toy::split is in B only" in out
    code, _, err = cmp(capsys, path, other, "--max-drop", "nosuch=0.1", "--max-drop", "final_acc=0.02")
    assert code == 2 and "max drop metric 'nosuch' is not in the scorecard(s)" in err


def test_a_results_store_compares_with_its_own_scorecard(baseline, tmp_path, capsys):
    path, records = baseline
    store = ResultsStore(tmp_path / "runs.sqlite")
    for r in records:
        store.put(r)
    store.close()
    code, out, _ = cmp(capsys, path, tmp_path / "runs.sqlite")
    assert code == 0 and "no regression" in out and "only in" not in out


@pytest.mark.parametrize("content, message", [
    (None, "does not exist"),
    ("{\"rows\": []}", "not a clharness scorecard JSON"),
    ("not json", "not a clharness scorecard JSON"),
])
def test_unusable_input_exits_2_with_the_reason(baseline, tmp_path, capsys, content, message):
    path, _ = baseline
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    code, out, err = cmp(capsys, path, bad)
    assert code == 2 and message in err and str(bad) in err
    assert cmp(capsys, path, path, "--max-drop", "final_acc")[0] == 2


def test_rank_agreement_between_scenarios_matches_scipy():
    # perm ranks the three methods like split except ewc and finetune swap places
    records = [record("split", m, s) for m in BASE for s in range(2)]
    flipped = {"er": 0.9, "ewc": 0.1, "finetune": 0.5}
    for m, v in flipped.items():
        for s in range(2):
            r = record("perm", m, s)
            r.metrics["final_acc"] = v
            records.append(r)
    agreement = rank_agreement(summarize(records))
    assert len(agreement) == 1
    row = agreement.iloc[0]
    split = [summarize(records).query("scenario == 'split' and method == @m").final_acc.item() for m in BASE]
    rho, p = stats.spearmanr(split, [flipped[m] for m in BASE])
    assert (row.scenario_a, row.scenario_b, row.methods) == ("split", "perm", 3)
    assert math.isclose(row.spearman, rho) and math.isclose(row.spearman_p, p)
    assert math.isclose(row.spearman, 0.5) and math.isclose(row.kendall, 1 / 3)
    # fewer than three shared methods: no row
    assert rank_agreement(summarize([r for r in records if r.method != "ewc"])).empty


def test_rank_agreement_pairs_gtep_scenarios_by_their_evaluation_phase_not_tuning_configs():
    """gtep-digits: one GTEP scenario has 3 tuning configurations and an evaluation phase; they are
    phases of one scenario, not scenarios to pair. Two GTEP scenarios give one row (their eval phases)."""
    records = []
    for scenario, accs in (("high", {"er": 0.9, "ewc": 0.5, "finetune": 0.1}),
                           ("low", {"er": 0.8, "ewc": 0.2, "finetune": 0.4})):
        for phase in ("tune-c0", "tune-c1", "tune-c2", "eval"):
            for m, v in accs.items():
                r = record(f"{scenario}:{phase}", m, 0)
                r.metrics["final_acc"] = v if phase == "eval" else 1 - v
                records.append(r)
    agreement = rank_agreement(summarize(records))
    assert len(agreement) == 1
    row = agreement.iloc[0]
    assert (row.scenario_a, row.scenario_b, row.methods) == ("high", "low", 3)
    assert math.isclose(row.kendall, stats.kendalltau([0.9, 0.5, 0.1], [0.8, 0.2, 0.4]).statistic)


def test_kind_specific_metrics_join_the_default_columns():
    from clharness.reporting.scorecard import COLUMNS, default_columns, render
    records = [record("split", "er", s) for s in range(2)]
    assert default_columns(records) == list(COLUMNS)
    for i, r in enumerate(records):   # an STF record: final_acc and information retention
        r.metrics = {"final_acc": 0.8 + 0.02 * i, "info_retention": 0.9}
    columns = default_columns(records)
    assert columns.index("info_retention") == columns.index("bwt") + 1 < columns.index("train_seconds")
    text = render(summarize(records, columns), columns)
    assert "info retention" in text and "0.900" in text
