"""The report, fit for a paper (issue 31): one colour per method across every figure of a page (the
families' included), vector export (--clh-figures / report --figures), no pseudo-methods in radars,
STF radars that do not collapse, intervals and tests that say n, GTEP labels that do not overlap,
training time with its spread, and scripts/render_report.py's check of a rendered demo report."""
import html
import importlib.util
import math
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from xml.etree import ElementTree

import numpy as np
import pytest
from scipy import stats

from clharness.cli import main
from clharness.reporting import plots, report, report_svg
from clharness.reporting.drawing import DRAWING
from clharness.reporting.scorecard import INTERVAL_NOTE, pairwise_welch, render, render_pairwise, summarize
from clharness.results import ResultsStore, RunRecord, run_key

REPO = Path(__file__).parent.parent
NAN = math.nan
R3 = [[0.9, NAN, NAN], [0.7, 0.9, NAN], [0.5, 0.6, 0.9]]


def rec(suite, scenario, method, seed, acc=0.7, matrix=True, **kw):
    r = RunRecord(suite=suite, scenario=scenario, method=method, seed=seed, setting="class-incremental",
                  status="passed", acc_matrix=R3 if matrix else [], task_sizes=[10, 10, 10] if matrix else [],
                  metrics={"final_acc": acc, "avg_inc_acc": acc, **kw.pop("metrics", {})},
                  train_seconds=kw.pop("train_seconds", 10.0 + seed), memory_mb=kw.pop("memory_mb", 5.0), **kw)
    r.key = run_key({"suite": suite, "scenario": scenario, "method": method, "seed": seed})
    return r


def spy_radars(monkeypatch):
    """Every radar drawn on a page: (values by method, colours), in drawing order."""
    drawn = []
    real = plots.radar_figure

    def radar(labels, values, colors):
        drawn.append((dict(values), {m: report_svg.hex_color(colors[m]) for m in values}))
        return real(labels, values, colors)
    monkeypatch.setattr(plots, "radar_figure", radar)
    return drawn


# ------------------------------------------------------------------------ 1. one colour per method
def test_a_method_has_one_colour_in_every_figure_of_the_page_the_gtep_section_included(monkeypatch):
    """Scenario toy::split runs a and b; GTEP's scenario runs b and c. Colouring each figure by its own
    sorted methods gave b the first colour in GTEP's slope plot and the second in the radar."""
    records = [rec("toy", "split", m, s) for m in "ab" for s in (0, 1)]
    for m, (tune, ev) in {"b": (0.8, 0.5), "c": (0.7, 0.6)}.items():
        for s in (0, 1):
            records += [rec("g", f"s:{phase}", m, s, acc, hparams={"lr": 0.1}) for phase, acc in (("tune-c0", tune), ("eval", ev))]
    radars = spy_radars(monkeypatch)
    page = report.build_html(records)
    slope = dict(re.findall(r"<line class='slope' data-method='(\w)'[^>]*stroke='(#[0-9a-f]{6})'", page))
    assert set(slope) == {"b", "c"}
    page_colors = {m: report_svg.hex_color(c) for m, c in plots.method_colors(["a", "b", "c"]).items()}
    assert len(set(page_colors.values())) == 3
    for _, colors in radars:                       # toy::split (a, b) and g::s:eval (b, c)
        assert colors == {m: page_colors[m] for m in colors}
    assert slope == {m: page_colors[m] for m in "bc"}
    assert {m for values, _ in radars for m in values} == {"a", "b", "c"}


def test_worker_processes_draw_with_the_parents_colours(tmp_path):
    """Figures drawn in spawned workers colour a method as the parent does: the exported SVGs of two
    scenarios with different method sets agree (each line carries its method as its SVG id)."""
    records = [rec("toy", "one", m, s) for m in ("er", "ewc") for s in (0, 1)]
    records += [rec("toy", "two", m, s) for m in ("ewc", "lwf") for s in (0, 1)]
    report.build_html(records, workers=2, figures=tmp_path)
    one = _svg_colors(tmp_path / "toy__one_method-radar.svg")
    two = _svg_colors(tmp_path / "toy__two_accuracy-over-tasks.svg")
    assert one["ewc"] == two["ewc"] and len({one["er"], one["ewc"], two["lwf"]}) == 3


