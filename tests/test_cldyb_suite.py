"""The cldyb suite kind end to end through pytest: search items, replays, summary, reuse, static replay."""
import json

import numpy as np

import pytest

import clharness.benchmarks.cldyb.kind  # noqa: F401  (loaded once: pytester's in-process runs share torch)
import clharness.engine.runner  # noqa: F401
import clharness.reporting.scorecard  # noqa: F401
import clharness_methods  # noqa: F401
import sklearn.cluster  # noqa: F401
import sklearn.datasets  # noqa: F401
import sklearn.model_selection  # noqa: F401

SUITE = """
[suite]
name = "dyb"
seeds = 1
methods = ["finetune", "ncm"]

[defaults]
kind = "cldyb"
backbone = "mlp"
backbone_options = { hidden = 16, layers = 1 }
epochs = 1
validation = 0.25
image_size = [8, 8]
channels = 1
max_train_per_class = 15
pool = [{ dataset = "digits" },
        { dataset = "synthetic", options = { num_classes = 20, image_size = 8, train_per_class = 20, test_per_class = 5 } }]
pool_growth = [
    { step = 2, name = "late", dataset = "synthetic", options = { num_classes = 10, image_size = 8, seed = 3, train_per_class = 20, test_per_class = 5 } },
]
heldout_pool = [
    { dataset = "synthetic", options = { num_classes = 12, image_size = 8, seed = 7, similarity = 0.3, train_per_class = 20, test_per_class = 5 } },
]
classes_per_task = 3
steps = 3
candidates = 4
search_space = 2
probe_per_class = 4
search_methods = ["finetune"]

[[scenario]]
name = "s"
use_cases = ["cc", "ic", "random", "heldout"]
"""


@pytest.fixture
def run(pytester):
    pytester.makefile(".toml", dyb=SUITE)

    def _run(*args):
        return pytester.runpytest("-p", "no:cacheprovider", "--clh-results", "r.sqlite", *args)
    return _run


def test_cc_ic_random_and_heldout_sequences_are_searched_saved_and_replayed(run, pytester):
    result = run("dyb.toml", "-v")
    result.assert_outcomes(passed=11)
    out = result.stdout.str()
    for item in ("s[search-cc-seed0]", "s[search-ic-finetune-seed0]", "s[search-random-seed0]",
                 "s[search-heldout-seed0]", "s/cc[finetune-seed0]", "s/cc[ncm-seed0]", "s/ic[finetune-seed0]",
                 "s/random[ncm-seed0]", "s/heldout[ncm-seed0]"):
        assert f"dyb.toml::{item}" in out
    assert "s/ic[ncm-seed0]" not in out            # ncm is evaluated, not searched with: no IC sequence
    seq = json.loads((pytester.path / ".clharness/sequences/dyb-s-cc-seed0.json").read_text())
    assert seq["format"] == "clharness-cldyb-sequence" and seq["methods"] == ["finetune"] and seq["seed"] == 0
    assert [len(s["classes"]) for s in seq["steps"]] == [3, 3, 3]
    assert seq["pool_growth"][0]["name"] == "late" and seq["steps"][2]["timings"]["pool_added"] == 10
    assert all("/" in c for s in seq["steps"] for c in s["classes"])
    assert len(seq["steps"][1]["candidates"]) == 2
    held = json.loads((pytester.path / ".clharness/sequences/dyb-s-heldout-seed0.json").read_text())
    assert all(c.startswith("synthetic/") for s in held["steps"] for c in s["classes"])
    # the session summary: CC metrics, robustness from the IC sequence, random and held-out AA, rank correlation
    assert "CLDyB (mean" in out and "robustness (IC AA)" in out
    assert "CC minus random final AA, mean over 2 methods" in out
    assert "rank correlation cc vs held-out over 2 methods: Spearman" in out
    assert "search dyb::s/cc seed 0: per step" in out and "lookahead" in out

    again = run("dyb.toml")                       # everything reused from the store
    again.assert_outcomes(passed=11)
    assert "7 runs, 7 reused" in again.stdout.str()

    # the saved CC sequence replays as a static scenario for a method held out of the search
    pytester.makefile(".toml", replay=f"""
[suite]
name = "replay"
methods = ["lwf"]
[[scenario]]
name = "published"
kind = "cldyb"
backbone_options = {{ hidden = 16, layers = 1 }}
sequence = "{pytester.path / '.clharness/sequences/dyb-s-cc-seed0.json'}"
""")
    replay = run("replay.toml", "-v")
    replay.assert_outcomes(passed=1)
    assert "replay.toml::published[lwf-seed0] PASSED" in replay.stdout.str()


