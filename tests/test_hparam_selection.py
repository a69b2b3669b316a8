"""select_hparams (clharness/engine/hparam_selection.py): hyperparameters selected on the validation splits of
the first tasks (CLDyB appendix B.3, following Chaudhry et al. 2018, A-GEM sec. 2 and 5), then fixed
for the full sequence.

The hand-made case: a dataset whose test images of class c look like the train images of its pair
partner c XOR 1 (and carry a marker pixel), and a nearest-class-mean method whose ``mode`` either
predicts the nearest class ("same": perfect on validation, 0 on test) or its partner ("partner": 0 on
validation, perfect on test). Selection on validation must choose "same", though "partner" is listed
first (so neither the tie rule nor the order can explain it) and is the one test data would choose.
"""
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torchvision  # noqa: F401  (loaded once: in-process pytester sessions would register its torch ops twice)

import clharness.engine.runner as runner
import clharness.reporting.scorecard  # noqa: F401
from clharness.benchmarks.splits import kind  # noqa: F401
from clharness.engine.hparam_selection import candidates, check_option, choose, search_space
from clharness.hparams import Choice, Float, HParamError
from clharness.results import ResultsStore

PLUGIN = '''
import os
import torch
import clharness as clh
from clharness.data import ArrayDataset, DatasetSource

MARK = 255   # pixel (0, 0) of every test image; 0 in train (and so validation) images


class MirrorPairs(DatasetSource):
    """8 classes of 4x4 images; class c's train images show pattern c, its test images pattern c ^ 1."""
    needs_root = False

    def load(self, root, train, download=False):
        g = torch.Generator().manual_seed(0 if train else 1)
        n = 12 if train else 4
        labels = torch.arange(8).repeat_interleave(n)
        shown = labels if train else labels ^ 1
        images = torch.randint(0, 20, (len(labels), 1, 4, 4), generator=g, dtype=torch.uint8)
        flat = images.view(len(labels), -1)
        flat[torch.arange(len(labels)), 1 + shown] = 200       # the class pattern: one bright pixel
        flat[:, 0] = 0 if train else MARK
        return ArrayDataset(images, labels, [f"c{i}" for i in range(8)], "mirror-pairs")


class Mirror(clh.Method):
    """Nearest class mean; ``mode = partner`` answers the pair partner of the nearest class."""
    name = "mirror"
    settings = {clh.Setting.CLASS_IL}
    hparams = {"mode": clh.Choice(["partner", "same"])}
    tuning_space = {"mode": clh.Choice(["partner", "same"])}

    def __init__(self, context, **hp):
        super().__init__(context, **hp)
        self.means = torch.zeros(context.num_classes, 16)
        self.seen = torch.zeros(context.num_classes, dtype=torch.bool)
        with open(os.environ["CLH_TEST_TRAININGS"], "a") as fh:   # one line per run trained
            fh.write(self.hp["mode"] + "\\n")

    def learn(self, experience):
        for c in experience.classes:
            xs = [x[y == c].flatten(1) for x, y in experience.batches(shuffle=False, augment=False)]
            self.means[c] = torch.cat(xs).mean(0)
            self.seen[c] = True

    def predict(self, x, task_id=None):
        d = torch.cdist(x.flatten(1)[:, 1:], self.means[:, 1:])
        d[:, ~self.seen] = float("inf")
        c = d.argmin(1)
        if self.hp["mode"] == "partner":
            c = c ^ 1
        return torch.nn.functional.one_hot(c, len(self.means)).float()


@clh.hookimpl
def clharness_add_methods(registry):
    registry.add(Mirror)


@clh.hookimpl
def clharness_add_datasets(registry):
    registry.add("mirror-pairs", MirrorPairs)
'''

SUITE = """
[suite]
name = "sel"
methods = ["mirror"]

[[scenario]]
name = "pairs"
dataset = "mirror-pairs"
class_order = "fixed"
tasks = 4
validation = 0.25
epochs = 1
select_hparams = { tasks = 2 }
"""


@pytest.fixture
def project(pytester, monkeypatch):
    pytester.makepyfile(mirror_plugin=PLUGIN)
    pytester.makefile(".toml", sel=SUITE)
    trainings = pytester.path / "trainings.txt"
    trainings.write_text("")
    monkeypatch.setenv("CLH_TEST_TRAININGS", str(trainings))
    pytester.syspathinsert(pytester.path)
    args = ("-p", "mirror_plugin", "-p", "no:cacheprovider", "--clh-device", "cpu", "--clh-results",
            str(pytester.path / "r.sqlite"), "sel.toml")
    return SimpleNamespace(store=pytester.path / "r.sqlite", trainings=trainings,
                           run=lambda *a: pytester.runpytest(*args, *a),
                           subprocess=lambda *a: pytester.runpytest_subprocess(*args, *a))


