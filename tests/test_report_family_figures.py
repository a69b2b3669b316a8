"""The M2I / I2M and CLDyB sections of the report (issue 19 part 1): what they show, on hand-made records
in the shape the runner and the CLDyB search store."""
import json
import math
import re

import numpy as np
import pytest

from clharness.reporting import plots
from clharness.reporting.drawing import DRAWING
from clharness.benchmarks.cldyb import kind as cldyb
from clharness.benchmarks.cldyb import report_html as cldyb_html
from clharness.benchmarks.cldyb import sequence as seqmod
from clharness.benchmarks.m2i import report_html as m2i_html
from clharness.benchmarks.m2i.effect import curriculum_effect
from clharness.benchmarks.m2i.kind import CURRICULA
from clharness.kinds import report_sections
from clharness.reporting.report import build_html
from clharness.results import RunRecord

# ---------------------------------------------------------------------------------- M2I / I2M
M2I_ACC = {"er": [0.60, 0.70, 0.65], "finetune": [0.30, 0.35, 0.20]}
I2M_ACC = {"er": [0.40, 0.45, 0.50], "finetune": [0.30, 0.25, 0.40]}


def curriculum_record(order, method, seed, acc):
    names = [f"{task}/{k}" for task in CURRICULA[order] for k in range(10)]
    R = np.tril(np.full((6, 6), acc)) + np.triu(np.full((6, 6), 0.1), 1)
    R[0, 0] = 0.9 if order == "m2i" else 0.2   # the first task's cell tells the two panels apart
    return RunRecord(suite="m2i-mini", scenario=f"ci-{order}", method=method, seed=seed, setting="class-incremental",
                     status="passed", class_order=names, acc_matrix=R.tolist(), task_sizes=[30] * 6,
                     metrics={"acc": acc, "bwt": -acc / 4 + 0.01 * seed, "fwt": 0.02 * seed})


def curriculum_records():
    return ([curriculum_record("m2i", m, s, a) for m, accs in M2I_ACC.items() for s, a in enumerate(accs)]
            + [curriculum_record("i2m", m, s, a) for m, accs in I2M_ACC.items() for s, a in enumerate(accs)])


def drawn_section(section, records):
    """``section(records)`` once, with what it drew: {alt: [axes titles]} of every figure turned into
    an <img> (the PNG itself is opaque) and the panels the M2I heatmap figure was given."""
    seen, real_img, real_pairs = {"panels": None}, plots.to_img, m2i_html.heatmap_pairs_figure

    def img(fig, alt, tight=True):
        seen[alt] = [ax.get_title() for ax in fig.axes if ax.get_title()]
        return real_img(fig, alt, tight)

    def pairs(panels, dpi):
        seen["panels"] = dict(panels)
        return real_pairs(panels, dpi)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plots, "to_img", img)
        mp.setattr(m2i_html, "heatmap_pairs_figure", pairs)
        return section(records), seen


@pytest.fixture(scope="module")
def m2i_page():
    records = curriculum_records()
    return (records, *drawn_section(lambda rs: m2i_html.section(rs, DRAWING), records))


def test_m2i_section_has_one_heatmap_pair_per_method(m2i_page):
    _, text, seen = m2i_page
    assert text.count("<img") == 1   # one figure for the paired scenario, every method in it
    assert json.loads(re.search(r"class='m2i-heatmaps' data-methods='([^']*)'", text).group(1).replace("&quot;", '"')) \
        == ["er", "finetune"]
    titles = seen["m2i-mini::ci-m2i vs ci-i2m: M2I and I2M accuracy matrices"]
    assert titles == ["er · M2I (3 seeds)", "er · I2M (3 seeds)", "finetune · M2I (3 seeds)", "finetune · I2M (3 seeds)"]


def test_heatmap_panels_are_the_mean_matrices_with_tasks_named_by_dataset(m2i_page):
    panels = m2i_page[2]["panels"]
    M, seeds, names = panels["er"]["m2i"]
    assert seeds == 3 and names == ["MNIST", "Omniglot", "F-MNIST", "SVHN", "CIFAR10", "TinyImgNet"]
    assert M[0, 0] == pytest.approx(0.9) and M[5, 4] == pytest.approx(np.mean(M2I_ACC["er"]))
    M, _, names = panels["finetune"]["i2m"]
    assert names[0] == "TinyImgNet" and names[-1] == "MNIST"
    assert M[0, 0] == pytest.approx(0.2) and M[3, 1] == pytest.approx(np.mean(I2M_ACC["finetune"]))


