"""CLDyB pipeline on live methods: pool, tree search (eqs. 5-7), MCTS, ablations, sequence files and replay."""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import clharness as clh
from clharness.engine.family_session import FamilyServices
from clharness import metrics
from clharness.toolkit.backbones import MLP
from clharness.benchmarks.cldyb import kind, sequence
from clharness.benchmarks.cldyb.pool import DataPool, PoolError
from clharness.benchmarks.cldyb.search import Search, SearchConfig, SearchError, select
from clharness.data import Digits, Synthetic
from clharness.method import Context, Setting

CPU = torch.device("cpu")


def synthetic(n=30, seed=0, similarity=0.5, name="synthetic"):
    s = Synthetic(num_classes=n, image_size=8, train_per_class=20, test_per_class=5, similarity=similarity, seed=seed)
    s.name = name
    return s


def make_pool(seed=0, n=30):
    pool = DataPool(CPU, validation=0.25, probe_per_class=5, seed=seed)
    digits = Digits()
    digits.name = "digits"
    pool.add("digits", digits)
    pool.add("syn", synthetic(n))
    return pool


class Linear(clh.Method):
    """Softmax regression on a small MLP: fast enough to train dozens of copies."""
    name = "linear"

    def __init__(self, context, **hp):
        super().__init__(context, **hp)
        self.model = context.make_classifier()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def learn(self, experience):
        for x, y in experience.batches(epochs=1):
            self.opt.zero_grad()
            F.cross_entropy(self.model(x), y).backward()
            self.opt.step()


class BackboneOnly(Linear):
    """features() fails: the search falls back to self.model.backbone."""
    name = "backbone-only"

    def features(self, x):
        raise clh.MethodError("no features here")


class Featureless(Linear):
    name = "featureless"

    def __init__(self, context, **hp):
        super().__init__(context, **hp)
        self.net = self.model
        del self.model

    def learn(self, experience):
        for x, y in experience.batches(epochs=1):
            self.opt.zero_grad()
            F.cross_entropy(self.net(x), y).backward()
            self.opt.step()

    def predict(self, x, task_id=None):
        return self.net(x)


def methods(pool, cfg, classes=(Linear, Linear)):
    ctx = Context(Setting.CLASS_IL, cfg.classes_per_task * (cfg.steps + 1), pool.input_shape, seed=0,
                  backbone_factory=lambda: MLP(pool.input_shape, hidden=16, layers=1))
    torch.manual_seed(0)
    return [cls(ctx) for cls in classes]


CFG = SearchConfig(classes_per_task=3, steps=3, candidates=6, search_space=3, clusters=2, knn_k=3)


def test_pool_names_classes_by_provenance_and_splits_them_disjointly():
    pool = make_pool()
    assert len(pool.classes) == 40 and "digits/7" in pool.classes and "syn/class29" in pool.classes
    for cls in pool.classes.values():
        assert not set(cls.index["train"]) & set(cls.index["val"])
        assert len(cls.index["val"]) >= 1 and len(cls.index["test"]) >= 1
    data = pool.data(["syn/class03", "digits/7"], "train", first_label=6)
    assert sorted(set(data.labels.tolist())) == [6, 7] and data.input_shape == (1, 8, 8)
    pool.take(["digits/7"])
    assert "digits/7" not in pool.available() and len(pool.available()) == 39
    with pytest.raises(PoolError, match=r"absent from the pool: \['digits/70'\].*digits \(10 classes\), syn \(30"):
        pool.data(["digits/70"], "test")
    with pytest.raises(PoolError, match="already in the pool"):
        pool.add("syn", synthetic())


