"""The CLDyB sections of the report (issue 19 part 1), per searched scenario:

* one row per method: final AA on the CC sequence with AR and ALA, robustness (mean final AA over
  the method's IC sequences, sec. 5.1), memory, final AA on the random-order and held-out sequences
  (table 1's columns), with CC minus random and the rank correlations with the held-out benchmark;
* beside it, fig. 7-style grouped bars: per method, final AA on the CC, random and held-out
  sequences with their 95% CIs (the lower CC is below random, the harder the searched sequence);
* the radar of fig. 4: final AA, AR, ALA on the CC sequence, robustness and memory efficiency;
* the chosen sequence itself: task by task, its classes with their source datasets (the search
  records' class order, cut into tasks by the replayed sequence's task count).

The numbers are kind.summary_rows'; this module lays them out. Text formats get the table, the
comparison lines and the CC sequence (``text_sections``).
"""
from __future__ import annotations

import html
import math
from collections import Counter, defaultdict
from pathlib import Path
from typing import Iterable, Sequence

from ...results import RunRecord
from . import summary as kind   # summary_rows and SEARCH_METHOD (kind imports this module)

TITLE = "CLDyB: CC vs random vs held-out sequences, robustness, method radar (fig. 4), the searched sequence"
TEXT_TITLE = ("CLDyB (mean ± half-width of the 95% Student-t CI over the n seeds; AR = -AFM; "
              "robustness = mean final AA on IC sequences)")
INTERVAL_NOTE = ("Intervals: mean ± half-width of the 95% Student-t confidence interval over the {n} of each "
                 "method and sequence, t_{{0.975, n−1}} · s / √n (t = 4.303 at n = 3, not the normal 1.96; "
                 "no interval at n = 1)")
SERIES = (("cc", "CC sequence", "#c44e52"), ("random", "random order", "#8c8c8c"), ("heldout", "held-out", "#4c72b0"))
COLUMNS = (("cc_aa", "CC AA"), ("cc_ar", "CC AR"), ("cc_ala", "CC ALA"), ("robustness", "robustness (IC AA)"),
           ("memory_mb", "memory MB"), ("random_aa", "random AA"), ("heldout_aa", "held-out AA"))
BARS_NOTE = ("Final average accuracy (per-task mean of the last row of R) on the commonly challenging (CC) "
             "sequence the search found, on a random-order sequence from the same pool, and on the held-out "
             "random-order benchmark; mean and 95% Student-t CI over seeds (CLDyB fig. 7, table 1). A lower CC bar than "
             "random means the search found a harder sequence.")
RADAR_NOTE = ("CLDyB fig. 4: final AA, AR and ALA on the CC sequence, robustness (mean final AA over the "
              "method's individually challenging sequences; axis shown when IC sequences were searched) and "
              "memory efficiency; further out is better. AR = -AFM is drawn as 1 + AR (0-1); memory (MB, "
              "appendix B.4) is min-max normalised across the methods and inverted: the smallest on the rim.")


def html_sections(records: Sequence[RunRecord], drawing) -> list[tuple[str, str]]:
    text = section(records, drawing)
    return [(TITLE, text)] if text else []


def scenarios(records: Iterable[RunRecord]) -> dict[tuple[str, str], list[dict]]:
    """kind.summary_rows grouped by (suite, searched scenario); search records left out."""
    out = defaultdict(list)
    for row in kind.summary_rows([r for r in records if r.method != kind.SEARCH_METHOD]):
        out[(row["suite"], row["scenario"])].append(row)
    return dict(out)


