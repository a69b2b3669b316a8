"""Report figures: accuracy-matrix heatmaps, accuracy over tasks, a method radar (CLDyB Fig. 4), and
accuracy against training FLOPs with the Pareto front (reporting/budget.py).

Each figure aggregates the passed seeds of one (suite, scenario) first and draws once, so a
store of thousands of records costs a few figures per scenario, not one per record. Figures
are plain ``matplotlib.figure.Figure`` objects on the Agg canvas (no pyplot): nothing is
registered globally, so nothing can leak between figures or into the caller's pyplot state.
"""
from __future__ import annotations

import base64
import hashlib
import html
import io
import math
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Mapping, Sequence

import matplotlib
import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from scipy import stats

from ..metrics import METRIC_INFO, all_metrics
from ..results import RunRecord

DPI = 100


# ------------------------------------------------------------------------ aggregation
def stack_matrices(records: Sequence[RunRecord]) -> np.ndarray:
    """(seeds, T, T) accuracy matrices; shorter or ragged ones are padded with NaN to the largest T."""
    T = max((len(r.acc_matrix) for r in records), default=0)
    out = np.full((len(records), T, T), np.nan)
    for k, r in enumerate(records):
        for i, row in enumerate(r.acc_matrix):
            out[k, i, :len(row)] = np.array(row, dtype=float)   # None was turned into NaN on load
    return out


def _nanmean(a: np.ndarray, axis: int) -> np.ndarray:
    # np.nanmean warns on all-NaN slices; an unreached cell is simply NaN here.
    n = (~np.isnan(a)).sum(axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, np.nansum(a, axis=axis) / np.maximum(n, 1), np.nan)


def mean_matrix(records: Sequence[RunRecord]) -> np.ndarray:
    """Mean over seeds of R[i][j], ignoring NaN (cells no seed reached stay NaN)."""
    return _nanmean(stack_matrices(records), axis=0)


def step_accuracy(records: Sequence[RunRecord]) -> np.ndarray:
    """(seeds, T): accuracy on all seen tasks after each task i, i.e. the mean of R[i, :i+1]
    weighted by the record's test samples per task (unweighted where task_sizes is missing),
    which equals the pooled accuracy on the seen test data."""
    R = stack_matrices(records)
    n, T, _ = R.shape
    w = np.ones((n, T))
    for k, r in enumerate(records):
        if len(r.task_sizes) == len(r.acc_matrix) > 0:
            w[k, :len(r.task_sizes)] = r.task_sizes
    seen = np.tril(np.ones((T, T), dtype=bool))[None] & ~np.isnan(R)
    wm = np.where(seen, w[:, None, :], 0.0)              # NaN cells drop out of the weights
    total = wm.sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, (np.where(seen, R, 0.0) * wm).sum(-1) / total, np.nan)


