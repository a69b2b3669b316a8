"""The pytest plugin end to end: suites collected as cases, ids, selection, failures, scorecards."""
import json
import os
import sys
from pathlib import Path

import pytest

# pytester's in-process runs drop modules first imported during a run; importing the
# harness (and torch) here keeps them loaded, so runs share one torch (re-importing crashes).
import clharness.engine.runner  # noqa: F401,E402
import clharness.reporting.scorecard  # noqa: F401,E402
import clharness_methods  # noqa: F401,E402
import sklearn.datasets  # noqa: F401,E402
import sklearn.model_selection  # noqa: F401,E402

HERE = Path(__file__).parent
REPO = HERE.parent

MINI = """
[suite]
name = "mini"
seeds = 2

[defaults]
dataset = "digits"
backbone = "mlp"
backbone_options = { hidden = 32, layers = 1 }
epochs = 1
tasks = 5

[[scenario]]
name = "ci"

[[scenario]]
name = "ti"
setting = "task-incremental"
"""


@pytest.fixture
def run(pytester):
    """pytester with our test methods importable as a plugin module."""
    pytester.syspathinsert(HERE)
    pytester.makefile(".toml", mini=MINI)

    def _run(*args, **kwargs):
        return pytester.runpytest("-p", "plugin_methods", "-p", "no:cacheprovider", *args, **kwargs)
    return _run


def case_ids(result):
    """Case ids in the order pytest reports them (a non-terminal's progress lines may split an item's
    line in two: its id first, its outcome after the progress lines, so each id counts once)."""
    return list(dict.fromkeys(
        line.split(" ")[0] for line in result.outlines if "[" in line and "::" in line
        and line.split(" ")[0].count("::") == 1 and not line.startswith(("FAILED", "DIVERGED", "ERROR"))))


def test_suite_file_collects_cases_with_readable_ids(run):
    result = run("mini.toml", "--clh-method", "tiny", "-v")
    result.assert_outcomes(passed=4)
    assert case_ids(result) == ["mini.toml::ci[tiny-seed0]", "mini.toml::ci[tiny-seed1]",
                                "mini.toml::ti[tiny-seed0]", "mini.toml::ti[tiny-seed1]"]
    result.stdout.fnmatch_lines(["*clharness scorecard*", "*mini::ci*tiny*2*", "*mini::ti*tiny*2*"])


def test_suite_by_name_ids_read_suite_scenario_method_seed(run, pytester):
    result = run("--clh-suite", "quickstart", "--clh-method", "tiny", "--clh-seeds", "2", "-v")
    result.assert_outcomes(passed=2)
    assert case_ids(result) == ["quickstart::ci-5x2[tiny-seed0]", "quickstart::ci-5x2[tiny-seed1]"]


def test_k_selects_and_x_stops(run):
    result = run("mini.toml", "--clh-method", "tiny", "--clh-method", "raiser", "-k", "ti and raiser")
    result.assert_outcomes(failed=2)
    result = run("mini.toml", "--clh-method", "raiser", "--clh-method", "tiny", "-x")
    result.assert_outcomes(failed=1)


def test_last_failed_reruns_only_failures(pytester):
    pytester.syspathinsert(HERE)
    pytester.makefile(".toml", mini=MINI)
    args = ("-p", "plugin_methods", "--clh-suite", str(pytester.path / "mini.toml"),
            "--clh-method", "tiny", "--clh-method", "raiser", "--clh-seeds", "1")
    pytester.runpytest(*args).assert_outcomes(passed=2, failed=2)
    again = pytester.runpytest(*args, "--lf", "-v")
    again.assert_outcomes(failed=2, deselected=2)
    assert all("raiser" in i for i in case_ids(again))