def test_the_validation_best_configuration_is_chosen_and_applied_to_the_full_run(project):
    project.run().assert_outcomes(passed=3)   # 2 selection runs, 1 full run
    records = {r.scenario: r for r in ResultsStore(project.store).records()}
    assert sorted(records) == ["pairs", "pairs:select-c0", "pairs:select-c1"]
    # scored on the first 2 tasks' validation splits: "same" is perfect there, "partner" never right
    assert records["pairs:select-c0"].hparams == {"mode": "partner"} and records["pairs:select-c0"].metrics["aa"] == 0
    assert records["pairs:select-c1"].hparams == {"mode": "same"} and records["pairs:select-c1"].metrics["aa"] == 1
    assert len(records["pairs:select-c1"].acc_matrix) == 2   # the first tasks only
    full = records["pairs"]
    assert full.selection["chosen"] == 1 and full.selection["candidates"] == 2
    assert full.selection["config"] == {"mode": "same"} and full.selection["scores"] == [0.0, 1.0]
    assert full.selection["first_tasks"] == 2 and full.selection["metric"] == "aa"
    assert full.selection["keys"] == [records["pairs:select-c0"].key, records["pairs:select-c1"].key]
    assert full.hparams == {"mode": "same"}   # the choice is what the full run ran with
    assert len(full.acc_matrix) == 4
    # on test data the validation-best configuration is the worst: test data would have chosen "partner"
    assert full.metrics["aa"] == 0


def test_selection_runs_never_evaluate_test_data(project, monkeypatch):
    seen = []

    def spying(evaluate):   # class-IL rows come from evaluate_views, the other settings' from evaluate
        def spy(method, scenario, device, after):
            marked = [bool((task.test.images[:, 0, 0, 0] == 255).any()) for task in scenario.tasks]
            seen.append((scenario.spec.name, len(scenario.tasks), marked))
            return evaluate(method, scenario, device, after)
        return spy

    monkeypatch.setattr(runner, "evaluate", spying(runner.evaluate))
    monkeypatch.setattr(runner, "evaluate_views", spying(runner.evaluate_views))
    project.run().assert_outcomes(passed=3)
    selection = [s for s in seen if ":select-c" in s[0]]
    full = [s for s in seen if s[0] == "pairs"]
    assert len(selection) == 2 * 2 and len(full) == 4   # one evaluation per learned task
    assert all(n == 2 and marked == [False, False] for _, n, marked in selection)
    assert all(marked == [True] * 4 for _, _, marked in full)   # the spy sees test data where it is used


def test_stored_selection_runs_are_reused_on_a_rerun_and_after_an_interrupted_session(project):
    project.run().assert_outcomes(passed=3)
    assert project.trainings.read_text().split() == ["partner", "same", "same"]
    again = project.run()
    again.assert_outcomes(passed=3)
    assert "3 reused" in again.stdout.str()
    assert project.trainings.read_text().split() == ["partner", "same", "same"]   # nothing trained again
    # as if killed after the selection runs: the full run's record is gone, the selection runs' are stored
    store = ResultsStore(project.store)
    full = next(r for r in store.records() if r.scenario == "pairs")
    with store._transaction() as db:
        db.execute("DELETE FROM runs WHERE key = ?", (full.key,))
    store.close()
    project.run().assert_outcomes(passed=3)
    assert project.trainings.read_text().split() == ["partner", "same", "same", "same"]
    assert next(r for r in ResultsStore(project.store).records() if r.scenario == "pairs").key == full.key


def test_under_pytest_xdist_the_full_run_waits_for_the_selection_runs(project):
    project.subprocess("-n", "2").assert_outcomes(passed=3)
    assert sorted(project.trainings.read_text().split()) == ["partner", "same", "same"]   # each trained once
    full = next(r for r in ResultsStore(project.store).records() if r.scenario == "pairs")
    assert full.hparams == {"mode": "same"} and full.selection["chosen"] == 1


def test_ties_go_to_the_lowest_candidate_and_failed_runs_never_win():
    def rec(score, status="passed"):
        return SimpleNamespace(status=status, metrics={"aa": score, "forgetting": score})
    assert choose([rec(0.5), rec(0.7), rec(0.7)], "aa") == (1, [0.5, 0.7, 0.7])
    assert choose([rec(0.9, "diverged"), rec(0.2)], "aa")[0] == 1
    assert choose([rec(0.3), rec(0.1), rec(0.1)], "forgetting")[0] == 1   # lower is better
    best, scores = choose([rec(0.9, "failed"), None], "aa")
    assert best is None and all(math.isnan(s) for s in scores)