def mean_band(values: np.ndarray, confidence: float = 0.95) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per column of (seeds, T): mean and the Student-t confidence band of the mean
    (the scorecard's interval; zero width with a single seed)."""
    mean = _nanmean(values, axis=0)
    n = (~np.isnan(values)).sum(axis=0)
    dev = np.where(np.isnan(values), 0.0, values - mean) ** 2
    with np.errstate(invalid="ignore", divide="ignore"):
        sd = np.sqrt(dev.sum(axis=0) / np.maximum(n - 1, 1))
        half = np.where(n > 1, stats.t.ppf((1 + confidence) / 2, np.maximum(n - 1, 1)) * sd / np.sqrt(n), 0.0)
    return mean, mean - half, mean + half


def _metric(record: RunRecord, key: str) -> float:
    value = record.metrics.get(key)
    if value is None and key in METRIC_INFO and record.acc_matrix:   # older records: recompute
        try:
            value = all_metrics(record.acc_matrix, record.task_sizes or None).get(key)
        except ValueError:
            value = None
    return math.nan if value is None else float(value)


def _mean(values: Sequence[float]) -> float:
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    return float(v.mean()) if v.size else math.nan


def cost_spread(records: Sequence[RunRecord], field: str = "train_seconds") -> tuple[float, float, int]:
    """(mean, sample sd, n) of a cost field over the records that carry it; sd is NaN below two."""
    v = np.asarray([getattr(r, field) for r in records], dtype=float)
    v = v[~np.isnan(v)]
    if not v.size:
        return math.nan, math.nan, 0
    return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else math.nan, int(v.size)


def efficiency(costs: Mapping[str, float]) -> dict[str, float]:
    """Cost -> radar value: the cheapest method's cost over each method's (1 on the rim, half as far
    out at twice the cost). A ratio, not min-max, so no method is put at the centre just for being
    the costliest and a radar of two methods does not collapse; ties sit on the rim."""
    finite = [v for v in costs.values() if not math.isnan(v)]
    lo = min(finite, default=math.nan)
    return {m: math.nan if math.isnan(v) else 1.0 if v <= lo else max(lo, 0.0) / v for m, v in costs.items()}


def radar_table(groups: Mapping[str, Sequence[RunRecord]]) -> tuple[list[str], dict[str, list[float]]]:
    """CLDyB Fig. 4 axes per method, each in [0, 1] with "better" further out.

    Accuracies keep their absolute scale so differences are not exaggerated; retention is
    1 - AFM (= 1 + AR, clipped to [0, 1]), or STF's information retention where records carry no
    AFM (a stream has no task matrix); an axis no method has a value for is left out rather than
    drawn at zero for all (that collapsed STF radars to a sliver). Memory (memory_mb) and training
    time (train_seconds) are drawn as :func:`efficiency`: cheapest cost over the method's."""
    methods = list(groups)
    keys = ("final_acc", "afm", "ala", "robustness", "info_retention")
    mean = {m: {k: _mean([_metric(r, k) for r in groups[m]]) for k in keys} for m in methods}
    for m in methods:
        mean[m]["memory_mb"] = _mean([r.memory_mb for r in groups[m]])
        mean[m]["train_seconds"] = _mean([r.train_seconds for r in groups[m]])
    carried = {k for k in keys if any(not math.isnan(mean[m][k]) for m in methods)}
    axes: list[tuple[str, dict[str, float]]] = []
    if "final_acc" in carried:
        axes.append(("final accuracy", {m: mean[m]["final_acc"] for m in methods}))
    if "afm" in carried:
        axes.append(("retention\n(1 − AFM)", {m: min(1.0, max(0.0, 1 - mean[m]["afm"])) for m in methods}))
    elif "info_retention" in carried:
        axes.append(("information\nretention", {m: mean[m]["info_retention"] for m in methods}))
    if "ala" in carried:
        axes.append(("learning accuracy\n(ALA)", {m: mean[m]["ala"] for m in methods}))
    if "robustness" in carried:
        axes.append(("robustness", {m: mean[m]["robustness"] for m in methods}))
    for key, label, unit in (("memory_mb", "memory efficiency", "MB"), ("train_seconds", "training time", "s")):
        raw = {m: mean[m][key] for m in methods}
        finite = [v for v in raw.values() if not math.isnan(v)]
        lo, hi = (min(finite), max(finite)) if finite else (0.0, 0.0)
        axes.append((f"{label}\n(mean {lo:.3g}–{hi:.3g} {unit})", efficiency(raw)))   # rim = the lowest cost
    labels = [a[0] for a in axes]
    # A method lacking a value is drawn at the centre rather than dropped from the chart.
    values = {m: [0.0 if math.isnan(a[1][m]) else float(a[1][m]) for a in axes] for m in methods}
    return labels, values


# ------------------------------------------------------------------------ figures
# Colour-blind-safe colours: Okabe and Ito (2008) and Paul Tol's "muted" scheme (no grey, no black).
METHOD_PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442",
                  "#332288", "#88CCEE", "#44AA99", "#117733", "#999933", "#DDCC77", "#CC6677", "#882255",
                  "#AA4499")


def method_gid(method: str) -> str:
    """The id of a method's line in an exported SVG (``<g id="method-er">``): a script can read a
    method's colour from any figure (scripts/render_report.py checks they agree)."""
    return "method-" + re.sub(r"[^A-Za-z0-9_.-]", "_", method)


def preferred_slot(method: str) -> int:
    """The METHOD_PALETTE index a method asks for: a stable hash of its name (SHA-256, not Python's
    salted ``hash``), so a method keeps its colour from one report, store or machine to the next."""
    return int.from_bytes(hashlib.sha256(method.encode("utf-8")).digest()[:8], "big") % FIRST_CHOICE


# the slots a method asks for: Okabe-Ito's seven (the most distinct for every kind of colour vision), so a
# page of a few methods never draws them in four shades of Tol's purples; Tol's nine take the overflow
FIRST_CHOICE = 7


