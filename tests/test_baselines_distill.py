"""iCaRL, BiC, WA and PODNet (issue 16): each one's defining property on a hand-made case or a
small digits run, and each beats fine-tuning on the quickstart's 5 x 2 digits split."""
import itertools
import math

import numpy as np
import pytest
import torch

from clharness.toolkit.exemplars import ExemplarMemory, herding
from test_methods_reference import METHODS, accuracy, context, digits, split  # noqa: F401  (fixture)

SEEDS = (0, 1, 2)
EPOCHS = 3


def learned(name, digits, seed=0, tasks_to_learn=5, epochs=EPOCHS, **hp):
    tasks, exps, tests = split(digits, seed)
    torch.manual_seed(seed)
    method = METHODS[name](context(seed, epochs=epochs), **hp)
    for exp in exps[:tasks_to_learn]:
        method.learn(exp)
    return method, tasks, tests


# --- iCaRL: herding (Rebuffi et al. 2017, Algorithm 4) -------------------------------------------

def test_herding_mean_is_closer_to_the_class_mean_than_random_picks():
    # five unit vectors, class mean mu = (0.32, 0.2). By hand: p_1 = argmin ||mu - phi|| is point 1
    # (0.625 against 0.709, 0.933, 0.862, 1.335); p_2 minimises ||mu - (phi_1 + phi)/2||: point 4
    # (0.432); p_3: point 0 (0.053). Its mean is 0.053 from mu; every other 3-subset is >= 0.233 away.
    phi = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.8, -0.6], [0.0, 1.0], [-1.0, 0.0]])
    mu = phi.mean(0)
    idx = herding(3 * phi, 3)          # herding normalises the features itself
    assert idx.tolist() == [1, 4, 0]
    assert herding(phi, 2).tolist() == [1, 4]   # greedy prefixes: Algorithm 5 keeps the first m
    gap = lambda rows: float((phi[list(rows)].mean(0) - mu).norm())   # noqa: E731
    assert gap(idx.tolist()) == pytest.approx(0.0533, abs=1e-3)
    others = [gap(rows) for rows in itertools.combinations(range(5), 3) if set(rows) != {0, 1, 4}]
    assert gap(idx.tolist()) < min(others)                  # closer than any other pick of size 3
    assert gap(idx.tolist()) < np.mean(others)              # so closer than a random pick on average


def test_icarl_memory_is_herded_balanced_and_counted(digits):
    icarl, tasks, _ = learned("icarl", digits, tasks_to_learn=2, epochs=2)
    per_class = 200 // 4
    assert {c: len(v) for c, v in icarl.memory.x.items()} == {c: per_class for t in tasks[:2] for c in t}
    report = icarl.memory_report()
    assert report.exemplars == 200 and report.exemplar_bytes == 200 * 64
    params = sum(p.numel() for p in icarl.model.parameters())
    assert report.parameters == 2 * params        # the network and the previous one (distillation)
    # a new class's exemplars: their feature mean is closer to the class mean than random subsets
    _, exps, _ = split(digits, 0)
    x, y = exps[1].tensors()
    c = tasks[1][0]
    phi = torch.nn.functional.normalize(icarl.embed(x[y == c]), dim=1)
    mu = phi.mean(0)
    ex = torch.nn.functional.normalize(icarl.embed(icarl.memory.x[c]), dim=1)
    g = torch.Generator().manual_seed(1)
    random_gaps = [float((phi[torch.randperm(len(phi), generator=g)[:per_class]].mean(0) - mu).norm())
                   for _ in range(200)]
    assert float((ex.mean(0) - mu).norm()) < min(random_gaps)


def test_memory_reduction_keeps_each_class_prefix():
    mem = ExemplarMemory(6)
    mem.add_class(0, torch.arange(3.0)[:, None], torch.randn(3, 2), 3)
    mem.add_class(1, torch.arange(3.0, 6.0)[:, None], torch.randn(3, 2), 3)
    first = {c: v.clone() for c, v in mem.x.items()}
    mem.reduce(mem.per_class(3))
    assert all(torch.equal(mem.x[c], first[c][:2]) for c in (0, 1)) and len(mem) == 4


def test_icarl_nme_predicts_by_the_nearest_exemplar_mean(digits):
    icarl, tasks, tests = learned("icarl", digits, tasks_to_learn=2, epochs=2)
    x = next(tests[0].batches(64))[0]
    logits = icarl.predict(x)
    phi = torch.nn.functional.normalize(icarl.features(x), dim=1)
    seen = [c for t in tasks[:2] for c in t]
    dist = torch.cdist(phi, icarl.class_means[seen])
    assert torch.equal(logits.argmax(1), torch.tensor(seen)[dist.argmin(1)])
    unseen = [c for c in range(10) if c not in seen]
    assert torch.isfinite(logits).all() and (logits[:, unseen] < logits[:, seen].min()).all()


# --- WA: weight aligning (Zhao et al. 2020, sec. 3.3) -------------------------------------------

