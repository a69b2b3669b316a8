"""`clharness report`: a results store -> the scorecard as text (md, latex, csv, json) or as one
self-contained HTML page with figures (see plots.py)."""
from __future__ import annotations

import html
import json
import math
import time
from collections import defaultdict
from pathlib import Path
from typing import Iterable, Sequence

from ..metrics import METRIC_INFO
from ..results import NoRecords, RunRecord, read_records
from .scorecard import (_FIELDS, COLUMNS, INTERVAL_NOTE, WELCH_NOTE, main_records, pairwise_welch, rank_agreement,
                        render, render_agreement, render_pairwise, summarize)

# --format -> tabulate format (md: a plain Markdown pipe table with alignment colons; github: GitHub's
# flavour, no colons); csv and json come from the pandas summary instead.
FORMATS = {"md": "pipe", "github": "github", "latex": "latex_booktabs", "csv": None, "json": None}


class ReportError(ValueError):
    """Input the report cannot use; the CLI prints the message on one line and exits 2."""


def load_records(path: str | Path, suites: Sequence[str] = ()) -> list[RunRecord]:
    """Every record of the store (of ``suites`` when given), reading only (``results.read_records``,
    which checks the file first); a path without records raises ReportError."""
    try:
        return read_records(path, suites)
    except NoRecords as exc:
        raise ReportError(str(exc)) from None


def check_columns(records: Iterable[RunRecord], columns: Sequence[str]) -> None:
    known = set(METRIC_INFO) | set(_FIELDS) | {k for r in records for k in r.metrics}
    unknown = [c for c in columns if c not in known]
    if unknown:
        raise ReportError(f"unknown column(s) {', '.join(unknown)}; choose from {', '.join(sorted(known))}")


def shown_rows(summary, every: bool = False):
    """(the rows a report shows, a note on the rows it leaves out or ""). By default each case's main
    configuration (the one the current code and suite would run): a paper's table has one row per
    method. ``every`` (``clharness report --all``): every configuration, the main row first and the
    others labelled by how they differ from it."""
    if every or summary.empty or "main" not in summary:
        return summary, ""
    main = summary.main.astype(bool)
    hidden = summary[~main]
    if hidden.empty:
        return summary, ""
    kinds = ", ".join(dict.fromkeys(hidden.configuration))
    return summary[main], (f"{len(hidden)} row(s) of other configurations of the same cases ({kinds}) are not shown: "
                           "each case shows the configuration the current code would run; --all shows every "
                           "configuration, labelled")


def render_text(records: Sequence[RunRecord], columns: Sequence[str] = COLUMNS, fmt: str = "md",
                current: dict | None = None, every: bool = False) -> str:
    """The scorecard in ``fmt`` (a key of FORMATS): per (suite, scenario, method) its main configuration,
    or with ``every`` each configuration (:func:`shown_rows`); ``current``: case -> the current code
    digest, whose configuration is the case's main row."""
    summary, hidden_note = shown_rows(summarize(records, columns, current=current), every)
    if fmt == "csv":   # the data formats keep every row, tuning configurations included
        return summary.to_csv(index=False)
    if fmt == "json":   # to_json turns NaN into null, which json.loads reads back
        agreement = rank_agreement(summary[~_tuning_rows(summary)])
        return json.dumps({"columns": list(columns), "summary": json.loads(summary.to_json(orient="records")),
                           "rank_agreement": json.loads(agreement.to_json(orient="records"))}, indent=1)
    # The tables a reader sees: a multi-run protocol's tuning configurations (GTEP's X:tune-cK) are
    # rows of the kind's own section (cli.report_results prints it after this), not scenarios.
    tuning = _tuning_rows(summary)
    summary = summary[~tuning]
    agreement = rank_agreement(summary)
    suites = list(dict.fromkeys(summary.suite)) if not summary.empty else []
    if len(suites) > 1:   # one table per suite, each with the columns its own runs carry
        text = "\n\n".join(f"suite {suite}:\n" + render(summary[summary.suite == suite], columns, FORMATS[fmt])
                             for suite in suites)
    else:
        text = render(summary, columns, FORMATS[fmt])
    if not agreement.empty:
        text += "\n\nRanking agreement between scenarios:\n" + render_agreement(agreement, FORMATS[fmt])
    text += f"\n\n({INTERVAL_NOTE})"
    if hidden_note:
        text += f"\n\n({hidden_note}.)"
    if tuning.any():
        text += (f"\n\n({int(tuning.sum())} tuning-configuration rows (method x configuration) are summarised "
                 "in the protocol's own section below; --format csv or json lists them all.)")
    return text