def _probe(slot: int) -> list[int]:
    """The slots a method tries in turn: its own, the next Okabe-Ito ones, then Tol's."""
    return [(slot + i) % FIRST_CHOICE for i in range(FIRST_CHOICE)] + list(range(FIRST_CHOICE, len(METHOD_PALETTE)))


def _assign_colors(methods: Sequence[str]) -> dict[str, tuple]:
    """Colours of ``methods``, assigned in sorted order: each takes its :func:`preferred_slot` unless a
    method earlier in the order took it (then the next free slot), so a method has the same colour
    in every report unless it collides with another method of the same page. Beyond len(METHOD_PALETTE)
    methods the palette starts again for the next sorted block of methods (the colours stay
    colour-blind-safe; no tab20): :func:`method_styles` gives the methods that share a colour
    different line styles and markers."""
    from matplotlib.colors import to_rgba
    out: dict[str, tuple] = {}
    ordered = sorted(set(methods))
    n = len(METHOD_PALETTE)
    for start in range(0, len(ordered), n):
        taken: set[int] = set()
        for m in ordered[start:start + n]:
            slot = next(k for k in _probe(preferred_slot(m)) if k not in taken)
            taken.add(slot)
            out[m] = to_rgba(METHOD_PALETTE[slot])
    return out


# What tells apart methods that share a colour (a page of more methods than METHOD_PALETTE has colours):
# the first method of a colour (in sorted order) draws solid lines with round markers, the next dashed
# with squares, ... (the matplotlib line figures: accuracy over tasks, radars). The hand-drawn SVG
# charts (GTEP slope, bars) name each line or bar by its method instead.
LINE_STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D")


def method_styles(colors: Mapping[str, tuple]) -> dict[str, int]:
    """method -> style index (into LINE_STYLES and MARKERS, wrapping round): 0 for the first method of
    each colour in sorted order, 1 for the second, ...; all 0 while every method has its own colour.
    Counted over the page's methods (:func:`page_palette`) when one is active and knows them all, so
    a method has one style in every figure of the page."""
    page = _page_colors if _page_colors and all(m in _page_colors for m in colors) else colors
    seen: dict[tuple, int] = {}
    styles = {}
    for m in sorted(page):
        key = tuple(page[m])
        styles[m] = seen.get(key, 0)
        seen[key] = styles[m] + 1
    return {m: styles[m] for m in colors}


_page_colors: dict[str, tuple] = {}   # set by page_palette while a report page is built


@contextmanager
def page_palette(methods: Sequence[str] | Mapping[str, tuple]):
    """Within the block every :func:`method_colors` call (the families' sections included) answers
    from one mapping: the page's methods (:func:`_assign_colors`), or the mapping given (a figure
    worker gets the parent's). Without it each figure coloured its own method list, so a method
    changed colour from one figure to the next."""
    global _page_colors
    saved = _page_colors
    _page_colors = dict(methods) if isinstance(methods, Mapping) else _assign_colors(methods)
    try:
        yield _page_colors
    finally:
        _page_colors = saved


def method_colors(methods: Sequence[str]) -> dict[str, tuple]:
    """One colour per method: the page's (:func:`page_palette`) when one is active and knows every
    method, else :func:`_assign_colors` of ``methods`` (by name, whatever their order), from the
    colour-blind-safe METHOD_PALETTE."""
    if _page_colors and all(m in _page_colors for m in methods):
        return {m: _page_colors[m] for m in methods}
    return _assign_colors(list(methods))


