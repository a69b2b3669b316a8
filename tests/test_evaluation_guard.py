"""Evaluation never changes a method, and the contract is checked before training (issue 38 items 4-5).

The runner fingerprints the method's tensors before every evaluation and compares after it
(clharness.state_guard); before the first ``learn`` it calls ``predict`` once on a batch of task 0's
training inputs (engine.contract_check) and checks the logits' shape, dtype and finiteness, leaving the
method, its modules' modes and every random stream as they were.
"""
import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import clharness as clh
import clharness.engine.runner  # noqa: F401  (pytester's in-process runs keep one torch)
import clharness_methods  # noqa: F401
import guard_methods
import sklearn.datasets  # noqa: F401
import sklearn.model_selection  # noqa: F401
from clharness.engine.contract_check import dry_predict
from clharness.engine.runner import Case, isolated_rng, run_case
from clharness.engine.scenario import build_scenario
from clharness.engine.suites import ScenarioSpec
from clharness.state_guard import first_change, fingerprint, unchanged

CPU = torch.device("cpu")
RULE = "evaluation must not change the method; test data must not train it"


@pytest.fixture(scope="module")
def harness():
    h = clh.Harness()
    h.register(guard_methods)
    return h


@pytest.fixture(autouse=True)
def fresh_counts():
    for cls in guard_methods.METHODS:
        cls.learned = 0
    yield


def spec(**kw):
    return ScenarioSpec(**{**dict(name="s", dataset="digits", tasks=5, epochs=1, batch_size=32), **kw})


def run(harness, method, **kw):
    return run_case(Case("t", spec(**kw), method, 0), harness, CPU)


# ------------------------------------------------------------------ item 4: evaluation never trains
def test_a_method_that_keeps_the_rule_passes(harness):
    record = run(harness, "guard-plain")
    assert record.status == "passed", record.message
    assert guard_methods.Plain.learned == 5


def test_a_gradient_step_on_the_test_batch_fails_the_case_naming_the_tensor_and_the_rule(harness):
    record = run(harness, "guard-entropy")
    assert record.status == "failed" and record.failed_task == 0
    assert guard_methods.EntropyMin.learned == 1          # caught at the first evaluation, after task 0
    assert f"predict() changed model.hidden.weight: {RULE}" in record.message


def test_a_method_adapting_from_its_first_call_fails_before_training(harness):
    record = run(harness, "guard-entropy-always")
    assert record.status == "failed" and guard_methods.EntropyMinAlways.learned == 1   # set by predict itself: learn never ran
    assert f"predict() before training changed model.hidden.weight: {RULE}" in record.message
    assert "failed at the check before training" in record.message


def test_batchnorm_in_train_mode_during_predict_is_caught(harness):
    record = run(harness, "guard-bn")
    assert record.status == "failed" and record.failed_task == 0
    # torch updates the running mean and variance inside its kernel (no version bump today); the counter of
    # batches is bumped by Python's += either way
    assert re.search(rf"predict\(\) changed model\.bn\.(running_mean|running_var|num_batches_tracked): {RULE}",
                     record.message), record.message


def test_the_default_predict_runs_the_model_in_eval_mode_and_puts_every_mode_back(harness):
    record = run(harness, "guard-default")      # BatchNorm, model left in train mode by learn()
    assert record.status == "passed", record.message
    method = guard_methods.DefaultPredict(clh.Context(clh.Setting.CLASS_IL, 10, (1, 8, 8)))
    method.model.train()
    method.model.fc.eval()                      # a mixed state, restored module by module
    batches = method.model.bn.num_batches_tracked.item()
    method.predict(torch.randn(4, 1, 8, 8))
    assert method.model.bn.num_batches_tracked.item() == batches
    assert [m.training for m in method.model.modules()] == [True, True, True, False]


def test_task_incremental_evaluation_is_guarded_too(harness):
    record = run(harness, "guard-entropy", setting="task-incremental")   # scored through accuracy(), per task
    assert record.status == "failed" and record.failed_task == 0
    assert f"predict() changed model.hidden.weight: {RULE}" in record.message


def test_continual_evaluation_is_guarded_too(harness):
    record = run(harness, "guard-entropy", eval_every=5)   # scored inside task 0, before its end
    assert record.status == "failed" and record.failed_task == 0 and RULE in record.message


def _method(context_classes=10):
    m = guard_methods.Plain(clh.Context(clh.Setting.CLASS_IL, context_classes, (1, 8, 8)))
    m.model.fc.weight.grad = torch.zeros_like(m.model.fc.weight)
    return m


def test_the_fingerprint_names_parameters_buffers_gradients_optimizer_state_and_attributes():
    m = _method()
    m.fisher = {"fc.weight": torch.ones(3)}
    m.memory = guard_methods.Memory(torch.zeros(4, 64))
    m.model.fc.weight.grad = torch.ones_like(m.model.fc.weight)
    m.opt.step()                              # momentum buffer for fc.weight only (the only gradient)
    names = set(fingerprint(m))
    assert {"model.fc.weight", "model.fc.weight.grad", "model.bn.running_mean", "model.bn.num_batches_tracked",
            "opt.state[model.fc.weight].momentum_buffer", "fisher['fc.weight']", "memory.x"} <= names
    assert "context" not in " ".join(names)


