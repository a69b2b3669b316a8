"""``clharness stream-plot``: figures 2 and 4 of the STF paper for any label set.

Top row (figure 2): the relative frequency of every class in each of ``chunks`` (200) equal parts
of a conventional disjoint-task stream (left) and of an STF stream of the same labels (right).
Bottom row (figure 4): the relative frequency of the most prevalent class in each chunk, constant
1/(classes per task) for the disjoint stream, varying for the STF stream.

The family's report section (report.py) draws the same pictures for the runs' own streams, the
information retention along the stream and ER's loss along the stream (figure 5), with the
functions at the end of this module.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from . import streams


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", metavar="NAME", help="take the labels of this dataset's train split "
                        "(needs its files under --data-root); default: balanced labels, --classes x --per-class")
    parser.add_argument("--data-root", metavar="DIR", help="folder holding the datasets")
    parser.add_argument("--classes", type=int, default=10, help="classes of the balanced labels (default 10)")
    parser.add_argument("--per-class", type=int, default=5000, help="instances per class (default 5000, CIFAR-10)")
    parser.add_argument("--tasks", type=int, default=5,
                        help="tasks of the disjoint stream, and mu_sigma = sqrt(1/12)/tasks (appendix D) "
                             "unless --mu-sigma is given (default 5)")
    parser.add_argument("--mu-sigma", type=float, help="average class standard deviation, in (0, 0.5]")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply mu_sigma (figure 3: 0.5, 1, 2, 4)")
    parser.add_argument("--chunks", type=int, default=200, help="chunks the streams are cut into (default 200)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="stream.png", help="PNG to write (default stream.png)")


def dataset_labels(name: str, data_root: str | None) -> np.ndarray:
    """Train-split labels of a registered dataset, as consecutive ids 0..C-1."""
    from ...data import load_split
    from ...plugins import Harness

    source = Harness().datasets[name]()
    source.name = name
    labels = load_split(source, Path(data_root) if data_root else None, True, False).labels.numpy()
    return np.unique(labels, return_inverse=True)[1]


def draw_streams(labels: np.ndarray, tasks: int, mu_sigma: float, seed: int = 0, chunks: int = 200):
    """The figure (matplotlib, Agg) with figure 2 on top and figure 4 below."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = streams.check_labels(np.asarray(labels))
    c = int(labels.max()) + 1
    disjoint = labels[streams.disjoint_order(labels, tasks, seed)]
    stf = labels[streams.stf_order(labels, mu_sigma, seed)[0]]
    fig, axes = plt.subplots(2, 2, figsize=(12, 6.5), sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    colors = plt.get_cmap("tab20" if c <= 20 else "turbo")(np.linspace(0, 1, c) if c > 20 else np.arange(c) % 20)
    x = np.arange(chunks)
    for col, (stream, title) in enumerate([(disjoint, f"conventional: {tasks} disjoint tasks"),
                                           (stf, f"STF: mu_sigma = {mu_sigma:.4g}")]):
        freq = streams.chunk_frequencies(stream, c, chunks)
        top, bottom = axes[0, col], axes[1, col]
        top.stackplot(x, freq.T, colors=colors, linewidth=0)
        top.set(title=title, ylim=(0, 1), xlim=(0, chunks - 1), ylabel="relative class frequency")
        bottom.plot(x, freq.max(1), color="black", linewidth=1)
        bottom.set(ylim=(0, 1.05), xlabel=f"chunk of the stream ({chunks} chunks)",
                   ylabel="most prevalent class")
    fig.tight_layout()
    return fig


def run(args: argparse.Namespace) -> int:
    import sys

    from ...registry import RegistryError
    try:
        labels = (dataset_labels(args.dataset, args.data_root) if args.dataset
                  else np.repeat(np.arange(args.classes), args.per_class))
        mu_sigma = (streams.check_mu_sigma(streams.check_mu_sigma(args.mu_sigma) * args.scale)
                    if args.mu_sigma is not None else streams.mu_sigma_for_tasks(args.tasks, args.scale))
        fig = draw_streams(labels, args.tasks, mu_sigma, args.seed, args.chunks)
    except (ValueError, KeyError, FileNotFoundError, RegistryError) as exc:
        print(f"clharness stream-plot: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"wrote {out} ({len(labels)} instances, {int(labels.max()) + 1} classes, "
          f"{args.tasks} tasks vs mu_sigma = {mu_sigma:.4g})")
    return 0



def add_commands(subparsers) -> dict:
    """The STF family's ``clharness stream-plot`` (the kind's ``cli`` module, clharness.kinds)."""
    add_arguments(subparsers.add_parser(
        "stream-plot", help="figures 2 and 4 of the STF paper: class frequencies of a disjoint and an STF stream",
        description="Draws, for the same labels, a conventional disjoint-task stream and a simulated task-free "
                    "(STF) stream: relative class frequency per chunk (figure 2) and the frequency of the most "
                    "prevalent class (figure 4), to a PNG."))
    return {"stream-plot": run}


# ------------------------------------------------------------------------ the report's figures
# Plain matplotlib Figures on no canvas (clharness.reporting.plots.to_img attaches Agg): no pyplot state.
def scenario_streams(scenarios, max_streams: int = 3) -> tuple[dict[str, list[tuple[int, np.ndarray, int]]], int | None]:
    """{scenario: [(seed, stream labels, classes)]} rebuilt from the records' stream descriptions
    (trace.rebuild_stream), up to ``max_streams`` seeds per scenario, lowest seeds first; and the
    seed of the first scenario's first stream (the one figure 2's panel shows)."""
    from . import trace
    out, shown = {}, None
    for scenario, runs in scenarios.items():
        found = {}
        for r in sorted((r for rs in runs.values() for r in rs), key=lambda r: r.seed):
            description = r.extra.get("stream")
            if description and r.seed not in found and len(found) < max_streams:
                try:
                    found[r.seed] = trace.rebuild_stream(description)
                except ValueError:   # recorded by another generator version: that stream is not drawn
                    continue
        if found:
            out[scenario] = [(seed, labels, int(labels.max()) + 1) for seed, labels in found.items()]
            shown = min(found) if shown is None else shown
    return out, shown


def _grid(n: int, per_row: int = 3) -> tuple[int, int]:
    cols = min(n, per_row)
    return math.ceil(n / cols), cols


def stream_figure(streams_by_scenario: dict, chunks: int = 200):
    """Per scenario: figure 2 (stacked relative class frequency per chunk of its first stream) over
    figure 4 (frequency of the most prevalent class per chunk, one line per stream)."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure
    rows, cols = _grid(len(streams_by_scenario))
    fig = Figure(figsize=(3.3 * cols + 0.3, 3.1 * rows), dpi=100, layout="constrained")
    grid = fig.add_gridspec(2 * rows, cols, height_ratios=[2, 1] * rows)
    for k, (scenario, streams_) in enumerate(streams_by_scenario.items()):
        r, c = divmod(k, cols)
        top, bottom = fig.add_subplot(grid[2 * r, c]), fig.add_subplot(grid[2 * r + 1, c])
        seed, labels, classes = streams_[0]
        n = min(chunks, len(labels))
        freq = streams.chunk_frequencies(labels, classes, n)
        cmap = colormaps["tab20" if classes <= 20 else "turbo"]
        colours = cmap(np.arange(classes) % 20) if classes <= 20 else cmap(np.linspace(0, 1, classes))
        x = np.arange(n)
        top.stackplot(x, freq.T, colors=colours, linewidth=0)
        top.set_title(f"{scenario} (seed {seed})", fontsize=9)
        top.set(ylim=(0, 1), xlim=(0, n - 1))
        top.tick_params(labelsize=7, labelbottom=False)
        for s, other, _ in streams_:
            m = min(chunks, len(other))
            bottom.plot(np.arange(m), streams.chunk_frequencies(other, classes, m).max(1), lw=0.9,
                        label=f"seed {s}")
        bottom.set(ylim=(0, 1.05), xlim=(0, n - 1))
        bottom.tick_params(labelsize=7)
        bottom.set_xlabel(f"chunk ({n} chunks)", fontsize=7.5)
        if c == 0:
            top.set_ylabel("class frequency", fontsize=7.5)
            bottom.set_ylabel("most prevalent", fontsize=7.5)
    return fig


def retention_figure(curves: dict, colors: dict):
    """Per scenario: information retention against the fraction of the stream observed, per method
    (mean and 95% CI band over seeds)."""
    from matplotlib.figure import Figure
    rows, cols = _grid(len(curves))
    fig = Figure(figsize=(3.3 * cols + 1.0, 2.7 * rows), dpi=100, layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows, cols, sharey=True, squeeze=False)).ravel()
    for ax, (scenario, methods) in zip(axes, curves.items()):
        for method, (x, mean, lo, hi) in methods.items():
            ax.plot(x, mean, marker="o", ms=2.5, lw=1.3, color=colors[method], label=method)
            ax.fill_between(x, np.clip(lo, 0, 1), np.clip(hi, 0, 1), color=colors[method], alpha=0.15, lw=0)
        ax.set_title(scenario, fontsize=9)
        ax.set(xlim=(0, 1.02))
        ax.set_xlabel("fraction of the stream observed", fontsize=7.5)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("information retention", fontsize=7.5)
    for ax in axes[len(curves):]:
        ax.set_visible(False)
    seen = {}   # one legend entry per method, whichever panel has it
    for ax in axes[:len(curves)]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    fig.legend(list(seen.values()), list(seen), loc="outside right upper", fontsize=7.5, frameon=False)
    return fig


def loss_figure(losses: dict):
    """Per scenario: ER's mean training loss per window of the stream, one line per seed (fig. 5)."""
    from matplotlib.figure import Figure
    rows, cols = _grid(len(losses))
    fig = Figure(figsize=(3.3 * cols + 0.3, 2.5 * rows), dpi=100, layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows, cols, sharey=True, squeeze=False)).ravel()
    for ax, (scenario, seeds) in zip(axes, losses.items()):
        for seed, (x, y) in seeds.items():
            keep = ~np.isnan(y)
            ax.plot(x[keep], y[keep], lw=0.9, label=f"seed {seed}")
        ax.set_title(scenario, fontsize=9)
        ax.set(xlim=(0, 1))
        ax.set_xlabel("fraction of the stream", fontsize=7.5)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if len(seeds) > 1:
            ax.legend(fontsize=6, frameon=False, loc="upper right")
    axes[0].set_ylabel("ER training loss", fontsize=7.5)
    for ax in axes[len(losses):]:
        ax.set_visible(False)
    return fig