def test_a_methods_colour_is_a_stable_function_of_its_name_not_of_the_pages_method_set():
    """ewc was the second colour on a page {er, ewc} and the first on {ewc, lwf}: its index in the page's
    sorted methods. Now it takes the palette slot of a stable hash of its name on both."""
    slots = {m: plots.preferred_slot(m) for m in ("er", "ewc", "lwf")}
    assert len(set(slots.values())) == 3      # no collision on either page: ewc keeps its slot
    with plots.page_palette(["er", "ewc"]) as one:
        pass
    with plots.page_palette(["lwf", "ewc"]) as two:
        pass
    assert one["ewc"] == two["ewc"] == matplotlib_rgba(plots.METHOD_PALETTE[slots["ewc"]])
    assert one["er"] != one["ewc"] and two["lwf"] != two["ewc"]
    # the slot comes from SHA-256 of the name, the same in every process (Python's hash() is salted)
    code = "from clharness.reporting import plots; print(plots.preferred_slot('ewc'))"
    env = {"PYTHONHASHSEED": "123", "PATH": ""}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
    assert out.stdout.strip() == str(slots["ewc"]), out.stderr


def matplotlib_rgba(colour):
    from matplotlib.colors import to_rgba
    return to_rgba(colour)


def test_methods_that_want_one_slot_get_one_colour_each_the_first_in_sorted_order_keeping_it():
    names = [f"m{k}" for k in range(200)]
    a = names[0]
    b = next(n for n in names[1:] if plots.preferred_slot(n) == plots.preferred_slot(a))
    colors = plots.method_colors([b, a, "ewc"])            # the order given does not matter
    assert colors[a] == matplotlib_rgba(plots.METHOD_PALETTE[plots.preferred_slot(a)])
    assert colors[b] != colors[a] and len(set(colors.values())) == 3
    page = plots.method_colors(names[:16])                  # a full palette: every colour once
    assert len(set(page.values())) == 16 and set(page.values()) == {matplotlib_rgba(c) for c in plots.METHOD_PALETTE}


def test_more_methods_than_colours_reuse_the_palette_with_other_line_styles_never_tab20(monkeypatch):
    names = [f"method-{k:02d}" for k in range(20)]
    palette = {matplotlib_rgba(c) for c in plots.METHOD_PALETTE}
    with plots.page_palette(names) as colors:
        assert set(colors.values()) <= palette                       # colour-blind-safe colours only
        styles = plots.method_styles(colors)
        assert len({(colors[m], styles[m]) for m in names}) == 20   # colour and style tell every method apart
        assert sorted(styles.values()) == [0] * 16 + [1] * 4
        subset = plots.method_colors(names[-2:])                      # a figure of two: the page's styles
        assert plots.method_styles(subset) == {m: styles[m] for m in names[-2:]}
        drawn = {}
        real = plots.Figure.savefig

        def lines(fig, *a, **kw):
            for ax in fig.axes:
                for line in ax.get_lines():
                    if line.get_gid():
                        drawn[line.get_gid()] = (line.get_linestyle(), line.get_marker())
            return real(fig, *a, **kw)
        monkeypatch.setattr(plots.Figure, "savefig", lines)
        curves = {m: (np.array([0.5, 0.4]), np.array([0.4, 0.3]), np.array([0.6, 0.5])) for m in names}
        plots.to_img(plots.curve_figure(curves, colors), "curves", tight=False)
    shared = [m for m in names if styles[m] == 1]
    first = {colors[m]: m for m in reversed(names) if styles[m] == 0}
    for m in shared:
        assert drawn[plots.method_gid(m)] != drawn[plots.method_gid(first[colors[m]])]


def _svg_colors(path: Path) -> dict[str, str]:
    svg = path.read_text()
    return {m: c for m, c in re.findall(r'<g id="method-([\w-]+)">\s*<path [^>]*?stroke: (#[0-9a-f]{6})', svg)}