def test_align_weights_equalises_mean_norms_by_hand():
    w = torch.tensor([[3.0, 4.0], [0.0, 1.0], [6.0, 8.0], [0.0, 10.0]])   # old norms 5, 1; new 10, 10
    from clharness_methods.wa import align_weights
    gamma = align_weights(w, [0, 1], [2, 3])
    assert gamma == pytest.approx(3.0 / 10.0)
    assert torch.allclose(w[2:], torch.tensor([[1.8, 2.4], [0.0, 3.0]]))
    assert torch.equal(w[:2], torch.tensor([[3.0, 4.0], [0.0, 1.0]]))


def test_wa_new_class_norms_equal_old_mean_after_each_task(digits):
    # PyCIL's variant (L2 norms, gamma not clamped); the authors' defaults are pinned by hand in
    # test_fidelity_exemplars.py
    wa, tasks, _ = learned("wa", digits, tasks_to_learn=3, epochs=2, align_norm=2, clamp_gamma=False)
    w = wa.model.head.weight.detach()
    old = [c for t in tasks[:2] for c in t]
    new = list(tasks[2])
    assert w[new].norm(dim=1).mean() == pytest.approx(float(w[old].norm(dim=1).mean()), rel=1e-5)
    assert len(wa.gammas) == 2 and all(abs(g - 1) > 0.01 for g in wa.gammas)   # the norms differed before
    assert (w >= 0).all()                                             # the paper's weight clipping


# --- BiC: the bias layer (Wu et al. 2019, eq. 5) ------------------------------------------------

def test_bic_bias_layer_changes_only_new_class_logits(digits):
    from clharness_methods.bic import BiasLayer
    layer = BiasLayer([3, 7])
    with torch.no_grad():
        layer.alpha.fill_(0.5)
        layer.beta.fill_(-2.0)
    logits = torch.randn(8, 10)
    out = layer(logits)
    old = [c for c in range(10) if c not in (3, 7)]
    assert torch.equal(out[:, old], logits[:, old])
    assert torch.allclose(out[:, [3, 7]], 0.5 * logits[:, [3, 7]] - 2.0)

    bic, tasks, tests = learned("bic", digits, tasks_to_learn=2, epochs=2)
    layer = bic.model.bias_layers[-1]
    assert (layer.alpha.item(), layer.beta.item()) != (1.0, 0.0)     # stage 2 trained it
    x = next(tests[0].batches(64))[0]
    with torch.no_grad():
        raw = bic.model.bias_layers[0](bic.model.head(bic.model.backbone(x)))
        corrected = bic.model(x)
    old, new = list(tasks[0]), list(tasks[1])
    assert torch.equal(corrected[:, old], raw[:, old])
    assert torch.allclose(corrected[:, new], layer.alpha * raw[:, new] + layer.beta)
    assert bic.memory_report().parameters == 2 * sum(p.numel() for p in bic.model.parameters())


# --- every method beats fine-tuning on the 5 x 2 digits split -----------------------------------

def final_accuracy(name, digits, seed, **hp):
    method, tasks, tests = learned(name, digits, seed, **hp)
    return accuracy(method, tasks, tests)


@pytest.fixture(scope="module")
def finetune_accuracy(digits):
    return [final_accuracy("finetune", digits, s) for s in SEEDS]


@pytest.mark.parametrize("name", ["icarl", "bic", "wa"])
def test_beats_finetune_on_digits(digits, finetune_accuracy, name):
    acc = [final_accuracy(name, digits, s) for s in SEEDS]
    print(f"\n{name} final accuracy {np.round(acc, 3)}; finetune {np.round(finetune_accuracy, 3)}")
    assert min(acc) > max(finetune_accuracy) + 0.3, (acc, finetune_accuracy)


# --- PODNet (Douillard et al. 2020) ------------------------------------------------------------

def test_pod_spatial_is_zero_for_identical_maps_and_matches_a_hand_computation():
    from clharness_methods.podnet import pod_spatial
    g = torch.Generator().manual_seed(0)
    maps = [torch.randn(3, 4, 5, 6, generator=g), torch.randn(3, 7, generator=g)]
    assert float(pod_spatial(maps, [m.clone() for m in maps])) == 0.0
    # one 1-channel 2x2 map. old^2 = [[1, 4], [9, 0]]: sums over the width (rows) 5, 9 and over the
    # height (columns) 10, 4 -> Phi_old = (5, 9, 10, 4) / sqrt(222); new^2 = [[1, 0], [0, 1]] ->
    # Phi_new = (1, 1, 1, 1) / 2; the loss is || Phi_old - Phi_new ||_2.
    old = torch.tensor([[[[1.0, 2.0], [3.0, 0.0]]]])
    new = torch.tensor([[[[1.0, 0.0], [0.0, -1.0]]]])
    phi_old = torch.tensor([5.0, 9.0, 10.0, 4.0]) / math.sqrt(222)
    expected = float((phi_old - 0.5).norm())
    assert float(pod_spatial([old], [new])) == pytest.approx(expected, rel=1e-6)
    # two maps: the mean of the per-map losses; a flat (N, C) output counts as (N, C, 1, 1)
    flat_old, flat_new = torch.tensor([[1.0, 2.0]]), torch.tensor([[2.0, 1.0]])
    per_flat = float((torch.tensor([1.0, 4.0, 1.0, 4.0]) / math.sqrt(34)
                      - torch.tensor([4.0, 1.0, 4.0, 1.0]) / math.sqrt(34)).norm())
    assert float(pod_spatial([old, flat_old], [new, flat_new])) == pytest.approx((expected + per_flat) / 2, rel=1e-6)


