"""CLDyB stage A on constructed prototypes: eq. 3 potentials, alg. 1 greedy sampling, alg. 2 clustering."""
import time

import numpy as np
import pytest
import torch

from clharness.benchmarks.cldyb import clustering, sampling


def grouped_prototypes(groups=4, per_group=5, dim=32, spread=0.05, seed=0):
    """Classes in ``groups`` tight clusters of directions: within a group cosine ~1, across ~0."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.linalg.qr(torch.randn(dim, groups, generator=g))[0].T   # orthonormal group directions
    protos = centres.repeat_interleave(per_group, 0) + spread * torch.randn(groups * per_group, dim, generator=g)
    return protos, np.repeat(np.arange(groups), per_group)


def test_potentials_are_the_mean_over_models_of_min_max_normalised_cosines():
    a = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    b = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0]])
    psi = sampling.potentials([a, b])
    # model a: cos(0,1)=0, cos(0,2)=cos(1,2)=0.7071 -> z: 0, 1, 1
    # model b: cos(0,1)=-1, cos(0,2)=0, cos(1,2)=0 -> z: 0, 1, 1
    expected = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    torch.testing.assert_close(psi, expected)
    c = torch.tensor([[1.0, 0.0], [1.0, 0.1], [0.0, 1.0]])   # one model where 0 and 1 are similar
    psi = sampling.potentials([a, c])
    cos_c = torch.nn.functional.normalize(c, dim=1) @ torch.nn.functional.normalize(c, dim=1).T
    z01 = (cos_c[0, 1] - cos_c[0, 2]) / (cos_c[0, 1] - cos_c[0, 2])
    assert psi[0, 1].item() == pytest.approx((0.0 + z01.item()) / 2)


def test_greedy_sampling_picks_whole_groups_of_similar_classes():
    protos, group = grouped_prototypes()
    psi = sampling.potentials([protos, protos * 2])   # two models, same geometry
    tasks = sampling.greedy_tasks(psi, k=5, j=12, rng=np.random.default_rng(0))
    assert tasks.shape == (12, 5)
    for row in tasks:
        assert len(set(row)) == 5
        assert len(set(group[row])) == 1            # the hardest 5-class task: one tight group
    assert len(sampling.unique_tasks(tasks)) == len(set(group[tasks[:, 0]]))


def test_greedy_maximises_the_product_of_potentials_at_each_step():
    torch.manual_seed(1)
    psi = sampling.potentials([torch.randn(30, 8)])
    task = sampling.greedy_tasks(psi, k=4, j=1, rng=np.random.default_rng(3))[0]
    for k in range(1, 4):
        chosen = list(task[:k])
        score = torch.log(psi[:, chosen].clamp_min(1e-12)).sum(1)
        score[chosen] = -np.inf
        assert score.argmax().item() == task[k]


def test_task_similarity_is_the_mean_potential_with_the_previous_task():
    """Ablation (d) of figure 7 takes the candidate most similar to the previous task: its score is
    the mean of Psi between the candidate's classes and the previous task's, higher = more similar."""
    psi = torch.tensor([[1.0, 0.9, 0.1, 0.2, 0.8],
                        [0.9, 1.0, 0.3, 0.0, 0.6],
                        [0.1, 0.3, 1.0, 0.5, 0.4],
                        [0.2, 0.0, 0.5, 1.0, 0.7],
                        [0.8, 0.6, 0.4, 0.7, 1.0]])
    candidates = np.array([[0, 1], [2, 3]])
    scores = sampling.task_similarity(psi, candidates, previous=[4])
    np.testing.assert_allclose(scores, [(0.8 + 0.6) / 2, (0.4 + 0.7) / 2], rtol=1e-6)
    assert int(np.argmax(scores)) == 0                  # {0, 1} is the most similar to {4}
    scores = sampling.task_similarity(psi, candidates, previous=[1, 4])
    np.testing.assert_allclose(scores, [(0.9 + 0.8 + 1.0 + 0.6) / 4, (0.3 + 0.4 + 0.0 + 0.7) / 4], rtol=1e-6)


def test_uniform_sampling_draws_within_one_dataset():
    groups = [list(range(0, 10)), list(range(10, 13)), list(range(13, 30))]
    tasks = sampling.uniform_tasks(groups, k=4, j=50, rng=np.random.default_rng(0))
    owner = np.array([0] * 10 + [1] * 3 + [2] * 17)
    assert all(len(set(owner[row])) == 1 and len(set(row)) == 4 for row in tasks)
    assert set(owner[tasks[:, 0]]) == {0, 2}   # the 3-class dataset cannot hold a 4-class task


@pytest.mark.parametrize("k, j, available, match", [(1, 5, 100, "K = 1"), (5, 0, 100, "J = 0"),
                                                     (20, 5, 12, "12 unused classes left")])
def test_bad_task_counts_name_the_value(k, j, available, match):
    with pytest.raises(sampling.SamplingError, match=match):
        sampling.check_task_counts(available, k, j)


def test_sampling_2400_classes_is_fast_once_prototypes_exist():
    torch.manual_seed(0)
    protos = [torch.randn(2400, 768) for _ in range(3)]
    t0 = time.perf_counter()
    psi = sampling.potentials(protos)
    tasks = sampling.greedy_tasks(psi, k=20, j=30, rng=np.random.default_rng(0))
    elapsed = time.perf_counter() - t0
    assert tasks.shape == (30, 20) and all(len(set(r)) == 20 for r in tasks)
    assert elapsed < 10, elapsed   # ~0.3 s on an idle 2-core CPU; generous for shared CI machines


def test_knn_nll_separates_easy_from_hard_tasks():
    g = torch.Generator().manual_seed(0)
    labels = torch.arange(3).repeat_interleave(10)
    easy = torch.eye(3)[labels] * 5 + 0.1 * torch.randn(30, 3, generator=g)
    hard = torch.randn(30, 3, generator=g)
    nll_easy = clustering.knn_nll(easy, labels, 3, k=5)
    nll_hard = clustering.knn_nll(hard, labels, 3, k=5)
    assert nll_easy == pytest.approx(-np.log(6 / 8))   # all 5 neighbours right: p = (5+1)/(5+3)
    assert nll_hard > nll_easy + 0.3


def test_functional_clustering_groups_tasks_by_which_model_finds_them_hard():
    # Two models; tasks 0-2 are separable for model A only, tasks 3-5 for model B only.
    g = torch.Generator().manual_seed(0)
    classes, per = 12, 6
    sample_class = torch.arange(classes).repeat_interleave(per)
    onehot = torch.eye(classes)[sample_class] * 4
    noise = torch.randn(classes * per, classes, generator=g)
    first = sample_class < 6
    feats_a = torch.where(first[:, None], onehot + 0.1 * noise, noise)
    feats_b = torch.where(first[:, None], noise, onehot + 0.1 * noise)
    tasks = np.array([[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]])
    G = clustering.functional_vectors(tasks, [feats_a, feats_b], sample_class, k=3)
    assert G.shape == (6, 2)
    assert (G[:3, 0] < G[:3, 1]).all() and (G[3:, 1] < G[3:, 0]).all()
    labels = clustering.cluster_tasks(G, 2, seed=0)
    assert len(set(labels[:3])) == 1 and len(set(labels[3:])) == 1 and labels[0] != labels[3]
    # ancestral sampling draws a uniform cluster first: a singleton cluster is drawn first half the
    # time (a uniform draw over tasks would take it 1 time in 6)
    unbalanced = np.array([0, 1, 1, 1, 1, 1])
    firsts = [clustering.ancestral_sample(unbalanced, 1, np.random.default_rng(s))[0] for s in range(400)]
    assert np.mean(np.array(firsts) == 0) == pytest.approx(0.5, abs=0.08)
    picked = clustering.ancestral_sample(labels, 10, np.random.default_rng(0))
    assert sorted(picked) == list(range(6))            # without replacement, capped at the set size