def test_m2i_effect_bars_show_effect_py_numbers_per_metric(m2i_page):
    records, text, _ = m2i_page
    charts = re.findall(r"<div class='m2i-effect-bars' data-metric='(\w+)'>(.*?)</div>", text)
    assert [m for m, _ in charts] == ["acc", "bwt", "fwt"]
    rows = {(r["metric"], r["method"]): r for r in curriculum_effect(records)}
    for metric, svg in charts:
        bars = re.findall(r"<rect class='bar' data-group='(\w+)' data-series='[^']*' data-metric='(\w+)' "
                          r"data-method='\w+' data-value='([-\d.]+)' data-ci='([-\d.]+)'", svg)
        assert [b[0] for b in bars] == ["er", "finetune"]
        for method, bar_metric, value, ci in bars:
            row = rows[(metric, method)]
            assert bar_metric == metric
            assert float(value) == pytest.approx(row["effect"], abs=5e-5)
            assert float(ci) == pytest.approx(row["effect_ci"], abs=5e-5)
    # er's accuracy effect by hand: mean of (0.6-0.4, 0.7-0.45, 0.65-0.5) = 0.2
    assert rows[("acc", "er")]["effect"] == pytest.approx(0.2)
    assert "+0.200 ± " in text and "<th>M2I − I2M</th>" in text


def test_metric_without_any_effect_gets_no_chart():
    records = curriculum_records()
    for r in records:
        r.metrics["fwt"] = math.nan
    text = m2i_html.effect_bars(curriculum_effect(records), plots.method_colors(["er", "finetune"]), DRAWING)
    assert re.findall(r"class='m2i-effect-bars' data-metric='(\w+)'", text) == ["acc", "bwt"]


def test_m2i_text_section_is_the_effect_table():
    # the paper's metrics per method come first (issue 30 item 10: tests/test_m2i_paper_metrics.py)
    [(paper_title, _), (title, text)] = m2i_html.text_sections(curriculum_records(), "github")
    assert "metrics of the paper" in paper_title
    assert "M2I minus I2M" in title and "| M2I - I2M" in text and text.count("| er ") == 4   # acc, bwt, bwt_authors, fwt


def test_m2i_and_i2m_suites_of_one_store_pair_on_the_page(tmp_path, monkeypatch):
    """The real suites are two (``m2i``, ``i2m``, scenario ``ci`` in each): the page pairs them once."""
    from clharness.reporting import report
    from clharness.reporting.report import load_records
    from clharness.results import ResultsStore
    monkeypatch.setattr(report, "_scenario_figures", lambda *a: "")   # the generic per-scenario figures: not ours
    store = ResultsStore(tmp_path / "results.sqlite")
    for r in curriculum_records():   # M2I runs first: suite m2i comes first on the page
        r.suite, r.scenario = r.scenario.split("-")[1], "ci"
        r.key = f"{r.suite}-{r.method}-{r.seed}"
        store.put(r)
    store.close()
    records = load_records(tmp_path / "results.sqlite")
    page, seen = drawn_section(build_html, records)
    m2i_part, _, i2m_part = page.partition("id='suite-i2m'")
    assert "id='suite-m2i'" in m2i_part and page.count("<table class='m2i-effect'>") == 1
    rows = {(r["metric"], r["method"]): r for r in curriculum_effect(records)}
    assert rows[("acc", "er")]["effect"] == pytest.approx(0.2) and rows[("acc", "er")]["seeds"] == 3
    effect_table = re.search(r"<table class='m2i-effect'>.*?</table>", m2i_part).group(0)
    assert f"{rows[('acc', 'er')]['effect']:+.3f} ± {rows[('acc', 'er')]['effect_ci']:.3f}" in effect_table
    bars = re.findall(r"data-metric='acc' data-method='(\w+)' data-value='([-\d.]+)'", m2i_part)
    assert [(m, float(v)) for m, v in bars] == [(m, pytest.approx(rows[("acc", m)]["effect"], abs=5e-5))
                                                for m in ("er", "finetune")]
    # the heatmaps: drawn once, each method's M2I panel (suite m2i) beside its I2M panel (suite i2m)
    assert seen["m2i::ci vs i2m::ci: M2I and I2M accuracy matrices"] == [
        "er · M2I (3 seeds)", "er · I2M (3 seeds)", "finetune · M2I (3 seeds)", "finetune · I2M (3 seeds)"]
    assert "no seed ran in both orders" not in page and page.count("class='m2i-heatmaps'") == 1
    anchor = re.search(r"<h3 id='(m2i-pair-[^']+)'>m2i::ci vs i2m::ci", m2i_part).group(1)
    assert f"paired with suite m2i: the effect and heatmaps are in <a href='#{anchor}'>" in i2m_part


# ---------------------------------------------------------------------------------- CLDyB
K, T = 2, 3
CC_SEQ = {0: ["digits/3", "digits/1", "synthetic-near/c7", "synthetic-near/c8", "synthetic-far/c2", "digits/9"],
          1: ["digits/0", "digits/4", "synthetic-far/c9", "synthetic-far/c1", "synthetic-near/c3", "digits/5"]}
