"""One GTEP tuning phase per D^HT (Sec. 4.1: tune once on CIFAR-50-1, apply H* to every D^E):
scenarios with the same D^HT, task configuration and search space share their tuning runs (same
record keys, trained once), within a suite and across suites; their evaluation phases use one H*."""
from pathlib import Path

import pytest

import clharness.engine.runner  # noqa: F401  (loaded once: pytester runs share one torch)
import clharness.reporting.scorecard  # noqa: F401
import clharness_methods  # noqa: F401
from clharness.benchmarks.gtep import kind  # noqa: F401  (loads torchvision once: it registers torch ops)
from clharness.benchmarks.gtep import protocol as gtep
from clharness.results import ResultsStore
from clharness.engine.suites import load_suite
from clharness.benchmarks.gtep import search as gtep_search, summary as gtep_summary

SYN = '{ num_classes = 12, image_size = 4, train_per_class = 20, test_per_class = 6, similarity = 0.2, noise = 0.2 }'
HEAD = """
[suite]
name = "{name}"
methods = ["tiny"]

[defaults]
kind = "gtep"
backbone = "mlp"
backbone_options = {{ hidden = 16, layers = 1 }}
validation = 0.25
configurations = 2
trials = 2
fixed = {{ optimizer = "sgd" }}
search = {{ "*" = {{ epochs = [1], lr = [0.01, 0.03, 0.1, 0.3], batch_size = [16] }} }}
tune_dataset = "synthetic"
tune_dataset_options = {syn}
tune_classes = [0, 6]
"""
HIGH = """
[[scenario]]
name = "{name}"
task_config = "{tasks}"
eval_dataset = "synthetic"
eval_dataset_options = {syn}
eval_classes = [6, 12]
"""
LOW = """
[[scenario]]
name = "{name}"
task_config = "2-equal"
eval_dataset = "digits"
eval_classes = [0, 6]
"""


def suite_text(name, *scenarios):
    return HEAD.format(name=name, syn=SYN) + "".join(scenarios)


def test_scenarios_with_one_dht_share_tuning_keys_and_draws_and_others_do_not(tmp_path):
    path = tmp_path / "g.toml"
    path.write_text(suite_text("g", HIGH.format(name="high", tasks="2-equal", syn=SYN), LOW.format(name="low"),
                               HIGH.format(name="three", tasks="3-equal", syn=SYN)))
    high, low, three = load_suite(path).scenarios
    assert gtep.tuning_id(high) == gtep.tuning_id(low) != gtep.tuning_id(three)   # task configuration differs
    assert gtep.tuning_id(high).startswith("synthetic[0-6]-2-equal-")
    other = tmp_path / "h.toml"   # another suite, another scenario name, same D^HT
    other.write_text(suite_text("h", LOW.format(name="elsewhere")))
    assert gtep.tuning_id(load_suite(other).scenarios[0]) == gtep.tuning_id(high)
    space = gtep_search.method_space(clharness_methods.er.ER, {"general": "table4"}).space
    assert [gtep_search.draw(space, gtep.tuning_id(high), "er", k) for k in range(4)] == \
        [gtep_search.draw(space, gtep.tuning_id(low), "er", k) for k in range(4)]


def collected(pytester, *args):
    """The session's items after collection (a --clh-suite's items are added in modifyitems)."""
    reprec = pytester.inline_run("-p", "no:cacheprovider", "--collect-only", *args)
    return reprec.getcalls("pytest_collection_finish")[0].session.items


def test_gtep_digits_tunes_once_for_its_two_scenarios(pytester):
    items = collected(pytester, "--clh-suite", "gtep-digits")
    tune = [i for i in items if i.unit.shared and ":tune-c" in i.unit.case.scenario.name]
    methods, R, S = 6, 6, 2   # gtep-digits: 6 methods, R = 6 configurations, S = 2 trials, 2 scenarios
    # before: every scenario tuned its own R x S runs per method; now the two share one set
    assert len(tune) == 2 * methods * R * S == 144
    assert len({i.case_key for i in tune}) == methods * R * S == 72
    again = collected(pytester, "--clh-suite", "gtep-digits")
    # the same items and keys in the same order in every (pytest-xdist) worker
    assert [(i.nodeid, getattr(i, "case_key", None)) for i in again] == \
        [(i.nodeid, getattr(i, "case_key", None)) for i in items]


def test_shared_tuning_runs_once_and_every_evaluation_uses_its_hstar(pytester):
    pytester.makefile(".toml", g=suite_text("g", HIGH.format(name="high", tasks="2-equal", syn=SYN),
                                            LOW.format(name="low")))
    pytester.makefile(".toml", h=suite_text("h", LOW.format(name="elsewhere")))
    store = pytester.path / "r.sqlite"
    pytester.syspathinsert(Path(__file__).parent)
    result = pytester.runpytest("-p", "plugin_methods", "-p", "no:cacheprovider", "--clh-results", str(store),
                                "g.toml", "h.toml", "-v")
    result.assert_outcomes(passed=18)   # 3 scenarios x (2 configurations x 2 trials + 2 evaluation trials)
    records = ResultsStore(store).records()
    tune = [r for r in records if ":tune-c" in r.scenario]
    evals = [r for r in records if ":eval@" in r.scenario]
    assert len(tune) == 4 and len({r.key for r in tune}) == 4          # trained once, not three times
    assert sorted(r.scenario.split(":eval@")[0] for r in evals) == ["elsewhere"] * 2 + ["high"] * 2 + ["low"] * 2
    tuned = {r.scenario.split("@")[1] for r in evals}
    assert tuned == {tune[0].scenario.split(":")[0]}
    assert len({tuple(sorted(r.hparams.items())) for r in evals}) == 1   # one H* for every D^E
    frame = gtep_summary.summarize(records)
    assert sorted(frame.scenario) == ["elsewhere", "high", "low"] and set(frame.tune_runs) == {4}
    assert len(set(frame.config)) == 1 and "H* tuned on synthetic[0-6]-2-equal-" in gtep_summary.render(frame)
    # a scenario selected alone (-k) still trains the shared runs itself
    alone = pytester.runpytest("-p", "plugin_methods", "-p", "no:cacheprovider", "--clh-results",
                               str(pytester.path / "alone.sqlite"), "g.toml", "-k", "low")
    alone.assert_outcomes(passed=6)
    assert len([r for r in ResultsStore(pytester.path / "alone.sqlite").records() if ":tune-c" in r.scenario]) == 4