def heatmap_figure(matrices: Mapping[str, tuple[np.ndarray, int]]) -> Figure:
    """One panel per method: mean R[i][j] over its seeds (rows = after task i, cols = task j).

    Panels sit on a fixed grid in inches rather than under constrained layout: with ten
    annotated panels the layout solver (and a tight bbox) redraw every text several times,
    which made this the slowest figure of the report by far."""
    n = len(matrices)
    rows = math.ceil(n / 4)
    cols = math.ceil(n / rows)   # balanced rows (5 methods: 3 + 2, not 4 + 1)
    T = max(M.shape[0] for M, _ in matrices.values())
    side = max(2.0, min(3.6, 0.4 * T + 0.6))           # panel edge, inches
    left, gap, top, bottom, bar = 0.6, 0.2, 0.32, 0.5, 0.9
    width, height = cols * (left + side + gap) + bar, rows * (top + side + bottom)
    fig = Figure(figsize=(width, height), dpi=DPI)
    cmap = colormaps["viridis"].with_extremes(bad="#dddddd")   # grey = no seed reached the cell
    image = None
    for k, (method, (M, seeds)) in enumerate(matrices.items()):
        r, c = divmod(k, cols)
        x0, y0 = c * (left + side + gap) + left, height - (r + 1) * (top + side + bottom) + bottom
        ax = fig.add_axes((x0 / width, y0 / height, side / width, side / height))
        image = ax.imshow(M, vmin=0, vmax=1, cmap=cmap, aspect="auto")
        ax.set_title(f"{method} ({seeds} seed{'s' * (seeds != 1)})", fontsize=9.5, pad=4)
        t = M.shape[0]
        step = max(1, math.ceil(t / 10))
        ax.set_xticks(range(0, t, step))
        ax.set_yticks(range(0, t, step))
        ax.tick_params(labelsize=7.5, length=2, pad=2)
        ax.set_xlabel("evaluated on task j", fontsize=7.5, labelpad=2)
        if c == 0:   # the other panels share the row's label
            ax.set_ylabel("after learning task i", fontsize=7.5, labelpad=2)
        if t <= 12:   # beyond that the numbers cannot be read; colour carries it
            fs = 8 if t <= 6 else 6
            for (i, j), v in np.ndenumerate(M):
                if not math.isnan(v):
                    ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=fs, clip_on=False,
                            color="black" if v > 0.55 else "white")   # unclipped: cheaper, and in the cell
    cax = fig.add_axes(((width - bar + 0.15) / width, bottom / height, 0.18 / width,
                        (height - bottom - top) / height))
    fig.colorbar(image, cax=cax, label="accuracy")
    return fig


def curve_figure(curves: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
                 colors: Mapping[str, tuple], seeds: Mapping[str, int] | None = None) -> Figure:
    """Accuracy on all seen tasks after each task, mean over seeds with its 95% CI band; ``seeds``
    puts each method's n in the legend (the band's width depends on it)."""
    fig = Figure(figsize=(6.2, 4.2), dpi=DPI, layout="constrained")
    ax = fig.subplots()
    T = 1
    styles = method_styles({m: colors[m] for m in curves})
    for method, (mean, lo, hi) in curves.items():
        x = np.arange(len(mean))
        T = max(T, len(mean))
        label = f"{method} (n={seeds[method]})" if seeds and method in seeds else method
        k = styles[method]
        ax.plot(x, mean, marker=MARKERS[k % len(MARKERS)], ms=3.5, lw=1.6, ls=LINE_STYLES[k % len(LINE_STYLES)],
                color=colors[method], label=label, gid=method_gid(method))
        # Accuracy lives in [0, 1]; a wide few-seed t-interval must not stretch the axis past it.
        ax.fill_between(x, np.clip(lo, 0, 1), np.clip(hi, 0, 1), color=colors[method], alpha=0.18, lw=0)
    bottom, top = ax.get_ylim()
    ax.set_ylim(max(bottom, 0.0), min(top, 1.02))
    ax.set_xlabel("after learning task i")
    ax.set_ylabel("accuracy on tasks 0..i")
    ax.set_xticks(range(0, T, max(1, math.ceil(T / 12))))
    ax.set_xlim(-0.2, T - 0.8)
    ax.grid(alpha=0.3)
    fig.legend(loc="outside right upper", fontsize=8, frameon=False)
    return fig


def continual_figure(curves: Mapping[str, dict]) -> Figure:
    """Continual evaluation (De Lange et al. 2023), one panel per method: the accuracy of every task on
    its evaluation subsample over training iterations (one line per task, from when it is first
    learned), task boundaries as dashed lines, so the stability gap after each switch shows."""
    n = len(curves)
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(4.2 * cols, 2.9 * rows), dpi=DPI, layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    cmap = colormaps["viridis"]
    for ax, (method, curve) in zip(axes, curves.items()):
        points = curve["points"]
        tasks = max((p["task"] for p in points), default=0) + 1
        for j in range(tasks):
            xs = [p["iteration"] for p in points if p["task"] >= j]
            ys = [p["acc"][j] for p in points if p["task"] >= j]
            ax.plot(xs, ys, lw=1.2, color=cmap(j / max(tasks - 1, 1)), label=f"task {j}")
        for p in points:
            if p["boundary"]:
                ax.axvline(p["iteration"], color="#888888", lw=0.8, ls="--")
        ax.set_title(method, fontsize=9)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("training iteration")
        ax.set_ylabel("accuracy")
        ax.grid(alpha=0.3)
    for ax in axes[n:]:
        ax.set_visible(False)
    if n:
        axes[0].legend(fontsize=7, frameon=False, ncol=2)
    return fig


