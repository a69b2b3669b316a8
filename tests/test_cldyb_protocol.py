"""Issue 15 CLDyB items: alg. 1 line 4 normalises over the candidate classes only (item 5); ablation
(d) picks the candidate most similar to all previously encountered tasks (item 9)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import clharness as clh
from clharness.toolkit.backbones import MLP
from clharness.benchmarks.cldyb import sampling, search
from clharness.benchmarks.cldyb.pool import DataPool
from clharness.benchmarks.cldyb.search import Search, SearchConfig
from clharness.data import Digits
from clharness.method import Context, Setting

CPU = torch.device("cpu")

# Unit prototypes (rows) of four candidate classes f, s, A, B with cosines f.s = .5, f.A = .3, f.B = .45,
# s.A = .9, s.B = .55, A.B = .2, and one class P of a previous task opposite to A (cos P.A = -1).
CANDIDATES = torch.tensor([[1.0, 0.0, 0.0, 0.0],
                           [0.5, 0.8660254, 0.0, 0.0],
                           [0.3, 0.8660254, 0.4, 0.0],
                           [0.45, 0.37527767, -0.65, 0.48419413]])
PREVIOUS = -CANDIDATES[2:3]


def grown_from_f(psi):
    """The tasks greedy sampling grows from class f (row[0] is the uniformly drawn first class)."""
    got = sampling.greedy_tasks(psi, k=3, j=30, rng=np.random.default_rng(0))
    return {tuple(sorted(row.tolist())) for row in got if row[0] == 0}


def test_alg1_line4_normalises_over_the_candidate_classes_only():
    """Greedy from f picks s, then the third class maximising z(cos(., f)) z(cos(., s)): over the
    candidates z runs from A.B = .2 to s.A = .9, so B (.45, .55) beats A (.3, .9); with P included z
    runs from -1 (to .9) and A wins. The candidate set changes with the class set z ranges over."""
    psi = sampling.potentials([CANDIDATES])
    off = ~torch.eye(4, dtype=torch.bool)
    assert psi[off].min() == pytest.approx(0.0, abs=1e-6) and psi[off].max() == pytest.approx(1.0, abs=1e-6)
    assert psi[0, 3] == pytest.approx((0.45 - 0.2) / 0.7, abs=1e-3)
    with_previous = sampling.potentials([torch.cat([CANDIDATES, PREVIOUS])])[:4, :4]
    assert with_previous[0, 3] == pytest.approx((0.45 + 1) / 1.9, abs=1e-3)
    assert grown_from_f(psi) == {(0, 1, 3)}
    assert grown_from_f(with_previous) == {(0, 1, 2)}


class Linear(clh.Method):
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


def run_search(monkeypatch, spy_name, **config):
    pool = DataPool(CPU, validation=0.25, probe_per_class=5, seed=0)
    pool.add("digits", Digits())
    cfg = SearchConfig(classes_per_task=2, steps=3, candidates=4, search_space=2, clusters=2, knn_k=3, **config)
    ctx = Context(Setting.CLASS_IL, cfg.classes_per_task * cfg.steps, pool.input_shape, seed=0,
                  backbone_factory=lambda: MLP(pool.input_shape, hidden=16, layers=1))
    torch.manual_seed(0)
    calls, real = [], getattr(sampling, spy_name)

    def spy(*args, **kwargs):
        calls.append((args, kwargs, list(pool.available())))
        return real(*args, **kwargs)
    monkeypatch.setattr(search.sampling, spy_name, spy)
    steps = list(Search(pool, [Linear(ctx)], cfg, seed=0, device=CPU).run())
    return steps, calls


def test_the_search_normalises_potentials_over_the_unused_classes(monkeypatch):
    steps, calls = run_search(monkeypatch, "greedy_tasks")
    assert len(calls) == 2                                  # steps 1 and 2 sample candidates
    for (psi, *_), _, available in calls:
        assert psi.shape == (len(available), len(available))
        off = ~torch.eye(len(available), dtype=torch.bool)
        # one model: z() over exactly these classes spans [0, 1]
        assert psi[off].min().item() == pytest.approx(0.0, abs=1e-6)
        assert psi[off].max().item() == pytest.approx(1.0, abs=1e-6)


def test_ablation_d_compares_candidates_with_every_previous_task(monkeypatch):
    """At step 2 the similarity reads the classes of tasks 0 and 1 (four positions after the unused
    classes), and the chosen candidate is the one with the highest mean potential to all of them."""
    steps, calls = run_search(monkeypatch, "task_similarity", search="most-similar")
    assert len(calls) == 2
    for step, ((psi, tasks, previous), _, available) in zip(steps[1:], calls):
        assert list(previous) == list(range(len(available), len(available) + 2 * step.step))
        expected = [psi[np.ix_(t, previous)].mean().item() for t in tasks]
        values = [c["value"] for c in step.candidates]
        assert values == pytest.approx(expected, abs=1e-6)
        assert step.chosen == int(np.argmax(expected))
    prior = {c for s in steps[:2] for c in s.classes}
    assert len(prior) == 4


def test_most_similar_to_all_previous_tasks_not_only_the_last():
    """Hand-made potentials: X matches the last task (class 1) only, Y both previous tasks (0, 1)
    moderately; compared with all previous tasks Y wins, with the last one alone X would."""
    #                  X     Y    t0    t1
    psi = torch.tensor([[1.0, 0.5, 0.0, 0.9],
                        [0.5, 1.0, 0.6, 0.6],
                        [0.0, 0.6, 1.0, 0.2],
                        [0.9, 0.6, 0.2, 1.0]])
    candidates = np.array([[0], [1]])
    assert sampling.task_similarity(psi, candidates, previous=[2, 3]).argmax() == 1
    assert sampling.task_similarity(psi, candidates, previous=[3]).argmax() == 0