# ------------------------------------------------------------------------ 2. vector export
def _check_figure_files(folder: Path, stems):
    for stem in stems:
        png, svg, pdf = (folder / f"{stem}{s}" for s in (".png", ".svg", ".pdf"))
        assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n"), png
        assert ElementTree.parse(svg).getroot().tag == "{http://www.w3.org/2000/svg}svg"
        assert pdf.read_bytes().startswith(b"%PDF-") and pdf.read_bytes().rstrip().endswith(b"%%EOF")


def test_report_figures_flag_writes_png_svg_and_pdf_per_figure(tmp_path, capsys):
    store = tmp_path / "results.sqlite"
    s = ResultsStore(store)
    for r in [rec("toy", "split", m, seed) for m in ("er", "ewc") for seed in (0, 1)]:
        s.put(r)
    s.close()
    out = tmp_path / "figs"
    assert main(["report", str(store), "--figures", str(out)]) == 0
    assert f"and its figures to {out}" in capsys.readouterr().err
    stems = [f"toy__split_{kind}" for kind in ("method-radar", "accuracy-over-tasks", "accuracy-matrices")]
    _check_figure_files(out, stems)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["report.html", *(f"{stem}{s}" for stem in stems for s in (".png", ".svg", ".pdf"))])
    assert plots.figure_stem("a::b/c: method radar") == "a__b-c_method-radar"


def test_clh_figures_option_writes_the_sessions_figures(pytester, tmp_path):
    import clharness.engine.runner  # noqa: F401  (kept loaded across pytester's in-process run)
    import clharness_methods  # noqa: F401
    pytester.syspathinsert(Path(__file__).parent)
    pytester.makefile(".toml", mini='[suite]\nname = "mini"\nseeds = 2\n[defaults]\ndataset = "digits"\n'
                                    'backbone = "mlp"\nbackbone_options = { hidden = 16, layers = 1 }\nepochs = 1\n'
                                    'tasks = 5\n[[scenario]]\nname = "ci"\n')
    out = tmp_path / "figs"
    result = pytester.runpytest("-p", "plugin_methods", "-p", "no:cacheprovider", "mini.toml", "--clh-method",
                                "tiny", "--clh-figures", str(out), "--clh-results", str(tmp_path / "r.sqlite"))
    result.assert_outcomes(passed=2)
    _check_figure_files(out, [f"mini__ci_{k}" for k in ("method-radar", "accuracy-over-tasks", "accuracy-matrices")])


# ------------------------------------------------------------------------ 3. no pseudo-methods
def test_cldyb_search_records_are_no_method_in_radars_or_colours(monkeypatch):
    """The search record shares its scenario (base/cc) with the methods' replays of the sequence."""
    from clharness.benchmarks.cldyb.summary import SEARCH_METHOD
    records = [rec("cldyb", "base/cc", m, s) for m in ("er", "ewc") for s in (0, 1)]
    for scenario in ("base/cc", "base/ic-er"):   # a search record: the sequence found, no accuracy
        records.append(rec("cldyb", scenario, SEARCH_METHOD, 0, matrix=False))
        records[-1].metrics = {"lookahead_seconds": 3.0}
    radars = spy_radars(monkeypatch)
    page = report.build_html(records)
    assert radars and all(set(values) == {"er", "ewc"} for values, _ in radars)   # the family's and base/cc's
    assert "protocol steps" in page.split("<h3>cldyb::base/ic-er</h3>")[1]
    with plots.page_palette({r.method for r in records if not report.pseudo_method(r)}) as colors:
        assert set(colors) == {"er", "ewc"}


# ------------------------------------------------------------------------ 4. STF radars
def _polygon_area(values):
    """Area of a radar polygon (radii on equally spaced spokes)."""
    k = len(values)
    return 0.5 * math.sin(2 * math.pi / k) * sum(values[i] * values[(i + 1) % k] for i in range(k))


