"""Progress inside long runs (issue 19 part 2): task i/T with elapsed and ETA while a case runs on a
terminal; a non-terminal (a CI log) gets one line per case, its result (issue 42 item 7); -q nothing;
the xdist controller counts runs."""
import io
import re
from pathlib import Path

import pytest

import clharness.engine.runner  # noqa: F401  (pytester's in-process runs share one torch)
import clharness_methods  # noqa: F401
import sklearn.datasets  # noqa: F401
import sklearn.model_selection  # noqa: F401
import clharness.reporting.scorecard  # noqa: F401
import torchvision.ops  # noqa: F401  (first imported inside a run, torch._dynamo would register twice)
from clharness.pytest_progress import Line, clock, eta, progress_text

HERE = Path(__file__).parent

MINI = """
[suite]
name = "mini"
seeds = 2

[defaults]
dataset = "digits"
backbone = "mlp"
backbone_options = { hidden = 16, layers = 1 }
epochs = 1
tasks = 5

[[scenario]]
name = "ci"
"""

TASK_LINE = re.compile(r"^clharness: mini\.toml::ci\[tiny-seed(\d)\]  task (\d)/5  elapsed \d+:\d\d  ETA \d+:\d\d$")
RESULT_LINE = re.compile(r"^clharness: mini\.toml::ci\[tiny-seed(\d)\]  passed( \(reused\))?  final acc (0\.\d{3})  "
                         r"train \d+\.\d s(  \[runs (\d)/2  elapsed \S+  ETA \S+\])?$")


def test_eta_from_the_mean_pace_of_the_tasks_done():
    assert eta(30.0, 2, 5) == pytest.approx(45.0)    # 15 s a task, 3 to go
    assert eta(0.0, 0, 5) is None
    assert clock(45) == "0:45" and clock(3725) == "1:02:05"
    assert progress_text("c", "task", 2, 5, 30.0) == "c  task 2/5  elapsed 0:30  ETA 0:45"
    assert progress_text("c", "task", 0, 5, 1.0).endswith("ETA -")


@pytest.fixture
def run(pytester):
    pytester.syspathinsert(HERE)
    pytester.makefile(".toml", mini=MINI)

    def _run(*args):
        return pytester.runpytest("-p", "plugin_methods", "-p", "no:cacheprovider", "mini.toml",
                                  "--clh-method", "tiny", *args)
    return _run


def test_non_terminal_gets_one_line_per_case_with_its_result(pytester, monkeypatch):
    # a subprocess: its fd-level output capture during the case is what the lines must get past
    monkeypatch.setenv("PYTHONPATH", str(HERE), prepend=":")
    pytester.makefile(".toml", mini=MINI)
    args = ("-p", "plugin_methods", "-p", "no:cacheprovider", "mini.toml", "--clh-method", "tiny")
    result = pytester.runpytest_subprocess(*args, "--clh-scorecard", "card.json")
    result.assert_outcomes(passed=2)
    assert not any(map(TASK_LINE.match, result.outlines))    # no task lines in a log
    lines = [m.groups() for m in map(RESULT_LINE.match, result.outlines) if m]
    assert [(seed, reused) for seed, reused, *_ in lines] == [("0", None), ("1", None)]
    import json
    finals = {r["seed"]: r["acc_matrix"][-1] for r in json.loads((pytester.path / "card.json").read_text())["records"]}
    for seed, _, acc, *_ in lines:   # the line's accuracy is the record's: the mean of the last row
        assert acc == f"{sum(finals[int(seed)]) / len(finals[int(seed)]):.3f}"
    assert "session  runs" not in result.stdout.str() and "[runs" not in result.stdout.str()   # one process
    again = pytester.runpytest_subprocess(*args)
    assert [m.group(2) for m in map(RESULT_LINE.match, again.outlines) if m] == [" (reused)"] * 2


def test_quiet_under_q(run):
    result = run("-q")
    result.assert_outcomes(passed=2)
    assert "clharness: mini.toml" not in result.stdout.str() and " task 1/5" not in result.stdout.str()


def test_stored_runs_show_no_task_lines(run):
    run().assert_outcomes(passed=2)
    result = run()   # every record reused from the store: nothing trains
    result.assert_outcomes(passed=2)
    assert not any(map(TASK_LINE.match, result.outlines))


class FakeWriter:
    fullwidth = 80

    def __init__(self):
        self.out = io.StringIO()
        self.width_of_current_line = 12
        self._current_line = "mini.toml ."

    def write(self, text, flush=False):
        self.out.write(text)


class FakeReporter:
    isatty = True

    def __init__(self):
        self._tw = FakeWriter()


