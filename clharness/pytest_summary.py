"""What a pytest session shows and leaves: each case's status line, the notes and the scorecard at the
end (with every family's own section), and the scorecard and figure files."""
from __future__ import annotations

from . import outcomes
from .results import RunRecord


def teststatus(report):
    """A case's status line: its final accuracy and training time, whether its record was reused."""
    if report.when != "call":
        return None
    record = next((RunRecord.from_json(v) for n, v in report.user_properties if n == outcomes.RECORD), None)
    if record is None:
        return None
    stored = ""
    if any(n == outcomes.REUSED for n, _ in report.user_properties):
        import datetime
        when = datetime.datetime.fromtimestamp(record.finished_at).strftime("%Y-%m-%d %H:%M") \
            if record.finished_at else "?"
        stored = f" (reused: stored {when}, key {record.key})"
    if record.status == "passed":
        acc = record.metrics.get("final_acc", float("nan"))
        return "passed", ".", (f"PASSED{stored} final_acc={acc:.3f} train={record.train_seconds:.1f}s",
                               {"green": True})
    if record.status == "not-applicable":
        return "skipped", "s", ("N/A", {"yellow": True})
    if hasattr(report, "wasxfail"):   # a divergence the protocol expects and counts
        return "xfailed", "x", ("DIVERGED (counted)", {"yellow": True})
    letter = "D" if record.status == "diverged" else "F"
    return "failed", letter, (record.status.upper(), {"red": True})


def terminal_summary(clh, terminalreporter, config) -> None:
    """The session's notes (each once), then the scorecard, ranking agreement and every family's section."""
    for message in clh.notes:
        terminalreporter.write_line(f"clharness: {message}", yellow=True)
    for line in clh.not_registered:
        terminalreporter.write_line(f"clharness: {line}", yellow=True)
    if clh.stale:
        terminalreporter.write_line(f"clharness: --clh-reuse-stale reused {len(clh.stale)} record(s) made by other "
                                    "code:", yellow=True)
        for line in clh.stale:
            terminalreporter.write_line(f"  {line}", yellow=True)
    records = clh.records
    if not records:
        return
    from .reporting.scorecard import default_columns, rank_agreement, render, render_agreement, summarize
    terminalreporter.section("clharness scorecard (mean ± 95% CI over seeds)")
    columns = default_columns(records)
    summary = summarize(records, columns)
    terminalreporter.write_line(render(summary, columns))
    agreement = rank_agreement(summary)
    if not agreement.empty:
        terminalreporter.write_line("\nRanking agreement between scenarios (methods ranked by seed mean):")
        terminalreporter.write_line(render_agreement(agreement))
    terminalreporter.write_line(f"clharness: {len(records)} runs, {clh.reused} reused from "
                                f"{config.getoption('clh_results')}, {len(records) - clh.reused} run now")
    for fam in _families():   # kinds with an end-of-session section (GTEP, CLDyB)
        fam.terminal_summary(clh, terminalreporter)
    path = config.getoption("clh_scorecard")
    if path and not hasattr(config, "workerinput"):
        terminalreporter.write_line(f"scorecard written to {path}")


def write_files(clh, config) -> None:
    """--clh-scorecard and --clh-figures, on the controller (interrupted or not: every finished record)."""
    if hasattr(config, "workerinput"):
        return
    records = clh.records
    path = config.getoption("clh_scorecard")
    if path:
        from .reporting.scorecard import write
        write(path, records)
        for fam in _families():
            fam.write_scorecard(path, records, clh.harness)
    figures = config.getoption("clh_figures")
    if figures and records:
        from .reporting.report import write_figures
        from .reporting.scorecard import default_columns
        write_figures(figures, records, default_columns(records), make_harness=lambda: clh.harness)


def _families():
    from .kinds import families
    return families()
