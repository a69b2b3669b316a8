"""STF ``realtime = true`` (issue 41 item 4; Ghunaim et al., CVPR 2023): a learner whose step costs C
baseline steps (in FLOPs) trains on batches floor(j * C) and lets the others pass unseen, pinned on a
digits stream of 12 batches with methods of known cost."""
import pytest
import torch
import torch.nn.functional as F

import clharness as clh
from clharness.benchmarks.stf.realtime import RealTimeStream, baseline_step_flops
from clharness.data import BUILTIN_SOURCES as DATASETS
from clharness.engine.runner import Case, base_key
from clharness.engine.scenario import build_scenario
from clharness.engine.suites import SuiteError, load_suite, spec_definition
from clharness.method import Context, Method, Setting
from clharness.results import RunRecord
from clharness.toolkit.backbones import MLP

SUITE = """
[suite]
name = "s"
[defaults]
kind = "stf"
dataset = "digits"
setting = "online"
tasks = 5
stream_batch = 10
max_train_per_class = 12
max_test_per_class = 2
eval_points = 3

[[scenario]]
name = "a"
{extra}
"""
BATCHES = 12   # 10 classes x 12 instances in batches of 10


class Repeated(Method):
    """``steps`` plain SGD steps per stream batch on its first ``share`` of rows: a step costs
    steps x share baseline steps (FLOPs are linear in the rows). Logs which rows it was given."""
    name = "repeated"
    settings = {Setting.ONLINE}
    hparams = {"steps": clh.Int(1, 10, default=2), "share": clh.Float(0.1, 1.0, default=1.0)}

    def __init__(self, context, **hp):
        super().__init__(context, **hp)
        self.model = context.make_classifier()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.seen = []

    def observe(self, batch):
        self.seen.append(batch.x.clone())
        x, y = batch.x[:round(len(batch.x) * self.hp["share"])], batch.y[:round(len(batch.y) * self.hp["share"])]
        for _ in range(self.hp["steps"]):
            self.opt.zero_grad()
            F.cross_entropy(self.model(x), y).backward()
            self.opt.step()


def _spec(tmp_path, extra):
    path = tmp_path / "s.toml"
    path.write_text(SUITE.format(extra=extra))
    return load_suite(path).scenarios[0]


def _run(tmp_path, make, extra='realtime = true'):
    """Stream the scenario through ``make(context)``; the stream batch indices it trained on, the record."""
    scenario = build_scenario(_spec(tmp_path, extra), DATASETS, 0, torch.device("cpu"))
    shape = scenario.input_shape
    context = Context(Setting.ONLINE, scenario.num_classes, shape, memory_size=50,
                      backbone_factory=lambda: MLP(shape, hidden=16, layers=1))
    method = make(context)
    record = RunRecord("s", "a", method.name, 0)
    scenario.protocol(method, scenario, torch.device("cpu"), record)
    stream = [x for x, _ in scenario.stream.batches(10)]
    assert len(stream) == BATCHES
    return [next(i for i, s in enumerate(stream) if torch.equal(s, x)) for x in method.seen], record


def _logging(cls):
    class Logged(cls):
        def __init__(self, context, **hp):
            super().__init__(context, **hp)
            self.seen = []

        def observe(self, batch):
            self.seen.append(batch.x.clone())
            super().observe(batch)
    return Logged


def test_a_step_twice_the_baseline_trains_on_every_second_batch(tmp_path):
    seen, record = _run(tmp_path, lambda c: Repeated(c, steps=2))
    assert seen == [0, 2, 4, 6, 8, 10]
    summary = record.extra["realtime"]
    assert summary["baseline"] == "finetune" and summary["batches"] == BATCHES and summary["trained"] == 6
    assert summary["mean_complexity"] == 2.0
    # evaluation as usual: retention over the whole delivered stream, the test accuracy at the end
    assert 0 <= record.metrics["info_retention"] <= 1 and "final_acc" in record.metrics


def test_a_fractional_cost_trains_on_a_fraction_one_over_c_floor_of_j_times_c(tmp_path):
    # 5 steps on half the rows: C = 5/2; the authors' MIR schedule trains 2 of every 5 batches (0, 2)
    seen, _ = _run(tmp_path, lambda c: Repeated(c, steps=5, share=0.5))
    assert seen == [0, 2, 5, 7, 10]
    # 3 steps on 4 of 10 rows: C = 6/5, floor(j * 6/5) = 0, 1, 2, 3, 4, 6, 7, 8, 9, 10 (one batch in six unseen)
    seen, _ = _run(tmp_path, lambda c: Repeated(c, steps=3, share=0.4))
    assert seen == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10]


