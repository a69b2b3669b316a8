"""``clharness stream-plot``: figures 2 and 4 of the STF paper for any label set.

Top row (figure 2): the relative frequency of every class in each of ``chunks`` (200) equal parts
of a conventional disjoint-task stream (left) and of an STF stream of the same labels (right).
Bottom row (figure 4): the relative frequency of the most prevalent class in each chunk, constant
1/(classes per task) for the disjoint stream, varying for the STF stream.
"""
from __future__ import annotations

import argparse
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