def pareto_figure(points: Sequence, colors: Mapping[str, tuple]) -> Figure:
    """Final accuracy against training GFLOPs, one marker per method (``reporting.budget.Point``s, seed
    means), the Pareto front as a step line through its methods (none beats them on both axes); the
    x axis is logarithmic where the costs span more than a factor of 20."""
    placed = [p for p in points if p.placed]
    fig = Figure(figsize=(6.2, 4.2), dpi=DPI, layout="constrained")
    ax = fig.subplots()
    styles = method_styles({p.method: colors[p.method] for p in placed})
    for p in placed:
        k = styles[p.method]
        ax.plot([p.gflops], [p.accuracy], ls="none", marker=MARKERS[k % len(MARKERS)], ms=8 if p.pareto else 6,
                color=colors[p.method], mfc=colors[p.method] if p.pareto else "none", mew=1.6,
                label=f"{p.method}{' (front)' if p.pareto else ''}", gid=method_gid(p.method))
    best = sorted((p for p in placed if p.pareto), key=lambda p: p.gflops)
    if best:   # the front: from each front method right to the next one's cost, then up to its accuracy
        xs, ys = [best[0].gflops], [best[0].accuracy]
        for q in best[1:]:
            xs += [q.gflops, q.gflops]
            ys += [ys[-1], q.accuracy]
        ax.plot(xs, ys, color="#444444", lw=1.1, ls="--", zorder=0, label="Pareto front")
    costs = [p.gflops for p in placed]
    if costs and max(costs) > 20 * min(costs):
        ax.set_xscale("log")
    ax.set_xlabel("training GFLOPs (forward + backward, seed mean)")
    ax.set_ylabel("final accuracy (seed mean)")
    ax.grid(alpha=0.3)
    fig.legend(loc="outside right upper", fontsize=8, frameon=False)
    return fig


def radar_figure(labels: Sequence[str], values: Mapping[str, Sequence[float]],
                 colors: Mapping[str, tuple]) -> Figure:
    """Methods as polygons over the radar_table axes; further out is better on every axis."""
    # No constrained layout: it ignores polar tick labels and clipped the long side ones; the
    # tight bbox of to_img grows the canvas to hold them and the legend instead.
    fig = Figure(figsize=(5.0, 4.4), dpi=DPI)
    ax = fig.add_subplot(projection="polar")
    angles = np.linspace(0, 2 * np.pi, len(labels), endpoint=False)
    closed = np.append(angles, angles[0])
    styles = method_styles({m: colors[m] for m in values})
    for method, v in values.items():
        v = np.append(v, v[0])
        k = styles[method]
        ax.plot(closed, v, lw=1.6, ls=LINE_STYLES[k % len(LINE_STYLES)], color=colors[method], label=method,
                gid=method_gid(method), **({"marker": MARKERS[k % len(MARKERS)], "ms": 3.5} if k else {}))
        ax.fill(closed, v, color=colors[method], alpha=0.08)
    ax.set_theta_offset(np.pi / 2)   # first axis (final accuracy) on top, then clockwise
    ax.set_theta_direction(-1)
    ax.set_xticks(angles)
    ax.set_xticklabels(labels, fontsize=7.5)
    ax.tick_params(axis="x", pad=2)
    # Anchor each label on its spoke's outer side so long labels grow away from the circle
    # (and constrained layout can make room) instead of being centred over the rim.
    for label, angle in zip(ax.get_xticklabels(), angles):
        side = np.sin(angle)
        label.set_horizontalalignment("left" if side > 0.1 else "right" if side < -0.1 else "center")
        label.set_verticalalignment("bottom" if np.cos(angle) > 0.1 else "top" if np.cos(angle) < -0.1 else "center")
    ax.set_ylim(0, 1)
    ax.set_yticks([0.25, 0.5, 0.75, 1.0])
    ax.set_yticklabels(["0.25", "0.5", "0.75", "1"], fontsize=6.5, color="#666666")
    ax.set_rlabel_position(180 / len(labels))   # between the first two spokes, clear of the labels
    ax.legend(loc="upper left", bbox_to_anchor=(1.22, 1.08), fontsize=8, frameon=False)
    return fig


