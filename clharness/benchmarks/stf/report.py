"""The STF sections of ``clharness report`` (issue 15 item 14, issue 19 part 1), per suite:

* Table 1 of the STF paper for the suite's runs: per method and scenario, the final test accuracy
  (Fin. Acc.) and the information retention averaged over the stream (Av. IR), in %, as mean ±
  the half-width of the two-sided 95% Student-t confidence interval over the seeds,
  t_{0.975, n-1} * s / sqrt(n) with s the sample standard deviation (``metrics.mean_ci``; the paper:
  "95%-confidence intervals over 20 runs", which ``--clh-preset stf:table1`` runs);
* (HTML) the run's own streams, rebuilt from the records (trace.py): the relative frequency of each
  class in 200 chunks of the stream (fig. 2) and of the most prevalent class (fig. 4, up to three
  seeds' streams); information retention along the stream per method (mean and 95% CI band over
  seeds); ER's training loss along the stream, one line per seed's stream (fig. 5).
Records of other families give no section.
"""
from __future__ import annotations

import html
import math
from collections import defaultdict
from typing import Iterable, Sequence

import numpy as np

from ...metrics import mean_ci
from ...results import RunRecord

TITLE = ("STF: Table 1 (final accuracy and average information retention, mean ± 95% CI), the streams "
         "(figs. 2 and 4), information retention along the stream, ER's loss along the stream (fig. 5)")
TABLE_NOTE = ("Fin. Acc. = test accuracy after the whole stream; Av. IR = information retention (accuracy on "
              "the stream instances observed so far, Cai et al. 2021) averaged over every step of the stream "
              "(retention = \"sampled\": over the evaluation points, on a sample); "
              "in %, mean ± half-width of the two-sided 95% Student-t confidence interval over the n seeds "
              "(t_0.975,n-1 · s / √n), as the STF paper's Table 1 (20 runs: --clh-preset stf:table1).")
STREAM_NOTE = ("The runs' own streams, rebuilt from their records. Top (fig. 2): relative frequency of each class "
               "in each of 200 equal chunks of the stream (seed {seed}); bottom (fig. 4): relative frequency of "
               "the most prevalent class per chunk, one line per seed's stream (up to three).")
RETENTION_NOTE = ("Information retention (accuracy on a sample of the stream instances observed so far) at each "
                  "evaluation point, against the fraction of the stream observed; mean over seeds with the 95% "
                  "Student-t confidence band.")
LOSS_NOTE = ("ER's training loss (cross-entropy over the stream batch and its replay batch) along the stream: "
             "the mean of the loss of every step in each of {windows} equal windows of the stream, one line per "
             "seed's stream (up to three), as the STF paper's fig. 5 plots for disjoint-task and STF streams.")
LOSS_METHOD = "er"
MAX_STREAMS = 3


def is_stf(record: RunRecord) -> bool:
    return "info_retention" in record.metrics or "stream" in record.extra


def by_suite(records: Iterable[RunRecord]) -> dict[str, dict[str, dict[str, list[RunRecord]]]]:
    """{suite: {scenario: {method: passed records by seed}}} of the STF runs, in store order."""
    out: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for r in records:
        if r.status == "passed" and is_stf(r):
            out[r.suite][r.scenario][r.method].append(r)
    for scenarios in out.values():
        for methods in scenarios.values():
            for rs in methods.values():
                rs.sort(key=lambda r: r.seed)
    return out


def cell(values: Sequence[float]) -> str:
    """``mean ± half`` in %, one decimal (Table 1's format); the mean alone for one run (no
    interval); "-" without values."""
    values = [float(v) for v in values if not math.isnan(float(v))]
    mean, half = mean_ci(values)
    if math.isnan(mean):
        return "-"
    if len(values) < 2:
        return f"{100 * mean:.1f}"
    return f"{100 * mean:.1f} ± {100 * half:.1f}"


def table(scenarios: dict[str, dict[str, list[RunRecord]]]) -> tuple[list[str], list[list[str]]]:
    """Table 1's layout: one row per method, per scenario Fin. Acc. and Av. IR, and the seed counts."""
    names = list(scenarios)
    methods = list(dict.fromkeys(m for runs in scenarios.values() for m in runs))
    head = ["method", *[f"{sc}: {col}" for sc in names for col in ("Fin. Acc.", "Av. IR")], "seeds"]
    rows = []
    for m in methods:
        row, seeds = [m], set()
        for sc in names:
            rs = scenarios[sc].get(m, [])
            seeds.add(len(rs))
            row += [cell([r.metrics.get("final_acc", math.nan) for r in rs]),
                    cell([r.metrics.get("info_retention", math.nan) for r in rs])]
        row.append(str(min(seeds)) if len(seeds) == 1 else f"{min(seeds)}-{max(seeds)}")
        rows.append(row)
    return head, rows