def test_failures_name_method_task_and_cause_and_others_still_run(run, tmp_path):
    card = tmp_path / "card.json"
    result = run("mini.toml", "-k", "ci", "--clh-method", "raiser", "--clh-method", "badshape",
                 "--clh-method", "nanlogits", "--clh-method", "tiny", "--clh-scorecard", str(card))
    result.assert_outcomes(passed=2, failed=6)
    out = result.stdout.str()
    assert "method 'raiser' failed at task 2: ValueError: boom in the third task" in out
    # a wrong logits shape fails before anything trains (the dry predict on task 0's training inputs)
    assert "method 'badshape' failed at the check before training" in out and \
        "returned shape (32, 3), expected (32, 10)" in out
    assert "[diverged]" in out and "non-finite logits" in out
    summary = {row["method"]: row for row in json.loads(card.read_text())["summary"]}
    assert summary["raiser"]["failed"] == 2 and summary["nanlogits"]["diverged"] == 2
    # tiny forgets (class-incremental fine-tuning) but learns each task as it comes.
    assert summary["tiny"]["seeds"] == 2 and summary["tiny"]["avg_inc_acc"] > 0.35


def test_scorecard_written_in_every_format(run, tmp_path):
    for suffix in (".md", ".csv", ".json"):
        path = tmp_path / f"card{suffix}"
        run("mini.toml", "-k", "ci", "--clh-method", "tiny", "--clh-scorecard", str(path)).assert_outcomes(passed=2)
        text = path.read_text()
        assert "tiny" in text and "final" in text
    rows = json.loads((tmp_path / "card.json").read_text())["records"]
    assert [r["seed"] for r in rows] == [0, 1] and all(len(r["acc_matrix"]) == 5 for r in rows)


def test_keyboard_interrupt_keeps_finished_records(run, tmp_path):
    card = tmp_path / "card.json"
    result = run("mini.toml", "-k", "ci", "--clh-method", "interrupter", "--clh-scorecard", str(card),
                 no_reraise_ctrlc=True)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    records = json.loads(card.read_text())["records"]
    assert [(r["method"], r["seed"], r["status"]) for r in records] == [("interrupter", 0, "passed")]


