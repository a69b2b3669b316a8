"""The M2I / I2M sections of the report (issue 19 part 1), per paired scenario (M2I with its I2M run,
paired as effect.py pairs them):

* the curriculum effect table (M2I, I2M and M2I minus I2M per method and metric, mean ± 95% CI over
  paired seeds) with, beside it, one bar chart per metric: each method's effect and its CI (inline
  SVG; the numbers are effect.curriculum_effect's, nothing is recomputed here);
* per method, the mean accuracy matrix over seeds of its M2I run beside its I2M run, tasks named by
  their datasets (Faber et al. 2024, figs. 2-13: "disaggregated performance (ACC) on single tasks
  after learning previous tasks"; one figure per paired scenario, all methods in it).

On a page of several suites (``page``), a suite's runs pair with the other direction's runs of any
suite (the real ``m2i`` and ``i2m`` suites are two suites): the pair is drawn once, under the first of
its suites in page order, and the other suite's section links to it.

Text formats get the effect table alone (``text_sections``).
"""
from __future__ import annotations

import html
import json
import math
import re
from collections import defaultdict
from typing import Iterable, Sequence

import numpy as np

from ...results import RunRecord
from . import effect
from . import names as curriculum

TITLE = "M2I / I2M: curriculum effect (M2I minus I2M) and per-task accuracy matrices"
TEXT_TITLE = ("M2I / I2M curriculum effect (M2I minus I2M; mean ± 95% Student-t CI, t_{0.975, n−1}, over the "
              "n paired seeds of each row: its seeds column)")
METRICS = effect.DEFAULT_METRICS
# the paper's names (sec. 2.3, eqs. 1-3); the authors' code's BWT variant named as theirs
METRIC_NAMES = {"acc": "ACC", "bwt": "BWT", "bwt_authors": "BWT (authors' code)", "fwt": "FWT"}
PAPER_TITLE = ("M2I / I2M metrics of the paper (mean ± 95% Student-t CI, t_{0.975, n−1}, over the n seeds of "
               "each row: its seeds column)")
# Tables 3-8's columns: ACC and BWT, FWT in task-incremental runs only (sec. 3: ill-defined
# class-incrementally), and the authors' BWT beside eq. 2's
PAPER_METRICS = ("acc", "bwt", "bwt_authors", "fwt")
PAPER_NOTE = ("ACC: eq. 1, mean of R[i,j] over i >= j (the authors' code computes the same). BWT: eq. 2, "
              "mean of R[i,j] - R[j,j] over i > j. BWT (authors' code): their analysis code's variant, mean of "
              "R[t,e] - R[t-1,e] over t > e (analysis/metrics/eval_results_metrics.py). FWT: eq. 3, mean of "
              "R[i,j] over i < j, shown for task-incremental runs only (the paper reports it only there). "
              "The scorecard above is the harness's common one; these are the paper's columns.")
# short dataset names for the heatmaps' axes (the paper's figures label tasks 0..5)
SHORT = {"mnist": "MNIST", "omniglot": "Omniglot", "fashion-mnist": "F-MNIST", "svhn": "SVHN",
         "cifar10": "CIFAR10", "tinyimagenet": "TinyImgNet"}
EFFECT_NOTE = ("M2I minus I2M per method: the mean over seeds of the paired per-seed differences (same seed, "
               "method, setting and hyperparameters; the same images in both orders), with its 95% Student-t "
               "interval; positive = the easy-to-hard curriculum scores higher (for BWT/FWT: transfers better).")
HEATMAP_NOTE = ("Mean accuracy matrix over seeds, M2I (left) and I2M (right) per method: row i = after learning "
                "task i, column j = accuracy on task j's test data, tasks named by their dataset in learning "
                "order (Faber et al. 2024, figs. 2-13); grey = no seed reached the cell.")


def curriculum_runs(records: Iterable[RunRecord]) -> dict[tuple, dict[tuple, dict[str, list[RunRecord]]]]:
    """Passed curriculum runs: {(suite, scenario, setting) with m2i/i2m blanked:
    {(method, hparams): {"m2i": [...], "i2m": [...]}}}, keyed as effect.py pairs them."""
    out: dict = defaultdict(lambda: defaultdict(lambda: {"m2i": [], "i2m": []}))
    for r in records:
        d = effect.direction(r) if r.status == "passed" else None
        if d is not None:
            suite, scenario, method, setting, hparams = effect._pair_key(r)
            out[(suite, scenario, setting)][(method, hparams)][d].append(r)
    return out


