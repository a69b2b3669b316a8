"""The runner guards the protocol and fills the accuracy matrix the metrics rely on."""
import numpy as np
import pytest
import torch

import clharness as clh
from clharness.engine.runner import Case, run_case
from clharness.engine.suites import ScenarioSpec

import plugin_methods


@pytest.fixture(scope="module")
def harness():
    h = clh.Harness()
    h.register(plugin_methods)
    return h


def spec(**kw):
    base = dict(name="s", dataset="digits", tasks=5, epochs=2, backbone="mlp",
                backbone_options={"hidden": 32, "layers": 1})
    return ScenarioSpec(**{**base, **kw})


@pytest.mark.parametrize("setting", ["class-incremental", "task-incremental"])
def test_method_sees_train_data_once_in_order_and_task_ids_only_in_task_il(harness, setting):
    plugin_methods.Spy.log.clear()
    record = run_case(Case("t", spec(setting=setting), "spy", 0), harness, torch.device("cpu"))
    assert record.status == "passed", record.message
    log = plugin_methods.Spy.log
    assert [e["classes"] for e in log] == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)]
    assert [e["labels"] for e in log] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    expected_ids = [None] * 5 if setting == "class-incremental" else [0, 1, 2, 3, 4]
    assert [e["task_id"] for e in log] == expected_ids
    # Train sizes: digits' 70% stratified train split (1,257 images), never its 540 test images.
    assert sum(e["n"] for e in log) == 1257 and sum(record.task_sizes) == 540


def test_accuracy_matrix_is_full_and_task_il_masks_to_the_task(harness):
    ci = run_case(Case("t", spec(), "tiny", 0), harness, torch.device("cpu"))
    ti = run_case(Case("t", spec(setting="task-incremental"), "tiny", 0), harness, torch.device("cpu"))
    R_ci, R_ti = np.array(ci.acc_matrix), np.array(ti.acc_matrix)
    assert R_ci.shape == R_ti.shape == (5, 5) and not np.isnan(R_ci).any()
    # Class-incremental fine-tuning: future tasks' classes are never predicted before training,
    # and the last task dominates the final row.
    assert np.all(R_ci[np.triu_indices(5, 1)] == 0.0)
    assert R_ci[4, 4] > 0.9 and R_ci[4, :4].mean() < 0.2
    # Task-incremental: the choice is between two classes, so accuracy stays far above chance.
    assert R_ti[4].mean() > 0.75
    assert ci.metrics["final_acc"] == pytest.approx(np.average(R_ci[4], weights=ci.task_sizes))


def test_same_seed_same_result_other_seed_other_class_order(harness):
    a = run_case(Case("t", spec(), "tiny", 3), harness, torch.device("cpu"))
    b = run_case(Case("t", spec(), "tiny", 3), harness, torch.device("cpu"))
    c = run_case(Case("t", spec(), "tiny", 4), harness, torch.device("cpu"))
    assert a.acc_matrix == b.acc_matrix and a.class_order == b.class_order and a.key == b.key
    assert a.class_order != c.class_order and a.key != c.key


def test_unequal_first_task_and_validation_split(harness):
    record = run_case(Case("t", spec(tasks=None, first_task=4, increment=2, validation=0.2), "spy", 0),
                      harness, torch.device("cpu"))
    assert record.status == "passed"
    assert [len(e["classes"]) for e in plugin_methods.Spy.log[-4:]] == [4, 2, 2, 2]
    assert sum(e["n"] for e in plugin_methods.Spy.log[-4:]) == pytest.approx(1257 * 0.8, abs=10)


def test_bad_split_and_missing_data_are_errors_not_crashes(harness, tmp_path):
    bad = run_case(Case("t", spec(tasks=3), "tiny", 0), harness, torch.device("cpu"))
    assert bad.status == "error" and "10 classes do not split into 3 equal tasks" in bad.message
    missing = run_case(Case("t", spec(dataset="cifar10"), "tiny", 0), harness, torch.device("cpu"),
                       data_root=tmp_path)
    assert missing.status == "error"
    assert str(tmp_path) in missing.message and "--clh-data-root" in missing.message


def test_memory_and_time_are_recorded(harness):
    record = run_case(Case("t", spec(), "tiny", 0), harness, torch.device("cpu"))
    params = 64 * 32 + 32 + 32 * 10 + 10
    assert record.parameters == params
    assert record.memory_mb == pytest.approx(4 * params / 2**20)
    assert record.train_seconds > 0 and record.eval_seconds > 0 and record.peak_rss_mb > 0