PALETTE_COLORS = 64


def _palette_png(png: bytes) -> bytes:
    """The PNG as a 64-colour palette PNG without dithering: a quarter of the bytes or less, so a
    page of many figures stays small (issue 19: under 1 MB for the five-family store and for
    10,000 records). Figures are flat colours and antialiased text on white; the octree picks
    the colours actually used, and dithering would only add noise that compresses badly.
    Heatmap cells carry their value as text, so a colour merged with its neighbour loses nothing."""
    from PIL import Image   # matplotlib's own dependency
    image = Image.open(io.BytesIO(png)).convert("RGB").quantize(
        colors=PALETTE_COLORS, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE)
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=True)
    return out.getvalue()


_export: dict = {"dir": None, "names": set()}   # set by export_figures while a report page is built


@contextmanager
def export_figures(directory: str | Path | None):
    """Within the block :func:`to_img` also writes each figure to ``directory`` as PNG, SVG and PDF
    (vector files for a paper), named after its alt text (:func:`figure_name`), and :func:`export_svg`
    the hand-drawn SVG charts (GTEP's slope plot, report_svg's bars) as SVG only: no SVG-to-PDF
    converter is a dependency. None: nothing written."""
    saved = dict(_export)
    if directory is not None:
        Path(directory).mkdir(parents=True, exist_ok=True)
    _export.update(dir=None if directory is None else Path(directory), names=set())
    try:
        yield
    finally:
        _export.update(saved)


def figure_stem(alt: str) -> str:
    """A stable, readable file stem from a figure's alt text: "suite::scenario: method radar" ->
    "suite__scenario_method-radar"."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", alt.replace("::", "__").replace(": ", "_")).strip("-.") or "figure"


def figure_name(alt: str) -> str:
    """:func:`figure_stem`, made unique in the running export (a repeat gets -2, -3, ...)."""
    stem = figure_stem(alt)
    name, k = stem, 1
    while name in _export["names"]:
        k += 1
        name = f"{stem}-{k}"
    _export["names"].add(name)
    return name


def _save_vectors(fig: Figure, alt: str, tight: bool) -> None:
    name = figure_name(alt)   # may hold a dot ("... (fig. 4)"): Path.with_suffix would cut the name there
    path = {suffix: _export["dir"] / f"{name}{suffix}" for suffix in (".png", ".svg", ".pdf")}
    box = {"bbox_inches": "tight" if tight else None, "pad_inches": 0.08}
    # no dates or matplotlib URLs in the files: the same figure gives the same bytes. Text stays text
    # (SVG) and TrueType (PDF, not Type 3): editable, and what journals ask for.
    with matplotlib.rc_context({"svg.fonttype": "none", "pdf.fonttype": 42, "svg.hashsalt": "clharness"}):
        fig.savefig(path[".png"], format="png", dpi=200, metadata={"Software": None}, **box)
        fig.savefig(path[".svg"], format="svg", metadata={"Date": None}, **box)
        fig.savefig(path[".pdf"], format="pdf", metadata={"CreationDate": None}, **box)


def export_svg(svg: str, alt: str) -> None:
    """A figure drawn as SVG text (report_svg's bar charts) into the export folder, when one is set."""
    if _export["dir"] is not None:
        (_export["dir"] / f"{figure_name(alt)}.svg").write_text(svg, encoding="utf-8")


def to_img(fig: Figure, alt: str, tight: bool = True) -> str:
    """The figure as an inline base64 PNG <img>, so the page needs no other file.
    ``tight`` grows the canvas to whatever is drawn outside the axes (legends, radar labels)
    at the cost of one extra draw; figures laid out by hand skip it. Inside :func:`export_figures`
    the figure is also written as PNG, SVG and PDF."""
    buf = io.BytesIO()
    FigureCanvasAgg(fig)   # attach the Agg canvas explicitly: no backend lookup, no pyplot
    if _export["dir"] is not None:
        _save_vectors(fig, alt, tight)
    fig.savefig(buf, format="png", metadata={"Software": None},   # no matplotlib URL in the PNG
                bbox_inches="tight" if tight else None, pad_inches=0.08)
    fig.clear()   # drop artists now; the page keeps only the bytes
    data = base64.b64encode(_palette_png(buf.getvalue())).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'