def test_podnet_takes_stage_outputs_from_generic_backbones():
    from clharness.toolkit.backbones import MLP, resnet32
    from clharness_methods.podnet import capture_outputs, stage_modules
    net = resnet32((3, 32, 32))
    names = stage_modules(net, (3, 32, 32), "cpu")
    with capture_outputs(net, names) as maps:
        net(torch.zeros(2, 3, 32, 32))
    assert [tuple(maps[n].shape[1:]) for n in names] == [(16, 32, 32), (32, 16, 16), (64, 8, 8)]  # 3 stages
    assert stage_modules(MLP((1, 8, 8)), (1, 8, 8), "cpu") == ["net.2", "net.4"]   # each Linear+ReLU


def test_lsc_and_nca_by_hand():
    from clharness_methods.podnet import LocalSimilarityClassifier, nca_loss
    lsc = LocalSimilarityClassifier(2, 1, 2)
    with torch.no_grad():
        lsc.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 3.0]]))   # two proxies of one class
        lsc.eta.fill_(2.0)
    h = torch.tensor([[3.0, 4.0]])                                 # cosines 0.6 and 0.8
    s = torch.tensor([0.6, 0.8])
    assert lsc(h).detach().item() == pytest.approx(2.0 * float((torch.softmax(s, 0) * s).sum()))
    logits = torch.tensor([[2.0, 1.0, 0.5]])
    # the paper's form (the default is the authors' code: test_fidelity_podnet_derpp)
    assert float(nca_loss(logits, torch.tensor([0]), 0.6, form="paper")) == pytest.approx(
        max(0.0, -(2.0 - 0.6) + math.log(math.exp(1.0) + math.exp(0.5))))
    assert float(nca_loss(torch.tensor([[9.0, 1.0, 0.5]]), torch.tensor([0]), 0.6, form="paper")) == 0.0   # hinged


def test_podnet_freezes_old_proxies_and_counts_its_state(digits):
    # main training only: the authors' class-balanced fine-tuning then tunes every class's proxies
    podnet, tasks, _ = learned("podnet", digits, tasks_to_learn=1, epochs=2, finetune_epochs=0)
    k = podnet.hp["proxies"]
    rows = lambda classes: torch.cat([torch.arange(c * k, (c + 1) * k) for c in classes])   # noqa: E731
    old = torch.nn.functional.normalize(podnet.model.head.weight.detach()[rows(tasks[0])], dim=1).clone()
    _, exps, _ = split(digits, 0)
    podnet.learn(exps[1])
    after = torch.nn.functional.normalize(podnet.model.head.weight.detach()[rows(tasks[0])], dim=1)
    assert torch.allclose(after, old, atol=1e-6)                  # directions kept (old_weights lr 0, PyCIL's fc1)
    assert podnet.map_names == ["net.2", "net.4"]
    report = podnet.memory_report()
    assert report.exemplars == 200
    assert report.parameters == 2 * sum(p.numel() for p in podnet.model.parameters())


def test_podnet_beats_finetune_on_digits(digits, finetune_accuracy):
    acc = [final_accuracy("podnet", digits, s, finetune_epochs=5) for s in SEEDS]
    print(f"\npodnet final accuracy {np.round(acc, 3)}; finetune {np.round(finetune_accuracy, 3)}")
    assert min(acc) > max(finetune_accuracy) + 0.25, (acc, finetune_accuracy)


def test_first_task_uses_the_suites_fixed_schedule(digits):
    _, exps, _ = split(digits, 0)
    ctx = context(0, epochs=2)
    ctx.first_task_train = {"epochs": 4, "lr": 0.05, "milestones": [1, 3], "lr_decay": 0.1, "weight_decay": 5e-4}
    method = METHODS["icarl"](ctx, scheduler="steplr")   # Table 3's milestones apply to StepLR (issue 30 item 1)
    method.labels.add(exps[0])
    trainer, epochs = method.task_trainer()
    group = trainer.optimizer.param_groups[0]
    assert epochs == 4 and group["weight_decay"] == 5e-4
    lrs = []
    for _ in range(4 * trainer.epoch_steps):
        lrs.append(group["lr"])
        trainer.step(lambda: sum(p.sum() for p in method.model.parameters()) * 0.0)
    per_epoch = lrs[::trainer.epoch_steps]
    assert per_epoch == pytest.approx([0.05, 0.005, 0.005, 0.0005])   # MultiStepLR at epochs 1 and 3
    method.labels.add(exps[1])
    trainer, epochs = method.task_trainer()                            # later tasks: the method's own
    later = trainer.optimizer.param_groups[0]
    assert epochs == 2 and later.get("initial_lr", later["lr"]) == method.hp["lr"]
