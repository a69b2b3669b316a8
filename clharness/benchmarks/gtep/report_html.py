"""The GTEP section of the HTML report (issue 19 part 1): per scenario, one row per method
(tuning-phase score of H*, evaluation-phase score P^E, gap, rank before and after), Kendall tau
between the two rankings, a slope plot from each method's tuned to its evaluated score (the
paper's point: rankings under the conventional protocol do not survive evaluation on fresh data,
GTEP section 4), and the per-configuration tuning records behind a collapsed <details>, sorted by
configuration. The numbers are summary.summarize's; this module only lays them out."""
from __future__ import annotations

import html
import math
from typing import Iterable, Sequence

from ...results import RunRecord
from . import protocol
from . import phases, search, selection, summary

TITLE = "GTEP: tuning phase (D^HT) vs evaluation phase (D^E), ranked by P^E"


def section(records: Iterable[RunRecord], drawing, harness=None) -> str | None:
    """The GTEP HTML of ``records``, or None when they hold no GTEP runs; drawn with ``drawing`` (the
    page's clharness.kinds.Drawing)."""
    records = [r for r in records if phases.is_gtep(r)]
    if not records:
        return None
    spaces = (search.method_spaces(harness, sorted({r.method for r in records}))
              if harness is not None else None)
    frame = summary.summarize(records, spaces)
    taus = summary.ranking_change(frame)
    out = []
    for (suite, scenario), group in frame.groupby(["suite", "scenario"], sort=False):
        tau = taus[(suite, scenario)]["kendall"]
        tuning = group.tuning.iloc[0]
        out.append(f"<h3>{_e(suite)}::{_e(scenario)} (GTEP)</h3>")
        out.append(f"<p class='note'>Kendall tau between the tuning-phase and evaluation-phase rankings: "
                   f"<b>{'-' if math.isnan(tau) else f'{tau:.3f}'}</b> "
                   f"({'fewer than 2 methods' if math.isnan(tau) else 'ranking unchanged' if math.isclose(tau, 1.0) else 'ranking changes'}). "
                   f"Tuning score: final accuracy of the chosen H* on D^HT (what the conventional protocol "
                   f"reports); evaluation score: P^E on D^E; both mean ± half-width of the 95% Student-t CI, "
                   f"t_{{0.975, n−1}} · s / √n, over {_e(trial_counts(group, records))}; gap = tuning − evaluation."
                   f"{f' H* tuned on {_e(tuning)}.' if tuning != scenario else ''}</p>")
        out.append("<div class='row'>" + method_table(group) + slope_svg(group, drawing) + "</div>")
        out.append(config_details([r for r in records if _tuning_name(r) == tuning]))
    return "\n".join(out)


def trial_counts(group, records: Sequence[RunRecord]) -> str:
    """The n of the scenario's intervals: the passed evaluation trials of each method and the passed
    tuning trials of its chosen H* (a single n, or the range over methods)."""
    def span(ns, what):
        ns = sorted(set(ns))
        n = "?" if not ns else str(ns[0]) if len(ns) == 1 else f"{ns[0]}–{ns[-1]}"
        return f"n = {n} {what} trial{'s' * (n != '1')}"
    tune = []
    for _, row in group.iterrows():
        if not summary._missing(row.config):
            tune.append(sum(r.status == "passed" and r.method == row.method
                            and phases.split_scenario(r.scenario) == (row.tuning, "tune", int(row.config))
                            for r in records))
    return (f"{span((int(t - d) for t, d in zip(group.eval_trials, group.eval_diverged)), 'evaluation')} "
            f"per method" + (f", {span(tune, 'tuning')} of the chosen H*" if tune else ""))


def method_rows(group) -> list[list[str]]:
    """One row per method, ranked by the evaluation phase: rank before (tuning) -> after
    (evaluation), method, tuning score, evaluation score, gap, chosen H*."""
    rows = []
    for _, r in group.iterrows():
        rows.append([f"{_rank(r.tune_rank)} → {_rank(r.eval_rank)}", r.method, summary._pm(r.tune_acc, r.tune_acc_ci),
                     summary._pm(r.eval_acc, r.eval_acc_ci), summary._num(r.gap, signed=True),
                     "-" if summary._missing(r.config) else f"c{int(r.config)}: {r.hparams}"])
    return rows


def method_table(group) -> str:
    head = ["rank tune → eval", "method", "tuning score", "evaluation score", "gap", "chosen H*"]
    return _table(head, method_rows(group))


