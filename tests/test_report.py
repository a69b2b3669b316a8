"""`clharness report`: text formats, the self-contained HTML page, its figures' data, bad input."""
import io
import json
import math
import re
import sqlite3

import numpy as np
import pandas as pd
import pytest

from clharness.reporting import plots
from clharness.cli import main
from clharness.metrics import all_metrics
from clharness.results import ResultsStore, RunRecord, run_key

SIZES = [100, 100, 200]
# Lower triangle per method; seed s adds 0.01 * s to every seen cell. Unreached cells are None.
BASE = {
    "er":       [[0.9, None, None], [0.8, 0.9, None], [0.6, 0.7, 0.9]],
    "ewc":      [[0.9, None, None], [0.5, 0.9, None], [0.3, 0.4, 0.9]],
    "finetune": [[0.9, None, None], [0.2, 0.9, None], [0.1, 0.1, 0.9]],
}
MEMORY = {"er": 50.0, "ewc": 20.0, "finetune": 10.0}
# er, split: final_acc = (0.6 + 0.7 + 2 * 0.9) / 4 = 0.775 at seed 0; seeds 0,1,2 add 0, .01, .02
# -> mean 0.785, sd 0.01, 95% CI half-width t(.975, 2) * 0.01 / sqrt(3) = 0.0248.
ER_FINAL_MEAN, ER_FINAL_CI = 0.785, 4.302653 * 0.01 / math.sqrt(3)


def record(scenario, method, seed, status="passed", **kw):
    R = [[None if v is None else v + 0.01 * seed for v in row] for row in BASE[method]]
    Rn = [[math.nan if v is None else v for v in row] for row in R]
    metrics = all_metrics(Rn, SIZES) if status == "passed" else {}
    if scenario == "perm":
        metrics["robustness"] = 0.5
    rec = RunRecord(suite="toy", scenario=scenario, method=method, seed=seed, setting="class-incremental",
                    status=status, acc_matrix=Rn, task_sizes=SIZES, metrics=metrics,
                    train_seconds=1.0 + seed, memory_mb=MEMORY[method], **kw)
    rec.key = run_key({"scenario": scenario, "method": method, "seed": seed})
    return rec


@pytest.fixture
def store(tmp_path):
    path = tmp_path / "results.sqlite"
    s = ResultsStore(path)
    for scenario in ("split", "perm"):
        for method in BASE:
            for seed in range(3):
                s.put(record(scenario, method, seed))
    s.put(record("split", "ewc", 3, status="failed", failed_task=1, message="loss became NaN at task 1"))
    s.put(record("hard", "er", 0, status="diverged", message="accuracy at chance after task 0"))
    s.close()
    return path


