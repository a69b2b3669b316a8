"""The reference methods on the quickstart setup (digits, MLP, 5 tasks x 2 classes, batch 32,
memory 200): accuracy ordering, task-incremental and online runs, state handling, memory."""
import math

import numpy as np
import pytest
import torch

import clharness as clh
from clharness.toolkit.backbones import MLP
from clharness.data.base import TensorData
from clharness.data.bundled import Digits
from clharness.toolkit.training import SupervisedMethod, Trainer, make_optimizer
from clharness_methods import REFERENCE_METHODS

METHODS = {cls.name: cls for cls in REFERENCE_METHODS}
# The quickstart's six methods, compared here; the others have their own test modules
# (test_stf_methods, test_m2i_methods, test_ptm_methods) and share the state tests below.
QUICKSTART = ("finetune", "joint", "er", "ewc", "lwf", "ncm")
EPOCHS = 5
SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def digits():
    src = Digits()
    train, test = src.load(None, True), src.load(None, False)
    return train, test, train.channel_stats()


def split(digits, seed, setting=clh.Setting.CLASS_IL):
    """5 tasks x 2 classes in a seed-shuffled class order: (task classes, experiences, test data)."""
    train, test, (mean, std) = digits
    order = torch.randperm(10, generator=torch.Generator().manual_seed(seed)).tolist()
    tasks = [tuple(order[2 * t:2 * t + 2]) for t in range(5)]
    def part(ds, classes):
        return TensorData(ds.subset(torch.isin(ds.labels, torch.tensor(classes)).nonzero().squeeze(1)), mean, std)
    exps = [clh.Experience(part(train, c), c, t if setting is clh.Setting.TASK_IL else None, 32, 1000 * seed + t)
            for t, c in enumerate(tasks)]
    return tasks, exps, [part(test, c) for c in tasks]


def context(seed, setting=clh.Setting.CLASS_IL, tasks=(), epochs=EPOCHS):
    return clh.Context(setting, 10, (1, 8, 8), seed=seed, epochs=epochs, batch_size=32, memory_size=200,
                       backbone_factory=lambda: MLP((1, 8, 8)),
                       task_classes=tuple(tasks) if setting is clh.Setting.TASK_IL else ())


def accuracy(method, tasks, tests, task_il=False):
    correct = total = 0
    for t, data in enumerate(tests):
        for x, y in data.batches(512):
            logits = method.predict(x, task_id=t if task_il else None)
            assert logits.shape == (len(x), 10) and torch.isfinite(logits).all()
            if task_il:
                classes = torch.tensor(tasks[t])
                pred = classes[logits[:, classes].argmax(1)]
            else:
                pred = logits.argmax(1)
            correct += int((pred == y).sum())
            total += len(y)
    return correct / total


def run(name, digits, seed, setting=clh.Setting.CLASS_IL, **hp):
    tasks, exps, tests = split(digits, seed, setting)
    torch.manual_seed(seed)
    method = METHODS[name](context(seed, setting, tasks), **hp)
    for exp in exps:
        method.learn(exp)
    return accuracy(method, tasks, tests, task_il=setting is clh.Setting.TASK_IL)


@pytest.fixture(scope="module")
def class_il_accuracy(digits):
    acc = {name: [run(name, digits, s) for s in SEEDS] for name in QUICKSTART}
    print("\nclass-incremental final accuracy (mean over seeds):",
          {k: round(float(np.mean(v)), 3) for k, v in acc.items()})
    return {k: float(np.mean(v)) for k, v in acc.items()}


def test_reference_methods_are_registered_through_the_hook():
    harness = clh.Harness(entry_points=False)
    assert set(QUICKSTART) <= set(harness.methods)
    for name, cls in METHODS.items():
        assert harness.methods[name] is cls
        # MSTE (one expert per task) and PNN (one column per task) need the task id by definition:
        # task-incremental only.
        settings = {clh.Setting.TASK_IL} if name in ("mste", "pnn") else {clh.Setting.CLASS_IL, clh.Setting.TASK_IL}
        assert settings <= set(cls.settings), name
        if issubclass(cls, SupervisedMethod):   # trained by gradient: a declared learning rate
            assert "lr" in cls.hparams, name


def test_class_incremental_ordering(class_il_accuracy):
    acc = class_il_accuracy
    assert acc["joint"] > acc["er"] > acc["finetune"]
    assert acc["finetune"] < 0.35          # forgets: only the last task's classes survive
    assert acc["joint"] > 0.8
    assert acc["er"] > 0.7


