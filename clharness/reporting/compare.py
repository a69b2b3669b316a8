"""`clharness compare A B`: two scorecards side by side, and a regression verdict.

A and B are each a scorecard JSON (``--clh-scorecard x.json``) or a results store (SQLite). Rows
are matched on (suite, scenario, method); for every metric given with ``--max-drop METRIC=DROP``
(default ``final_acc=0.02``) B may be worse than A by at most DROP, where "worse" follows the metric
(lower is better for forgetting, AFM, seconds, megabytes).

The verdict uses the spread over seeds the scorecard stores, not the means alone: each row holds
the seed mean, the half-width ``<metric>_ci`` of its 95% Student-t interval and ``seeds`` (n), so
the sample sd is ``ci * sqrt(n) / t_{0.975, n-1}``. A row regresses when a one-sided Welch t-test
rejects, at level ``alpha`` (default 0.05), H0: ``worse <= DROP`` in favour of H1: ``worse > DROP``
(``worse = mean_A - mean_B`` for higher-is-better metrics, ``mean_B - mean_A`` otherwise). A drop
beyond DROP that the seeds do not make significant is a note, not a regression. Where a side has a
single seed (no spread) the means alone decide, with a note; ``means_only`` decides every row so.

Strict about what it compares: a suite, scenario, method or judged metric on one side only is a
mismatch (exit 1, named with a difflib did-you-mean), and a ``--max-drop`` metric that neither
scorecard carries is unusable input (exit 2). Like pytest-benchmark's ``compare --fail``: exit 1 on
a regression or a mismatch, 0 otherwise, 2 on unusable input.
"""
from __future__ import annotations

import difflib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from tabulate import tabulate

from .gates import COST_FIELDS, higher_is_better
from .report import ReportError, load_records
from ..results import configuration_differences
from .scorecard import COLUMNS, HEADERS, summarize

KEY = ("suite", "scenario", "method")
CONFIDENCE = 0.95   # the level of the ``<metric>_ci`` half-widths a scorecard stores (scorecard.summarize)
ALPHA = 0.05        # the level of the one-sided Welch test
# a row's configuration (scorecard.summarize): what it is, not a metric
CONFIG_COLUMNS = ("configuration", "config_id", "main", "budget", "code_digest", "hparams")
_NOT_METRICS = {*KEY, "seeds", "failed", "diverged", "error", "not-applicable", *CONFIG_COLUMNS}


@dataclass
class Comparison:
    rows: list[list]                                     # the side-by-side table
    headers: list[str]
    regressions: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)   # on one side only: fatal (exit 1)
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return bool(self.regressions or self.mismatches)

    def render(self, fmt: str = "github") -> str:
        lines = [tabulate(self.rows, headers=self.headers, tablefmt=fmt, disable_numparse=True)]
        lines += [f"note: {n}" for n in self.notes]
        lines += [f"MISMATCH {m}" for m in self.mismatches]
        lines += [f"REGRESSION {r}" for r in self.regressions]
        verdict = [f"{len(self.regressions)} regression(s)" if self.regressions else "no regression"]
        if self.mismatches:
            verdict.append(f"{len(self.mismatches)} mismatch(es)")
        lines.append(", ".join(verdict))
        return "\n".join(lines)


def load_summary(path: str | Path, columns=COLUMNS) -> dict[tuple[str, str, str], dict]:
    """(suite, scenario, method) -> summary row (metric means, ``<metric>_ci``, seeds)."""
    path = Path(path)
    if not path.exists():
        raise ReportError(f"{path} does not exist")
    if path.suffix == ".json":
        try:
            rows = json.loads(path.read_text())["summary"]
            return {tuple(r[k] for k in KEY): r for r in rows if r.get("main", True)}
        except (ValueError, KeyError, TypeError) as exc:
            raise ReportError(f"{path} is not a clharness scorecard JSON ({type(exc).__name__}: {exc}); "
                              "write one with --clh-scorecard FILE.json") from None
    records = load_records(path)   # checks that it is a results store
    metrics = sorted({*columns, *(k for r in records for k in r.metrics)})
    return {tuple(r[k] for k in KEY): r.to_dict() for _, r in summarize(records, metrics).iterrows() if r["main"]}


