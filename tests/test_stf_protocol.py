"""The "stf" scenario kind and its online protocol, and the stf-digits suite end to end."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import clharness.engine.runner  # noqa: F401  (pytester runs share one torch import)
import clharness.reporting.scorecard  # noqa: F401
import clharness_methods  # noqa: F401
import sklearn.datasets  # noqa: F401
import sklearn.model_selection  # noqa: F401
from clharness.benchmarks.stf import streams
from clharness.data import BUILTIN_SOURCES as DATASETS
from clharness.method import Method, Setting
from clharness.results import RunRecord
from clharness.engine.scenario import build_scenario
from clharness.engine.suites import SuiteError, load_suite

REPO = Path(__file__).parent.parent

SUITE = """
[suite]
name = "s"
[defaults]
kind = "stf"
dataset = "digits"
setting = "online"
tasks = 5

[[scenario]]
name = "a"
{extra}
"""


def _spec(tmp_path, extra=""):
    path = tmp_path / "s.toml"
    path.write_text(SUITE.format(extra=extra))
    return load_suite(path).scenarios[0]


def _build(spec, seed=0):
    return build_scenario(spec, DATASETS, seed, torch.device("cpu"))


class Recorder(Method):
    """Counts what the protocol hands over; predicts the most frequent label seen so far."""
    name = "recorder"
    settings = {Setting.ONLINE}

    def __init__(self, context):
        super().__init__(context)
        self.batches, self.counts = [], torch.zeros(context.num_classes)

    def observe(self, batch):
        self.batches.append((len(batch.y), batch.task_id, batch.y.clone()))
        self.counts += torch.bincount(batch.y, minlength=len(self.counts))

    def predict(self, x, task_id=None):
        return self.counts.expand(len(x), -1).clone()


def test_stream_is_the_train_split_in_stf_order(tmp_path):
    spec = _spec(tmp_path)
    a, b = _build(spec), _build(spec)
    assert a.setting is Setting.ONLINE and a.tasks == [] and a.num_classes == 10
    assert np.array_equal(a.stream_labels, b.stream_labels)                 # deterministic per seed
    assert not np.array_equal(a.stream_labels, _build(spec, seed=1).stream_labels)
    assert len(a.stream_labels) == len(a.stream) == 1257
    assert torch.equal(a.stream.labels, torch.from_numpy(a.stream_labels))
    # mu_sigma = sqrt(1/12)/5: the class distributions are concentrated, so the stream is far from iid
    freq = streams.chunk_frequencies(a.stream_labels, 10, chunks=20)
    assert freq.max(1).mean() > 0.3
    assert a.class_sigma.shape == (10,)


def test_disjoint_stream_has_task_blocks(tmp_path):
    s = _build(_spec(tmp_path, 'stream = "disjoint"'))
    task = s.stream_labels // 2          # global ids follow the class order: task k = classes 2k, 2k+1
    assert np.all(np.diff(task) >= 0) and np.array_equal(np.unique(task), np.arange(5))
    first = s.stream_labels[task == 0]
    assert 0.3 < (first == 0).mean() < 0.7          # shuffled within the task, not sorted by class


def test_protocol_observes_minibatches_and_scores_past_and_test(tmp_path):
    spec = _spec(tmp_path, "eval_points = 4\nstream_batch = 10\nretention_samples = 50")
    scenario = _build(spec)
    from clharness.method import Context
    method = Recorder(Context(Setting.ONLINE, scenario.num_classes, scenario.input_shape))
    record, seen = RunRecord("s", "a", "recorder", 0), []
    scenario.protocol(method, scenario, torch.device("cpu"), record, lambda k, n, unit: seen.append((k, n, unit)))
    sizes = [n for n, _, _ in method.batches]
    assert sizes == [10] * 125 + [7] and all(t is None for _, t, _ in method.batches)
    assert torch.equal(torch.cat([y for _, _, y in method.batches]), torch.from_numpy(scenario.stream_labels))
    # progress in the stream's unit: instances seen (of 1257) at each retention point
    assert seen == [(319, 1257, "instances"), (629, 1257, "instances"), (949, 1257, "instances"),
                    (1256, 1257, "instances")] and scenario.eval_steps() == [32, 63, 95, 126]
    # the majority-label predictor: its test accuracy is the test share of the stream's majority class
    majority = int(np.bincount(scenario.stream_labels).argmax())
    expected = float((scenario.test.labels == majority).float().mean())
    assert record.metrics["final_acc"] == pytest.approx(expected)
    assert 0 < record.metrics["info_retention"] <= 1   # a sample of 50: the exact value is pinned below
    assert record.failed_task == 125 and record.acc_matrix == []


def test_info_retention_is_the_mean_accuracy_on_past_stream_observations(tmp_path):
    """Cai et al. 2021's information retention: at each evaluation point, accuracy on the stream
    instances observed so far (retention_samples = 0: all of them), averaged over the points; never
    the test split. The majority-so-far predictor makes it computable by hand."""
    # retention = "sampled": the per-point estimate (the paper's exact Av. IR: tests/test_stf_exact_ir.py)
    spec = _spec(tmp_path, "eval_points = 4\nstream_batch = 10\nretention_samples = 0\nretention = \"sampled\"")
    scenario = _build(spec)
    from clharness.method import Context
    method = Recorder(Context(Setting.ONLINE, scenario.num_classes, scenario.input_shape))
    record = RunRecord("s", "a", "recorder", 0)
    scenario.protocol(method, scenario, torch.device("cpu"), record)
    labels, per_point = scenario.stream_labels, []
    for step in scenario.eval_steps():
        past = labels[:min(step * 10, len(labels))]
        per_point.append(float((past == np.bincount(past, minlength=10).argmax()).mean()))
    assert record.metrics["info_retention"] == pytest.approx(np.mean(per_point))
    # the same predictor on the test split scores differently (so the two cannot be confused)
    test = scenario.test.labels.numpy()
    on_test = [float((test == np.bincount(labels[:min(s * 10, len(labels))], minlength=10).argmax()).mean())
               for s in scenario.eval_steps()]
    assert abs(np.mean(on_test) - np.mean(per_point)) > 0.05


def test_bad_scenario_values_name_value_and_range(tmp_path):
    with pytest.raises(SuiteError, match=r"mu_sigma = 0.7 is outside \(0, 0.5\]"):
        _spec(tmp_path, "mu_sigma = 0.7")
    with pytest.raises(SuiteError, match=r"mu_sigma = 0 is outside \(0, 0.5\]"):
        _spec(tmp_path, "mu_sigma = 0")
    with pytest.raises(SuiteError, match=r"mu_sigma = 0.6 is outside"):
        _spec(tmp_path, "mu_sigma = 0.3\nmu_sigma_scale = 2.0")
    with pytest.raises(SuiteError, match="stream = 'iid'; allowed values: stf, disjoint"):
        _spec(tmp_path, 'stream = "iid"')
    with pytest.raises(SuiteError, match="increment do.es. not apply to an stf stream"):
        _spec(tmp_path, "increment = 2")
    with pytest.raises(SuiteError, match='use setting = "online"'):
        _spec(tmp_path, 'setting = "class-incremental"')
    with pytest.raises(Exception, match=r"stream_batch = 5000 is larger than the stream \(1257 instances\)"):
        _build(_spec(tmp_path, "stream_batch = 5000"))
    with pytest.raises(Exception, match="num_classes = 1; .* a stream needs at least 2"):
        _build(_spec(tmp_path, "num_classes = 1"))


def test_mu_sigma_from_tasks_and_scale(tmp_path):
    from clharness.benchmarks.stf.kind import mu_sigma
    assert mu_sigma(_spec(tmp_path, "mu_sigma_scale = 2.0")) == pytest.approx(2 * (1 / 12) ** 0.5 / 5)
    assert mu_sigma(_spec(tmp_path, "mu_sigma = 0.1")) == pytest.approx(0.1)


def test_stf_digits_suite_end_to_end(pytester, tmp_path):
    card = tmp_path / "card.json"
    result = pytester.runpytest("-p", "no:cacheprovider", "--clh-suite", "stf-digits", "--clh-quick",
                                "--clh-method", "er", "--clh-seeds", "1", "--clh-scorecard", str(card),
                                "--clh-results", str(tmp_path / "r.sqlite"), "-v")
    result.assert_outcomes(passed=2)
    records = json.loads(card.read_text())["records"]
    assert [(r["scenario"], r["status"]) for r in records] == [("stf", "passed"), ("disjoint", "passed")]
    for r in records:
        assert 0.3 < r["metrics"]["final_acc"] <= 1 and 0.3 < r["metrics"]["info_retention"] <= 1
    result.stdout.fnmatch_lines(["*stf-digits::stf*er*1*"])


def test_cpu_threads_apply_while_streaming_and_are_restored(tmp_path):
    scenario = _build(_spec(tmp_path, "cpu_threads = 1\neval_points = 1"))
    from clharness.method import Context
    method = Recorder(Context(Setting.ONLINE, scenario.num_classes, scenario.input_shape))
    threads = []
    method.observe = lambda batch: threads.append(torch.get_num_threads())
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        scenario.protocol(method, scenario, torch.device("cpu"), RunRecord("s", "a", "recorder", 0))
        assert set(threads) == {1} and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(old)
    with pytest.raises(SuiteError, match="cpu_threads = -1 must be >= 0"):
        _spec(tmp_path, "cpu_threads = -1")


def test_consolidate_runs_before_every_evaluation_and_counts_as_training(tmp_path):
    """GDumb-like methods retrain in consolidate(); the protocol calls it once before each
    evaluation point and before the final test, so no predict() ever meets unconsolidated state."""
    scenario = _build(_spec(tmp_path, "eval_points = 4\nretention = \"sampled\""))   # exact: every step
    from clharness.method import Context
    method = Recorder(Context(Setting.ONLINE, scenario.num_classes, scenario.input_shape))
    calls = []
    observe, predict = method.observe, method.predict
    method.observe = lambda batch: (calls.append("observe"), observe(batch))
    method.consolidate = lambda: calls.append("consolidate")
    method.predict = lambda x, task_id=None: (calls.append("predict"), predict(x))[1]
    scenario.protocol(method, scenario, torch.device("cpu"), RunRecord("s", "a", "recorder", 0))
    assert calls.count("consolidate") == 4 + 1
    for i, call in enumerate(calls):
        if call == "predict":   # the last call before the predictions that is not a predict
            assert next(c for c in reversed(calls[:i]) if c != "predict") == "consolidate"