@pytest.mark.parametrize("name", ["ewc", "lwf", "ncm"])
def test_regularisation_and_prototype_methods_beat_chance(class_il_accuracy, name):
    assert class_il_accuracy[name] > 0.25       # chance is 0.1; finetune sits at ~0.2
    if name == "ncm":
        assert class_il_accuracy[name] > 0.7


def test_task_incremental(digits):
    acc = {name: run(name, digits, 0, clh.Setting.TASK_IL) for name in QUICKSTART}
    print("\ntask-incremental final accuracy (seed 0):", {k: round(v, 3) for k, v in acc.items()})
    assert all(a > 0.8 for a in acc.values()), acc
    assert acc["er"] > acc["finetune"] and acc["lwf"] > acc["finetune"] and acc["ewc"] > acc["finetune"], acc


@pytest.mark.parametrize("name", ["finetune", "er"])
def test_online_stream(digits, name):
    tasks, exps, tests = split(digits, 0)
    torch.manual_seed(0)
    method = METHODS[name](clh.Context(clh.Setting.ONLINE, 10, (1, 8, 8), batch_size=10, memory_size=200,
                                       backbone_factory=lambda: MLP((1, 8, 8))))
    assert clh.Setting.ONLINE in METHODS[name].settings
    for exp in exps:
        for batch in exp.batches(batch_size=10):
            method.observe(clh.Batch(batch.x, batch.y))
    acc = accuracy(method, tasks, tests)
    if name == "er":
        assert len(method.buffer) == 200 and acc > 0.6
    else:
        assert acc < 0.35


def _predictions(method, tests):
    return torch.cat([method.predict(x) for data in tests for x, _ in data.batches(512)])


# The ViT-prompting methods need a ViT (no MLP): their clone tests are in tests/test_ptm_methods.py
# (L2P, DualPrompt) and tests/test_ptm_new_methods.py (the rest)
VIT_ONLY = {"l2p", "dualprompt", "aper", "coda_prompt", "ease", "hide_prompt", "lae", "pgp"}
SMALL = {"ranpac": {"projection_dim": 256}}   # M = 10,000 by default: a 10k x 10k solve per task


@pytest.mark.parametrize("name", sorted(set(METHODS) - VIT_ONLY))
def test_snapshot_restore_and_clone(digits, name):
    tasks, exps, tests = split(digits, 0)
    torch.manual_seed(0)
    method = METHODS[name](context(0, epochs=2), **SMALL.get(name, {}))
    method.learn(exps[0])
    after_1 = _predictions(method, tests)
    snap = method.snapshot()
    method.learn(exps[1])
    after_2 = _predictions(method, tests)
    assert not torch.equal(after_1, after_2) or name == "ncm"

    method.restore(snap)
    assert torch.equal(_predictions(method, tests), after_1)
    method.learn(exps[1])                  # the snapshot carries the full state: same future
    assert torch.equal(_predictions(method, tests), after_2)

    method.restore(snap)
    twin = method.clone()
    twin.learn(exps[1])
    assert torch.equal(_predictions(method, tests), after_1)   # the original is untouched
    assert torch.equal(_predictions(twin, tests), after_2)
    method.restore(snap)                   # the snapshot itself is not consumed by restore
    assert torch.equal(_predictions(method, tests), after_1)


def test_memory_report_counts_exemplars_and_stored_data(digits):
    tasks, exps, _ = split(digits, 0)
    er = METHODS["er"](context(0, epochs=1))
    joint = METHODS["joint"](context(0, epochs=1))
    params = sum(p.numel() for p in er.model.parameters())
    seen = 0
    for exp in exps:
        er.learn(exp)
        joint.learn(exp)
        seen += len(exp)
        report = er.memory_report()
        assert report.exemplars == min(200, seen) and report.exemplar_bytes == report.exemplars * 64
        assert report.parameters == params
        report = joint.memory_report()
        assert report.exemplars == seen and report.exemplar_bytes == seen * 64
    finetune = METHODS["finetune"](context(0))
    assert finetune.memory_report().exemplars == 0
    lwf = METHODS["lwf"](context(0, epochs=1))
    lwf.learn(exps[0])
    assert lwf.memory_report().parameters == 2 * params      # the previous model is stored too
    ewc = METHODS["ewc"](context(0, epochs=1))
    ewc.learn(exps[0])
    assert ewc.memory_report().tensor_elements == 2 * params  # Fisher diagonal + anchor weights