def section(records: Sequence[RunRecord], drawing) -> str | None:
    """The CLDyB HTML of ``records``, or None when they hold no searched-sequence evaluation; drawn with
    ``drawing`` (the page's clharness.kinds.Drawing)."""
    records = list(records)
    groups = scenarios(records)
    if not groups:
        return None
    colors = drawing.method_colors(sorted({row["method"] for rows in groups.values() for row in rows}))
    out = []
    for (suite, base), rows in groups.items():
        name = f"{suite}::{base}"
        out.append(f"<h3>{_e(name)} (CLDyB)</h3>")
        lines = comparison_lines(rows)
        if lines:
            out.append("<p class='note'>" + "<br>".join(_e(line) for line in lines) + "</p>")
        out.append(f"<p class='note'>{_e(BARS_NOTE)} {_e(interval_note(records, suite, base))}.</p>")
        out.append("<div class='row'>" + _table(["method", *[h for _, h in COLUMNS]], table_rows(rows))
                   + f"<figure class='cldyb-bars' style='flex:0 1 auto'>{use_case_bars(name, rows, drawing)}</figure></div>")
        out.append(f"<div class='row'>{radar(name, rows, colors, drawing)}<div>{sequences_html(records, suite, base)}</div></div>")
    return "\n".join(out)


def text_sections(records: Sequence[RunRecord], fmt: str) -> list[tuple[str, str]]:
    from tabulate import tabulate
    out = []
    for (suite, base), rows in scenarios(records).items():
        text = tabulate(table_rows(rows), headers=["method", *[h for _, h in COLUMNS]], tablefmt=fmt,
                        disable_numparse=True)
        text += "".join(f"\n{line}" for line in comparison_lines(rows))
        text += f"\n({interval_note(records, suite, base)})"
        seqs = chosen_sequences(records, suite, base, "cc")
        if seqs:
            seed, tasks = seqs[0]
            text += f"\n\nCC sequence found by the search (seed {seed}):\n" + tabulate(
                [[t, sources_text(classes), ", ".join(classes)] for t, classes in enumerate(tasks)],
                headers=["task", "source datasets", "classes"], tablefmt=fmt, disable_numparse=True)
        out.append((f"{TEXT_TITLE}: {suite}::{base}", text))
    return out


def seed_counts(records: Sequence[RunRecord], suite: str, base: str) -> Counter:
    """(method, use case) -> its passed seeds: the n of each interval of the scenario's table and bars."""
    out = Counter()
    for r in records:
        scenario, _, use_case = r.scenario.rpartition("/")
        if (r.suite, scenario) == (suite, base) and use_case in kind.USE_CASES and r.status == "passed" \
                and r.method != kind.SEARCH_METHOD:
            out[(r.method, use_case)] += 1
    return out


def interval_note(records: Sequence[RunRecord], suite: str, base: str) -> str:
    """INTERVAL_NOTE with the scenario's n: "n = 3 seeds", or their range where methods or sequences differ."""
    ns = sorted(set(seed_counts(records, suite, base).values()))
    n = "n = ?" if not ns else f"n = {ns[0]} seed{'s' * (ns[0] != 1)}" if len(ns) == 1 else f"n = {ns[0]}–{ns[-1]} seeds"
    return INTERVAL_NOTE.format(n=n)


def table_rows(rows: Sequence[dict]) -> list[list[str]]:
    return [[row["method"], *[_cell(row.get(key)) for key, _ in COLUMNS]] for row in rows]


def comparison_lines(rows: Sequence[dict]) -> list[str]:
    """CC minus random (mean over methods) and the rank correlations of CC and random with held-out
    (table 1's Spearman and Kendall rows), as the session summary prints them."""
    from ...metrics import rank_correlation
    lines = []
    both = [r for r in rows if "cc_aa" in r and "random_aa" in r]
    if both:
        gap = sum(r["cc_aa"][0] - r["random_aa"][0] for r in both) / len(both)
        lines.append(f"CC minus random final AA, mean over {len(both)} methods: {gap:+.3f}")
    for name in ("cc", "random"):
        pair = [r for r in rows if f"{name}_aa" in r and "heldout_aa" in r]
        if len(pair) >= 2:
            rc = rank_correlation([r[f"{name}_aa"][0] for r in pair], [r["heldout_aa"][0] for r in pair])
            lines.append(f"rank correlation {name} vs held-out over {len(pair)} methods: Spearman "
                         f"{rc['spearman']:.3f} (p={rc['spearman_p']:.3g}), Kendall {rc['kendall']:.3f} "
                         f"(p={rc['kendall_p']:.3g})")
    return lines