def slope_svg(group, drawing, width: int = 360, height: int = 260) -> str:
    """Each method a line from its tuning score (left) to its evaluation score (right); a crossing
    is a change of rank. Plain SVG text, a few hundred bytes a method; the scores ride on each
    line as data attributes. Also written to the report's figure folder (--clh-figures)."""
    ok = group.dropna(subset=["tune_acc", "eval_acc"])
    if ok.empty:
        return ""
    values = [*ok.tune_acc, *ok.eval_acc]
    lo, hi = min(values), max(values)
    pad = max((hi - lo) * 0.08, 0.01)
    lo, hi = lo - pad, hi + pad
    # margins as wide as the longest label, so none runs off the picture
    margin = int(max(110, 10 + max(drawing.text_width(f"{m} 0.000") for m in ok.method)))
    width = max(width, 2 * margin + 140)
    top, bottom, left, right = 24, height - 28, margin, width - margin
    y = lambda v: bottom - (v - lo) / (hi - lo) * (bottom - top)  # noqa: E731
    # labels of close scores moved apart (one line of 11px text each), the picture grown to hold them
    # (the left column shares its place with the axis' hi and lo values)
    hi_y, lo_y, *left_y = drawing.spread_labels([top - 8, bottom + 12, *(y(v) + 4 for v in ok.tune_acc)], 13, 12)
    right_y = drawing.spread_labels([y(v) + 4 for v in ok.eval_acc], 13, 12)
    height = max(height, int(max(lo_y, *left_y, *right_y)) + 28)
    colors = drawing.method_colors(sorted(group.method))
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
             f"viewBox='0 0 {width} {height}' font-size='11' font-family='sans-serif' role='img'>",
             f"<title>{_e(group.suite.iloc[0])}::{_e(group.scenario.iloc[0])}: tuned vs evaluated final accuracy</title>",
             f"<line x1='{left}' y1='{top}' x2='{left}' y2='{bottom}' stroke='#999'/>",
             f"<line x1='{right}' y1='{top}' x2='{right}' y2='{bottom}' stroke='#999'/>",
             f"<text x='{left}' y='{height - 10}' text-anchor='middle'>tuning (D^HT)</text>",
             f"<text x='{right}' y='{height - 10}' text-anchor='middle'>evaluation (D^E)</text>",
             f"<text x='{left - 6}' y='{hi_y:.1f}' text-anchor='end' fill='#666'>{hi:.2f}</text>",
             f"<text x='{left - 6}' y='{lo_y:.1f}' text-anchor='end' fill='#666'>{lo:.2f}</text>"]
    for k, (_, r) in enumerate(ok.iterrows()):
        c = _hex(colors[r.method])
        y0, y1 = y(r.tune_acc), y(r.eval_acc)
        parts.append(f"<line class='slope' data-method='{_e(r.method)}' data-tune='{r.tune_acc:.4f}' "
                     f"data-eval='{r.eval_acc:.4f}' x1='{left}' y1='{y0:.1f}' x2='{right}' y2='{y1:.1f}' "
                     f"stroke='{c}' stroke-width='2'/>"
                     f"<circle cx='{left}' cy='{y0:.1f}' r='3' fill='{c}'/><circle cx='{right}' cy='{y1:.1f}' r='3' fill='{c}'/>"
                     f"<text x='{left - 6}' y='{left_y[k]:.1f}' text-anchor='end' fill='{c}'>{_e(r.method)} {r.tune_acc:.3f}</text>"
                     f"<text x='{right + 6}' y='{right_y[k]:.1f}' fill='{c}'>{r.eval_acc:.3f} {_e(r.method)}</text>")
    parts.append("</svg>")
    drawing.export_svg("".join(parts), f"{group.suite.iloc[0]}::{group.scenario.iloc[0]}: GTEP slope")
    return f"<figure>{''.join(parts)}<figcaption>Final accuracy of each method's H* in the tuning phase (left) " \
           f"and the evaluation phase (right); crossing lines are rank changes.</figcaption></figure>"


def config_rows(records: Sequence[RunRecord]) -> list[list[str]]:
    """Every tuning record, sorted by configuration number (c2 before c10), method, trial."""
    def k(r):
        return phases.split_scenario(r.scenario)[2]
    rows = []
    for r in sorted(records, key=lambda r: (k(r), r.method, r.seed)):
        rows.append([f"c{k(r)}", r.method, str(r.seed), r.status, summary._num(r.metrics.get("final_acc", math.nan)),
                     summary._num(r.metrics.get("avg_inc_acc", math.nan)), summary._num(selection.hmean_score(r)),
                     summary._config_text(r)])
    return rows


def config_details(records: Sequence[RunRecord]) -> str:
    records = [r for r in records if phases.split_scenario(r.scenario)[1] == "tune"]
    if not records:
        return ""
    head = ["config", "method", "trial", "status", "final acc", "avg inc acc", "H(acc, avg)", "hyperparameters"]
    return (f"<details><summary>per-configuration tuning records ({len(records)})</summary>"
            + _table(head, config_rows(records)) + "</details>")


def _tuning_name(record: RunRecord) -> str | None:
    parsed = phases.split_scenario(record.scenario)
    return parsed[0] if parsed and parsed[1] == "tune" else None


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    return ("<table><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows) + "</table>")


def _rank(v) -> str:
    return "-" if summary._missing(v) else str(int(v))


def _hex(rgba) -> str:
    return "#" + "".join(f"{int(round(255 * c)):02x}" for c in rgba[:3])


def _e(text) -> str:
    return html.escape(str(text), quote=True)