def test_stf_radar_keeps_its_axes_and_does_not_collapse():
    """STF records carry final accuracy and information retention, no matrix (no AFM, no ALA), and
    equal costs: the old radar drew retention and ALA at zero for every method."""
    groups = {m: [rec("stf", "stream", m, s, acc, matrix=False, metrics={"info_retention": ir})
                  for s in (0, 1)] for m, acc, ir in (("er", 0.6, 0.5), ("gdumb", 0.4, 0.7))}
    labels, values = plots.radar_table(groups)
    assert labels[:2] == ["final accuracy", "information\nretention"] and len(labels) == 4
    assert not any(lab.startswith(("learning accuracy", "retention\n(1")) for lab in labels)
    assert values["er"] == pytest.approx([0.6, 0.5, 1.0, 1.0]) and values["gdumb"] == pytest.approx([0.4, 0.7, 1.0, 1.0])
    for axis in range(len(labels)):                 # no axis with every method at the centre
        assert max(v[axis] for v in values.values()) > 0
    assert all(_polygon_area(v) > 0.2 for v in values.values())


def test_costs_are_efficiencies_never_the_centre_for_the_costliest():
    assert plots.efficiency({"a": 10.0, "b": 20.0, "c": 40.0, "d": NAN}) == pytest.approx(
        {"a": 1.0, "b": 0.5, "c": 0.25, "d": NAN}, nan_ok=True)
    assert plots.efficiency({"a": 3.0, "b": 3.0}) == {"a": 1.0, "b": 1.0}


# ------------------------------------------------------------------------ 5. n and the right tests
A, B = [0.80, 0.82, 0.84], [0.70, 0.75, 0.80]   # n = 3 each: means 0.82, 0.75; sd 0.02, 0.05


def test_intervals_use_student_t_with_n_minus_one_and_say_n():
    # by hand: t_{0.975, 2} = 4.303, half = 4.303 * 0.02 / sqrt(3) = 0.0497 (1.96 would give 0.0226)
    assert stats.t.ppf(0.975, 2) == pytest.approx(4.303, abs=5e-4)
    summary = summarize([rec("toy", "s", "er", k, v) for k, v in enumerate(A)], ["final_acc"])
    assert summary.final_acc_ci[0] == pytest.approx(4.302653 * 0.02 / math.sqrt(3), rel=1e-5)
    assert "0.820 ± 0.050" in render(summary, ["final_acc"])
    assert "n = 3" in INTERVAL_NOTE and "4.303" in INTERVAL_NOTE and "Student-t" in INTERVAL_NOTE
    assert INTERVAL_NOTE in report.render_text([rec("toy", "s", "er", 0)])


def test_pairwise_comparison_is_welchs_t_test_with_both_n():
    records = [rec("toy", "s", "er", k, v) for k, v in enumerate(A)] + \
              [rec("toy", "s", "ewc", k, v) for k, v in enumerate(B)]
    row = pairwise_welch(records).iloc[0]
    # Welch by hand: se^2 = 0.02^2/3 + 0.05^2/3; df = se^4 / ((0.02^2/3)^2/2 + (0.05^2/3)^2/2)
    va, vb = 0.02 ** 2 / 3, 0.05 ** 2 / 3
    t = 0.07 / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / 2 + vb ** 2 / 2)
    assert t == pytest.approx(2.2514, abs=1e-4) and df == pytest.approx(2.6240, abs=1e-4)
    assert (row.best, row.method, row.n_best, row.n) == ("er", "ewc", 3, 3)
    assert row.t == pytest.approx(t) and row.p == pytest.approx(2 * stats.t.sf(t, df))
    assert row.p != pytest.approx(2 * stats.t.sf(t, 4))      # Student's pooled test would have df = 4
    text = render_pairwise(pairwise_welch(records))
    assert "er vs ewc" in text and f"p = {row.p:.3g}" in text and "3 vs 3" in text
    page = report.build_html(records)
    assert "Welch" in page and "3 vs 3" in page


def test_a_single_seed_gets_no_test():
    row = pairwise_welch([rec("toy", "s", "er", 0, 0.9), rec("toy", "s", "ewc", 0, 0.5)]).iloc[0]
    assert math.isnan(row.p) and "no test (n < 2)" in render_pairwise(pairwise_welch(
        [rec("toy", "s", "er", 0, 0.9), rec("toy", "s", "ewc", 0, 0.5)]))


