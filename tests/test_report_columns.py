"""Report tables per family (issue 19 part 1): each table shows only the metrics its own records
carry, under readable headings, in a fixed order; text, markdown, LaTeX and HTML alike."""
import re

import pytest

from clharness.reporting.report import build_html, render_text
from clharness.results import RunRecord, run_key
from clharness.reporting.scorecard import default_columns, heading

R = [[0.9, float("nan")], [0.6, 0.8]]
FAMILY_METRICS = {   # suite -> the metrics its kind adds to the common ones
    "quickstart": {},
    "stf-digits": {"info_retention": 0.4},
    "cldyb-mini": {"lookahead_seconds": 3.0, "clustering_seconds": 1.5, "robustness": 0.5},
}


def make(suite, method, seed):
    rec = RunRecord(suite=suite, scenario="s", method=method, seed=seed, setting="class-incremental",
                    status="passed", acc_matrix=R, task_sizes=[10, 10],
                    metrics={"final_acc": 0.7, "avg_inc_acc": 0.8, "forgetting": 0.3, "bwt": -0.3,
                             **FAMILY_METRICS[suite]}, train_seconds=2.0, memory_mb=5.0)
    rec.key = run_key({"suite": suite, "method": method, "seed": seed})
    return rec


@pytest.fixture(scope="module")
def records():
    return [make(s, m, seed) for s in FAMILY_METRICS for m in ("er", "finetune") for seed in (0, 1)]


def test_default_columns_fixed_order(records):
    assert default_columns(records) == ["final_acc", "avg_inc_acc", "forgetting", "bwt", "info_retention",
                                        "robustness", "train_seconds", "clustering_seconds",
                                        "lookahead_seconds", "train_gflops", "eval_gflops", "memory_mb"]
    # the order does not depend on the order of the records
    assert default_columns(records[::-1]) == default_columns(records)


def test_readable_headings():
    assert heading("train_seconds") == "train s"
    assert heading("lookahead_seconds") == "look-ahead s"
    assert heading("clustering_seconds") == "clustering s"
    assert heading("info_retention") == "info retention"
    assert heading("bwt") == "BWT"


