"""Ensembles with each member's own trainer (schedules, clipping, its own lr) and ensembles over float
hyperparameters (``--clh-ensemble=hparams``, ``[suite] ensemble``), issue 32: every member equals its solo run."""
import dataclasses

import numpy as np
import pytest
import torch

import clharness
# pytester's in-process runs drop modules first imported during a run: import them here (as test_ensemble)
import clharness.engine.runner  # noqa: F401
import clharness.reporting.scorecard  # noqa: F401
import clharness_methods  # noqa: F401
import sklearn.datasets  # noqa: F401
import sklearn.model_selection  # noqa: F401
from clharness.engine.ensemble import _ensemble_id, run_ensemble, shared_hparams
from mini_suite import mini_suite, paused_members


def _quickstart(**scenario):
    from clharness.engine.suites import load_suite
    from clharness.kinds import install
    from clharness.plugins import Harness
    harness = Harness()
    install(harness.kinds)
    suite = load_suite(harness.suites["quickstart"], quick=True)
    return harness, suite.name, dataclasses.replace(suite.scenarios[0], **scenario)


def _against_solo(harness, cases):
    """Each case solo and all of them as one ensemble: equal accuracy matrices (bit for bit), equal keys."""
    from clharness.engine.runner import run_case
    solo = [run_case(c, harness, torch.device("cpu")) for c in cases]
    ens = run_ensemble(cases, harness, torch.device("cpu"))
    for a, b in zip(solo, ens):
        assert a.status == b.status == "passed" and a.key == b.key and b.extra["executor"] == f"ensemble:{len(cases)}"
        assert np.array_equal(a.acc_matrix, b.acc_matrix, equal_nan=True), (a.hparams, a.seed)
    return solo, ens


@pytest.mark.parametrize("hp", [
    {"scheduler": "steplr", "momentum": 0.9},                 # milestones at epochs 1 and 2 of 3, decay 0.1
    {"scheduler": "cosine", "momentum": 0.9}])
def test_scheduled_members_equal_their_solo_runs(hp):
    """Each member steps its own trainer: its schedule at its own epoch ends (members' task sizes differ by
    seed, hence their epochs' lengths), its gradient norm clipped over its own gradients."""
    from clharness.engine.runner import Case, resolve_hparams
    harness, suite, spec = _quickstart(epochs=3)
    base = resolve_hparams(harness.methods["finetune"])
    cases = [Case(suite, spec, "finetune", s, {**base, **hp}) for s in range(3)]
    _against_solo(harness, cases)


def test_trainer_step_by_step_equals_each_members_solo_fit():
    """``_train_task`` against each member's own solo ``fit`` (Trainer.step), on a task of 2 steps an epoch
    over 3 epochs: members with their own lr, a StepLR schedule stepping at each epoch end, and gradients
    clipped to a norm they exceed; member 1 runs out a step before member 0 (its optimizer and schedule
    stop) and member 0's last batch is ragged."""
    import copy
    import functools

    from clharness.engine.ensemble_step import _train_task
    from clharness.method import Context, Setting
    from clharness.toolkit.backbones import MLP
    from clharness.toolkit.training import SupervisedMethod

    class Exp:
        classes, batch_size = (0, 1, 2), 4

        def __len__(self):
            return 8   # 2 steps an epoch: the schedule steps after steps 2, 4, 6

    class Clipped(SupervisedMethod):
        hparams = {**SupervisedMethod.hparams, "clip_grad": clharness.Float(0.0, 100.0, default=0.0)}

    torch.manual_seed(0)
    ctx = Context(Setting.CLASS_IL, 3, (4,), epochs=3,
                  backbone_factory=functools.partial(MLP, (4,), hidden=5, layers=1))
    methods = []
    for lr in (0.5, 0.2):
        method = Clipped(ctx, optimizer="sgd", lr=lr, momentum=0.9, scheduler="steplr", num_milestones=2,
                                  lr_decay=0.1, clip_grad=0.05)
        method.labels.add(Exp())
        methods.append(method)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(28, 4, generator=g), torch.randint(0, 3, (28,), generator=g)
    data = [[(x[i:i + 4], y[i:i + 4]) for i in range(0, 24, 4)] + [(x[24:26], y[24:26])],
            [(x[i + 2:i + 6], y[i + 2:i + 6]) for i in range(0, 20, 4)]]
    solo = [copy.deepcopy(m) for m in methods]
    trainers = [method.fit(batches) for method, batches in zip(solo, data)]
    assert [t.scheduler.get_last_lr()[0] for t in trainers] == pytest.approx([0.005, 0.002])   # 3 and 2 epochs: milestones 1, 2
    members = paused_members(methods, data)
    _train_task(members)
    for method, want in zip(methods, solo):
        for p, q in zip(method.model.parameters(), want.model.parameters()):
            assert torch.allclose(p, q, atol=1e-6), (p - q).abs().max()


