"""STF Table 1 preset and report (issue 15 item 14, issue 19 part 1): the 95% Student-t interval of
the STF table, ``--clh-preset stf:table1``, the training loss and information retention recorded
along the stream, the stream rebuilt from its record, and the family's report sections."""
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from clharness.benchmarks.stf import report, trace
from clharness.benchmarks.stf.kind import preset_seeds
from clharness.data import BUILTIN_SOURCES as DATASETS
from clharness.kinds import report_sections
from clharness.reporting.drawing import DRAWING
from clharness.metrics import mean_ci
from clharness.plugins import Harness
from clharness.results import RunRecord
from clharness.engine.runner import Case, resolve_hparams, run_case
from clharness.engine.scenario import build_scenario
from clharness.engine.suites import SuiteError, load_suite

SUITES = Path(__file__).parent.parent / "suites"
FIGURES = ("stf-digits: class frequencies along the stream (figs. 2 and 4)",
           "stf-digits: information retention along the stream",
           "stf-digits: ER's training loss along the stream (fig. 5)")


def test_table_interval_is_scipys_student_t_interval_for_20_runs():
    rng = np.random.default_rng(7)
    values = rng.uniform(0.3, 0.5, 20)            # 20 runs, as Table 1
    lo, hi = stats.t.interval(0.95, df=19, loc=values.mean(), scale=stats.sem(values))
    mean, half = mean_ci(values)
    assert mean == pytest.approx(values.mean(), abs=1e-15)
    assert half == pytest.approx((hi - lo) / 2, rel=1e-12)
    assert report.cell(values) == f"{100 * values.mean():.1f} ± {100 * (hi - lo) / 2:.1f}"
    # by hand: t_{0.975,19} = 2.0930; ten values 0.4 and ten 0.5 have s = 0.05 * sqrt(20/19)
    half_by_hand = 2.0930240544 * 0.05 * math.sqrt(20 / 19) / math.sqrt(20)
    assert mean_ci([0.4] * 10 + [0.5] * 10)[1] == pytest.approx(half_by_hand, rel=1e-9)
    assert report.cell([0.4] * 10 + [0.5] * 10) == "45.0 ± 2.4"
    assert report.cell([0.881]) == "88.1" and report.cell([]) == "-"   # one run has no interval


def test_table1_preset_asks_20_seeds_of_stf_suites_only():
    cifar = load_suite(SUITES / "stf-cifar10.toml")
    quick = load_suite(SUITES / "stf-cifar10.toml", quick=True)
    assert cifar.seeds == quick.seeds == 5                       # the suites keep their own counts
    assert preset_seeds(["stf:table1"], cifar) == preset_seeds(["stf:table1"], quick) == 20
    assert quick.scenarios[0].max_train_per_class == 4           # and the quick budget per run
    assert preset_seeds(["gtep:cifar50-1-10tasks"], cifar) is None
    assert preset_seeds(["stf:table1"], load_suite(SUITES / "quickstart.toml")) is None
    with pytest.raises(SuiteError, match="stf:tabel1: no such STF preset; available: stf:table1"):
        preset_seeds(["stf:tabel1"], cifar)


def test_loss_windows_average_each_window_and_leave_stepless_windows_nan():
    w = trace.LossWindows(steps=10, windows=5)                   # windows of steps 1-2, 3-4, ..., 9-10
    for step, loss in [(1, 1.0), (2, 3.0), (3, 5.0), (3, 7.0), (9, 0.5)]:
        w.at(step)
        w(torch.tensor(loss))
    got = w.means()
    assert got[:2] == [2.0, 6.0] and math.isnan(got[2]) and math.isnan(got[3]) and got[4] == 0.5
    assert trace.LossWindows(steps=7).windows == 7               # never more windows than steps


@pytest.fixture(scope="module")
def stf_records():
    """stf-digits --clh-quick: ER on the STF stream (seeds 0, 1) and the disjoint stream (seed 0),
    GDumb on the STF stream (seed 0), run in this process."""
    torch.set_num_threads(1)
    harness = Harness()
    suite = load_suite(SUITES / "stf-digits.toml", quick=True)
    specs = {s.name: s for s in suite.scenarios}
    runs = [("stf", "er", 0), ("stf", "er", 1), ("disjoint", "er", 0), ("stf", "gdumb", 0)]
    out = []
    for scenario, method, seed in runs:
        hp = resolve_hparams(harness.methods[method], suite.hparams.get(method, {}))
        out.append(run_case(Case(suite.name, specs[scenario], method, seed, hp), harness, torch.device("cpu")))
    assert all(r.status == "passed" for r in out), [r.message for r in out]
    return out