def text_sections(records: Sequence[RunRecord], fmt: str) -> list[tuple[str, str]]:
    from tabulate import tabulate
    out = []
    for suite, scenarios in by_suite(records).items():
        head, rows = table(scenarios)
        text = tabulate(rows, headers=head, tablefmt=fmt, disable_numparse=True) + "\n" + TABLE_NOTE
        out.append((f"STF Table 1: {suite} (in %, mean ± 95% Student-t CI over seeds)", text))
    return out


def terminal_summary(records: Sequence[RunRecord], terminalreporter) -> None:
    """Table 1 of the session's STF runs at the end of a pytest session."""
    for title, text in text_sections(records, "github"):
        terminalreporter.section(f"clharness {title}")
        terminalreporter.write_line(text)


def write_scorecard(path, records: Sequence[RunRecord]) -> None:
    """A .md scorecard gets Table 1 appended (.json and .csv already hold every run's metrics and their
    mean and CI per column)."""
    from pathlib import Path
    path = Path(path)
    sections = text_sections(records, "github") if path.suffix == ".md" else []
    if sections:
        with open(path, "a") as fh:
            fh.write("".join(f"\n## {title}\n\n{text}\n" for title, text in sections))


def html_sections(records: Sequence[RunRecord], drawing) -> list[tuple[str, str]]:
    parts = [suite_html(suite, scenarios, drawing) for suite, scenarios in by_suite(records).items()]
    return [(TITLE, "\n".join(parts))] if parts else []


def suite_html(suite: str, scenarios: dict[str, dict[str, list[RunRecord]]], drawing) -> str:
    """One suite's Table 1 and figures, drawn with ``drawing`` (the page's clharness.kinds.Drawing)."""
    from . import plots
    head, rows = table(scenarios)
    out = [f"<h3>{_e(suite)}: STF Table 1</h3>", _table(head, rows), f"<p class='note'>{_e(TABLE_NOTE)}</p>"]
    figures = []
    streams, seed = plots.scenario_streams(scenarios, MAX_STREAMS)
    if streams:
        figures.append(_figure(drawing, plots.stream_figure(streams), f"{suite}: class frequencies along the stream "
                               "(figs. 2 and 4)", STREAM_NOTE.format(seed=seed)))
    curves = {sc: retention_curves(runs, drawing) for sc, runs in scenarios.items()}
    curves = {sc: c for sc, c in curves.items() if c}
    if curves:
        colors = drawing.method_colors(sorted({m for c in curves.values() for m in c}))
        figures.append(_figure(drawing, plots.retention_figure(curves, colors),
                               f"{suite}: information retention along the stream", RETENTION_NOTE))
    losses = {sc: loss_curves(runs.get(LOSS_METHOD, [])) for sc, runs in scenarios.items()}
    losses = {sc: c for sc, c in losses.items() if c}
    if losses:
        windows = max(len(y) for c in losses.values() for _, (_, y) in c.items())
        figures.append(_figure(drawing, plots.loss_figure(losses), f"{suite}: ER's training loss along the stream (fig. 5)",
                               LOSS_NOTE.format(windows=windows)))
    missing = [what for what, ok in (("streams", streams), ("retention curves", curves),
                                     ("ER loss curves", losses)) if not ok]
    if missing:   # records from before these were kept, or no ER runs
        out.append(f"<p class='note'>not drawn: {_e(', '.join(missing))} (the records hold none; "
                   "rerun the cases with --clh-fresh to record them).</p>")
    out.extend(figures)
    return "\n".join(out)


def retention_curves(runs: dict[str, list[RunRecord]], drawing) -> dict[str, tuple]:
    """{method: (x, mean, lo, hi)}: information retention at each evaluation point over the seeds whose
    points match the first seed's (x = fraction of the stream observed)."""
    out = {}
    for method, rs in runs.items():
        with_curve = [r for r in rs if r.extra.get("info_retention") and r.extra.get("eval_at")]
        if not with_curve:
            continue
        x = with_curve[0].extra["eval_at"]
        values = np.array([_floats(r.extra["info_retention"]) for r in with_curve if r.extra["eval_at"] == x])
        out[method] = (np.array(x, dtype=float), *drawing.mean_band(values))
    return out


def loss_curves(runs: Sequence[RunRecord]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """{seed: (x, loss)} of up to MAX_STREAMS seeds: the mean loss per window at the window's middle
    (fraction of the stream)."""
    out = {}
    for r in runs:
        y = _floats(r.extra.get("train_loss") or [])
        if len(y) and len(out) < MAX_STREAMS:
            out[r.seed] = ((np.arange(len(y)) + 0.5) / len(y), y)
    return out


def _floats(values) -> np.ndarray:
    return np.array([math.nan if v is None else v for v in values], dtype=float)   # null = NaN


def _figure(drawing, fig, alt: str, note: str) -> str:
    return f"<figure>{drawing.to_img(fig, alt)}<figcaption><b>{_e(alt)}</b>. {_e(note)}</figcaption></figure>"


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    return ("<table class='stf-table1'><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows) + "</table>")


def _e(text) -> str:
    return html.escape(str(text), quote=True)