def per_gflop_text(records: Sequence[RunRecord], fmt: str = "md", current: dict | None = None) -> str:
    """``clharness report --per-gflop``: per scenario, the methods ranked by final accuracy per training
    GFLOP with the Pareto front marked (reporting/budget.py); each case's main configuration, methods only
    (no protocol steps, no tuning configurations)."""
    from ..kinds import split_scenario
    from . import budget
    kept = [r for r in main_records(records, current) if not pseudo_method(r)
            and (split_scenario(r.scenario) or ("", ""))[1] != "tune"]
    return budget.render_ranking(budget.by_case(kept), FORMATS[fmt])


def pseudo_method(record: RunRecord) -> bool:
    """A record whose method field names a protocol step, not a method (CLDyB's sequence search):
    it has no place in a comparison of methods (radars, colours, tests between methods)."""
    from ..kinds import pseudo_methods
    return record.method in pseudo_methods()


def _tuning_rows(summary):
    """Rows of a kind's tuning phase (GTEP's ``X:tune-cK``): per-configuration, not per-scenario."""
    from ..kinds import split_scenario
    if summary.empty:
        return summary.scenario == summary.scenario   # an empty boolean mask
    return summary.scenario.map(lambda sc: (split_scenario(sc) or ("", ""))[1] == "tune").astype(bool)


# ------------------------------------------------------------------------ HTML page
_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#222;margin:0 auto;
     max-width:1360px;padding:16px 24px}