def test_terminal_line_updates_in_place_and_returns_to_the_test_line():
    reporter = FakeReporter()
    line = Line(reporter)
    line.show("task 1/3")
    line.show("task 2/3")
    line.clear()
    # one new line, each update redrawn over the last, then back up to column 12 of the test line
    assert reporter._tw.out.getvalue() == ("\n\r\x1b[Ktask 1/3\r\x1b[Ktask 2/3\r\x1b[K\x1b[1A\x1b[12C")


@pytest.mark.slow   # ~30 s on 2 cores (CI under 15 min); python -m pytest -m slow
def test_xdist_controller_counts_runs_done(pytester, monkeypatch):
    """Under -n 2 the workers' task lines are not shown; the controller's result lines count runs done/total."""
    monkeypatch.setenv("PYTHONPATH", str(HERE), prepend=":")
    pytester.makefile(".toml", mini=MINI)
    result = pytester.runpytest_subprocess("-p", "plugin_methods", "-p", "no:cacheprovider", "mini.toml",
                                           "--clh-method", "tiny", "-n", "2")
    result.assert_outcomes(passed=2)
    done = [int(m.group(5)) for m in map(RESULT_LINE.match, result.outlines) if m]
    assert done == [1, 2]
    assert not any(map(TASK_LINE.match, result.outlines))


GATED = 'gates = ["finetune: final_acc beats tiny by 0.0"]\n' + MINI


@pytest.mark.parametrize("workers", [(), pytest.param(("-n", "2"), marks=pytest.mark.slow)],   # xdist: ~26 s
                         ids=["serial", "xdist"])
def test_a_gate_that_cannot_be_judged_is_said_once_in_the_summary(pytester, monkeypatch, workers):
    """--clh-method tiny leaves out the gate's finetune: one line in clharness's summary, with the reason,
    however many workers planned the suite, and no pytest warning."""
    monkeypatch.setenv("PYTHONPATH", str(HERE), prepend=":")
    pytester.makefile(".toml", mini=GATED)
    result = pytester.runpytest_subprocess("-p", "plugin_methods", "-p", "no:cacheprovider", "mini.toml",
                                           "--clh-method", "tiny", *workers)
    result.assert_outcomes(passed=2)
    said = [line for line in result.outlines if "not judged" in line]
    assert said == ["clharness: mini: gate 'finetune: final_acc beats tiny by 0.0' not judged: this session "
                    "does not run finetune"]
    assert "warnings summary" not in result.stdout.str()


def test_a_session_without_suites_prints_no_progress_of_ours(pytester):
    """Installed clharness is active in every pytest run: without a suite it stays silent, also on
    an xdist controller (the harness's own test run, or any other project's)."""
    pytester.makepyfile(test_plain="def test_a():\n    pass\n\ndef test_b():\n    pass\n")
    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    assert not [line for line in result.outlines if "clharness:" in line]


class _Shown:
    tty = True

    def __init__(self):
        self.lines = []

    def show(self, text, final=False):
        self.lines.append(text)


def test_iterations_inside_a_task_show_their_rate_and_the_task_eta():
    from clharness.pytest_progress import CaseProgress
    clock_now = [100.0]
    line = _Shown()
    progress = CaseProgress(line, "s::c[m-seed0]", lambda: clock_now[0])
    progress(0, 5)                                   # task 1/5 done
    clock_now[0] += 2.0
    progress.step(40, 100)                           # 40 iterations in 2 s: 20 it/s, 60 left: 3 s
    assert line.lines[-1].endswith("iter 40/100  20.0 it/s  task ETA 0:03")
    clock_now[0] += 0.1
    progress.step(42, 100)                           # redrawn at most twice a second
    assert len(line.lines) == 2
    line.tty = False
    clock_now[0] += 5
    progress.step(90, 100)                           # a log gets no per-iteration lines
    assert len(line.lines) == 2


def test_the_runner_reports_every_iteration_of_a_standard_loop(tmp_path):
    import clharness as clh
    from clharness.engine import runner

    class Spy:
        def __init__(self):
            self.steps, self.tasks = [], []

        def __call__(self, done, total, unit="task"):
            self.tasks.append((done, total, unit))

        def step(self, iteration, expected):
            self.steps.append((iteration, expected))

    case = clh.load_case("quickstart", "ci-5x2", "finetune", seed=0, quick=True)
    spy = Spy()
    record = runner.run_case(case.case, clh.Harness(entry_points=False), runner.pick_device("cpu"), on_task=spy)
    assert record.status == "passed" and [t for t, _, _ in spy.tasks] == [0, 1, 2, 3, 4]
    first_task = [(i, e) for i, e in spy.steps[:100] if e == spy.steps[0][1]]
    n, bs = len(case.scenario.tasks[0].train), case.context.batch_size
    assert spy.steps[0] == (1, -(-n // bs)) and first_task[-1][0] == -(-n // bs)   # 1 epoch: ceil(n / bs)