AA = {"cc": {"er": 0.40, "finetune": 0.20}, "random": {"er": 0.60, "finetune": 0.35},
      "heldout": {"er": 0.55, "finetune": 0.30}, "ic": {"er": 0.30, "finetune": 0.15}}
MEMORY = {"er": 12.0, "finetune": 2.0}


def search_record(job, seed, classes):
    return RunRecord(suite="cldyb-mini", scenario=f"mini/{job}", method=cldyb.SEARCH_METHOD, seed=seed,
                     setting="class-incremental", status="passed", message="/nonexistent/sequence.json",
                     class_order=list(classes), metrics={"lookahead_seconds": 0.5}, key=f"search-{job}-{seed}")


def replay_record(use_case, method, seed, classes):
    aa = AA[use_case][method] + 0.02 * seed
    R = np.tril(np.full((T, T), aa)).tolist()
    return RunRecord(suite="cldyb-mini", scenario=f"mini/{use_case}", method=method, seed=seed,
                     setting="class-incremental", status="passed", class_order=list(classes), acc_matrix=R,
                     task_sizes=[20] * T, memory_mb=MEMORY[method],
                     metrics={"aa": aa, "ar": -0.1 * (method == "finetune"), "ala": 0.8})


def cldyb_records():
    out = []
    for seed in (0, 1):
        other = [f"synthetic-far/c{k + 10 * seed}" for k in range(K * T)]
        ic_er = CC_SEQ[seed][::-1]
        out += [search_record("cc", seed, CC_SEQ[seed]), search_record("random", seed, other),
                search_record("ic-er", seed, ic_er)]
        for m in ("er", "finetune"):
            out += [replay_record("cc", m, seed, CC_SEQ[seed]), replay_record("random", m, seed, other),
                    replay_record("heldout", m, seed, [c.replace("far", "held") for c in other])]
        out.append(replay_record("ic", "er", seed, ic_er))
    return out


@pytest.fixture(scope="module")
def cldyb_page():
    records = cldyb_records()
    return (records, *drawn_section(lambda rs: cldyb_html.section(rs, DRAWING), records))


def test_cldyb_bars_show_cc_random_and_heldout_per_method(cldyb_page):
    records, text, _ = cldyb_page
    svg = re.search(r"<figure class='cldyb-bars'[^>]*>(.*?)</figure>", text).group(1)
    bars = re.findall(r"<rect class='bar' data-group='(\w+)' data-series='(\w+)' data-method='\w+' "
                      r"data-value='([\d.]+)' data-ci='([\d.]+)'", svg)
    assert [(g, s) for g, s, _, _ in bars] == [(m, s) for m in ("er", "finetune") for s in ("cc", "random", "heldout")]
    rows = {r["method"]: r for r in cldyb.summary_rows(records)}   # the search records' row is not drawn
    for method, series, value, ci in bars:
        mean, half = rows[method][f"{series}_aa"]
        assert mean == pytest.approx(AA[series][method] + 0.01)   # seeds 0 and 1 add 0 and 0.02
        assert float(value) == pytest.approx(mean, abs=5e-5)
        assert float(ci) == pytest.approx(half, abs=5e-5) and half > 0
    assert "CC sequence" in svg and "held-out" in svg   # the legend
    assert "CC minus random final AA, mean over 2 methods: -0.175" in text
    assert "rank correlation cc vs held-out over 2 methods" in text
    assert "<th>robustness (IC AA)</th>" in text and "0.310 ± " in text   # er's IC AA over seeds 0, 1


def test_cldyb_radar_has_fig4_axes(cldyb_page):
    records, text, seen = cldyb_page
    assert list(seen) == ["panels", "cldyb-mini::mini: CLDyB radar (fig. 4)"]   # the one figure drawn
    assert "class='cldyb-radar' style='flex:0 1 auto'><img alt=\"cldyb-mini::mini: CLDyB radar (fig. 4)\"" in text
    labels, values = cldyb_html.radar_table(cldyb_html.scenarios(records)[("cldyb-mini", "mini")])
    assert [lab.split("\n")[0] for lab in labels] == ["final AA (CC)", "AR (CC)", "ALA (CC)", "robustness",
                                                      "memory efficiency"]
    assert values["er"] == pytest.approx([0.41, 1.0, 0.8, 0.31, 0.0])
    # finetune: AR -0.1 -> 0.9; robustness absent (no IC run) -> centre; least memory -> rim
    assert values["finetune"] == pytest.approx([0.21, 0.9, 0.8, 0.0, 1.0])


