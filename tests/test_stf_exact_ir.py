"""STF (issue 30 item 13): Table 1's Av. IR is information retention (Cai et al. 2021: accuracy on the
observations seen so far) "averaged over the entire stream": after every minibatch, on every past
observation, averaged over all steps. Pinned by hand with a predictor whose accuracy is computable
from the labels alone; the sampled estimate (eval_points x retention_samples) stays as an option."""
import numpy as np
import pytest
import torch

import clharness.engine.runner  # noqa: F401
from clharness.benchmarks.stf.kind import StreamPrefix
from clharness.data import BUILTIN_SOURCES as DATASETS
from clharness.engine.scenario import build_scenario
from clharness.engine.suites import SuiteError, load_suite, spec_definition
from clharness.method import Context, Method, Setting
from clharness.results import RunRecord

SUITE = """
[suite]
name = "s"
[defaults]
kind = "stf"
dataset = "digits"
setting = "online"
tasks = 5
stream_batch = 10
eval_points = 4

[[scenario]]
name = "a"
{extra}
"""


class Majority(Method):
    """Predicts the most frequent label observed so far (first of equals); counts consolidate() calls."""
    name = "majority"
    settings = {Setting.ONLINE}

    def __init__(self, context):
        super().__init__(context)
        self.counts, self.consolidated = torch.zeros(context.num_classes), 0

    def observe(self, batch):
        self.counts += torch.bincount(batch.y, minlength=len(self.counts))

    def consolidate(self):
        self.consolidated += 1

    def predict(self, x, task_id=None):
        return self.counts.expand(len(x), -1).clone()


def _run(tmp_path, extra=""):
    path = tmp_path / "s.toml"
    path.write_text(SUITE.format(extra=extra))
    spec = load_suite(path).scenarios[0]
    scenario = build_scenario(spec, DATASETS, 0, torch.device("cpu"))
    method = Majority(Context(Setting.ONLINE, scenario.num_classes, scenario.input_shape))
    record, progress = RunRecord("s", "a", "majority", 0), []
    scenario.protocol(method, scenario, torch.device("cpu"), record, lambda k, n, unit: progress.append((k, n, unit)))
    return scenario, method, record, progress


def _ir_at(labels, step, b=10):
    """Accuracy of the majority-so-far predictor on the first min(step*b, n) stream labels."""
    past = labels[:min(step * b, len(labels))]
    return float((past == np.bincount(past, minlength=10).argmax()).mean())


def test_av_ir_is_the_mean_over_every_step_of_accuracy_on_all_past_observations(tmp_path):
    scenario, method, record, progress = _run(tmp_path)
    labels = scenario.stream_labels
    steps = int(np.ceil(len(labels) / 10))
    assert steps == 126
    by_hand = np.mean([_ir_at(labels, t) for t in range(1, steps + 1)])
    assert record.metrics["info_retention"] == pytest.approx(by_hand, abs=1e-12)
    # not the 4-point average of earlier versions
    four = np.mean([_ir_at(labels, t) for t in scenario.eval_steps()])
    assert abs(four - by_hand) > 1e-3
    # the curve keeps eval_points of the per-step values; consolidate() before every evaluation + the test
    assert record.extra["info_retention"] == pytest.approx([_ir_at(labels, t) for t in scenario.eval_steps()])
    assert len(progress) == 4 and progress[-1] == (len(scenario.stream_labels) - 1, len(scenario.stream_labels),
                                                   "instances") and method.consolidated == steps + 1


def test_sampled_option_is_the_per_point_estimate(tmp_path):
    scenario, method, record, _ = _run(tmp_path, 'retention = "sampled"\nretention_samples = 0')
    labels = scenario.stream_labels
    assert record.metrics["info_retention"] == pytest.approx(np.mean([_ir_at(labels, t) for t in scenario.eval_steps()]))
    assert method.consolidated == 4 + 1
    # eval_points moves the sampled estimate but not the exact value
    _, _, exact4, _ = _run(tmp_path)
    _, _, exact7, _ = _run(tmp_path, "eval_points = 7")
    assert exact4.metrics["info_retention"] == exact7.metrics["info_retention"]
    _, _, sampled7, _ = _run(tmp_path, 'retention = "sampled"\nretention_samples = 0\neval_points = 7')
    assert sampled7.metrics["info_retention"] != pytest.approx(record.metrics["info_retention"], abs=1e-6)


def test_retention_option_is_checked_and_old_sampled_keys_stay(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(SUITE.format(extra='retention = "every"'))
    with pytest.raises(SuiteError, match="retention = 'every'"):
        load_suite(path)
    path.write_text(SUITE.format(extra='retention = "sampled"'))
    assert "retention" not in spec_definition(load_suite(path).scenarios[0])["options"]
    path.write_text(SUITE.format(extra=""))
    assert spec_definition(load_suite(path).scenarios[0])["options"]["retention"] == "exact"


def test_stream_prefix_yields_exactly_the_first_n_in_order():
    class Data:
        labels = torch.arange(25)

        def batches(self, bs):
            for i in range(0, 25, bs):
                yield self.labels[i:i + bs].float(), self.labels[i:i + bs]
    prefix = StreamPrefix(Data(), 13)
    got = torch.cat([y for _, y in prefix.batches(5)])
    assert len(prefix) == 13 and got.tolist() == list(range(13))


class Noisy(Majority):
    """Draws from the global generators in consolidate() and predict(): an evaluation that left those
    draws in the training's streams would move what ``observe`` draws next."""
    name = "noisy"

    def observe(self, batch):
        self.counts += torch.bincount(batch.y, minlength=len(self.counts)) * torch.rand(1)

    def consolidate(self):
        torch.rand(3), np.random.rand(3)

    def predict(self, x, task_id=None):
        torch.rand(1)
        return super().predict(x)


def test_how_often_retention_is_scored_never_moves_the_training(tmp_path):
    """Exact Av. IR scores after every step, the sampled one at 4 points: the learner sees the same
    draws either way (evaluation runs on forked random streams), so its final state is the same."""
    finals = {}
    for mode in ("exact", "sampled"):
        path = tmp_path / f"{mode}.toml"
        path.write_text(SUITE.format(extra=f'retention = "{mode}"'))
        spec = load_suite(path).scenarios[0]
        scenario = build_scenario(spec, DATASETS, 0, torch.device("cpu"))
        method = Noisy(Context(Setting.ONLINE, scenario.num_classes, scenario.input_shape))
        torch.manual_seed(0)
        scenario.protocol(method, scenario, torch.device("cpu"), RunRecord("s", "a", "noisy", 0))
        finals[mode] = method.counts.clone()
    assert torch.equal(finals["exact"], finals["sampled"])