def use_case_bars(name: str, rows: Sequence[dict], drawing) -> str:
    """Per method, a bar for each use case any method was evaluated on (CC, random, held-out)."""
    Bar = drawing.Bar   # noqa: N806
    present = [s for s in SERIES if any(f"{s[0]}_aa" in r for r in rows)]
    groups = [(r["method"], [Bar(*r.get(f"{key}_aa", (math.nan, math.nan)), color, key, {"method": r["method"]})
                             for key, _, color in present]) for r in rows]
    return drawing.bar_chart(groups, f"{name}: final AA by sequence", "final AA",
                     legend=[(label, color) for _, label, color in present])


def radar_table(rows: Sequence[dict]) -> tuple[list[str], dict[str, list[float]]]:
    """Fig. 4's axes per method, each in [0, 1] with better further out (see RADAR_NOTE)."""
    def mean(row, key):
        value = row.get(key, (math.nan, math.nan))
        return value[0] if isinstance(value, tuple) else value
    axes = [("final AA (CC)", {r["method"]: mean(r, "cc_aa") for r in rows}),
            ("AR (CC)\n(1 + AR)", {r["method"]: min(1.0, max(0.0, 1 + mean(r, "cc_ar"))) for r in rows}),
            ("ALA (CC)", {r["method"]: mean(r, "cc_ala") for r in rows})]
    if any(not math.isnan(mean(r, "robustness")) for r in rows):
        axes.append(("robustness\n(IC AA)", {r["method"]: mean(r, "robustness") for r in rows}))
    memory = {r["method"]: r["memory_mb"] for r in rows}
    finite = [v for v in memory.values() if not math.isnan(v)]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 0.0)
    axes.append((f"memory efficiency\n({lo:.3g}–{hi:.3g} MB)",
                 {m: math.nan if math.isnan(v) else 1.0 if hi == lo else (hi - v) / (hi - lo) for m, v in memory.items()}))
    # a method without a value sits at the centre rather than being dropped
    values = {r["method"]: [0.0 if math.isnan(a[1][r["method"]]) else float(a[1][r["method"]]) for a in axes]
              for r in rows}
    return [a[0] for a in axes], values


def radar(name: str, rows: Sequence[dict], colors, drawing) -> str:
    labels, values = radar_table(rows)
    fig = drawing.radar_figure(labels, values, colors)
    return (f"<figure class='cldyb-radar' style='flex:0 1 auto'>{drawing.to_img(fig, f'{name}: CLDyB radar (fig. 4)')}"
            f"<figcaption>{_e(RADAR_NOTE)}</figcaption></figure>")


# ---------------------------------------------------------------------------------- the sequence
def chosen_sequences(records: Sequence[RunRecord], suite: str, base: str, job: str = "cc"
                     ) -> list[tuple[int, list[list[str]]]]:
    """[(seed, tasks)] of the sequences the ``job`` searches (cc, ic-<method>, random, heldout)
    found, by seed: each task its classes ("dataset/class") in learning order. The search record
    holds the classes in order; the task boundaries come from a replay of the same sequence (its
    accuracy matrix has a row per task) or else from the sequence file the search wrote."""
    use_case = job.split("-", 1)[0]
    searches = sorted((r for r in records if r.method == kind.SEARCH_METHOD and r.status == "passed"
                       and (r.suite, r.scenario) == (suite, f"{base}/{job}") and r.class_order),
                      key=lambda r: r.seed)
    out = []
    for search in searches:
        tasks = _replay_tasks(records, suite, f"{base}/{use_case}", search)
        out.append((search.seed, tasks if tasks is not None else _file_tasks(search) or [list(search.class_order)]))
    return out


