"""GTEP end to end: deterministic disjoint phase datasets, tuning and evaluation items, selection
(Alg. 1), store reuse and resume, the scorecard section, and bad input caught at collection."""
import math
import sqlite3
from pathlib import Path

import numpy as np
import pytest
import torch

import clharness.engine.runner  # noqa: F401  (loaded once: pytester runs share one torch)
from clharness.engine.family_session import FamilyServices
import clharness.reporting.scorecard  # noqa: F401
import clharness_methods  # noqa: F401
from clharness.benchmarks.gtep import protocol as gtep
from clharness.data import BUILTIN_SOURCES
from clharness.results import ResultsStore, RunRecord
from clharness.benchmarks.gtep import kind
from clharness.engine.suites import ScenarioSpec, SuiteError, load_suite
from clharness.benchmarks.gtep import search as gtep_search, selection as gtep_selection, summary as gtep_summary

SYN = '{ num_classes = 12, image_size = 4, train_per_class = 20, test_per_class = 6, similarity = 0.2, noise = 0.2 }'
SUITE = f"""
[suite]
name = "g"
methods = ["tiny", "gtep-scaled", "gtep-diverger"]

[defaults]
kind = "gtep"
backbone = "mlp"
backbone_options = {{ hidden = 16, layers = 1 }}
validation = 0.25
task_config = "2-equal"
configurations = 3
trials = 2
fixed = {{ optimizer = "sgd" }}
search = {{ "*" = {{ epochs = [1], lr = [0.01, 0.03, 0.3], batch_size = [16] }} }}

[[scenario]]
name = "high"
tune_dataset = "synthetic"
tune_dataset_options = {SYN}
tune_classes = [0, 6]
eval_dataset = "synthetic"
eval_dataset_options = {SYN}
eval_classes = [6, 12]
"""


def spec(**options):
    base = {k: d for k, (_, d) in kind.OPTIONS.items()}
    base.update(tune_dataset="synthetic", eval_dataset="synthetic", tune_classes=[0, 6], eval_classes=[6, 12],
                task_config="2-equal")
    base.update(options)
    return ScenarioSpec(name="s", kind="gtep", validation=0.25, options=base)


def built(phase, seed, side_classes, dataset="synthetic", options=None):
    s = spec()
    s = gtep.phase_spec(s, phase, {})
    s = ScenarioSpec(**{**s.__dict__, "dataset": dataset, "dataset_options": options if options is not None else
                        {"num_classes": 12, "image_size": 4, "train_per_class": 20, "test_per_class": 6},
                        "options": {**s.options, "classes": side_classes}})
    return kind.build(s, BUILTIN_SOURCES, seed, torch.device("cpu"))


def test_phase_datasets_are_deterministic_disjoint_and_shuffled_per_trial():
    tune0, tune0b, tune1 = built("tune", 0, [0, 6]), built("tune", 0, [0, 6]), built("tune", 1, [0, 6])
    evals = built("eval", 0, [6, 12])
    assert tune0.class_names == tune0b.class_names                      # deterministic
    assert set(tune0.class_names) == set(tune1.class_names)             # same slice in every trial ...
    assert tune0.class_names != tune1.class_names                       # ... in a shuffled order
    assert set(tune0.class_names).isdisjoint(evals.class_names)         # D^HT and D^E share no class
    assert len(set(tune0.class_names) | set(evals.class_names)) == 12
    assert [len(t.classes) for t in tune0.tasks] == [3, 3]
    # tuning is scored on the validation split: 25% of each class's 20 train images, not the 6 test ones
    assert [len(t.test) for t in tune0.tasks] == [15, 15] and [len(t.train) for t in tune0.tasks] == [45, 45]
    assert [len(t.test) for t in evals.tasks] == [18, 18] and [len(t.train) for t in evals.tasks] == [60, 60]
    order = kind.fixed_order(torch.arange(12).repeat(3), split_seed=0)
    assert sorted(order.tolist()) == list(range(12)) and order.tolist() == kind.fixed_order(torch.arange(12), 0).tolist()