def test_search_space_grid_and_draws():
    method = SimpleNamespace(name="m", hparams={"lr": Float(1e-4, 1.0, default=0.1, log=True),
                                                "opt": Choice(["sgd", "adam"]),
                                                "mom": Float(0.0, 0.9, default=0.0, when={"opt": ["sgd"]})},
                             tuning_space=None)
    space = search_space(method, {"*": {"lr": [0.01, 0.1], "absent": [1]}, "m": {"opt": ["sgd", "adam"],
                                                                                "mom": [0.0, 0.9]}})
    grid = candidates(space, 0, "x")
    # first parameter slowest; mom only where opt = sgd, so adam appears once per lr
    assert grid == [{"lr": 0.01, "opt": "sgd", "mom": 0.0}, {"lr": 0.01, "opt": "sgd", "mom": 0.9},
                    {"lr": 0.01, "opt": "adam"}, {"lr": 0.1, "opt": "sgd", "mom": 0.0},
                    {"lr": 0.1, "opt": "sgd", "mom": 0.9}, {"lr": 0.1, "opt": "adam"}]
    assert search_space(method, {}) is None   # no sets, no tuning_space: nothing to select
    method.tuning_space = {"lr": method.hparams["lr"]}
    with pytest.raises(HParamError, match="configurations = R"):
        candidates(search_space(method, {}), 0, "x")
    draws = candidates(search_space(method, {}), 3, "x")
    assert draws == candidates(search_space(method, {}), 3, "x") and len({d["lr"] for d in draws}) == 3
    with pytest.raises(HParamError, match="no hyperparameter 'nope'"):
        search_space(method, {"m": {"nope": [1]}})


@pytest.mark.parametrize("value, kind, validation, message", [
    ({"taks": 3}, "split", 0.2, "unknown key"),
    ({"metric": "accuracy"}, "split", 0.2, "allowed: final_acc"),
    ({"tasks": 0}, "split", 0.2, "must be >= 1"),
    ({}, "split", 0.0, "set validation"),
    ({}, "gtep", 0.2, "GTEP tunes in its own phase"),
    ({"search": {"er": {"lr": []}}}, "split", 0.2, "non-empty lists"),
])
def test_bad_select_hparams_values_are_clear_errors(value, kind, validation, message):
    with pytest.raises(ValueError, match=message):
        check_option(value, kind, validation=validation)
    assert check_option({"tasks": 2}, "cldyb")["metric"] == "aa"


def test_the_shipped_example_suite_selects_on_three_tasks():
    from clharness.engine.suites import load_suite
    suite = load_suite(Path(__file__).parents[1] / "suites" / "select-hparams-digits.toml", quick=True)
    assert [s.kind for s in suite.scenarios] == ["split", "cldyb"]
    assert all(s.select_hparams["tasks"] == 3 for s in suite.scenarios)


def test_selection_runs_are_not_scenarios_in_the_ranking_agreement():
    import pandas as pd

    from clharness.reporting.scorecard import rank_agreement
    rows = [{"suite": "s", "scenario": sc, "method": m, "final_acc": acc}
            for sc, accs in {"a": (0.1, 0.2, 0.3), "b": (0.3, 0.2, 0.1), "a:select-c0": (0.1, 0.2, 0.3)}.items()
            for m, acc in zip("xyz", accs)]
    pairs = rank_agreement(pd.DataFrame(rows))
    assert [(r.scenario_a, r.scenario_b) for r in pairs.itertuples()] == [("a", "b")]


def test_cldyb_replays_select_on_their_searched_sequence_after_the_search(pytester):
    """CLDyB (appendix B.3): per searched sequence, selection runs wait for its search, then the replay."""
    suite = Path(__file__).parents[1] / "suites" / "select-hparams-digits.toml"
    reprec = pytester.inline_run("-p", "no:cacheprovider", "--collect-only", "--clh-suite", str(suite), "--clh-quick",
                                 "--clh-method", "finetune", "-k", "cldyb and seed0")
    units = [i.unit for i in reprec.getcalls("pytest_collection_finish")[0].session.items]
    search = [u for u in units if u.role == "search"]
    selection = [u for u in units if u.role == "selection"]
    final = [u for u in units if u.role == "selected"]
    assert len(search) == 1 and len(selection) == 3 and len(final) == 1   # lr in [0.01, 0.05, 0.2]
    assert {u.after for u in selection} == {final[0].after} == {search[0].key}
    assert [u.name for u in selection] == [f"cldyb-mini-cc/cc[finetune-seed0-select-c{k}]" for k in range(3)]
    plan = final[0].data["plan"]
    assert final[0].name == "cldyb-mini-cc/cc[finetune-seed0]" and plan.tasks == 3
    assert all(u.case.scenario.options["sequence"] == plan.full.scenario.options["sequence"] for u in selection)