def test_the_cldyb_section_says_n_and_student_t_for_its_intervals():
    from test_report_family_figures import cldyb_records

    from clharness.benchmarks.cldyb import report_html as cldyb_html
    records = cldyb_records()                       # seeds 0 and 1 of every method and sequence
    page = cldyb_html.section(records, DRAWING)
    note = "95% Student-t confidence interval over the n = 2 seeds of each method and sequence"
    assert note in page and "t_{0.975, n−1}" in page
    (title, text), = cldyb_html.text_sections(records, "pipe")
    assert "Student-t" in title and note in text
    # one seed fewer for er on the random sequence: the range of n
    fewer = [r for r in records if not (r.method == "er" and r.scenario == "mini/random" and r.seed == 1)]
    assert "over the n = 1–2 seeds" in cldyb_html.section(fewer, DRAWING)


def test_the_gtep_caption_says_n_and_student_t_for_its_intervals():
    records = []
    for m in "bc":
        for s in (0, 1, 2):
            records += [rec("g", "s:tune-c0", m, s, 0.8 - 0.1 * (m == "c") - 0.01 * s, hparams={"lr": 0.1})]
            records += [rec("g", "s:eval", m, s, 0.6 + 0.01 * s, hparams={"lr": 0.1})]
    records[-1].status = "failed"                   # c's third evaluation trial: n = 2 for c
    page = report.build_html(records)
    caption = re.search(r"Kendall tau between.*?</p>", page).group(0)
    assert "95% Student-t CI" in caption and "t_{0.975, n−1}" in caption
    assert "n = 2–3 evaluation trials per method, n = 3 tuning trials of the chosen H*" in caption


def test_gate_welch_lines_give_n_for_both_sides():
    from clharness.reporting.gates import judge, parse_gate
    records = [rec("toy", "s", "er", k, v) for k, v in enumerate(A)] + \
              [rec("toy", "s", "ewc", k, v) for k, v in enumerate(B[:2])]
    ok, (line,) = judge(parse_gate("er: final_acc beats ewc by 0.0 welch 0.05"), records)
    assert "one-sided Welch t-test p = " in line and "n = 3 vs 2 seeds" in line
    ok, (line,) = judge(parse_gate("er: final_acc beats ewc by 0.0 welch 0.05"), records[:4])
    assert not ok and "no Welch t-test (n = 3 vs 1 seeds" in line


# ------------------------------------------------------------------------ 5b. records without a matrix
def test_metrics_only_records_get_a_neutral_note_not_a_red_no_matrices():
    """STF's stream runs store final accuracy and information retention, no per-task accuracy matrix:
    nothing is wrong with them, so their scenario shows the radar and a note, never class='bad'."""
    records = [rec("stf", "stream", m, s, acc, matrix=False, metrics={"info_retention": ir})
               for m, acc, ir in (("er", 0.6, 0.5), ("gdumb", 0.4, 0.7)) for s in (0, 1)]
    page = report.build_html(records)
    body = page.split("<h3>stf::stream</h3>")[1].split("<h2")[0]
    assert "these runs store metrics, not a per-task accuracy matrix" in body
    assert 'alt="stf::stream: method radar"' in body and "accuracy over tasks" not in body
    assert "class='bad'" not in body and "no accuracy matrices" not in page


# ------------------------------------------------------------------------ 6. GTEP labels
def _text_boxes(svg: str):
    """(x0, y0, x1, y1) of every <text>: its baseline y, an 11px line, the generous width estimate."""
    boxes = []
    for attrs, text in re.findall(r"<text ([^>]*)>([^<]*)</text>", svg):
        a = dict(re.findall(r"([\w-]+)='([^']*)'", attrs))
        if "transform" in a:
            continue
        x, y, w = float(a["x"]), float(a["y"]), report_svg.text_width(text)
        x0 = {"end": x - w, "middle": x - w / 2}.get(a.get("text-anchor"), x)
        boxes.append((x0, y - 9, x0 + w, y + 2.5, text))
    return boxes


def test_gtep_slope_labels_do_not_overlap_with_many_long_close_labels():
    import pandas as pd
    from clharness.benchmarks.gtep.report_html import slope_svg
    names = [f"a-rather-long-method-name-{k}" for k in range(12)]
    group = pd.DataFrame({"suite": "g", "scenario": "s", "method": names,
                          "tune_acc": [0.700 + 0.001 * k for k in range(12)],
                          "eval_acc": [0.500 + 0.0005 * (k % 3) for k in range(12)]})
    svg = slope_svg(group, DRAWING)
    width = float(re.search(r"width='(\d+)'", svg).group(1))
    height = float(re.search(r"height='(\d+)'", svg).group(1))
    boxes = _text_boxes(svg)
    assert len(boxes) == 2 * 12 + 4
    for i, a in enumerate(boxes):
        assert 0 <= a[0] and a[2] <= width and 0 <= a[1] and a[3] <= height, a
        for b in boxes[i + 1:]:
            assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1], (a, b)