def test_search_builds_a_sequence_of_disjoint_tasks_with_eq5_rewards_and_timings():
    pool = make_pool()
    search = Search(pool, methods(pool, CFG), CFG, seed=0, device=CPU)
    steps = list(search.run())
    assert [len(s.classes) for s in steps] == [3, 3, 3]
    flat = [c for s in steps for c in s.classes]
    assert len(set(flat)) == 9 and pool.used == set(flat)
    for s in steps[1:]:
        assert len(s.candidates) == 3 and s.candidates[s.chosen]["classes"] == s.classes
        values = [c["value"] for c in s.candidates]
        assert s.chosen == int(np.argmax(values))                       # tau = 0: the greedy ("hard") pick
        assert all(-1 <= c["reward"] <= 1 for c in s.candidates)
        assert all(v >= c["reward"] - 1 for v, c in zip(values, s.candidates))
        assert set(s.timings) >= {"prototypes", "sampling", "clustering", "lookahead", "learn"}
        assert s.timings["lookahead"] > 0
    # the live methods learned the chosen tasks: their diagonal is the per-step val accuracy
    assert [len(d) for d in search.state.diags] == [3, 3]
    # eq. 5: the immediate reward of one more task is AFM - ALA of the copies, averaged over models
    extra = [c for c in pool.available()[:3]]
    _, reward, rows = search.transition(search.state, extra)
    expect = []
    for diag, row in zip(search.state.diags, rows):
        R = np.full((4, 4), np.nan)
        R[np.arange(3), np.arange(3)] = diag
        R[3] = row
        expect.append(metrics.afm(R) - metrics.ala(R))
    assert reward == pytest.approx(np.mean(expect))
    assert len(search.state.tasks) == 3            # copies only: the live state did not move


def test_softmax_temperature_sets_the_difficulty():
    values = [0.1, 0.5, 0.2]
    rng = np.random.default_rng(0)
    assert select(values, 0.0, rng) == 1
    hot = np.bincount([select(values, 100.0, rng) for _ in range(3000)], minlength=3) / 3000
    assert np.allclose(hot, 1 / 3, atol=0.04)
    warm = np.bincount([select(values, 0.1, rng) for _ in range(3000)], minlength=3) / 3000
    p = np.exp(np.array(values) / 0.1) / np.exp(np.array(values) / 0.1).sum()
    assert np.allclose(warm, p, atol=0.04)


def test_mcts_values_every_candidate_and_respects_the_budget():
    pool = make_pool()
    cfg = SearchConfig(**{**CFG.__dict__, "search": "mcts", "simulations": 7, "lookahead": 1})
    search = Search(pool, methods(pool, cfg), cfg, seed=0, device=CPU)
    steps = list(search.run())
    for s in steps[1:]:
        values = [c["value"] for c in s.candidates]
        assert all(np.isfinite(values)) and s.chosen == int(np.argmax(values))
        assert sum(c["visits"] for c in s.candidates) == 7 and min(c["visits"] for c in s.candidates) >= 1


@pytest.mark.parametrize("change", [{"search": "random"}, {"search": "most-similar"}, {"sampling": "uniform"},
                                    {"clustering": False}, {"lookahead": 0}, {"lookahead": 2, "lookahead_width": 1, "steps": 3}])
def test_ablations_of_figure_7_run(change):
    pool = make_pool()
    cfg = SearchConfig(**{**CFG.__dict__, "steps": 2, **change})
    steps = list(Search(pool, methods(pool, cfg, (Linear,)), cfg, seed=0, device=CPU).run())
    flat = [c for s in steps for c in s.classes]
    assert len(steps) == cfg.steps and len(set(flat)) == 3 * cfg.steps
    later = steps[1:]
    assert later
    if change.get("sampling") == "uniform":   # each candidate drawn from one dataset
        for s in later:
            assert all(len({n.split("/")[0] for n in c["classes"]}) == 1 for c in s.candidates)
    if change.get("search") == "random":      # (a): one uniformly drawn task, nothing valued
        assert all(len(s.candidates) == 1 and s.candidates[0]["value"] is None for s in later)
    if change.get("search") == "most-similar":   # (d): value = mean potential with the previous task
        for s in later:
            values = [c["value"] for c in s.candidates]
            assert all(0.0 <= v <= 1.0 for v in values) and all(c["reward"] is None for c in s.candidates)
            assert s.chosen == int(np.argmax(values))   # tau = 0: the most similar, not the least
    if change.get("clustering") is False:     # (c): no functional clusters
        assert all(c["cluster"] == 0 for s in later for c in s.candidates)
    if change.get("lookahead") == 0:          # (e): the value is the immediate reward alone
        assert all(c["value"] == pytest.approx(c["reward"]) for s in later for c in s.candidates)


def test_first_task_is_fixed_per_seed_for_every_strategy():
    firsts = []
    for search in ("lookahead", "random"):
        pool = make_pool()
        cfg = SearchConfig(**{**CFG.__dict__, "search": search, "steps": 1})
        firsts.append(next(Search(pool, methods(pool, cfg, (Linear,)), cfg, seed=4, device=CPU).run()).classes)
    assert firsts[0] == firsts[1]


