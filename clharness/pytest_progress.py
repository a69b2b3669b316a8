"""Progress inside long runs, on pytest's terminal (the pytest front end's; issue 19 part 2).

One GTEP or CLDyB case on real data trains for hours between two pytest status letters, so:

- while a case runs, a terminal shows one updating line under the test line:
  ``<case>  task i/T  elapsed 1:02:03  ETA 0:41:10``, the ETA from the mean time of the tasks done;
- a non-terminal (a CI log, which nobody watches live) gets one line per case instead, its result:
  ``clharness: <case>  passed  final acc 0.875  train 1.2 s`` (``reused`` for a stored record);
- the controller of a pytest-xdist or Ray session, which does not run cases itself, shows runs
  done/total and a session ETA from the mean time of the runs done (on a terminal an updating line;
  in a log the same count ends each case's result line);
- nothing under ``-q`` (and nothing on an xdist worker, whose output nobody sees).

The runner reports tasks through its ``on_task(task, T)`` callback; it has no epoch callback, so
the line shows tasks only.
"""
from __future__ import annotations

import contextlib
import time
from typing import Callable

import pytest

ERASE = "\r\x1b[K"   # back to the start of the line and clear it


def clock(seconds: float) -> str:
    """``h:mm:ss`` (``m:ss`` under an hour)."""
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def eta(elapsed: float, done: int, total: int) -> float | None:
    """Seconds left if the rest goes at the mean pace of the ``done`` units; None before the first."""
    return elapsed / done * (total - done) if done > 0 else None


def progress_text(label: str, unit: str, done: int, total: int, elapsed: float) -> str:
    left = eta(elapsed, done, total)
    return (f"{label}  {unit} {done}/{total}  elapsed {clock(elapsed)}"
            f"  ETA {'-' if left is None else clock(left)}")


class Line:
    """Shows progress on the terminal reporter: an updating line below the current one on a
    terminal (the test line is left as it was when the case ends), plain lines otherwise."""

    def __init__(self, reporter, now: Callable[[], float] = time.monotonic, capture=None):
        self.reporter, self.now = reporter, now
        self.capture = capture   # pytest's capture manager: a case writes while output is captured
        self.tty = bool(getattr(reporter, "isatty", False))
        self.shown = False
        self.column = 0

    def _uncaptured(self):
        return self.capture.global_and_fixture_disabled() if self.capture is not None else contextlib.nullcontext()

    def show(self, text: str, final: bool = False) -> None:
        """On a terminal: (re)draw ``text``; elsewhere: one line per call when ``final``."""
        with self._uncaptured():
            self._show(text, final)

    def _show(self, text: str, final: bool) -> None:
        tw = self.reporter._tw
        if not self.tty:
            if final:   # after the status letters, a line of its own (no blank line: pytest's own
                if tw.width_of_current_line:   # write_line would end its file's line with one)
                    tw.line()
                tw.line(f"clharness: {text}")
            return
        if not self.shown:
            self.column = tw.width_of_current_line   # where the test line stood, to return to
            tw.write("\n")
            self.shown = True
        tw.write(ERASE + text[: max(tw.fullwidth - 1, 20)], flush=True)

    def clear(self) -> None:
        """Erase the progress line and put the cursor back at the end of the test line."""
        if self.tty and self.shown:
            tw = self.reporter._tw
            with self._uncaptured():
                tw.write(ERASE + "\x1b[1A" + (f"\x1b[{self.column}C" if self.column else ""), flush=True)
            tw._current_line = " " * self.column   # pytest's idea of the line it is writing on
            self.shown = False


class CaseProgress:
    """The runner's ``on_task(done, total, unit)`` for one case (``unit``: "task", or STF's "instances"),
    and ``step(iteration, expected)`` inside a task: on a terminal the line shows the task's iterations,
    their rate and the task's ETA (redrawn at most twice a second); a log gets only the task lines."""

    def __init__(self, line: "Line", label: str, now: Callable[[], float]):
        self.line, self.label, self.now = line, label, now
        self.start = self.task_start = now()
        self.last_draw = 0.0
        self.head = ""

    def __call__(self, done: int, total: int, unit: str = "task") -> None:
        self.head = progress_text(self.label, unit, done + 1, total, self.now() - self.start)
        self.task_start = self.now()
        if self.line.tty:   # a log gets the case's result line instead (ProgressPlugin.result_line)
            self.line.show(self.head)

    def step(self, iteration: int, expected: int) -> None:
        now = self.now()
        if not self.line.tty or now - self.last_draw < 0.5:
            return
        self.last_draw = now
        spent = now - self.task_start
        rate = iteration / spent if spent > 0 else 0.0
        left = (expected - iteration) / rate if rate and expected > iteration else None
        self.line.show(f"{self.head or self.label}  iter {iteration}/{expected}  {rate:.1f} it/s"
                       f"  task ETA {'-' if left is None else clock(left)}")