def run(capsys, *argv):
    code = main(["report", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------------------ text formats
def test_markdown_table_has_hand_computed_mean_and_ci(store, capsys):
    code, out, err = run(capsys, store)
    assert code == 0 and err == ""
    er_split = next(line for line in out.splitlines() if "toy::split" in line and "| er " in line)
    assert f"{ER_FINAL_MEAN:.3f} ± {ER_FINAL_CI:.3f}" == "0.785 ± 0.025"
    assert "0.785 ± 0.025" in er_split
    assert "| 3 " in er_split   # seeds that passed
    ewc_split = next(line for line in out.splitlines() if "toy::split" in line and "| ewc " in line)
    assert "1 failed" in ewc_split
    assert "toy::hard" in out and "1 diverged" in out
    assert out.lstrip().startswith("| scenario")


def test_md_is_a_plain_pipe_table_and_github_its_own_flavour(store, capsys):
    md, github = run(capsys, store)[1], run(capsys, store, "--format", "github")[1]
    assert md != github
    md_rule, gh_rule = md.splitlines()[1], github.splitlines()[1]
    assert set(md_rule) <= set("|:-") and ":" in md_rule                 # pipe table with alignment colons
    assert set(gh_rule) <= set("|-") and gh_rule.startswith("|--")      # GitHub's: dashes only
    assert [ln for ln in md.splitlines() if "| er " in ln] and [ln for ln in github.splitlines() if "| er " in ln]


def test_report_help_reads_95_percent(capsys):
    with pytest.raises(SystemExit):
        main(["report", "--help"])
    out = capsys.readouterr().out
    assert "95% CI" in " ".join(out.split()) and "%%" not in out


def test_latex_csv_json(store, capsys):
    code, out, _ = run(capsys, store, "--format", "latex")
    assert code == 0 and "\\toprule" in out and "0.785 ± 0.025" in out
    assert "toy::split" in out   # tabulate escapes what LaTeX would choke on (underscores, &)

    code, out, _ = run(capsys, store, "--format", "csv", "--columns", "final_acc,ala", "--columns", "memory_mb")
    frame = pd.read_csv(io.StringIO(out))
    assert code == 0 and {"final_acc", "final_acc_ci", "ala", "memory_mb"} <= set(frame.columns)
    assert "forgetting" not in frame.columns
    row = frame[(frame.scenario == "split") & (frame.method == "er")].iloc[0]
    assert row.final_acc == pytest.approx(ER_FINAL_MEAN) and row.final_acc_ci == pytest.approx(ER_FINAL_CI, rel=1e-4)
    assert row.ala == pytest.approx(0.91) and row.memory_mb == 50.0

    code, out, _ = run(capsys, store, "--format", "json")
    data = json.loads(out)
    assert code == 0 and data["columns"][0] == "final_acc"
    er = next(r for r in data["summary"] if r["scenario"] == "split" and r["method"] == "er")
    assert er["final_acc"] == pytest.approx(ER_FINAL_MEAN) and er["seeds"] == 3
    hard = next(r for r in data["summary"] if r["scenario"] == "hard")
    assert hard["final_acc"] is None and hard["diverged"] == 1   # NaN -> null, still valid JSON


def test_suite_filter(store, capsys, tmp_path):
    s = ResultsStore(store)
    other = record("split", "er", 0)
    other.suite, other.key = "other", "other-key"
    s.put(other)
    s.close()
    code, out, _ = run(capsys, store, "--suite", "other")
    assert code == 0 and "other::split" in out and "toy::" not in out
    code, _, err = run(capsys, store, "--suite", "nope")
    assert code == 2 and "no runs of suite nope" in err and "other, toy" in err


# ------------------------------------------------------------------------ HTML page
def test_html_is_self_contained_with_one_image_per_figure(store, capsys, tmp_path):
    page = tmp_path / "out" / "report.html"
    code, out, err = run(capsys, store, "--html", page, "--format", "json")
    assert code == 0 and json.loads(out) and "wrote" in err
    text = page.read_text()
    # Two scenarios with passed runs x (accuracy curve, radar, heatmap grid); "hard" has none.
    images = re.findall(r"<img [^>]*src=\"data:image/png;base64,", text)
    assert len(images) == len(re.findall(r"<img", text)) == 6
    assert "<svg" not in text
    assert "http://" not in text and "https://" not in text
    assert not re.search(r"(src|href)=[\"'](?!data:|#)", text)   # only inline data and in-page anchors
    assert "<link" not in text and "<script" not in text and "@import" not in text
    # the scorecard table, and the failed and diverged runs listed (not plotted)
    assert "0.785 ± 0.025" in text
    assert "toy::split[ewc-seed3]" in text and "loss became NaN at task 1" in text
    assert "toy::hard[er-seed0]" in text and "no passed runs to plot" in text
    assert "runs not plotted (2)" in text


def test_figures_drawn_by_worker_processes_give_the_same_page(store):
    """``workers`` only spreads the figures over processes: the page is byte for byte the serial one
    (but for its timestamp), each scenario's figures in its own place."""
    from clharness.reporting.report import build_html
    records = ResultsStore(store).records()
    serial, parallel = (re.sub(r"generated [0-9-]+ [0-9:]+", "", build_html(records, workers=n)) for n in (1, 2))
    assert parallel == serial
    assert len(re.findall(r"<img", serial)) == 6


def test_a_section_that_raises_mid_page_leaves_no_figure_worker_behind(store, monkeypatch):
    """The error reaches the caller and the worker processes are gone with it (not left running
    until the caller's process exits)."""
    import multiprocessing
    from clharness.reporting import report

    records = ResultsStore(store).records()

    def broken_sections(*args, **kwargs):
        raise RuntimeError("section exploded")

    monkeypatch.setattr("clharness.kinds.report_sections", broken_sections)
    with pytest.raises(RuntimeError, match="section exploded"):
        report.build_html(records, workers=2)
    assert multiprocessing.active_children() == []


def test_figure_data(store):
    recs = [r for r in ResultsStore(store).records() if r.status == "passed"]
    er = [r for r in recs if r.scenario == "split" and r.method == "er"]
    M = plots.mean_matrix(er)
    assert M[2, 0] == pytest.approx(0.61) and np.isnan(M[0, 2])
    steps = plots.step_accuracy(er)
    # seed 0: after task 1 (0.8 + 0.9) / 2; after task 2 weighted (0.6 + 0.7 + 2 * 0.9) / 4
    assert steps[0].tolist() == pytest.approx([0.9, 0.85, 0.775])
    mean, lo, hi = plots.mean_band(steps)
    assert mean[2] == pytest.approx(ER_FINAL_MEAN) and hi[2] - mean[2] == pytest.approx(ER_FINAL_CI, rel=1e-4)

    def groups(scenario):
        return {m: [r for r in recs if r.scenario == scenario and r.method == m] for m in BASE}

    labels, values = plots.radar_table(groups("split"))
    assert not any("robustness" in lab for lab in labels) and len(labels) == 5
    mem = next(i for i, lab in enumerate(labels) if lab.startswith("memory"))
    # efficiency = cheapest cost / the method's: 10/50, 10/20, 10/10 (not min-max: nobody at the centre)
    assert [values[m][mem] for m in ("er", "ewc", "finetune")] == pytest.approx([0.2, 0.5, 1.0])
    time_axis = next(i for i, lab in enumerate(labels) if lab.startswith("training time"))
    assert all(v[time_axis] == 1.0 for v in values.values())   # all tied: everyone on the rim
    retention = labels.index("retention\n(1 − AFM)")
    assert values["er"][retention] == pytest.approx(1 - (0.3 + 0.2) / 2)
    labels, values = plots.radar_table(groups("perm"))
    assert "robustness" in labels and values["er"][labels.index("robustness")] == 0.5


# ------------------------------------------------------------------------ bad input
def bad(capsys, path, *extra):
    code, out, err = run(capsys, path, *extra)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    return err


def test_missing_file_is_not_created(capsys, tmp_path):
    path = tmp_path / "nope.sqlite"
    assert "does not exist" in bad(capsys, path)
    assert not path.exists()


def test_not_sqlite_and_empty_files(capsys, tmp_path):
    text = tmp_path / "scorecard.md"
    text.write_text("| a | b |\n")
    assert "not an SQLite file" in bad(capsys, text)
    empty = tmp_path / "empty.sqlite"
    empty.touch()
    assert "empty" in bad(capsys, empty)
    assert empty.stat().st_size == 0   # the report never initialises a store
    assert "directory" in bad(capsys, tmp_path)


def test_other_sqlite_and_store_without_runs(capsys, tmp_path):
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE customers (id INTEGER)")
    assert "SQLite file of something else" in bad(capsys, other)
    fresh = tmp_path / "fresh.sqlite"
    ResultsStore(fresh).close()
    assert "holds no runs" in bad(capsys, fresh)


def test_unknown_column(store, capsys):
    assert "unknown column(s) accuracy" in bad(capsys, store, "--columns", "accuracy")