@pytest.mark.parametrize("line, message", [
    ("classes_per_task = 1", "classes_per_task = 1; a task needs at least 2 classes"),
    ("search_space = 9", "search_space = 9 exceeds candidates = 4"),
    ("search = \"beam\"", "search = 'beam'; allowed: lookahead, mcts, most-similar, random"),
    ("use_cases = [\"cc\", \"hard\"]", "allowed entries: cc, ic, random, heldout"),
    ("validation = 0.0", "validation = 0.0; the CLDyB search scores tasks on held-out validation data"),
])
def test_bad_options_are_reported_with_the_value_and_the_choices(tmp_path, line, message):
    from clharness.engine.suites import SuiteError, load_suite
    body = SUITE.replace('use_cases = ["cc", "ic", "random", "heldout"]', line) if "use_cases" in line else SUITE + line
    (tmp_path / "bad.toml").write_text(body + "\n")
    with pytest.raises(SuiteError, match="bad.toml: \\[\\[scenario\\]\\] #1 \\(s\\): ") as info:
        load_suite(tmp_path / "bad.toml")
    assert message in str(info.value)


def test_a_bad_option_fails_the_pytest_session_with_the_message(pytester):
    pytester.makefile(".toml", bad=SUITE + "steps = 0\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "bad.toml")
    assert "steps = 0 must be at least 1" in result.stdout.str() and result.ret != 0


def test_summary_robustness_is_the_mean_final_accuracy_over_ic_sequences():
    from clharness.benchmarks.cldyb.kind import summary_rows
    from clharness.results import RunRecord
    records = [RunRecord("s", "m/cc", "a", 0, status="passed", metrics={"aa": 0.2, "ar": -0.1, "ala": 0.5},
                         memory_mb=1.5),
               RunRecord("s", "m/cc", "a", 1, status="passed", metrics={"aa": 0.4, "ar": -0.3, "ala": 0.7},
                         memory_mb=2.5),
               RunRecord("s", "m/ic", "a", 0, status="passed", metrics={"aa": 0.1}),
               RunRecord("s", "m/ic", "a", 1, status="passed", metrics={"aa": 0.3}),
               RunRecord("s", "m/ic", "a", 2, status="failed", metrics={"aa": 0.9}),
               RunRecord("s", "m/random", "b", 0, status="passed", metrics={"aa": 0.9})]
    a, b = summary_rows(records)
    assert a["robustness"][0] == pytest.approx(0.2) and a["cc_aa"][0] == pytest.approx(0.3)
    assert a["cc_ar"][0] == pytest.approx(-0.2) and a["cc_ala"][0] == pytest.approx(0.6) and a["memory_mb"] == 2.0
    assert b["random_aa"] == (0.9, 0.0) and np.isnan(b["robustness"][0])


def test_summary_aa_is_the_per_task_mean_not_the_sample_weighted_accuracy():
    """Issue 15 item 6: tasks of 10 and 90 test images; CLDyB's Final AA is (0.2 + 0.9) / 2."""
    from clharness.benchmarks.cldyb.kind import summary_rows
    from clharness.metrics import all_metrics
    from clharness.results import RunRecord
    R = [[0.8, 0.0], [0.2, 0.9]]
    new = RunRecord("s", "m/cc", "a", 0, status="passed", acc_matrix=R, task_sizes=[10, 90],
                    metrics=all_metrics(R, [10, 90]))
    old = RunRecord("s", "m/random", "a", 0, status="passed", acc_matrix=R, task_sizes=[10, 90],
                    metrics={"final_acc": 0.83})   # stored before "aa" existed
    (row,) = summary_rows([new, old])
    assert new.metrics["final_acc"] == pytest.approx(0.83)
    assert row["cc_aa"][0] == pytest.approx(0.55) and row["random_aa"][0] == pytest.approx(0.55)


def test_relative_sequence_path_is_read_beside_the_suite_file(pytester):
    sub = pytester.mkdir("suites_here")
    (sub / "replay.toml").write_text("""
[suite]
name = "replay"
methods = ["finetune"]
[[scenario]]
name = "published"
kind = "cldyb"
backbone_options = { hidden = 16, layers = 1 }
sequence = "saved.json"
""")
    (pytester.path / "saved.json").write_text("{}")   # a decoy where the invocation is: must not be read
    result = pytester.runpytest("-p", "no:cacheprovider", "--clh-results", "r.sqlite", "suites_here/replay.toml")
    result.assert_outcomes(failed=1)
    assert str(sub / "saved.json") in result.stdout.str()