def test_pool_grows_mid_search():
    pool = make_pool(n=6)
    extra = synthetic(20, seed=9, similarity=0.9, name="synthetic")

    def grow(step):
        return pool.add("late", extra) if step == 2 else []
    cfg = SearchConfig(**{**CFG.__dict__, "candidates": 8})
    steps = list(Search(pool, methods(pool, cfg, (Linear,)), cfg, seed=0, device=CPU, grow=grow).run())
    assert steps[2].timings["pool_added"] == 20
    assert not any(c.startswith("late/") for s in steps[:2] for cand in s.candidates for c in cand["classes"])
    assert any(c.startswith("late/") for cand in steps[2].candidates for c in cand["classes"])


def test_features_fall_back_to_the_backbone_and_fail_clearly_without_one():
    pool = make_pool()
    steps = list(Search(pool, methods(pool, CFG, (BackboneOnly,)), CFG, seed=0, device=CPU).run())
    assert len(steps) == 3
    pool = make_pool()
    with pytest.raises(SearchError, match="method 'featureless' gives no features.*no backbone to fall back on"):
        list(Search(pool, methods(pool, CFG, (Featureless,)), CFG, seed=0, device=CPU).run())


def test_pool_running_out_of_classes_is_a_clear_error():
    pool = make_pool(n=2)   # 12 classes; 3 steps of 5 need 15
    cfg = SearchConfig(**{**CFG.__dict__, "classes_per_task": 5, "search": "random"})
    with pytest.raises(ValueError, match="2 unused classes left, fewer than classes_per_task K = 5"):
        list(Search(pool, methods(pool, cfg, (Linear,)), cfg, seed=0, device=CPU).run())


def test_sequence_file_round_trips_and_replays_for_a_held_out_method(tmp_path):
    from clharness.plugins import Harness
    from clharness.engine.runner import Case, run_case
    from clharness.engine.suites import ScenarioSpec
    harness = Harness()
    spec = ScenarioSpec(name="t", kind="cldyb", validation=0.25, image_size=[8, 8], channels=1,
                        backbone_options={"hidden": 16, "layers": 1},
                        options={**{k: d for k, (_, d) in kind.OPTIONS.items()}, "classes_per_task": 3, "steps": 3,
                                 "candidates": 4, "search_space": 2, "probe_per_class": 5,
                                 "pool": [{"dataset": "digits"}, {"dataset": "synthetic",
                                          "options": {"num_classes": 20, "image_size": 8, "train_per_class": 20}}]})
    kind.check(spec)
    job = kind.Job("cc", "cc", ["finetune"], ["ncm"])
    seq = kind.run_search(FamilyServices(), "s", spec, job, {"finetune": {}}, harness, 0, CPU)
    path = sequence.save(tmp_path / "seq.json", seq)
    loaded = sequence.load(path)
    assert loaded["format"] == sequence.FORMAT and loaded["methods"] == ["finetune"] and loaded["backbone"] == "mlp"
    assert all(set(s) >= {"classes", "candidates", "chosen", "timings"} for s in loaded["steps"])
    assert json.loads(path.read_text())["steps"][1]["candidates"][0]["value"] is not None
    # replay as a static scenario for a method that was not searched with (figure 3 protocol)
    replay = ScenarioSpec(name="t/cc", kind="cldyb", backbone_options={"hidden": 16, "layers": 1},
                          options={**{k: d for k, (_, d) in kind.OPTIONS.items()}, "sequence": str(path)})
    record = run_case(Case("s", replay, "ncm", 1, {}), harness, CPU)
    assert record.status == "passed", record.message
    assert np.array(record.acc_matrix).shape == (3, 3) and 0 <= record.metrics["final_acc"] <= 1
    assert record.class_order == [c for s in loaded["steps"] for c in s["classes"]]
    # a sequence naming classes the pool does not hold
    bad = dict(loaded)
    bad["steps"] = [dict(loaded["steps"][0], classes=["digits/0", "digits/1", "nowhere/x"])]
    sequence.save(tmp_path / "bad.json", {k: v for k, v in bad.items() if k not in ("format", "version")})
    record = run_case(Case("s", ScenarioSpec(name="b", kind="cldyb", options={**replay.options,
                      "sequence": str(tmp_path / "bad.json")}), "ncm", 0, {}), harness, CPU)
    assert record.status == "error" and "absent from the pool: ['nowhere/x']" in record.message
    with pytest.raises(sequence.SequenceError, match="does not exist"):
        sequence.load(tmp_path / "missing.json")