def is_curriculum(record: RunRecord) -> bool:
    """A run of the curriculum kind (its dataset is "curriculum(...)"), or one in either standard order."""
    return record.dataset.startswith("curriculum(") or effect.direction(record) is not None


def paper_rows(records: Iterable[RunRecord], confidence: float = 0.95) -> list[dict]:
    """Per (suite, scenario, setting, method): the paper's metrics over passed seeds, as
    {metric: (mean, CI half-width)}; FWT is NaN for class-incremental runs (not reported there)."""
    from ...metrics import mean_ci
    groups: dict[tuple, list[RunRecord]] = defaultdict(list)
    for r in records:
        if r.status == "passed" and is_curriculum(r):
            groups[(r.suite, r.scenario, str(r.setting), r.method)].append(r)
    rows = []
    for (suite, scenario, setting, method), rs in groups.items():
        row = {"suite": suite, "scenario": scenario, "setting": setting, "method": method, "seeds": len(rs)}
        for metric in PAPER_METRICS:
            if metric == "fwt" and "task" not in setting:
                row[metric] = (math.nan, math.nan)
            else:
                row[metric] = mean_ci([r.metrics.get(metric, math.nan) for r in rs], confidence)
        rows.append(row)
    return rows


def paper_table(rows: Sequence[dict], fmt: str = "github") -> str:
    from tabulate import tabulate
    head = ["suite", "scenario", "setting", "method", *[METRIC_NAMES[m] for m in PAPER_METRICS], "seeds"]
    body = [[r["suite"], r["scenario"], r["setting"], r["method"], *[_pm(*r[m]) for m in PAPER_METRICS], r["seeds"]]
            for r in rows]
    return tabulate(body, headers=head, tablefmt=fmt)


def html_sections(records: Sequence[RunRecord], drawing, page: Sequence[RunRecord] | None = None
                  ) -> list[tuple[str, str]]:
    out = []
    rows = paper_rows(records)
    if rows:
        out.append((PAPER_TITLE, f"<p class='note'>{_e(PAPER_NOTE)}</p>" + paper_table(rows, "html")))
    text = section(records, drawing, page)
    return out + ([(TITLE, text)] if text else [])


def text_sections(records: Sequence[RunRecord], fmt: str) -> list[tuple[str, str]]:
    out = []
    paper = paper_rows(records)
    if paper:
        out.append((PAPER_TITLE, paper_table(paper, fmt)))
    rows = effect.curriculum_effect(records, METRICS)
    return out + ([(TEXT_TITLE, effect.render(rows, fmt))] if rows else [])


def section(records: Sequence[RunRecord], drawing, page: Sequence[RunRecord] | None = None) -> str | None:
    """The M2I / I2M HTML of ``records``, or None when they hold no curriculum run. With ``page``
    (every record of the page, ``records`` one suite of it), pairs are formed over the page: a pair
    spanning suites is drawn under the first of them in page order, linked from the others. Drawn with
    ``drawing`` (the page's clharness.kinds.Drawing)."""
    own_suites = {r.suite for r in records}
    order = list(dict.fromkeys(r.suite for r in (records if page is None else page)))
    runs = {key: group for key, group in curriculum_runs(records if page is None else page).items()
            if group_suites(group) & own_suites}
    if not runs:
        return None
    rows = effect.curriculum_effect([r for group in runs.values() for by_dir in group.values()
                                     for rs in by_dir.values() for r in rs], METRICS)
    colors = drawing.method_colors(sorted({m for group in runs.values() for m, _ in group}))
    out = []
    for (suite, scenario, setting), group in runs.items():
        name = pair_name(group)
        anchor = "m2i-pair-" + re.sub(r"[^\w-]+", "-", f"{suite}-{scenario}-{setting}")
        home = min(group_suites(group), key=order.index)
        if home not in own_suites:
            out.append(f"<h3>{_e(name)} ({_e(setting)}): M2I vs I2M</h3><p class='note m2i-paired-elsewhere'>"
                       f"paired with suite {_e(home)}: the effect and heatmaps are in "
                       f"<a href='#{_e(anchor)}'>suite {_e(home)}'s section</a>.</p>")
            continue
        out.append(f"<h3 id='{_e(anchor)}'>{_e(name)} ({_e(setting)}): M2I vs I2M</h3>")
        mine = [r for r in rows if (r["suite"], r["scenario"], r["setting"]) == (suite, scenario, setting)]
        if mine:
            out.append(f"<p class='note'>{_e(EFFECT_NOTE)}</p>")
            out.append("<div class='row'>" + effect_table(mine) + effect_bars(mine, colors, drawing) + "</div>")
        else:
            out.append("<p class='bad'>no seed ran in both orders: no curriculum effect.</p>")
        out.append(heatmaps(name, group, drawing))
    return "\n".join(out)