class Memorizer(clh.Method):
    """Predicts the stored label of a training image it has seen, class 0 for any other image:
    accuracy 1 on train data, the share of class 0 (plus exact duplicates) on unseen test data."""
    name = "memorizer"

    def __init__(self, context, **hp):
        super().__init__(context, **hp)
        self.x, self.y = torch.empty(0, 64), torch.empty(0, dtype=torch.long)

    def learn(self, experience):
        for x, y in experience.batches(epochs=1):
            self.x, self.y = torch.cat([self.x, x.flatten(1)]), torch.cat([self.y, y])

    def predict(self, x, task_id=None):
        dist, nearest = torch.cdist(x.flatten(1), self.x).min(1)
        logits = torch.zeros(len(x), self.context.num_classes)
        hit = dist < 0.05   # the same image (normalised on two code paths, rounding differs by < 0.01)
        logits[hit, self.y[nearest[hit]]] = 1.0
        return logits


def test_accuracy_matrix_scores_each_task_on_its_test_split_not_its_train_split(harness):
    from clharness.method import Context
    from clharness.results import RunRecord
    from clharness.engine.runner import accuracy, task_protocol
    from clharness.engine.scenario import build_scenario
    scenario = build_scenario(spec(), harness.datasets, 0, torch.device("cpu"))
    method = Memorizer(Context(scenario.setting, scenario.num_classes, scenario.input_shape))
    record = RunRecord("t", "s", "memorizer", 0)
    task_protocol(method, scenario, torch.device("cpu"), record)
    R = np.array(record.acc_matrix)
    for j, task in enumerate(scenario.tasks):   # what the matrix must hold, by hand
        train = accuracy(method, task.train, None, scenario.num_classes, torch.device("cpu"), "end")
        assert train == 1.0                    # it memorised the train split ...
        correct = n = 0
        for x, y in task.test.batches(64):
            correct += int((method.predict(x).argmax(1) == y).sum())
            n += len(y)
        assert R[4, j] == pytest.approx(correct / n)   # ... and R holds its test accuracy
    assert R[np.tril_indices(5)].max() <= 0.55   # 0.5 on the task holding class 0, 0 elsewhere; 1.0 on train data


def test_record_key_changes_when_the_method_version_is_bumped(monkeypatch):
    """A version bump must redo stored runs: the version is part of the content hash."""
    from clharness.engine.runner import case_key
    case = Case("t", spec(), "tiny", 0, {"lr": 0.1})
    before = case_key(case, plugin_methods.Tiny)
    assert case_key(case, plugin_methods.Tiny) == before          # deterministic
    assert case_key(Case("t", spec(), "tiny", 0, {"lr": 0.2}), plugin_methods.Tiny) != before   # hparams too
    monkeypatch.setattr(plugin_methods.Tiny, "version", "2")
    assert case.definition(plugin_methods.Tiny, {})["method_version"] == "2"
    assert case_key(case, plugin_methods.Tiny) != before


def test_record_notes_the_cpu_threads_of_the_run_outside_its_key(harness):
    """CPU sums split by thread, so the record says how many there were; the key stays the case's."""
    from clharness.results import RunRecord
    from clharness.engine.runner import case_key
    case = Case("t", spec(), "tiny", 0, {"lr": 0.1})
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run_case(case, harness, torch.device("cpu"))
    finally:
        torch.set_num_threads(before)
    assert one.cpu_threads == 1 and one.key == case_key(case, plugin_methods.Tiny)
    assert RunRecord.from_json(one.to_json()).cpu_threads == 1


def test_task_il_accuracy_matrix_scores_each_task_on_its_test_split_too(harness):
    """The task-incremental path (runner.evaluate, not the class-IL views): the same memoriser scores 1.0
    on every train split and chance-or-below on the test splits it never saw; R must hold the latter."""
    from clharness.method import Context
    from clharness.results import RunRecord
    from clharness.engine.runner import accuracy, task_protocol
    from clharness.engine.scenario import build_scenario
    scenario = build_scenario(spec(setting="task-incremental"), harness.datasets, 0, torch.device("cpu"))
    method = Memorizer(Context(scenario.setting, scenario.num_classes, scenario.input_shape))
    record = RunRecord("t", "s", "memorizer", 0)
    task_protocol(method, scenario, torch.device("cpu"), record)
    R = np.array(record.acc_matrix)
    for j, task in enumerate(scenario.tasks):
        assert accuracy(method, task.train, task.classes, scenario.num_classes, torch.device("cpu"), "end", j) == 1.0
    assert R[np.tril_indices(5)].max() <= 0.55   # each task's unseen test images: its first class by default