def test_spread_labels_keeps_order_and_gap_and_leaves_far_labels_alone():
    ys = [100.0, 101.0, 102.0, 200.0]
    out = report_svg.spread_labels(ys, 13, 12)
    assert out == pytest.approx([88.0, 101.0, 114.0, 200.0])    # the close three centred on their mean
    assert report_svg.spread_labels([20.0, 20.0], 13, 15) == pytest.approx([15.0, 28.0])   # not above top


# ------------------------------------------------------------------------ 7. training time spread
def test_training_time_is_shown_with_its_spread_and_n():
    records = [rec("toy", "s", "er", k, train_seconds=t) for k, t in enumerate((10.0, 12.0, 14.0))]
    records += [rec("toy", "s", "ewc", 0, train_seconds=30.0)]
    assert plots.cost_spread(records[:3]) == (12.0, 2.0, 3)
    note = report.training_time_note({"er": records[:3], "ewc": records[3:]})
    assert note == "Training time, mean ± sd over seeds: er 12 ± 2 s (n=3); ewc 30 s (n=1)."
    page = report.build_html(records)
    assert "er 12 ± 2 s (n=3)" in page
    # and the scorecard's train s column: mean ± the n = 3 interval t_{0.975,2} * 2 / sqrt(3) = 4.97
    assert "12.00 ± 4.97" in render(summarize(records[:3], ["train_seconds"]), ["train_seconds"])