def test_low_similarity_uses_another_dataset_and_six_task_config_is_half_then_five():
    digits = built("eval", 0, [], dataset="digits", options={})
    assert digits.num_classes == 10 and digits.dataset.startswith("digits(")
    assert kind.task_split("6-half", 50, "s") == {"tasks": None, "first_task": 25, "increment": 5}
    assert kind.task_split("10-equal", 50, "s")["tasks"] == 10
    with pytest.raises(kind.ScenarioError, match="do not split into 20 equal tasks"):
        kind.task_split("20-equal", 50, "s")


@pytest.mark.parametrize("options, message", [
    ({"eval_classes": [4, 10]}, "overlap on dataset 'synthetic'"),
    ({"eval_classes": []}, "overlap"),
    ({"tune_classes": [5, 2]}, "must be \\[start, stop\\]"),
    ({"task_config": "6"}, "task_config = '6'"),
    ({"eval_dataset": ""}, "eval_dataset is missing"),
    ({"search": {"*": {"lr": []}}}, "search.\\*.lr = \\[\\] must be a non-empty list"),
])
def test_bad_scenario_options_are_load_errors(options, message):
    with pytest.raises(ValueError, match=message):
        kind.check(spec(**options))


def test_select_best_is_the_highest_mean_harmonic_mean_and_skips_diverged_configs():
    def rec(acc, avg, status="passed"):
        return RunRecord("g", "s:tune-c0", "m", 0, status=status, metrics={"final_acc": acc, "avg_inc_acc": avg})
    tuning = {0: [rec(0.5, 0.5), rec(0.5, 0.5)],            # P = 0.5
              1: [rec(0.9, 0.9), rec(0.0, 0.0, "diverged")],  # NaN trial: cannot win
              2: [rec(0.6, 0.3), rec(0.6, 0.6)]}            # P = (0.4 + 0.6) / 2 = 0.5: tie, lower k wins
    best, scores = gtep_selection.select_best(tuning)
    assert best == 0 and scores[2] == pytest.approx(0.5) and math.isnan(scores[1])
    assert gtep_selection.select_best({0: [rec(0, 0, "diverged")]})[0] is None


def _phase_records():
    """Three methods whose tuning-phase ranking (a > b > c) the evaluation phase reverses (c > b > a).
    Two configurations each; c1 wins tuning for every method; two trials per phase."""
    def rec(method, scenario, seed, acc, lr):
        return RunRecord("g", scenario, method, seed, status="passed", hparams={"lr": lr}, parameters=100,
                         metrics={"final_acc": acc, "avg_inc_acc": acc}, train_seconds=1.0, eval_seconds=0.5)
    tune = {"a": 0.9, "b": 0.8, "c": 0.7}
    evals = {"a": (0.40, 0.44), "b": (0.50, 0.54), "c": (0.60, 0.64)}
    records = []
    for m in "abc":
        for seed in (0, 1):
            records.append(rec(m, "s:tune-c0", seed, tune[m] - 0.2, 0.01))
            records.append(rec(m, "s:tune-c1", seed, tune[m], 0.1))
            records.append(rec(m, "s:eval", seed, evals[m][seed], 0.1))
    return records


def test_gtep_summary_and_table_hold_the_hand_computed_values():
    frame = gtep_summary.summarize(_phase_records())
    rows = frame.set_index("method")
    assert list(frame.method) == ["c", "b", "a"]                        # ranked by the evaluation phase
    assert rows.loc["a", "config"] == 1 and rows.loc["a", "tune_acc"] == pytest.approx(0.9)
    assert rows.loc["c", "eval_acc"] == pytest.approx(0.62) and rows.loc["a", "gap"] == pytest.approx(0.9 - 0.42)
    # 95% t-interval of two trials 0.60, 0.64: t(0.975, 1) * 0.02828 / sqrt(2) = 12.706 * 0.02 = 0.254
    assert rows.loc["c", "eval_acc_ci"] == pytest.approx(12.7062 * 0.02, rel=1e-4)
    # the tuning ranking is reversed: Kendall tau -1 between the phases, not 1 (a ranking with itself)
    tau = gtep_summary.ranking_change(frame)[("g", "s")]
    assert tau["kendall"] == pytest.approx(-1.0) and tau["spearman"] == pytest.approx(-1.0)
    text = gtep_summary.render(frame, fmt="github")
    assert "(Kendall tau, tuning vs evaluation ranking: -1.000; ranking changes)" in text
    table = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
             if line.startswith("| ") and not line.startswith("| rank")]
    assert [r[:5] for r in table] == [["1", "c", "0.700", "0.620 ± 0.254", "+0.080"],   # equal tuning trials: no ±
                                      ["2", "b", "0.800", "0.520 ± 0.254", "+0.280"],
                                      ["3", "a", "0.900", "0.420 ± 0.254", "+0.480"]]
    assert [r[10] for r in table] == ["3", "2", "1"]                   # tune rank
    assert all(r[14] == "c1: lr=0.1" for r in table)                  # chosen H*