def test_er_loss_is_recorded_per_window_and_falls_along_the_stream(stf_records):
    er = stf_records[0]
    steps = math.ceil(1257 / 10)                                 # the digits train split, stream batch 10
    loss = np.array(er.extra["train_loss"], dtype=float)
    assert len(loss) == min(trace.LOSS_WINDOWS, steps) == 126 and not np.isnan(loss).any()
    assert 1.5 < loss[0] < 3.5                                    # an untrained 10-way head: about ln 10
    assert np.median(loss[len(loss) // 2:]) < 0.5 * loss[0]      # the loss falls along the stream
    assert len(er.extra["info_retention"]) == 3 and er.extra["eval_at"] == [1 / 3, 2 / 3, 1.0]
    # Av. IR is exact (every step, issue 30 item 13): the three kept points are a curve, not its mean
    assert 0 < er.metrics["info_retention"] <= 1
    assert min(er.extra["info_retention"]) - 0.2 < er.metrics["info_retention"] < max(er.extra["info_retention"]) + 0.2
    # GDumb trains only when evaluated, and exact retention evaluates after every step: every window
    # holds its losses
    gdumb = np.array(stf_records[3].extra["train_loss"], dtype=float)
    assert not np.isnan(gdumb).any() and len(gdumb) == steps
    # the record survives the store's JSON (NaN as null) unchanged
    back = RunRecord.from_json(stf_records[3].to_json())
    assert np.array_equal(np.array(back.extra["train_loss"], dtype=float), gdumb, equal_nan=True)


def test_the_recorded_description_rebuilds_the_runs_own_stream(stf_records):
    suite = load_suite(SUITES / "stf-digits.toml", quick=True)
    for record, spec in ((stf_records[1], suite.scenarios[0]), (stf_records[2], suite.scenarios[1])):
        scenario = build_scenario(spec, DATASETS, record.seed, torch.device("cpu"))
        assert np.array_equal(trace.rebuild_stream(record.extra["stream"]), scenario.stream_labels)
    broken = dict(stf_records[0].extra["stream"], seed=[5, 2])
    with pytest.raises(ValueError, match="cannot be rebuilt"):
        trace.rebuild_stream(broken)


def _other_record() -> RunRecord:
    return RunRecord("quickstart", "ci-5x2", "er", 0, status="passed", acc_matrix=[[0.9, math.nan], [0.6, 0.8]],
                     task_sizes=[10, 10], metrics={"final_acc": 0.7})


def test_html_section_has_table1_and_the_three_figures(stf_records):
    sections = report_sections(stf_records + [_other_record()], "html", lambda: None, drawing=DRAWING)
    assert [title for title, _ in sections if title.startswith("STF")] == [report.TITLE]
    body = dict(sections)[report.TITLE]
    alts = re.findall(r'<img alt="([^"]*)" src="data:image/png;base64,', body)
    assert [a.replace("&#x27;", "'") for a in alts] == list(FIGURES)
    assert "stf: Fin. Acc.</th><th>stf: Av. IR</th><th>disjoint: Fin. Acc." in body
    assert "quickstart" not in body and len(body) < 150_000
    text = dict(report_sections(stf_records, "pipe", lambda: None))["STF Table 1: stf-digits (in %, mean ± "
                                                                        "95% Student-t CI over seeds)"]
    er = [line for line in text.splitlines() if line.startswith("| er ")][0]
    fin = [r.metrics["final_acc"] for r in stf_records[:2]]
    assert report.cell(fin) in er and er.rstrip(" |").endswith("1-2")   # seeds: 2 on stf, 1 on disjoint
    one = report.cell([stf_records[2].metrics["final_acc"]])     # one seed: the mean alone, no interval
    assert "±" not in one and f"| {one} " in er


def test_nothing_stf_for_a_store_without_stf_runs():
    from clharness.reporting.report import build_html
    others = [_other_record()]
    assert not any("STF" in title for title, _ in report_sections(others, "pipe", lambda: None))
    assert not any("STF" in title for title, _ in report_sections(others, "html", lambda: None, drawing=DRAWING))
    page = build_html(others)
    assert "STF" not in page and "along the stream" not in page


def test_session_with_table1_preset_collects_20_seeds(pytester):
    collected = pytester.runpytest_subprocess("--clh-suite", "stf-digits", "--clh-quick", "--clh-method", "er",
                                              "--clh-preset", "stf:table1", "--collect-only", "-q",
                                              "-p", "no:cacheprovider")
    assert collected.ret == 0 and "stf-digits::stf[er-seed19]" in collected.stdout.str()
    collected.stdout.fnmatch_lines(["40 tests collected*"])      # 2 scenarios x 20 seeds


def test_session_end_and_md_scorecard_show_table1(stf_records, tmp_path):
    from clharness.benchmarks.stf import kind

    class Terminal:
        lines: list = []

        def section(self, title):
            self.lines.append(f"== {title}")

        def write_line(self, text):
            self.lines.append(text)

    class Session:
        records = stf_records

    kind.terminal_summary(Session(), Terminal())
    assert Terminal.lines[0] == "== clharness STF Table 1: stf-digits (in %, mean ± 95% Student-t CI over seeds)"
    assert "| er " in Terminal.lines[1] and "Student-t" in Terminal.lines[1]
    card = tmp_path / "card.md"
    card.write_text("scorecard\n")
    kind.write_scorecard(card, stf_records, None)
    kind.write_scorecard(tmp_path / "card.json", stf_records, None)   # .json / .csv: nothing added
    assert "## STF Table 1: stf-digits" in card.read_text() and not (tmp_path / "card.json").exists()