def group_suites(group: dict) -> set[str]:
    """The suites holding a run of a paired scenario's group (one, or an m2i and an i2m suite)."""
    return {r.suite for by_dir in group.values() for rs in by_dir.values() for r in rs}


def pair_name(group: dict) -> str:
    """'m2i-mini::ci-m2i vs ci-i2m' (or 'm2i::ci vs i2m::ci' across suites): the runs' own names."""
    first = {d: rs[0] for by_dir in group.values() for d, rs in by_dir.items() if rs}
    names = [(first[d].suite, first[d].scenario) for d in ("m2i", "i2m") if d in first]
    if len(names) == 2 and names[0][0] == names[1][0]:
        return f"{names[0][0]}::{names[0][1]} vs {names[1][1]}"
    return " vs ".join(f"{a}::{b}" for a, b in names)


def effect_table(rows: Sequence[dict]) -> str:
    head = ["method", "metric", "M2I", "I2M", "M2I − I2M", "seeds"]
    body = [[r["method"], METRIC_NAMES.get(r["metric"], r["metric"]), _pm(r["m2i"], r["m2i_ci"]),
             _pm(r["i2m"], r["i2m_ci"]), _pm(r["effect"], r["effect_ci"], signed=True), str(r["seeds"])]
            for r in rows]
    return ("<table class='m2i-effect'><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in body) + "</table>")


def effect_bars(rows: Sequence[dict], colors, drawing) -> str:
    """One SVG bar chart per metric: a bar per method (its effect, CI as an error bar). A metric
    whose effect is NaN for every method (e.g. FWT without its baseline) gets no chart."""
    Bar = drawing.Bar   # noqa: N806
    charts = []
    for metric in dict.fromkeys(r["metric"] for r in rows):
        mine = [r for r in rows if r["metric"] == metric]
        if all(math.isnan(r["effect"]) for r in mine):
            continue
        label = METRIC_NAMES.get(metric, metric)
        groups = [(r["method"], [Bar(r["effect"], r["effect_ci"], drawing.hex_color(colors[r["method"]]),
                                                "M2I − I2M", {"metric": metric, "method": r["method"]})])
                  for r in mine]
        charts.append(f"<div class='m2i-effect-bars' data-metric='{_e(metric)}'>"
                      + drawing.bar_chart(groups, f"{label}: M2I − I2M", f"Δ {label}", height=210, bar_width=22)
                      + "</div>")
    if not charts:
        return ""
    return (f"<figure style='flex:0 1 auto'><div style='display:flex;flex-wrap:wrap;gap:6px'>{''.join(charts)}</div>"
            "<figcaption>M2I − I2M per method and metric; error bars: 95% Student-t CI over the n paired seeds "
            "(the effect table's seeds column).</figcaption></figure>")


def heatmaps(name: str, group: dict, drawing) -> str:
    """One figure: per (method, hyperparameters) of the group, its M2I and I2M mean matrices."""
    panels = []
    several = defaultdict(int)
    for method, _ in group:
        several[method] += 1
    for (method, hparams), by_dir in sorted(group.items()):
        label = method if several[method] == 1 else f"{method} {_short_hparams(hparams)}"
        pair = {d: (drawing.mean_matrix(rs), len(rs), task_labels(rs[0])) for d, rs in by_dir.items()
                if any(r.acc_matrix for r in rs)}
        if pair:
            panels.append((label, pair))
    if not panels:
        return "<p class='bad'>no accuracy matrices stored.</p>"
    fig = heatmap_pairs_figure(panels, drawing.DPI)
    alt = f"{name}: M2I and I2M accuracy matrices"
    return (f"<figure class='m2i-heatmaps' data-methods='{_e(json.dumps([p[0] for p in panels]))}'>"
            f"{drawing.to_img(fig, alt, tight=False)}<figcaption>{_e(HEATMAP_NOTE)}</figcaption></figure>")


def task_labels(record: RunRecord) -> list[str]:
    """Each task's dataset in learning order (the task names before '/' in the class order; with the
    shared 10-way head each class name joins the tasks' classes, as effect.direction reads it)."""
    names = record.class_order[::10]
    sep = getattr(curriculum, "SHARED_SEP", " | ")
    if names and sep in names[0]:
        names = names[0].split(sep)
    names = [c.split("/", 1)[0] for c in names]
    return [SHORT.get(n, n[:10]) for n in names]


def heatmap_pairs_figure(panels: Sequence[tuple[str, dict]], dpi: int):
    """Two methods a row, each as its M2I panel beside its I2M panel; one colour bar (0-1); ``dpi``: the
    page's (Drawing.DPI)."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure
    per_row = 1 if len(panels) == 1 else 2
    rows = math.ceil(len(panels) / per_row)
    side, left, top, bottom, pair_gap, bar = 1.75, 0.72, 0.34, 0.62, 0.3, 0.8
    width = per_row * (2 * (left + side) + pair_gap) + bar
    height = rows * (top + side + bottom)
    fig = Figure(figsize=(width, height), dpi=dpi)
    cmap = colormaps["viridis"].with_extremes(bad="#dddddd")
    image = None
    for k, (label, pair) in enumerate(panels):
        r, c = divmod(k, per_row)
        for slot, d in enumerate(("m2i", "i2m")):
            x0 = c * (2 * (left + side) + pair_gap) + slot * (left + side) + left
            y0 = height - (r + 1) * (top + side + bottom) + bottom
            ax = fig.add_axes((x0 / width, y0 / height, side / width, side / height))
            if d not in pair:
                ax.set_axis_off()
                ax.text(0.5, 0.5, f"no {d.upper()} run", ha="center", va="center", fontsize=8, color="#888")
                continue
            M, seeds, names = pair[d]
            image = ax.imshow(M, vmin=0, vmax=1, cmap=cmap, aspect="auto")
            ax.set_title(f"{label} · {d.upper()} ({seeds} seed{'s' * (seeds != 1)})", fontsize=8.5, pad=3)
            t = M.shape[0]
            ticks = [names[i] if i < len(names) else str(i) for i in range(t)]
            ax.set_xticks(range(t), ticks, rotation=45, ha="right", rotation_mode="anchor")
            ax.set_yticks(range(t), ticks)
            ax.tick_params(labelsize=6.5, length=2, pad=1.5)
            if t <= 12:
                for (i, j), v in np.ndenumerate(M):
                    if not math.isnan(v):
                        ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6 if t <= 6 else 5,
                                clip_on=False, color="black" if v > 0.55 else "white")
    if image is not None:
        cax = fig.add_axes(((width - bar + 0.15) / width, bottom / height, 0.16 / width,
                            (height - bottom - top) / height))
        fig.colorbar(image, cax=cax).ax.tick_params(labelsize=7)
    return fig


def _short_hparams(hparams: str) -> str:
    return ", ".join(f"{k}={v}" for k, v in json.loads(hparams).items())[:40]


def _pm(mean: float, ci: float, signed: bool = False) -> str:
    if mean is None or math.isnan(mean):
        return "-"
    text = f"{mean:+.3f}" if signed else f"{mean:.3f}"
    return text if ci is None or math.isnan(ci) else f"{text} ± {ci:.3f}"


def _e(text) -> str:
    return html.escape(str(text), quote=True)