@pytest.mark.parametrize("change, name", [
    (lambda m: setattr(m.model.fc.weight, "data", torch.zeros_like(m.model.fc.weight)),
     "model.fc.weight"),                                                   # replaced storage: the address moves
    (lambda m: m.model.fc.bias.detach().add_(1), "model.fc.bias"),         # in place through an alias: version
    (lambda m: m.model.bn.running_var.mul_(2), "model.bn.running_var"),    # a buffer
    (lambda m: m.model.fc.weight.grad.add_(1), "model.fc.weight.grad"),    # a gradient accumulated
    (lambda m: setattr(m.model.hidden.weight, "grad", torch.ones_like(m.model.hidden.weight)),
     "model.hidden.weight.grad"),                                          # a gradient appears
    (lambda m: m.opt.state[m.model.fc.weight]["momentum_buffer"].add_(1),
     "opt.state[model.fc.weight].momentum_buffer"),                        # optimizer state
    (lambda m: m.memory.x.index_fill_(0, torch.tensor([0]), 1.0), "memory.x"),   # a replay buffer's images
    (lambda m: m.store.append(torch.zeros(1)), "store[1]"),                # test data kept in a list
])
def test_each_kind_of_change_is_caught_and_named(change, name):
    def method():
        m = _method()
        m.model.fc.weight.grad = torch.ones_like(m.model.fc.weight)
        m.opt.step()                          # a momentum buffer for fc.weight
        m.store = [torch.zeros(2)]
        m.memory = guard_methods.Memory(torch.zeros(4, 64))
        return m
    m = method()
    before = fingerprint(m)
    assert first_change(before, fingerprint(m)) is None
    change(m)
    assert first_change(before, fingerprint(m)) == name
    m = method()
    with pytest.raises(clh.MethodError) as caught:
        with unchanged(m):
            change(m)
    assert str(caught.value) == f"predict() changed {name}: {RULE}"


# ------------------------------------------------------------------ item 5: the contract before training
@pytest.mark.parametrize("method, problem", [
    ("guard-shape", "returned shape (32, 3), expected (32, 10)"),
    ("guard-int", "returned dtype torch.int64, expected a floating dtype"),
    ("guard-inf", "returned 1 non-finite logit(s)"),
])
def test_a_broken_predict_fails_before_any_learn_call(harness, method, problem):
    record = run(harness, method)
    cls = next(c for c in guard_methods.METHODS if c.name == method)
    assert cls.learned == 0, "learn() was called before the contract check"
    assert record.status == "failed" and record.failed_task == 0
    assert f"method {method!r}: predict() on a batch of task 0's training inputs, before training, {problem}" \
        in record.message
    assert record.message.count(problem) == 1 and "Traceback" not in record.message


def test_the_dry_predict_leaves_random_streams_modes_and_state_as_they_were(harness):
    scenario = build_scenario(spec(), harness.datasets, 0, CPU)
    method = guard_methods.Drawer(clh.Context(scenario.setting, scenario.num_classes, scenario.input_shape))
    method.model.train()
    torch.manual_seed(5), random.seed(5), np.random.seed(5)
    states = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    before = fingerprint(method)
    dry_predict(method, scenario, CPU, isolated_rng)
    assert torch.equal(torch.get_rng_state(), states[0]) and random.getstate() == states[1]
    assert np.array_equal(np.random.get_state()[1], states[2])
    assert all(m.training for m in method.model.modules())     # predict() switched to eval; put back
    assert first_change(before, fingerprint(method)) is None


def test_without_the_rng_guard_the_draws_would_show(harness):
    """The test above is not vacuous: Drawer's predict does move every stream."""
    scenario = build_scenario(spec(), harness.datasets, 0, CPU)
    method = guard_methods.Drawer(clh.Context(scenario.setting, scenario.num_classes, scenario.input_shape))
    torch.manual_seed(5)
    state = torch.get_rng_state()
    with torch.no_grad():
        method.predict(next(iter(scenario.experience(0).batches(shuffle=False))).x)
    assert not torch.equal(torch.get_rng_state(), state)


MINI = """
[suite]
name = "mini"
seeds = 1

[defaults]
dataset = "digits"
backbone = "mlp"
epochs = 1
tasks = 5

[[scenario]]
name = "ci"
"""


def test_the_error_is_printed_once_without_a_chained_traceback(pytester):
    pytester.syspathinsert(Path(__file__).parent)
    pytester.makefile(".toml", mini=MINI)
    result = pytester.runpytest("-p", "guard_methods", "--clh-suite", str(pytester.path / "mini.toml"),
                                "--clh-method", "guard-shape", "-p", "no:cacheprovider",
                                "-rN")   # no short summary: under CI=true pytest repeats the message there untruncated
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert out.count("returned shape (32, 3), expected (32, 10)") == 1, out
    assert "During handling of the above exception" not in out and "Traceback" not in out