def test_identical_phase_rankings_give_tau_one():
    records = [r for r in _phase_records() if r.scenario != "s:eval"]
    for r in _phase_records():
        if r.scenario == "s:eval":
            r.metrics = {"final_acc": {"a": 0.6, "b": 0.5, "c": 0.4}[r.method] + 0.01 * r.seed, "avg_inc_acc": 0.5}
            records.append(r)
    frame = gtep_summary.summarize(records)
    assert gtep_summary.ranking_change(frame)[("g", "s")]["kendall"] == pytest.approx(1.0)
    assert "ranking unchanged" in gtep_summary.render(frame)


@pytest.fixture
def run(pytester):
    pytester.syspathinsert(Path(__file__).parent)
    pytester.makefile(".toml", g=SUITE)

    def _run(*args):
        return pytester.runpytest("-p", "plugin_methods", "-p", "gtep_methods", "-p", "no:cacheprovider",
                                  "--clh-results", str(pytester.path / "r.sqlite"), *args)
    return _run


def test_protocol_runs_selects_reuses_and_resumes(run, pytester):
    first = run("g.toml", "-v")
    # 3 methods x (3 configs x 2 trials + 2 eval trials); gtep-diverger diverges at lr 0.3
    outcomes = first.parseoutcomes()
    # a diverged tuning trial is counted (NaN), an expected outcome: xfailed, not failed
    assert outcomes["passed"] + outcomes["xfailed"] == 24 and "failed" not in outcomes
    ids = [line.split(" ")[0] for line in first.outlines if line.startswith("g.toml::high[")]
    assert "g.toml::high[tiny-tune-c0-t0]" in ids and "g.toml::high[gtep-scaled-eval-t1]" in ids
    assert ids.index("g.toml::high[tiny-tune-c2-t1]") < ids.index("g.toml::high[tiny-eval-t0]")
    text = first.stdout.str()
    assert "clharness GTEP" in text and "general parameters only" in text   # tiny declares no own space
    assert "does not take general parameter(s) num_milestones, lr_decay, weight_decay, scheduler, optimizer" in text

    store = ResultsStore(pytester.path / "r.sqlite")
    records = store.records("g")
    assert len(records) == 24
    for method in ("tiny", "gtep-scaled", "gtep-diverger"):
        tuning = {}
        for r in records:
            if r.method == method and ":tune-c" in r.scenario:
                tuning.setdefault(int(r.scenario.rsplit("-c", 1)[1]), []).append(r)
        # Alg. 1 recomputed here: the highest mean over trials of the harmonic mean of Acc and AvgAcc
        means = {k: np.mean([2 * r.metrics["final_acc"] * r.metrics["avg_inc_acc"]
                             / (r.metrics["final_acc"] + r.metrics["avg_inc_acc"]) if r.status == "passed"
                             else np.nan for r in rs]) for k, rs in tuning.items()}
        best = min(k for k, v in means.items() if v == np.nanmax(list(means.values())))
        evals = [r for r in records if r.method == method and r.scenario.startswith("high:eval@")]
        assert len(evals) == 2 and all(r.hparams == tuning[best][0].hparams for r in evals)
        assert all(r.dataset.endswith("[6:12]") for r in evals)
        assert all(r.dataset.endswith("[0:6]") for rs in tuning.values() for r in rs)
    diverged = [r for r in records if r.method == "gtep-diverger" and r.status == "diverged"]
    assert diverged and all(r.hparams["lr"] >= 0.1 for r in diverged)
    assert outcomes["xfailed"] == len(diverged)
    assert all(r.hparams["lr"] < 0.1 for r in records if r.method == "gtep-diverger" and r.scenario.startswith("high:eval@"))
    frame = gtep_summary.summarize(records)
    row = frame.set_index("method").loc["gtep-diverger"]
    assert row.tune_diverged == len(diverged) and row.gap == pytest.approx(row.tune_acc - row.eval_acc)
    assert sorted(frame.eval_rank) == [1, 2, 3]

    # Resume: drop one tuning record (an interrupted phase); the rerun does only that run again.
    victim = next(r for r in records if r.method == "gtep-scaled" and r.scenario.endswith(":tune-c1") and r.seed == 1)
    with sqlite3.connect(pytester.path / "r.sqlite") as db:
        db.execute("DELETE FROM runs WHERE key = ?", (victim.key,))
    second = run("g.toml")
    assert "24 runs, 23 reused" in second.stdout.str()
    assert len(ResultsStore(pytester.path / "r.sqlite").records("g")) == 24