def test_not_applicable_methods_are_skipped_with_reason(run):
    result = run("mini.toml", "-k", "ci", "--clh-method", "online-only", "-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.re_match_lines([r"N/A \[2\] mini.toml.*supports \['online'\], not class-incremental"])


def test_unknown_method_and_suite_list_the_known_ones(run):
    result = run("mini.toml", "--clh-method", "nosuch")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*--clh-method: method 'nosuch' is not registered; registered: *er*tiny*"])
    result = run("--clh-suite", "nosuch")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown suite; known suites: *quickstart*"])


@pytest.mark.parametrize("body, message", [
    (MINI.replace("epochs = 1", "epocs = 1"), "bad.toml:9: [defaults]: unknown key(s) 'epocs' (did you mean 'epochs'?); allowed: name, dataset"),
    (MINI.replace('setting = "task-incremental"', 'setting = "task-il"'),
     "setting = 'task-il'; allowed values: class-incremental, task-incremental, online, domain-incremental"),
    (MINI.replace("seeds = 2", "seeds = 0"), "[suite] seeds = 0; expected a positive integer"),
    (MINI + "\n[hparams.tiny]\nlr = 7.0\n", "[hparams.tiny]: hyperparameter 'lr'=7.0 is outside [0.001, 1.0]"),
    (MINI + "\n[hparams.tiny]\nmomentum = 0.9\n", "[hparams.tiny] 'momentum': 'tiny' has no hyperparameter 'momentum'"),
    ("[suite\nname=1", "not valid TOML"),
])
def test_malformed_suite_is_a_collection_error_naming_file_and_key(pytester, body, message):
    pytester.syspathinsert(HERE)
    path = pytester.makefile(".toml", bad=body)
    # A file that is not valid TOML is only a suite if it lives in a suites/ folder.
    if "name=1" in body:
        (pytester.path / "suites").mkdir()
        path = path.rename(pytester.path / "suites" / "bad.toml")
    result = pytester.runpytest("-p", "plugin_methods", str(path), "--clh-method", "tiny")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    out = result.stdout.str()
    assert message in out and "bad.toml" in out


def test_missing_dataset_names_path_layout_and_flag(run, pytester):
    result = run("--clh-suite", "split-mnist", "--clh-method", "tiny", "--clh-seeds", "1", "-k", "ci",
                 "--clh-data-root", str(pytester.path / "nodata"))
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "[error]" in out and "dataset 'mnist' not found at" in out and "--clh-data-root" in out


def test_conftest_plugin_registers_a_method(pytester):
    pytester.makeconftest((HERE / "plugin_methods.py").read_text())
    pytester.makefile(".toml", mini=MINI)
    result = pytester.runpytest("mini.toml", "--clh-method", "tiny", "-k", "ci and seed0", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_name_clash_between_plugins_names_both_sources(pytester):
    pytester.makeconftest((HERE / "plugin_methods.py").read_text())
    pytester.syspathinsert(HERE)
    pytester.makefile(".toml", mini=MINI)
    result = pytester.runpytest("mini.toml", "-p", "plugin_methods", "--clh-method", "tiny")
    assert result.ret == pytest.ExitCode.USAGE_ERROR   # a usage error, not an INTERNALERROR
    out = result.stderr.str()
    assert "method 'tiny' is registered twice: by " in out and "Fix: rename one of them" in out
    assert "plugin_methods" in out and "conftest" in out


def test_xdist_runs_cases_in_parallel(pytester, monkeypatch):
    # the workers import plugin_methods too, and this checkout's clharness, not an installed one
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), str(HERE)]))
    pytester.makefile(".toml", mini=MINI)
    result = pytester.runpytest_subprocess("-p", "plugin_methods", "mini.toml", "--clh-method", "tiny", "-n", "2")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*clharness scorecard*", "*mini::ci*tiny*2*", "*mini::ti*tiny*2*"])


def test_stored_runs_are_reused_and_clh_fresh_reruns_them(run, pytester):
    from clharness.results import ResultsStore
    args = ("mini.toml", "--clh-method", "tiny", "-k", "ci and seed0", "-v")
    first = run(*args)
    first.assert_outcomes(passed=1)
    assert "clharness: 1 runs, 0 reused" in first.stdout.str()
    stored = ResultsStore(pytester.path / ".clharness/results.sqlite").records()
    assert len(stored) == 1
    second = run(*args)
    out = second.stdout.str()
    assert "clharness: 1 runs, 1 reused" in out and "PASSED (reused: stored " in out and f"key {stored[0].key})" in out
    fresh = run(*args, "--clh-fresh")
    fresh.assert_outcomes(passed=1)
    assert "clharness: 1 runs, 0 reused" in fresh.stdout.str() and "(reused:" not in fresh.stdout.str()
    rerun, = ResultsStore(pytester.path / ".clharness/results.sqlite").records()
    assert rerun.key == stored[0].key and rerun.session != stored[0].session   # trained again, replaced


def test_cuda_device_without_cuda_fails_up_front_even_when_every_run_is_stored(run, monkeypatch):
    import torch
    args = ("mini.toml", "--clh-method", "tiny", "-k", "ci and seed0")
    run(*args).assert_outcomes(passed=1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = run(*args, "--clh-device", "cuda")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--clh-device cuda asked for CUDA, but torch sees no CUDA device*"])


def test_a_failed_stored_run_is_run_again_not_reused(run):
    args = ("mini.toml", "--clh-method", "raiser", "-k", "ci and seed0")
    run(*args).assert_outcomes(failed=1)
    again = run(*args)
    again.assert_outcomes(failed=1)
    assert "clharness: 1 runs, 0 reused" in again.stdout.str()   # only passed/diverged/N-A runs are reused