# ------------------------------------------------------------------------ 8. the rendered report
def _render_script():
    spec = importlib.util.spec_from_file_location("render_report", REPO / "scripts" / "render_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """The demo report (4 methods; its second scenario without the first method) with --figures."""
    out = tmp_path_factory.mktemp("render")
    cmd = [sys.executable, str(REPO / "scripts" / "render_report.py"), "--out", str(out), "--methods", "4",
           "--scenarios", "2", "--seeds", "2", "--tasks", "3", "--no-screenshot", "--figures", str(out / "figs"),
           "--check"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "check: 0 problem(s)" in done.stdout
    return out


def test_rendered_demo_report_has_every_figure_and_one_colour_per_method(rendered):
    script = _render_script()
    page, figs = rendered / "report.html", rendered / "figs"
    text = page.read_text()
    for scenario in ("demo::split-cifar10", "demo::split-mnist"):
        for kind in script.FIGURE_KINDS:
            assert f'alt="{scenario}: {kind}"' in text
    assert script.check_page(page, figs) == []
    # er runs in split-cifar10 only: ewc is the first method of split-mnist, yet keeps its colour
    a = script.figure_colors((figs / "demo__split-cifar10_method-radar.svg").read_text())
    b = script.figure_colors((figs / "demo__split-mnist_accuracy-over-tasks.svg").read_text())
    assert "er" in a and "er" not in b and a["ewc"] == b["ewc"]


def test_render_check_catches_a_method_in_two_colours(rendered, tmp_path):
    script = _render_script()
    figs = tmp_path / "figs"
    shutil.copytree(rendered / "figs", figs)
    radar = figs / "demo__split-mnist_method-radar.svg"
    colour = script.figure_colors(radar.read_text())["ewc"]
    radar.write_text(radar.read_text().replace(colour, "#123456"))
    problems = script.check_page(rendered / "report.html", figs)
    assert any(p.startswith("method ewc has 2 colours") for p in problems)
    (figs / "demo__split-mnist_method-radar.pdf").unlink()
    assert any("demo__split-mnist_method-radar.pdf: missing" in p for p in script.check_page(rendered / "report.html", figs))


def test_rendered_demo_report_has_the_family_figures_with_one_colour_per_method(rendered):
    """The demo store's GTEP, STF (metrics only), CLDyB and continual-evaluation records draw their figures,
    --check requires them, and er has one colour in GTEP's slope plot (inline SVG), the STF radar and
    CLDyB's radar (matplotlib SVG files)."""
    script = _render_script()
    page, figs = rendered / "report.html", rendered / "figs"
    found = script.family_figures_of(page.read_text(), figs)
    assert all(found[kind] for kind in script.DEMO_FIGURES), found
    (_, slope), = found["GTEP slope"]
    (_, stf), = found["STF radar"]
    (_, cldyb), = found["CLDyB radar"]
    assert {"er", "ewc", "lwf", "finetune"} <= set(slope) and slope["er"] == stf["er"] == cldyb["er"]
    assert len(set(slope.values())) == len(slope)
    assert script.check_page(page, figs, script.DEMO_FIGURES) == []
    assert (figs / "demo-gtep__gtep-digits_GTEP-slope.svg").exists()          # hand-drawn: SVG only
    assert (figs / "demo-cldyb__pool_CLDyB-radar-fig.-4.pdf").exists()       # "(fig. 4)": no cut at the dot
    text = page.read_text()
    assert "these runs store metrics, not a per-task accuracy matrix" in text.split("demo-stf::stf-stream</h3>")[1]


def test_render_check_requires_the_family_figures_and_their_colours(rendered, tmp_path):
    script = _render_script()
    figs = tmp_path / "figs"
    shutil.copytree(rendered / "figs", figs)
    text = (rendered / "report.html").read_text()
    without = re.sub(r'<img alt="demo::split-cifar10: continual evaluation"[^>]*>', "", text)
    assert "page: no continual evaluation figure" in script.check_html(without, figs, script.DEMO_FIGURES)
    radar = figs / "demo-stf__stf-stream_method-radar.svg"
    colour = script.figure_colors(radar.read_text())["er"]
    radar.write_text(radar.read_text().replace(colour, "#123456"))
    problems = script.check_html(text, figs, script.DEMO_FIGURES)
    assert any(p.startswith("method er differs between the family figures") for p in problems), problems
    (figs / "demo-gtep__gtep-digits_GTEP-slope.svg").unlink()
    assert any("GTEP-slope.svg: missing" in p for p in script.check_html(text, figs))


class _DomLike(HTMLParser):
    """Re-serialises a page as a browser's --dump-dom does: every attribute in double quotes."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.out, self.raw = [], False

    def handle_starttag(self, tag, attrs):
        self.raw = tag in ("style", "script")
        self.out.append(f"<{tag}" + "".join(f' {k}="{html.escape(v or "", quote=True)}"' for k, v in attrs) + ">")

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)

    def handle_endtag(self, tag):
        self.raw = False
        self.out.append(f"</{tag}>")

    def handle_data(self, data):
        self.out.append(data if self.raw else html.escape(data, quote=False))

    def handle_decl(self, decl):
        self.out.append(f"<!{decl}>")


def test_render_check_reads_a_browsers_dom_of_the_page(rendered):
    """--dump-dom quotes every attribute with ": the check reads that as it reads the page."""
    script = _render_script()
    dom = _DomLike()
    dom.feed((rendered / "report.html").read_text())
    text = "".join(dom.out)
    assert "class=\"slope\" data-method=\"er\"" in text and "class='slope'" not in text
    assert script.check_html(text, rendered / "figs", script.DEMO_FIGURES) == []


def _browser():
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        if os.environ.get("CI"):   # .ci/run installs Debian's chromium: a CI without it has lost the check
            pytest.fail("CI is set but no headless Chromium is installed: .ci/run installs Debian's chromium "
                        "(apt-get install -y chromium); the report's browser check must run in CI")
        pytest.skip("no headless Chromium on this machine (chromium, chromium-browser, google-chrome; "
                    "apt-get install -y chromium): the page, a DOM-like serialisation of it and its figures "
                    "are checked without a browser above")
    return browser


def _audit_module():
    spec = importlib.util.spec_from_file_location("browser_audit", REPO / "scripts" / "browser_audit.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["browser_audit"] = module   # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_headless_browser_renders_the_report_and_its_dom_passes_the_check(rendered):
    _browser()
    script = _render_script()
    dom = script.dump_dom(rendered / "report.html")
    assert script.check_html(dom, rendered / "figs", script.DEMO_FIGURES) == []
    png = script.screenshot(rendered / "report.html", rendered / "report.png", 1400, 3000)
    assert png.read_bytes().startswith(b"\x89PNG")


def test_the_report_opened_in_a_real_browser_renders_every_figure_with_no_console_error_or_outside_request(rendered):
    """Headless Chromium over the DevTools protocol: every <img> decodes, every inline chart has an area,
    the console stays clean and no request leaves the machine."""
    _browser()
    page = rendered / "report.html"
    found = _audit_module().audit(page)
    assert found.problems == []
    alts = re.findall(r'<img alt="', page.read_text())
    images = [f for f in found.figures if f["w"] > 0 and f["h"] > 0]
    assert len(alts) > 5 and len(images) == len(found.figures) >= len(alts)


def test_the_browser_audit_sees_a_broken_figure_a_console_error_and_an_outside_request(rendered, tmp_path):
    """The audit is not blind: the same page with one image pointed nowhere, a script error and an image
    from the web reports all three."""
    _browser()
    text = (rendered / "report.html").read_text()
    planted = text.replace("</body>", '<img alt="gone" src="missing.png"><script>console.error("planted")</script>'
                                      '<img alt="web" src="https://example.invalid/a.png"></body>')
    (tmp_path / "report.html").write_text(planted)
    problems = _audit_module().audit(tmp_path / "report.html").problems
    assert "console: planted" in problems
    assert "external request: https://example.invalid/a.png" in problems
    assert any(p.startswith("figure not rendered: gone") for p in problems)


def test_gtep_slope_figure_is_exported_as_svg(tmp_path):
    import pandas as pd

    from clharness.benchmarks.gtep.report_html import slope_svg
    group = pd.DataFrame({"suite": "g", "scenario": "s", "method": ["er", "ewc"], "tune_acc": [0.8, 0.7],
                          "eval_acc": [0.6, 0.65]})
    with plots.export_figures(tmp_path):
        html = slope_svg(group, DRAWING)
    svg = (tmp_path / "g__s_GTEP-slope.svg").read_text()
    assert svg in html
    ElementTree.fromstring(svg)   # a standalone, well-formed SVG file


def test_hand_drawn_charts_are_exported_as_svg_only_and_the_help_and_readme_say_so(tmp_path, capsys):
    """No SVG-to-PDF converter is a dependency: GTEP's slope plot and the bar charts (report_svg) are
    written as SVG alone, every matplotlib figure as PNG, SVG and PDF; README and both help texts say so."""
    records = []
    for m in ("er", "ewc"):
        for s in (0, 1):
            records += [rec("g", f"s:{phase}", m, s, acc + 0.01 * s, hparams={"lr": 0.1})
                        for phase, acc in (("tune-c0", 0.8 if m == "er" else 0.75), ("eval", 0.6 if m == "er" else 0.65))]
    report.build_html(records, figures=tmp_path)
    slope = sorted(p.name for p in tmp_path.glob("g__s_GTEP-slope*"))
    assert slope == ["g__s_GTEP-slope.svg"]
    _check_figure_files(tmp_path, ["g__s-eval_method-radar"])
    readme = (REPO / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `--clh-figures DIR`"))
    assert "every matplotlib figure as PNG, SVG (text kept as text) and PDF" in row and "as SVG only" in row
    assert "as SVG only" in " ".join((REPO / "clharness" / "engine" / "options.py").read_text().split())
    with pytest.raises(SystemExit):
        main(["report", "--help"])
    assert "as SVG only" in " ".join(capsys.readouterr().out.split())



def test_a_page_of_up_to_seven_methods_draws_only_okabe_itos_colours():
    from matplotlib.colors import to_hex
    okabe_ito = {c.lower() for c in plots.METHOD_PALETTE[:7]}
    for methods in (["er", "ewc", "lwf", "finetune"], ["joint", "ncm", "derpp", "agem", "si", "gdumb", "icarl"]):
        colours = {to_hex(c) for c in plots.method_colors(methods).values()}
        assert len(colours) == len(methods) and colours <= okabe_ito