def result_text(nodeid: str, outcome: str, properties) -> str | None:
    """A case's one line in a log: its outcome and, from its record, final accuracy and training time;
    None for an item that is not a clharness unit."""
    from . import outcomes
    props = dict(properties or ())
    if not any(key.startswith(("clharness_", "clh_")) for key in props):
        return None
    parts = [nodeid, outcome + (" (reused)" if outcomes.REUSED in props or outcomes.REUSED_STALE in props else "")]
    if outcomes.RECORD in props:
        import json
        record = json.loads(props[outcomes.RECORD])
        matrix = [row for row in record.get("acc_matrix") or [] if row]
        if matrix and matrix[-1]:
            final = [v for v in matrix[-1] if v is not None]
            if final and len(final) == len(matrix[-1]):
                parts.append(f"final acc {sum(final) / len(final):.3f}")
        if record.get("status") not in (None, "passed"):
            parts.append(record["status"])
        parts.append(f"train {record.get('train_seconds', 0.0):.1f} s")
    return "  ".join(parts)


class ProgressPlugin:
    """Registered by clharness.pytest_plugin; ``case_callback(case)`` gives run_case its on_task."""

    def __init__(self, config: pytest.Config, now: Callable[[], float] = time.monotonic,
                 remote: Callable[[], bool] = lambda: False):
        self.config, self.now, self.remote = config, now, remote
        self.total = 0
        self.done = 0
        self.start = now()
        self.active: Line | None = None   # the line on screen, erased before pytest writes again
        self.result: str | None = None    # the finished case's result line, written after its status

    def _line(self) -> Line | None:
        if self.config.get_verbosity() < 0 or hasattr(self.config, "workerinput"):
            return None
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        capture = self.config.pluginmanager.get_plugin("capturemanager")
        return Line(reporter, self.now, capture) if reporter is not None else None

    def case_callback(self, label: str) -> "CaseProgress | None":
        """``on_task(done, total, unit)`` (with ``.step`` for iterations) for one case run in this process,
        or None when quiet."""
        line = self._line()
        if line is None:
            return None
        self.active = line
        return CaseProgress(line, label, self.now)

    # --- session progress on the controller of an xdist or Ray session
    def _controller(self) -> bool:
        xdist = bool(self.config.getoption("numprocesses", None)) and not hasattr(self.config, "workerinput")
        return xdist or self.remote()

    def pytest_collection_finish(self, session) -> None:
        self.total = self.total or len(session.items)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids) -> None:
        self.total = self.total or len(ids)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logstart(self, nodeid, location) -> None:
        self.pytest_runtest_logreport(None)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report) -> None:
        """Before pytest writes the status: the progress line goes, the test line is as it was. A case's
        result (its call, or a setup that failed) is kept for its line in a log."""
        if self.active is not None:
            self.active.clear()
            self.active = None
        if report is not None and (report.when == "call" or (report.when == "setup" and not report.passed)):
            self.result = result_text(report.nodeid, report.outcome, report.user_properties)

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logfinish(self, nodeid, location) -> None:
        """After a run's status is written: in a log, the case's result line; the controller's runs
        done/total and session ETA (on a terminal its own updating line, in a log at the result's end)."""
        self.done += 1
        result, self.result = self.result, None
        line = self._line()
        if line is None:
            return
        session = progress_text("session", "runs", self.done, self.total, self.now() - self.start)
        if not line.tty:
            if result is not None:
                line.show(result + (f"  [{session.removeprefix('session  ')}]" if self._controller() else ""), final=True)
            return
        if self._controller():
            self.active = line
            line.show(session)