def test_finetune_sees_every_batch_and_er_pays_for_its_replay(tmp_path):
    methods = clh.Harness().methods
    seen, record = _run(tmp_path, _logging(methods["finetune"]))
    assert seen == list(range(BATCHES)) and record.extra["realtime"]["mean_complexity"] == 1.0
    # ER's first step has an empty memory (cost 1), every later one replays an equal batch (cost 2)
    seen, _ = _run(tmp_path, _logging(methods["er"]))
    assert seen == [0, 1, 3, 5, 7, 9, 11]
    # against the paper's baseline (ER's own step, complexity 1) ER trains on every batch
    seen, _ = _run(tmp_path, _logging(methods["er"]), 'realtime = true\nrealtime_baseline = "er"')
    assert seen == list(range(BATCHES))


def test_without_the_option_every_batch_is_trained_on(tmp_path):
    seen, record = _run(tmp_path, lambda c: Repeated(c, steps=2), "")
    assert seen == list(range(BATCHES)) and "realtime" not in record.extra


class Costs:
    """A learner whose steps cost the given numbers of thirds of a baseline step (one k x 1 matmul is
    2k FLOPs; the baseline is set to 6 FLOPs)."""
    name = "costs"

    def __init__(self, thirds):
        self.thirds = list(thirds)

    def observe(self, batch):
        k = self.thirds.pop(0)
        torch.ones(1, k) @ torch.ones(k, 1)


def test_the_clock_is_exact_and_never_runs_ahead_of_the_stream():
    clock = RealTimeStream("finetune")
    clock.baseline_flops = 6
    learner = Costs([1, 1, 4, 4, 4, 4, 4, 1, 1, 1, 1])
    taken = [i for i in range(11) if clock.offer(learner, None, i)]
    # free at 1/3 -> waits for batch 1 (free at 4/3) -> 2 (10/3) -> 3 (14/3) -> 4 (6): batch 5 passes while
    # it trains -> 6 (22/3) -> 7 (26/3) -> 8 (9) -> 9 (28/3) -> 10: a cheap step never runs ahead
    assert taken == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10]
    assert clock.summary()["trained"] == 10 and clock.flops == 2 * (1 + 1 + 4 * 5 + 1 * 3)


def test_the_option_is_in_the_key_and_checked(tmp_path):
    plain, rt = _spec(tmp_path, ""), _spec(tmp_path, "realtime = true")
    er = _spec(tmp_path, 'realtime = true\nrealtime_baseline = "er"')
    # at their defaults the options stay out of the key: records stored before them keep their keys
    assert "realtime" not in spec_definition(plain)["options"]
    assert "realtime_baseline" not in spec_definition(plain)["options"]
    cls = clh.Harness().methods["finetune"]
    keys = {base_key(Case("s", spec, "finetune", 0), cls) for spec in (plain, rt, er)}
    assert len(keys) == 3
    with pytest.raises(SuiteError, match="realtime_baseline = 'gdumb'"):
        _spec(tmp_path, 'realtime = true\nrealtime_baseline = "gdumb"')
    with pytest.raises(SuiteError, match="realtime = 'yes' must be of type bool"):
        _spec(tmp_path, 'realtime = "yes"')


def test_the_baseline_step_is_hand_counted_and_hidden_from_the_runs_meter():
    """finetune's step on an MLP 48 -> 16 -> head 4, batch 10: forward 2*10*(48*16 + 16*4), backward the
    head's input and weight gradients 2 * 2*10*16*4 and the first layer's weight gradient 2*10*48*16
    (the input needs no gradient). A counter around the run sees none of it."""
    from torch.utils.flop_counter import FlopCounterMode
    context = Context(Setting.ONLINE, 4, (3, 4, 4), backbone_factory=lambda: MLP((3, 4, 4), hidden=16, layers=1))
    x, y = torch.randn(10, 3, 4, 4), torch.randint(0, 4, (10,))
    expected = 2 * 10 * (48 * 16 + 16 * 4) + 2 * 2 * 10 * 16 * 4 + 2 * 10 * 48 * 16
    state = torch.random.get_rng_state()
    with FlopCounterMode(display=False) as around:
        assert baseline_step_flops(context, x, y, "finetune") == expected
        assert baseline_step_flops(context, x, y, "er") == 2 * expected    # the stream batch and an equal replay batch
    assert around.get_total_flops() == 0
    assert torch.equal(torch.random.get_rng_state(), state)                # the run's draws did not move