def test_bad_spaces_fail_collection_before_any_training(run, pytester):
    pytester.makefile(".toml", empty=SUITE.replace('lr = [0.01, 0.03, 0.3]', 'lr = []'))
    result = run("g.toml", "empty.toml", "--clh-method", "gtep-orphan")
    text = result.stdout.str()
    assert "'beta' is conditional on 'use_beta', which the space does not declare" in text
    assert "search.*.lr = [] must be a non-empty list of values" in text
    assert result.ret == pytest.ExitCode.INTERRUPTED and "collected 0 items / 2 errors" in text
    assert not (pytester.path / "r.sqlite").exists() or len(ResultsStore(pytester.path / "r.sqlite")) == 0


def test_method_space_restricts_general_parameters_and_applies_fixed_values():
    from clharness.hparams import TABLE4
    er = clharness_methods.er.ER
    ms = gtep_search.method_space(er, {"general": "table4", "fixed": {"momentum": 0.9}, "search": {}})
    # Table 4's Replay row: the general sets only (issue 30 item 4); the method's own space on request
    assert ms.space["epochs"].values == tuple(TABLE4["epochs"]) and ms.own == () and ms.paper
    # spaces = "method": ER's declared tuning_space (mammoth's lr set, the CLDyB B.3 selection space)
    method = gtep_search.method_space(er, {"general": "table4", "spaces": "method"})
    assert method.own == ("lr",) and method.space["lr"].values == er.tuning_space["lr"].values
    assert ms.fixed == {"momentum": 0.9} and "momentum" not in ms.space
    lwf = gtep_search.method_space(clharness_methods.lwf.LwF, {"general": "table4"})
    assert lwf.space["temperature"].values == (0.5, 1, 1.5, 2, 2.5)     # table 4's T (KD) set
    case = gtep.make_case(FamilyServices(), load_suite_stub(), spec(), er, {}, ms, {"epochs": 3, "lr": 0.1, "scheduler": "steplr",
                                                                  "num_milestones": 2, "lr_decay": 0.5}, "tune", 1, 4)
    assert case.scenario.epochs == 3 and case.scenario.name == "s:tune-c4" and case.hparams["momentum"] == 0.9
    assert case.hparams["scheduler"] == "steplr" and "epochs" not in case.hparams
    # suite sets naming a method's own parameters are its whole own space; general-only sets keep the rest
    assert gtep_search.method_space(clharness_methods.lwf.LwF, {"search": {"lwf": {"temperature": [2.0]}}}).own == ("temperature",)
    assert gtep_search.method_space(clharness_methods.lwf.LwF, {"search": {"lwf": {"lr": [0.1]}}}).own == ("temperature", "lwf_lambda")
    with pytest.raises(Exception, match="has no hyperparameter 'nope'"):
        gtep_search.method_space(er, {"search": {"er": {"nope": [1]}}})


def load_suite_stub():
    class S:
        name = "g"
        hparams = {}
    return S()