def test_members_with_their_own_lr_equal_their_solo_runs():
    """An "hparams" ensemble: members differ in lr and weight decay (and seed), under a StepLR schedule."""
    from clharness.engine.runner import Case, resolve_hparams
    harness, suite, spec = _quickstart(epochs=3)
    base = resolve_hparams(harness.methods["finetune"], {"scheduler": "steplr", "momentum": 0.9})
    cases = [Case(suite, spec, "finetune", s, {**base, "lr": lr, "weight_decay": wd})
             for s, lr, wd in ((0, 0.02, 0.0), (1, 0.1, 5e-4), (0, 0.3, 1e-3))]
    assert len({_ensemble_id(c, "hparams") for c in cases}) == 1
    solo, ens = _against_solo(harness, cases)
    assert len({tuple(np.ravel(r.acc_matrix)) for r in ens}) == 3


def test_members_with_their_own_ewc_lambda_equal_their_solo_runs():
    """EWC's loss reads its member's own lambda (its own hyperparameters, as a Python float), not member 0's."""
    from clharness.engine.runner import Case, resolve_hparams
    harness, suite, spec = _quickstart()
    cls = harness.methods["ewc"]
    cases = [Case(suite, spec, "ewc", 0, resolve_hparams(cls, {"ewc_lambda": lam}))
             for lam in (1.0, 300.0, 1e5)]
    solo, ens = _against_solo(harness, cases)
    assert len({tuple(np.ravel(r.acc_matrix)) for r in solo}) == 3   # lambda changes the run


def test_hparams_grouping_is_float_values_only():
    """The grouping key: "hparams" ignores float values (not their names), never an int, string or bool;
    "seeds" ignores nothing (the seed is not a hyperparameter)."""
    base = {"optimizer": "sgd", "lr": 0.1, "weight_decay": 0.0, "scheduler": "steplr", "num_milestones": 2,
            "nesterov": False}
    same = [{**base, "lr": 0.03}, {**base, "weight_decay": 5e-4, "lr": 0.3}]
    other = [{**base, "num_milestones": 3}, {**base, "scheduler": "cosine"}, {**base, "optimizer": "adam"},
             {**base, "nesterov": True}, {**base, "lr": 1},        # an int lr is not a float lr
             {k: v for k, v in base.items() if k != "weight_decay"}]  # a float's name must match
    key = lambda hp, how: clharness.results.run_key(shared_hparams(hp, how))   # noqa: E731
    assert all(key(hp, "hparams") == key(base, "hparams") for hp in same)
    assert all(key(hp, "hparams") != key(base, "hparams") for hp in other)
    assert all(key(hp, "seeds") != key(base, "seeds") for hp in same + other)


GTEP = """
[suite]
name = "gtep-ens"
methods = ["finetune"]
{ensemble}

[defaults]
kind = "gtep"
backbone = "mlp"
backbone_options = {{ hidden = 32, layers = 1 }}
validation = 0.2
task_config = "5-equal"
configurations = 2
trials = 2
general = "table4"
fixed = {{ momentum = 0.9, scheduler = "cosine" }}
search = {{ "*" = {{ epochs = [2], lr = [0.03, 0.1], batch_size = [32] }} }}

[[scenario]]
name = "high"
tune_dataset = "synthetic"
tune_dataset_options = {{ num_classes = 20, image_size = 8, train_per_class = 40, test_per_class = 20, similarity = 0.3, noise = 0.25 }}
tune_classes = [0, 10]
eval_dataset = "synthetic"
eval_dataset_options = {{ num_classes = 20, image_size = 8, train_per_class = 40, test_per_class = 20, similarity = 0.3, noise = 0.25 }}
eval_classes = [10, 20]
"""


def test_suite_key_groups_gtep_configurations_and_enters_no_key(tmp_path):
    """``[suite] ensemble = "hparams"``: GTEP's two tuning configurations (their lr and weight decay drawn,
    a cosine schedule) and two trials each train as one ensemble of 4; the CLI's "seeds" wins (two
    ensembles of 2). The records and keys are the solo session's: the key is how runs execute, no part of
    what they compute."""
    results = {}
    for name, key, option in (("solo", "", False), ("suite", 'ensemble = "hparams"', False),
                              ("cli", 'ensemble = "hparams"', "seeds")):
        path = tmp_path / name / "gtep-ens.toml"
        path.parent.mkdir()
        path.write_text(GTEP.format(ensemble=key))
        records = clharness.run(path, results=tmp_path / f"{name}.sqlite", device="cpu", ensemble=option)
        results[name] = {r.key: r for r in records if ":tune-c" in r.scenario}
    tuned = results["solo"]
    assert len(tuned) == 4
    assert results["solo"].keys() == results["suite"].keys() == results["cli"].keys()
    executors = {name: sorted(r.extra.get("executor", "solo") for r in recs.values()) for name, recs in results.items()}
    assert executors["solo"] == ["solo"] * len(tuned)
    assert executors["suite"].count("ensemble:4") == 4 and executors["cli"].count("ensemble:2") == 4
    for name in ("suite", "cli"):
        for k, r in results[name].items():
            assert np.array_equal(r.acc_matrix, results["solo"][k].acc_matrix, equal_nan=True)