def _tables(text):
    """suite -> its table's text, from the per-suite sections of render_text."""
    parts = re.split(r"^suite (\S+):\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


@pytest.mark.parametrize("fmt", ["md", "github", "latex"])
def test_each_suite_table_has_only_its_columns(records, fmt):
    tables = _tables(render_text(records, default_columns(records), fmt))
    assert set(tables) == set(FAMILY_METRICS)
    quick, stf, cldyb = tables["quickstart"], tables["stf-digits"], tables["cldyb-mini"]
    for absent in ("info retention", "look-ahead s", "clustering s", "robustness"):
        assert absent not in quick
    assert "train s" in quick and "memory MB" in quick and "final acc" in quick
    assert "info retention" in stf and "look-ahead s" not in stf and "robustness" not in stf
    assert "look-ahead s" in cldyb and "clustering s" in cldyb and "info retention" not in cldyb
    # fixed order: accuracy columns, the family's scores, train s, the family's timings, memory
    order = [quick.index(h) for h in ("final acc", "avg inc acc", "forgetting", "BWT", "train s", "memory MB")]
    assert order == sorted(order)
    order = [cldyb.index(h) for h in ("BWT", "robustness", "train s", "clustering s", "look-ahead s", "memory MB")]
    assert order == sorted(order)


def test_html_tables_per_suite(records):
    page = build_html(records, default_columns(records))
    sections = dict(re.findall(r"<h2 id='suite-([^']+)'>.*?</h2>\s*(<table>.*?</table>)", page, flags=re.S))
    assert set(sections) == set(FAMILY_METRICS)
    heads = {s: [h.strip() for h in re.findall(r"<th[^>]*>(.*?)</th>", t)] for s, t in sections.items()}
    assert heads["quickstart"] == ["scenario", "method", "seeds", "final acc", "avg inc acc", "forgetting", "BWT",
                                   "train s", "memory MB", "problems"]
    assert "info retention" in heads["stf-digits"] and "look-ahead s" not in heads["stf-digits"]
    assert {"look-ahead s", "clustering s", "robustness"} <= set(heads["cldyb-mini"])


# ------------------------------------------------------------------ GTEP section (HTML)
def _gtep_records():
    """Methods a > b > c in tuning (c1 wins every method's tuning), c > b > a in evaluation; the
    suite's tuning ran 12 configurations for method a so c10/c11 must sort after c2."""
    def rec(method, scenario, seed, acc, lr):
        r = RunRecord("g", scenario, method, seed, status="passed", hparams={"lr": lr}, parameters=100,
                      metrics={"final_acc": acc, "avg_inc_acc": acc}, train_seconds=1.0, eval_seconds=0.5,
                      acc_matrix=R, task_sizes=[10, 10])
        r.key = run_key({"s": scenario, "m": method, "seed": seed})
        return r
    tune = {"a": 0.9, "b": 0.8, "c": 0.7}
    evals = {"a": (0.40, 0.44), "b": (0.50, 0.54), "c": (0.60, 0.64)}
    out = []
    for m in "abc":
        for seed in (0, 1):
            out.append(rec(m, "s:tune-c0", seed, tune[m] - 0.2, 0.01))
            out.append(rec(m, "s:tune-c1", seed, tune[m], 0.1))
            out.append(rec(m, "s:eval", seed, evals[m][seed], 0.1))
    out += [rec("a", f"s:tune-c{k}", 0, 0.1, 0.5) for k in (10, 11, 2)]
    return out


def test_gtep_html_section_rows_tau_plot_and_sorted_configs():
    from clharness.benchmarks.gtep import report_html
    records = _gtep_records()
    from clharness.reporting.drawing import DRAWING
    page = report_html.section(records, DRAWING)
    rows = [[c for c in re.findall(r"<td>(.*?)</td>", tr)]
            for tr in re.findall(r"<tr>(<td>.*?)</tr>", page.split("<details>")[0])]
    assert rows == [["3 → 1", "c", "0.700", "0.620 ± 0.254", "+0.080", "c1: lr=0.1"],
                    ["2 → 2", "b", "0.800", "0.520 ± 0.254", "+0.280", "c1: lr=0.1"],
                    ["1 → 3", "a", "0.900", "0.420 ± 0.254", "+0.480", "c1: lr=0.1"]]
    assert "Kendall tau between the tuning-phase and evaluation-phase rankings: <b>-1.000</b> (ranking changes)" in page
    # the slope plot: one line per method from its tuned to its evaluated score
    lines = {m: (float(t), float(e), float(y0), float(y1)) for m, t, e, y0, y1 in re.findall(
        r"<line class='slope' data-method='(\w)' data-tune='([\d.]+)' data-eval='([\d.]+)' "
        r"x1='\d+' y1='([\d.]+)' x2='\d+' y2='([\d.]+)'", page)}
    assert {m: v[:2] for m, v in lines.items()} == {"a": (0.9, 0.42), "b": (0.8, 0.52), "c": (0.7, 0.62)}
    assert lines["a"][2] < lines["b"][2] < lines["c"][2]    # higher score drawn higher on the left ...
    assert lines["a"][3] > lines["b"][3] > lines["c"][3]    # ... and the order reversed on the right
    # the tuning records, collapsed and sorted by configuration number, then method, then trial
    details = page.split("<details>")[1]
    assert details.startswith("<summary>per-configuration tuning records (15)</summary>")
    configs = [(c, m, t) for c, m, t in re.findall(r"<tr><td>(c\d+)</td><td>(\w)</td><td>(\d)</td>", details)]
    assert configs[:4] == [("c0", "a", "0"), ("c0", "a", "1"), ("c0", "b", "0"), ("c0", "b", "1")]
    assert [c for c, _, _ in configs][-3:] == ["c2", "c10", "c11"]


def test_html_page_has_the_gtep_section_not_a_scenario_per_configuration():
    page = build_html(_gtep_records())
    assert "<h3>g::s (GTEP)</h3>" in page and "<svg" in page
    assert "<h3>g::s:tune-c" not in page           # no figure section per tuning configuration
    main_table = page.split("<h2 id='suite-g'>")[1].split("</table>")[0]
    assert "s:eval" in main_table and "s:tune-c" not in main_table


@pytest.mark.parametrize("fmt", ["md", "latex"])
def test_text_tables_leave_tuning_configurations_to_the_gtep_section(fmt):
    text = render_text(_gtep_records(), fmt=fmt)
    assert "s:eval" in text and "s:tune-c" not in text
    # 9 (method, configuration) rows: c0 and c1 for each of a, b, c, and a's c2, c10, c11
    assert "9 tuning-configuration rows (method x configuration) are summarised" in text


def test_data_formats_keep_every_tuning_row():
    import json
    rows = json.loads(render_text(_gtep_records(), fmt="json"))["summary"]
    assert sum(r["scenario"].startswith("s:tune-c") for r in rows) == 9   # (method, configuration) rows
    assert render_text(_gtep_records(), fmt="csv").count("s:tune-c") == 9