def test_ncm_logits_are_finite_for_unseen_classes(digits):
    tasks, exps, tests = split(digits, 0)
    for mode in ("first-task", "frozen"):
        torch.manual_seed(0)
        ncm = METHODS["ncm"](context(0, epochs=1), train_backbone=mode)
        before = [p.detach().clone() for p in ncm.model.parameters()]
        ncm.learn(exps[0])
        changed = any(not torch.equal(a, p) for a, p in zip(before, ncm.model.parameters()))
        assert changed == (mode == "first-task")
        frozen = [p.detach().clone() for p in ncm.model.parameters()]
        ncm.learn(exps[1])
        assert all(torch.equal(a, p) for a, p in zip(frozen, ncm.model.parameters()))
        logits = ncm.predict(next(tests[0].batches(64))[0])
        seen = list(tasks[0] + tasks[1])
        unseen = [c for c in range(10) if c not in seen]
        assert torch.isfinite(logits).all()
        assert (logits[:, unseen] < logits[:, seen].min()).all()


def test_hyperparameters_are_validated():
    with pytest.raises(clh.HParamError, match=r"'lr'=5.0 is outside \[0.0001, 1.0\]"):
        METHODS["er"](context(0), lr=5.0)
    with pytest.raises(clh.HParamError, match=r"method 'ewc': unknown hyperparameter\(s\) \['no_such_thing'\]; "
                                                r"declared: \['ewc_fisher', 'ewc_lambda', 'ewc_mode', 'lr'"):
        METHODS["ewc"](context(0), no_such_thing=1)
    er = METHODS["er"](context(0), buffer="reservoir", optimizer="adam", lr=1e-3)
    assert "momentum" not in er.hp                      # only active for SGD
    assert type(er.buffer).__name__ == "ReservoirBuffer"


def test_non_finite_loss_raises_a_method_error(digits):
    model = torch.nn.Linear(3, 2)
    trainer = Trainer("mine", make_optimizer(model.parameters(), "sgd", 0.1), context(0))
    trainer.step(lambda x: model(x).pow(2).mean(), torch.ones(4, 3))
    with pytest.raises(clh.MethodError, match=r"'mine'.*non-finite loss"):
        trainer.step(lambda x: model(x).sum() * math.inf, torch.ones(4, 3))
    with pytest.raises(clh.MethodError, match="non-finite loss"):
        trainer.step(lambda x: model(x).sum() * math.nan, torch.ones(4, 3))
    # a method whose weights went bad surfaces the same error from learn(), before any update
    _, exps, _ = split(digits, 0)
    method = METHODS["finetune"](context(0))
    with torch.no_grad():
        method.model.head.weight[0, 0] = math.inf
    weights = method.model.backbone.net[1].weight.detach().clone()
    with pytest.raises(clh.Diverged, match="'finetune': non-finite loss"):
        method.learn(exps[0])
    assert torch.equal(method.model.backbone.net[1].weight, weights)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="AMP runs on CUDA only")
def test_amp_training_on_cuda(digits):
    tasks, exps, tests = split(digits, 0)
    device = torch.device("cuda")
    train, test, (mean, std) = digits
    exps = [clh.Experience(TensorData(train.subset(torch.isin(train.labels, torch.tensor(c)).nonzero().squeeze(1)),
                                      mean, std, device), c, None, 32, t) for t, c in enumerate(tasks)]
    ctx = context(0)
    ctx.device, ctx.amp = device, True
    method = METHODS["er"](ctx)
    assert Trainer.for_method(method).amp
    for exp in exps:
        method.learn(exp)
    x = next(exps[0].data.batches(64))[0]
    logits = method.predict(x)
    assert logits.dtype == torch.float32 and logits.device.type == "cuda" and torch.isfinite(logits).all()


def test_make_optimizer():
    params = list(torch.nn.Linear(2, 2).parameters())
    assert isinstance(make_optimizer(params, "sgd", 0.1, 0.9, 1e-4), torch.optim.SGD)
    assert isinstance(make_optimizer(params, "adam", 1e-3), torch.optim.Adam)
    assert isinstance(make_optimizer(params, "adamw", 1e-3, weight_decay=0.01), torch.optim.AdamW)
    frozen = torch.nn.Linear(2, 2).requires_grad_(False)
    opt = make_optimizer([*params, *frozen.parameters()], "sgd", 0.1)
    assert len(opt.param_groups[0]["params"]) == 2      # frozen parameters are left out
    with pytest.raises(ValueError, match="unknown optimizer"):
        make_optimizer(params, "lbfgs", 0.1)