MINI = mini_suite(seeds=2, hidden=16)


def test_plain_option_before_a_path_means_seeds_and_a_bad_mode_is_a_usage_error(pytester, tmp_path):
    """``--clh-ensemble`` takes an optional value: a suite path after the plain flag stays a path (the flag
    means seeds); ``--clh-ensemble=hparams`` runs; any other value is refused before anything trains."""
    from clharness.results import ResultsStore
    pytester.makefile(".toml", mini=MINI)
    for n, flag in enumerate(("--clh-ensemble", "--clh-ensemble=hparams")):
        store = tmp_path / f"{n}.sqlite"
        pytester.runpytest("-p", "no:cacheprovider", flag, "mini.toml", "--clh-method", "finetune",
                           "--clh-results", str(store)).assert_outcomes(passed=2)
        assert [r.extra.get("executor") for r in ResultsStore(store).records()] == ["ensemble:2"] * 2
    result = pytester.runpytest("-p", "no:cacheprovider", "--clh-ensemble=all", "mini.toml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "choose seeds, hparams or off" in result.stderr.str()


def test_off_runs_every_case_solo_whatever_the_suites_key(pytester, tmp_path):
    from clharness.results import ResultsStore
    pytester.makefile(".toml", mini=mini_suite(seeds=2, hidden=16, suite_keys='ensemble = "seeds"'))
    for flag, executor in (("--clh-ensemble=off", None), ("--clh-quick", "ensemble:2")):
        store = tmp_path / f"{flag}.sqlite"
        pytester.runpytest("-p", "no:cacheprovider", flag, "mini.toml", "--clh-method", "finetune",
                           "--clh-results", str(store)).assert_outcomes(passed=2)
        assert [r.extra.get("executor") for r in ResultsStore(store).records()] == [executor] * 2


def test_suite_key_is_checked(tmp_path):
    from clharness.engine.suites import SuiteError, load_suite
    path = tmp_path / "mini.toml"
    path.write_text(mini_suite(seeds=2, hidden=16, suite_keys='ensemble = "hparams"'))
    assert load_suite(path).ensemble == "hparams"
    path.write_text(mini_suite(seeds=2, hidden=16, suite_keys="ensemble = true"))
    with pytest.raises(SuiteError, match="ensemble = True; allowed values: seeds, hparams"):
        load_suite(path)


def test_a_member_that_diverges_fails_alone_end_to_end():
    """Three seeds, one ensemble over a float hyperparameter ("hparams"): seed 1's loss is scaled by 1e30,
    so its weights blow up after its first step and its loss turns non-finite. Its record says "diverged",
    as its solo run's does; seeds 0 and 2 pass and equal their solo runs (the diverged member's stop
    changes nothing of theirs)."""
    from clharness.engine.runner import Case, resolve_hparams, run_case
    from clharness_methods.finetune import Finetune

    class Scaled(Finetune):
        name = "scaled"
        ensemble = True          # opted in; its loss reads nothing per member but its hyperparameters
        ensemble_state = ()
        hparams = {**Finetune.hparams, "loss_scale": clharness.Float(1.0, 1e38, default=1.0, log=True)}

        def loss(self, x, y):
            return self.hp["loss_scale"] * self.cross_entropy(self.model(x), y)

    harness, suite, spec = _quickstart()
    harness.methods.add(Scaled)
    cases = [Case(suite, spec, "scaled", seed, resolve_hparams(Scaled, {"loss_scale": scale}))
             for seed, scale in enumerate((1.0, 1e30, 1.0))]
    assert len({_ensemble_id(c, "hparams") for c in cases}) == 1   # one ensemble under "hparams"
    solo = [run_case(c, harness, torch.device("cpu")) for c in cases]
    ens = run_ensemble(cases, harness, torch.device("cpu"))
    assert [r.status for r in solo] == [r.status for r in ens] == ["passed", "diverged", "passed"]
    assert "non-finite loss" in ens[1].message and ens[1].failed_task == solo[1].failed_task == 0
    for a, b in zip(solo, ens):
        assert a.key == b.key and b.extra["executor"] == "ensemble:3"
    for e in (0, 2):
        assert np.array_equal(solo[e].acc_matrix, ens[e].acc_matrix, equal_nan=True)