def scorecard_metrics(rows: Iterable[dict]) -> set[str]:
    """The metrics that at least one summary row carries a value for (not its keys, ``*_ci`` or counts)."""
    return {k for row in rows for k in row
            if k not in _NOT_METRICS and not k.endswith("_ci") and _value(row, k) is not None}


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``candidates`` (difflib), else ''."""
    close = difflib.get_close_matches(name, sorted(set(candidates)), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def parse_drops(items: list[str], known: Iterable[str] | None = None) -> dict[str, float]:
    """``METRIC=VALUE`` items (default ``final_acc=0.02``) -> {metric: allowed drop}. With ``known``
    (the metrics the scorecards carry: :func:`scorecard_metrics`) every metric must be one of them:
    a misspelled or absent metric raises ReportError (a ValueError) with a did-you-mean, instead of
    judging nothing. A negative or non-finite drop is refused too."""
    drops = {}
    for item in items or ["final_acc=0.02"]:
        metric, _, value = item.partition("=")
        metric = metric.strip()
        try:
            drops[metric] = float(value)
        except ValueError:
            raise ReportError(f"max drop {item!r}: write METRIC=VALUE, e.g. final_acc=0.02") from None
        if not metric or not math.isfinite(drops[metric]) or drops[metric] < 0:
            raise ReportError(f"max drop {item!r}: write METRIC=VALUE with a finite VALUE >= 0, e.g. final_acc=0.02")
    if known is not None:
        known = set(known)
        for metric in drops:
            if metric not in known:
                from ..metrics import METRIC_INFO
                raise ReportError(f"max drop metric {metric!r} is not in the scorecard(s)"
                                  f"{did_you_mean(metric, known | set(METRIC_INFO) | set(COST_FIELDS))}; "
                                  f"they carry: {', '.join(sorted(known)) or '(no metric)'}")
    return drops


def spread(row: dict, metric: str, confidence: float = CONFIDENCE) -> tuple[float, float | None, int]:
    """(mean, sample sd, n) of ``metric`` over a row's seeds, the sd recovered from the stored CI
    half-width ``ci = t_{(1+c)/2, n-1} * sd / sqrt(n)``; sd is None when n < 2 or no CI is stored."""
    from scipy import stats
    mean, ci = _value(row, metric), _value(row, f"{metric}_ci")
    n = int(row.get("seeds") or 0)
    if n < 2 or ci is None:
        return mean, None, n
    return mean, ci * math.sqrt(n) / float(stats.t.ppf((1 + confidence) / 2, n - 1)), n


def welch_drop_p(a: tuple[float, float, int], b: tuple[float, float, int], drop: float, sign: int = 1) -> float:
    """p-value of the one-sided Welch t-test of H0: ``sign*(mu_A - mu_B) <= drop`` against H1:
    ``> drop`` from summary statistics (mean, sd, n) of each side (Welch-Satterthwaite df). Zero
    spread on both sides: 0.0 if the observed drop exceeds ``drop``, else 1.0."""
    from scipy import stats
    (ma, sa, na), (mb, sb, nb) = a, b
    va, vb = sa * sa / na, sb * sb / nb
    worse = sign * (ma - mb)
    if va + vb == 0:
        return 0.0 if worse > drop + 1e-12 else 1.0
    t = (worse - drop) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va * va / (na - 1) + vb * vb / (nb - 1))
    return float(stats.t.sf(t, df))


def compare(a: dict, b: dict, drops: dict[str, float], columns=COLUMNS, alpha: float = ALPHA,
            means_only: bool = False) -> Comparison:
    """Side by side on ``columns`` plus the drop-checked metrics; mismatches and regressions per
    ``drops`` (module docstring). Raises ReportError for a drop metric that neither side carries."""
    if not 0 < alpha < 1:
        raise ReportError(f"alpha {alpha} must be in (0, 1)")
    known = scorecard_metrics([*a.values(), *b.values()])
    parse_drops([f"{m}={v}" for m, v in drops.items()], known)   # every judged metric exists somewhere
    metrics = list(dict.fromkeys([*drops, *columns]))
    headers = ["scenario", "method", *(f"{HEADERS.get(m, m)} A → B" for m in metrics)]
    out = Comparison([], headers)
    out.mismatches += _mismatched_rows(a, b)
    for m in drops:
        for side, rows in (("A", a), ("B", b)):
            carried = scorecard_metrics(rows.values())
            if m not in carried:
                out.mismatches.append(f"metric {m!r} is not in {side}{did_you_mean(m, carried)}")
    for key in [k for k in a if k in b]:
        ra, rb = a[key], b[key]
        cells = [f"{key[0]}::{key[1]}", key[2]]
        where = f"{key[1]}/{key[2]}"
        differs, code = configuration_mismatch(ra, rb)
        out.mismatches += [f"{where}: configuration differs, {d} (A vs B)" for d in differs]
        if code:
            out.notes.append(f"{where}: {code} (A vs B): the code compared")
        for m in metrics:
            va, vb = _value(ra, m), _value(rb, m)
            cells.append(_cell(va, vb, m))
            if m not in drops:
                continue
            if va is None and vb is None:
                out.notes.append(f"{where}: {m} missing on both sides (no passed seed): not judged")
                continue
            if va is None or vb is None:
                side, row = ("A", ra) if va is None else ("B", rb)
                out.mismatches.append(f"{where}: {m} missing on the {side} side ({row.get('seeds', 0)} passed seeds)")
                continue
            sign = 1 if higher_is_better(m) else -1
            worse = sign * (va - vb)
            sa, sb = spread(ra, m), spread(rb, m)
            numbers = (f"{m} {va:.4f} -> {vb:.4f}, worse by {worse:.4f} > allowed drop {drops[m]}")
            if means_only or sa[1] is None or sb[1] is None:
                if not means_only and worse > drops[m] + 1e-12:
                    out.notes.append(f"{where}: {m} has no spread on the {'A' if sa[1] is None else 'B'} side "
                                     f"(n = {sa[2] if sa[1] is None else sb[2]}): judged on the means alone")
                if worse > drops[m] + 1e-12:
                    out.regressions.append(f"{where}: {numbers} (means)")
                continue
            p = welch_drop_p(sa, sb, drops[m], sign)
            test = (f"one-sided Welch t-test p = {p:.3g} {'<' if p < alpha else '>='} {alpha} "
                    f"(A sd {sa[1]:.4f} n={sa[2]}, B sd {sb[1]:.4f} n={sb[2]})")
            if p < alpha:
                out.regressions.append(f"{where}: {numbers}; {test}")
            elif worse > drops[m] + 1e-12:
                out.notes.append(f"{where}: {numbers} but not significant over the seeds; {test}")
        out.rows.append(cells)
    return out


def configuration_mismatch(ra: dict, rb: dict) -> tuple[list[str], str]:
    """(differences that make two rows incomparable, the code-digest difference or ""): a budget or a
    hyperparameter that differs is a mismatch ("budget: quick vs full", "hparams lr: 0.1 vs 0.01"); other
    code is what a comparison compares, so it is only said. Rows of scorecards written before rows
    carried their configuration have none to compare."""
    def fields(row):
        hparams = row.get("hparams")
        if isinstance(hparams, str):
            try:
                hparams = json.loads(hparams)
            except ValueError:
                hparams = {"(unreadable)": hparams}
        return {"budget": row.get("budget") or "", "code_digest": row.get("code_digest") or "",
                "hparams": hparams or {}}
    if "budget" not in ra or "budget" not in rb:
        return [], ""
    fa, fb = fields(ra), fields(rb)
    if not fa["budget"] or not fb["budget"]:   # a record kept before budgets were: unknown, not different
        fa["budget"] = fb["budget"] = ""
    found = configuration_differences(fa, fb)
    return ([d for d in found if not d.startswith("code digest")],
            next((d for d in found if d.startswith("code digest")), ""))


def _mismatched_rows(a: dict, b: dict) -> list[str]:
    """Suites, then scenarios of shared suites, then methods of shared scenarios, on one side only."""
    out = []

    def one_side(what, where, names_a, names_b):
        for side, mine, other in (("A", names_a, names_b), ("B", names_b, names_a)):
            for name in sorted(mine - other):
                out.append(f"{what} {name!r}{where} is in {side} only{did_you_mean(name, other - mine)}")

    suites_a, suites_b = {k[0] for k in a}, {k[0] for k in b}
    one_side("suite", "", suites_a, suites_b)
    for suite in sorted(suites_a & suites_b):
        sc_a = {k[1] for k in a if k[0] == suite}
        sc_b = {k[1] for k in b if k[0] == suite}
        one_side("scenario", f" of suite {suite}", sc_a, sc_b)
        for scenario in sorted(sc_a & sc_b):
            ma = {k[2] for k in a if k[:2] == (suite, scenario)}
            mb = {k[2] for k in b if k[:2] == (suite, scenario)}
            one_side("method", f" in {suite}::{scenario}", ma, mb)
    return out


def _value(row: dict, metric: str) -> float | None:
    v = row.get(metric)
    if v is None or isinstance(v, (str, bool)):
        return None
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def _cell(va, vb, metric) -> str:
    if va is None and vb is None:
        return "-"
    fa, fb = ("-" if v is None else f"{v:.3f}" for v in (va, vb))
    if va is None or vb is None:
        return f"{fa} → {fb}"
    delta = vb - va
    if abs(delta) < 5e-4:
        return f"{fa} → {fb} (=)"
    better = delta > 0 if higher_is_better(metric) else delta < 0
    return f"{fa} → {fb} ({delta:+.3f} {'▲' if better else '▼'})"