def _replay_tasks(records, suite, scenario, search) -> list[list[str]] | None:
    for r in records:
        if ((r.suite, r.scenario, r.seed) == (suite, scenario, search.seed) and r.method != kind.SEARCH_METHOD
                and r.acc_matrix and r.class_order == search.class_order and len(r.class_order) % len(r.acc_matrix) == 0):
            k = len(r.class_order) // len(r.acc_matrix)
            return [list(r.class_order[t:t + k]) for t in range(0, len(r.class_order), k)]
    return None


def _file_tasks(search) -> list[list[str]] | None:
    from . import sequence as seqmod
    path = Path(search.message)
    try:
        seq = seqmod.load(path) if search.message and path.is_file() else None
    except seqmod.SequenceError:
        return None
    if seq is None or seq.get("search_key") != search.key:   # a later search overwrote the file
        return None
    tasks = seqmod.task_names(seq)
    return tasks if [c for t in tasks for c in t] == list(search.class_order) else None


def sources_text(classes: Sequence[str]) -> str:
    """'digits ×2, synthetic-near ×3': each source dataset of a task and its number of classes."""
    return ", ".join(f"{d} ×{n}" for d, n in Counter(c.split("/", 1)[0] for c in classes).items())


CLASS_LIST_STYLE = "margin:0;padding:0;list-style:none;display:flex;flex-wrap:wrap;gap:0 10px"   # in order, inline


def sequence_table(tasks: Sequence[Sequence[str]]) -> str:
    rows = []
    for t, classes in enumerate(tasks):
        names = "".join(f"<li data-dataset='{_e(c.split('/', 1)[0])}'>{_e(c)}</li>" for c in classes)
        rows.append(f"<tr><td>{t}</td><td>{_e(sources_text(classes))}</td><td><ol class='classes' style='{CLASS_LIST_STYLE}'>{names}</ol></td></tr>")
    return ("<table class='cldyb-sequence'><tr><th>task</th><th>source datasets</th><th>classes "
            "(dataset/class)</th></tr>" + "".join(rows) + "</table>")


def sequences_html(records: Sequence[RunRecord], suite: str, base: str) -> str:
    """The CC sequence of the lowest seed in the open; other seeds and the IC sequences collapsed."""
    jobs = sorted({r.scenario.rpartition("/")[2] for r in records if r.method == kind.SEARCH_METHOD
                   and r.suite == suite and r.scenario.rpartition("/")[0] == base})
    cc = chosen_sequences(records, suite, base, "cc")
    out = []
    if cc:
        seed, tasks = cc[0]
        out.append(f"<p class='note'>The commonly challenging (CC) sequence the search chose (seed {seed}), "
                   f"task by task: {len(tasks)} tasks.</p>" + sequence_table(tasks))
    else:
        out.append("<p class='note'>no passed CC search record in the store: the searched sequence cannot be shown.</p>")
    more = [(job, seed, tasks) for job in jobs if job.startswith("ic-") or job == "cc"
            for seed, tasks in chosen_sequences(records, suite, base, job)][1 if cc else 0:]
    if more:
        out.append(f"<details><summary>other searched sequences ({len(more)}: other seeds, individually "
                   f"challenging ones)</summary>" + "".join(
                       f"<p class='note'>{_e(job)}, seed {seed}</p>{sequence_table(tasks)}" for job, seed, tasks in more)
                   + "</details>")
    return "".join(out)


def _cell(value) -> str:
    v = value[0] if isinstance(value, tuple) else value
    if v is None or math.isnan(v):
        return "-"
    return f"{value[0]:.3f} ± {value[1]:.3f}" if isinstance(value, tuple) else f"{value:.3g}"


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    return ("<table class='cldyb-summary'><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows) + "</table>")


def _e(text) -> str:
    return html.escape(str(text), quote=True)