def test_chosen_sequence_lists_the_searched_classes_task_by_task(cldyb_page):
    text = cldyb_page[1]
    opened, _, collapsed = text.partition("<details>")
    table = re.search(r"<table class='cldyb-sequence'>(.*?)</table>", opened).group(1)
    tasks = [re.findall(r"<li data-dataset='([\w-]+)'>([^<]+)</li>", row) for row in table.split("<tr>")[2:]]
    assert [[c for _, c in t] for t in tasks] == [CC_SEQ[0][i:i + K] for i in range(0, K * T, K)]
    assert all(d == c.split("/")[0] for t in tasks for d, c in t)
    assert [re.search(r"<td>\d</td><td>([^<]*)</td>", row).group(1) for row in table.split("<tr>")[2:]] == \
        ["digits ×2", "synthetic-near ×2", "synthetic-far ×1, digits ×1"]
    assert "seed 0" in opened
    # seed 1's CC sequence and the IC sequences (both seeds) are behind the collapsed <details>
    assert "cc, seed 1" in collapsed and collapsed.count("ic-er, seed") == 2
    assert "synthetic-far/c9" in collapsed and "synthetic-far/c9" not in opened


def test_sequence_tasks_come_from_the_sequence_file_without_a_replay(tmp_path):
    path = seqmod.save(tmp_path / "seq.json", {"classes_per_task": 3, "pool": [], "search_key": "k1",
                                               "steps": [{"classes": CC_SEQ[0][:3]}, {"classes": CC_SEQ[0][3:]}]})
    search = search_record("cc", 0, CC_SEQ[0])
    search.message, search.key = str(path), "k1"
    assert cldyb_html.chosen_sequences([search], "cldyb-mini", "mini") == [(0, [CC_SEQ[0][:3], CC_SEQ[0][3:]])]
    search.key = "a later search"   # the file was overwritten by another search: boundaries unknown, one row
    assert cldyb_html.chosen_sequences([search], "cldyb-mini", "mini") == [(0, [CC_SEQ[0]])]


def test_cldyb_text_section_has_table_and_cc_sequence():
    [(title, text)] = cldyb_html.text_sections(cldyb_records(), "github")
    assert title.endswith("cldyb-mini::mini") and "| held-out AA" in text
    assert "CC sequence found by the search (seed 0)" in text
    assert "| 0      | digits ×2                   | digits/3, digits/1 " in text


# ---------------------------------------------------------------------------------- the page
def split_record(method, seed):
    return RunRecord(suite="toy", scenario="split", method=method, seed=seed, setting="class-incremental",
                     status="passed", acc_matrix=[[0.9, math.nan], [0.5, 0.8]], task_sizes=[10, 10],
                     class_order=["0", "1", "2", "3"], metrics={"final_acc": 0.65})


def test_page_has_the_family_sections_only_for_their_families(monkeypatch):
    from clharness.reporting import report
    monkeypatch.setattr(report, "_scenario_figures", lambda *a: "")   # the generic per-scenario figures: not ours
    page = build_html(curriculum_records() + cldyb_records() + [split_record("er", s) for s in range(2)])
    assert page.count(m2i_html.TITLE) == 1 and page.count(cldyb_html.TITLE) == 1
    toy = page.partition("id='suite-toy'")[2]
    assert m2i_html.TITLE not in toy and cldyb_html.TITLE not in toy
    plain = [split_record(m, s) for m in ("er", "finetune") for s in range(2)]
    titles = [t for t, _ in report_sections(plain, "html", lambda: None, drawing=DRAWING)]
    titles += [t for t, _ in report_sections(plain, "github", lambda: None)]
    assert not [t for t in titles if "M2I" in t or "CLDyB" in t]
    assert m2i_html.section(plain, DRAWING) is None and cldyb_html.section(plain, DRAWING) is None


def test_task_labels_read_the_shared_head_class_names():
    """With the authors' shared 10-way head, class k's name joins class k of every task (" | ")."""
    joined = [" | ".join(f"{task}/{k}" for task in CURRICULA["i2m"]) for k in range(10)]
    record = RunRecord(suite="s", scenario="ti-i2m", method="er", seed=0, class_order=joined)
    assert m2i_html.task_labels(record) == ["TinyImgNet", "CIFAR10", "SVHN", "F-MNIST", "Omniglot", "MNIST"]


def test_svg_bar_chart_spans_zero_and_marks_missing_values():
    from clharness.reporting.report_svg import Bar, bar_chart, nice_ticks
    assert nice_ticks(-0.23, 0.41) == [-0.2, 0.0, 0.2, 0.4]
    svg = bar_chart([("a", [Bar(-0.3, 0.1, series="x")]), ("b", [Bar(math.nan, series="x")])], "t", "y")
    assert "data-value='-0.3000' data-ci='0.1000'" in svg and "class='bar-missing'" in svg
    ticks = [float(t) for t in re.findall(r"font-size='10'>([-\d.]+)</text>", svg)]
    assert min(ticks) <= -0.4 and max(ticks) >= 0.0   # the error bar's end (-0.4) and zero are on the axis
