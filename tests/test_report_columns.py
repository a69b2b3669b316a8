"""Report tables per family (issue 19 part 1): each table shows only the metrics its own records
carry, under readable headings, in a fixed order; text, markdown, LaTeX and HTML alike."""
import re

import pytest

from clharness.report import build_html, render_text
from clharness.results import RunRecord, run_key
from clharness.scorecard import default_columns, heading

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
                                        "lookahead_seconds", "memory_mb"]
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