h1{font-size:22px;margin:4px 0}h2{font-size:18px;border-bottom:2px solid #ccd;padding-bottom:3px;margin-top:28px}
h3{font-size:15px;margin:22px 0 6px}.meta{color:#555}.note{color:#555;font-size:12.5px;max-width:1100px}
table{border-collapse:collapse;font-size:12.5px;margin:6px 0}
th,td{border:1px solid #ccd;padding:3px 8px;text-align:left;vertical-align:top}th{background:#eef0f6}
tr:nth-child(even) td{background:#f8f9fb}
.row{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start}
figure{margin:4px 0;border:1px solid #e2e4ea;padding:6px;background:#fff}
figcaption{font-size:12px;color:#444;max-width:640px}img{max-width:100%;height:auto;display:block}
.row>figure{flex:1 1 560px;min-width:0}
.bad{color:#a00}nav a{margin-right:10px}
"""

_NOTES = {
    "continual": "Continual evaluation (eval_every): accuracy of every task on its evaluation subsample over "
                 "training iterations, the first seed of each method; dashed lines mark task ends. A drop right "
                 "after a dashed line that recovers later is the stability gap (De Lange et al., ICLR 2023).",
    "heatmap": "Mean accuracy matrix R[i][j] over the passed seeds: row i = after learning task i, column j = "
               "accuracy on task j's test data (tasks numbered from 0; grey = no seed reached the cell).",
    "curve": "Accuracy on all tasks seen so far after each task (mean of R[i, 0..i] weighted by test samples "
             "per task), mean over seeds; the band is the 95% Student-t confidence interval of that mean "
             "(t_{0.975, n−1}, n = the method's seeds, shown in the legend).",
    "pareto": "Equal-budget view: final accuracy against training GFLOPs (forward and backward of every "
              "matmul and convolution the method ran, engine/flops.py), seed means. Filled markers and the dashed "
              "step line: the Pareto front, the methods no other method beats with at most their training FLOPs "
              "and at least their accuracy; hollow markers are dominated.",
    "radar": "Methods compared as in CLDyB Fig. 4; further out is better on every axis. Final accuracy, "
             "learning accuracy (ALA, mean of R[j][j]) and robustness on their absolute 0-1 scale; retention = "
             "1 − AFM (= 1 + AR, CLDyB's average retention shifted into 0-1), or the information retention "
             "for a stream without a task matrix; an axis no method carries is left out. Memory (memory_mb) and "
             "training time (train_seconds) are efficiencies: the cheapest method's seed-mean cost over each "
             "method's (the cheapest on the rim, twice the cost half-way in).",
}


def build_html(records: Sequence[RunRecord], columns: Sequence[str] = COLUMNS, source: str = "",
               make_harness=None, workers: int | None = 1, figures: str | Path | None = None,
               current: dict | None = None, every: bool = False) -> str:
    """The whole report as one HTML page: CSS inline, figures as base64 PNG or inline SVG, no
    external reference. Each suite: its table (the runs of a kind's phases, GTEP's tuning
    configurations, left to the kind's own section), the kinds' sections (``make_harness()``
    builds the registries for a kind that needs them), then figures per scenario, drawn by
    ``workers`` processes (None: one per CPU), which are most of the page's build time: matplotlib
    draws one figure at a time per process. More than one worker spawns processes, which re-import
    the caller's main module: call it from a guarded ``if __name__ == "__main__":`` (the CLI does).
    Every figure colours a method alike (plots.page_palette over the page's methods, the families'
    sections included); ``figures``: also write each figure there as PNG, SVG and PDF (the hand-drawn
    SVG charts as SVG only). The tables show each case's main configuration (``every``: each
    configuration, labelled; :func:`shown_rows`); the figures, Welch tests and the kinds' sections use
    the main configuration's records only, never a pool of configurations."""
    from . import plots   # matplotlib loads only for the page, not for the text formats
    methods = {r.method for r in records if not pseudo_method(r)}
    with plots.page_palette(methods) as colors, plots.export_figures(figures):
        return _build_html(records, columns, source, make_harness, workers, colors, figures, current, every)


def _build_html(records, columns, source, make_harness, workers, colors, figures, current=None, every=False) -> str:
    from ..kinds import report_sections, split_scenario
    from .drawing import DRAWING
    summary, hidden_note = shown_rows(summarize(records, columns, current=current), every)
    records = main_records(records, current)   # one configuration per case from here on
    passed = [r for r in records if r.status == "passed"]
    by_case: dict[tuple[str, str], dict[str, list[RunRecord]]] = defaultdict(lambda: defaultdict(list))
    for r in passed:
        by_case[(r.suite, r.scenario)][r.method].append(r)
    esc = html.escape
    suites = list(dict.fromkeys(r.suite for r in records))
    with _FigureDrawer(len(by_case), workers) as drawer:   # started now: worker start-up overlaps the tables
        out = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>clharness report</title>"
               f"<style>{_CSS}</style></head><body>",
               "<h1>clharness report</h1>",
               f"<p class='meta'>{esc(source)} · {len(records)} runs, {len(passed)} passed, "
               f"{len(records) - len(passed)} not plotted · generated {time.strftime('%Y-%m-%d %H:%M:%S')}</p>",
               *([f"<p class='note'>{esc(hidden_note)}.</p>"] if hidden_note else []),
               *(["<p class='note'>Every configuration of a case is a row of its table, the main one first; "
                  "the figures and tests use each case's main configuration.</p>"] if every else []),
               "<nav>" + "".join(f"<a href='#suite-{esc(s)}'>{esc(s)}</a>" for s in suites)
               + "<a href='#not-plotted'>runs not plotted</a></nav>"]
        for suite in suites:
            out.append(f"<h2 id='suite-{esc(suite)}'>suite {esc(suite)}</h2>")
            # tabulate's "html" format escapes every cell.
            shown = summary[(summary.suite == suite) & ~_tuning_rows(summary)]
            out.append(render(shown, columns, "html"))
            out.append(f"<p class='note'>{esc(INTERVAL_NOTE)}</p>")
            pairs = pairwise_welch([r for r in records if r.suite == suite], skip=pseudo_method, current=current)
            if not pairs.empty:
                out.append(f"<p class='note'>{esc(WELCH_NOTE)}</p>" + render_pairwise(pairs, "html"))
            agreement = rank_agreement(shown)
            if not agreement.empty:
                out.append("<p class='note'>Do the scenarios rank the methods alike? Spearman and Kendall "
                           "correlation of the method rankings by seed-mean final accuracy.</p>")
                out.append(render_agreement(agreement, "html"))
            # page=records: a kind may pair this suite's runs with another suite's (M2I's m2i with i2m)
            for title, section in report_sections([r for r in records if r.suite == suite], "html",
                                                  make_harness or (lambda: None), page=records, drawing=DRAWING):
                out.append(f"<p class='note'>{esc(title)}</p>{section}")
            scenarios = [sc for sc in dict.fromkeys(r.scenario for r in records if r.suite == suite)
                         if (split_scenario(sc) or ("", ""))[1] != "tune"]   # in the kind's section instead
            for scenario in scenarios:
                groups = by_case.get((suite, scenario))
                out.append(f"<h3>{esc(suite)}::{esc(scenario)}</h3>")
                if not groups:
                    out.append("<p class='bad'>no passed runs to plot.</p>")
                    continue
                out.append(drawer.draw(f"{suite}::{scenario}", dict(sorted(groups.items())), colors, figures))
        out = drawer.finish(out)
    out.append(_not_plotted([r for r in records if r.status != "passed"]))
    out.append("</body></html>")
    return "\n".join(out)


class _FigureDrawer:
    """Draws the scenarios' figures in this process, or (``workers`` > 1; None: one per CPU when
    there are at least two scenarios per process) in spawned worker processes started at once, so
    their start-up (importing matplotlib, about a second) overlaps the page's tables and sections.
    The PNG bytes are the same either way: Agg draws deterministically."""

    def __init__(self, scenarios: int, workers: int | None):
        import os
        workers = min(scenarios // 2, os.cpu_count() or 1) if workers is None else min(workers, scenarios)
        self.pool = None
        if workers > 1:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor
            # spawn, not fork: the report may run in a process that holds torch's threads (a pytest session)
            self.pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
            for _ in range(workers):
                self.pool.submit(_load_plots)

    def draw(self, name: str, groups: dict, colors: dict, figures=None):
        """The scenario's figures (HTML), or a future of them. A worker gets the page's colours and
        export folder as arguments: the parent's module state does not reach a spawned process."""
        if self.pool is None:
            return _scenario_figures(name, groups, colors)
        return self.pool.submit(_worker_figures, name, groups, colors, figures)

    def finish(self, parts: list) -> list[str]:
        """``parts`` with every future replaced by its figures, in place order."""
        return [part if isinstance(part, str) else part.result() for part in parts]

    def __enter__(self) -> "_FigureDrawer":
        return self

    def __exit__(self, *exc) -> None:
        # also when a section raised mid-page: no worker outlives the page, queued figures are dropped
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


def _load_plots() -> None:
    from . import plots  # noqa: F401  (a worker's start-up: matplotlib)


def _worker_figures(name: str, groups: dict, colors: dict, figures) -> str:
    from . import plots
    with plots.page_palette(colors), plots.export_figures(figures):
        return _scenario_figures(name, groups, colors)


def _scenario_figures(name: str, groups: dict[str, list[RunRecord]], colors) -> str:
    from . import plots
    pseudo = sorted(m for m, rs in groups.items() if any(pseudo_method(r) for r in rs))
    groups = {m: rs for m, rs in groups.items() if m not in pseudo}
    if not groups:   # CLDyB's search records: a protocol step, shown in the CLDyB section
        return (f"<p class='note'>{html.escape(', '.join(pseudo))}: protocol steps (the sequence search), "
                "not methods; their outcome is in the family's section.</p>")
    labels, values = plots.radar_table(groups)
    # Matrix figures only for methods that stored a matrix (a record may carry metrics alone).
    with_matrix = {m: rs for m, rs in groups.items() if any(r.acc_matrix for r in rs)}
    curves = {m: plots.mean_band(plots.step_accuracy(rs)) for m, rs in with_matrix.items()}
    matrices = {m: (plots.mean_matrix(rs), len(rs)) for m, rs in with_matrix.items()}

    def figure(fig, alt, note, tight=True):
        return f"<figure>{plots.to_img(fig, alt, tight)}<figcaption>{html.escape(note)}</figcaption></figure>"

    row = figure(plots.radar_figure(labels, values, colors), f"{name}: method radar",
                 _NOTES["radar"] + " " + training_time_note(groups))
    row += pareto_html(groups, colors, name, figure)
    if not with_matrix:   # a protocol that stores metrics only (STF's stream): nothing is wrong
        return (f"<div class='row'>{row}</div><p class='note'>these runs store metrics, not a per-task accuracy "
                "matrix (their protocol has no task sequence to score).</p>")
    seeds = {m: len(rs) for m, rs in with_matrix.items()}
    row = figure(plots.curve_figure(curves, colors, seeds), f"{name}: accuracy over tasks", _NOTES["curve"],
                 tight=False) + row
    out = (f"<div class='row'>{row}</div>"
           + figure(plots.heatmap_figure(matrices), f"{name}: accuracy matrices", _NOTES["heatmap"], tight=False))
    continual = {m: next(r.extra["continual"] for r in rs if "continual" in r.extra)
                 for m, rs in groups.items() if any("continual" in r.extra for r in rs)}
    if continual:
        out += figure(plots.continual_figure(continual), f"{name}: continual evaluation", _NOTES["continual"],
                      tight=False)
    return out


def pareto_html(groups: dict[str, list[RunRecord]], colors, name: str, figure) -> str:
    """Accuracy against training FLOPs with the Pareto front (reporting/budget.py), where at least two
    methods have counted FLOPs; the methods without a point are named in the caption."""
    from . import budget, plots
    pts = budget.points(r for rs in groups.values() for r in rs)
    if sum(p.placed for p in pts) < 2:
        return ""
    left = [f"{p.method} ({p.why_not_placed})" for p in pts if not p.placed]
    return figure(plots.pareto_figure(pts, colors), f"{name}: accuracy vs training FLOPs",
                  _NOTES["pareto"] + (f" Not placed: {'; '.join(left)}." if left else ""), tight=False)


def training_time_note(groups: dict[str, list[RunRecord]]) -> str:
    """Training time per method as mean ± sample sd over its n seeds: the radar draws the means only."""
    from . import plots
    parts = []
    for m, rs in groups.items():
        mean, sd, n = plots.cost_spread(rs, "train_seconds")
        if n:
            parts.append(f"{m} {mean:.3g}" + ("" if math.isnan(sd) else f" ± {sd:.2g}") + f" s (n={n})")
    return ("Training time, mean ± sd over seeds: " + "; ".join(parts) + ".") if parts else ""


def _not_plotted(records: Sequence[RunRecord]) -> str:
    head = f"<h2 id='not-plotted'>runs not plotted ({len(records)})</h2>"
    if not records:
        return head + "<p>every run passed.</p>"
    rows = "".join(
        f"<tr><td class='bad'>{html.escape(r.status)}</td><td>{html.escape(r.case_id)}</td>"
        f"<td>{'' if r.failed_task is None else r.failed_task}</td><td>{html.escape(r.message[:500])}</td></tr>"
        for r in records)
    return (head + "<p class='note'>failed, diverged, errored and not-applicable runs: counted in the "
            "scorecard's problems column, left out of every figure.</p>"
            "<table><tr><th>status</th><th>case</th><th>failed at task</th><th>message</th></tr>"
            + rows + "</table>")


def write_html(path: str | Path, records: Sequence[RunRecord], columns: Sequence[str] = COLUMNS,
               source: str = "", make_harness=None, workers: int | None = 1,
               figures: str | Path | None = None, current: dict | None = None, every: bool = False) -> Path:
    path = Path(path)
    text = build_html(records, columns, source, make_harness, workers, figures, current, every)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def write_figures(directory: str | Path, records: Sequence[RunRecord], columns: Sequence[str] = COLUMNS,
                  source: str = "", make_harness=None, workers: int | None = 1, current: dict | None = None,
                  every: bool = False) -> Path:
    """Every figure of the report in ``directory`` (``--clh-figures``, ``clharness report --figures``):
    matplotlib's as PNG, SVG and PDF, the hand-drawn SVG charts (GTEP slope, M2I and CLDyB bars) as SVG
    only; with the page that shows them all as ``directory/report.html``."""
    return write_html(Path(directory) / "report.html", records, columns, source, make_harness, workers, directory,
                      current, every)
