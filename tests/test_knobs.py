"""Issue 39, tests that pin the knobs: each temperature, loss weight, per-sample random draw and its
range, count passed between stages, aggregate, seed derivation and optimizer argument that an
independent round of seeded one-line bugs found unpinned. Every expectation is the paper's or the
reference's formula written out by hand on a tiny case, never our own output copied back."""
import copy
import math
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import clharness as clh
from clharness import metrics as M
from clharness.results import ResultsStore, RunRecord
from clharness.toolkit import augment as A
from clharness.toolkit.training import Trainer, make_optimizer

from test_fidelity_replay import METHODS, ctx, experience, hand_ce
from clharness.benchmarks.gtep import search as gtep_search


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


# --- LwF: the temperature softens BOTH the teacher and the student (Li & Hoiem 2017, eq. 2) ----------

def test_lwf_li_hoiem_distillation_softens_teacher_and_student_with_t():
    torch.manual_seed(0)
    T, lam = 3.0, 1.5
    lwf = METHODS["lwf"](ctx(num_classes=4), temperature=T, lwf_lambda=lam)
    x, y = torch.randn(5, 1, 2, 2, generator=gen(7)), torch.tensor([2, 3, 2, 3, 2])
    seen = []
    lwf.fit = lambda *a, **k: seen.append(lwf.loss(x, y).item())   # the loss while task 2 trains
    lwf.learn(experience([0, 1], seed=0))
    lwf.learn(experience([2, 3], seed=1))
    with torch.no_grad():
        new, old = lwf.model(x), lwf.old_model(x)
        y_old = F.softmax(old[:, [0, 1]] / T, 1)                   # y'_o = softmax(old logits / T)
        y_hat = F.softmax(new[:, [0, 1]] / T, 1)                   # ŷ'_o = softmax(new logits / T)
        l_old = -(y_old * y_hat.log()).sum(1).mean()
        expected = hand_ce(new, y, [2, 3]) + lam * l_old           # L_new on the new task's outputs
    assert seen[1] == pytest.approx(expected.item(), rel=1e-5)
    # a student at T = 1 (the surviving bug) gives another loss on this case
    wrong = hand_ce(new, y, [2, 3]) + lam * -(y_old * F.log_softmax(new[:, [0, 1]], 1)).sum(1).mean()
    assert abs(wrong.item() - expected.item()) > 1e-3


# --- FOSTER: compression distils with the beta_2 class-balanced weights (PyCIL foster.py BKD) ----------

def test_foster_compression_distils_with_the_beta2_weights_of_the_class_counts():
    from test_fidelity_exemplars import experience as uint8_experience, tiny_context
    torch.manual_seed(0)
    b1, b2, T = 0.5, 0.9, 2.0
    foster = METHODS["foster"](tiny_context(memory_size=6, epochs=1), beta1=b1, beta2=b2, temperature=T,
                               compression_epochs=1)
    foster.learn(uint8_experience((0, 1), seed=0, per_class=5))
    x = torch.randn(4, 1, 2, 2, generator=gen(5))
    got = {}
    real_fit = foster.fit

    def spy(batches, loss_fn=None, params=None, trainer=None):
        if getattr(loss_fn, "__name__", "") == "compression_loss":
            got["loss"] = loss_fn(x, torch.zeros(4, dtype=torch.long)).item()
            with torch.no_grad():
                got["teacher"], got["student"] = foster.teacher(x)[:, :4], foster.model(x)[:, :4]
            got["memory"] = torch.bincount(foster.memory.tensors()[1], minlength=2).tolist()
        return real_fit(batches, loss_fn, params, trainer)

    foster.fit = spy
    foster.learn(uint8_experience((2, 3), seed=1, per_class=5))
    # seen classes 0..3: 3 exemplars each of 0, 1 (memory 6 over 2 classes) and 5 new images of 2, 3
    assert got["memory"] == [3, 3]
    n = torch.tensor([3.0, 3.0, 5.0, 5.0], dtype=torch.float64)
    w = (1 - b2) / (1 - b2 ** n)                      # Cui et al.'s effective number, beta_2
    w = (w / w.sum() * 4).float()                     # PyCIL: per_cls_weights / sum * num_classes
    s = F.softmax(got["teacher"] / T, 1) * w
    s = s / s.sum(1, keepdim=True)
    expected = -(s * F.log_softmax(got["student"] / T, 1)).sum(1).mean()
    assert got["loss"] == pytest.approx(expected.item(), rel=1e-5)
    w1 = (1 - b1) / (1 - b1 ** n)
    s1 = F.softmax(got["teacher"] / T, 1) * (w1 / w1.sum() * 4).float()
    s1 = s1 / s1.sum(1, keepdim=True)
    assert abs((-(s1 * F.log_softmax(got["student"] / T, 1)).sum(1).mean() - expected).item()) > 1e-4


# --- augmentation: draws per image, over the whole range -----------------------------------------------

def _crop_params(out, x, padding, fill):
    """(top, left, flipped) of each output image: the one crop of the padded image it equals."""
    found = []
    for i in range(len(x)):
        hits = [(t, l, f) for t in range(2 * padding + 1) for l in range(2 * padding + 1) for f in (False, True)
                if torch.equal(out[i], A.crop_at(x[i:i + 1], padding, fill, torch.tensor([t]), torch.tensor([l]),
                                                  torch.tensor([f]))[0])]
        assert len(hits) == 1, hits
        found.append(hits[0])
    return found


def test_random_crop_reaches_every_offset_0_to_2p_and_flips_per_image():
    """torchvision RandomCrop(padding=p): top, left uniform over 0..2p (both edges); RandomHorizontalFlip
    draws per image."""
    p, n = 2, 600
    x = (torch.arange(n * 9, dtype=torch.float32).view(n, 1, 3, 3) + 1)
    fill = torch.zeros(1, 1, 1, 1)
    found = _crop_params(A.random_crop(x, p, fill, gen(3), flip_p=0.5), x, p, fill)
    tops, lefts = {t for t, _, _ in found}, {l for _, l, _ in found}
    assert tops == lefts == set(range(2 * p + 1))                       # 0 .. 2p, the far edge included
    counts = np.bincount([t * 5 + l for t, l, _ in found], minlength=25)
    assert counts.min() > 8                                              # 600 / 25 = 24 expected each
    flips = [f for _, _, f in found]
    assert 200 < sum(flips) < 400                                        # p = 0.5, one draw per image


def test_cifar_recipe_on_uint8_draws_brightness_per_image_over_its_range():
    """ColorJitter(brightness=63/255): a factor per image, uniform in [1 - 63/255, 1 + 63/255]."""
    recipe = A.BUILTIN_RECIPES["cifar"]
    n = 400
    images = (torch.arange(n * 64).view(n, 1, 8, 8) % 200 + 1).to(torch.uint8)   # never clipped at white
    out = recipe.train_pixels(images, torch.zeros(1, 1, 1, 1), torch.ones(1, 1, 1, 1) / 255,
                              A.Frame.unit(1), (8, 8), gen(2))
    crops = A.random_crop(images, 4, None, gen(2), 0.5).float() / 255            # the same crop and flip draws
    factor = torch.stack([(out[i][crops[i] > 0] / crops[i][crops[i] > 0]).mean() for i in range(n)])
    assert torch.allclose(out, crops * factor.view(n, 1, 1, 1), atol=1e-5)        # one factor per image
    lo, hi = 1 - 63 / 255, 1 + 63 / 255
    assert factor.min() >= lo - 1e-5 and factor.max() <= hi + 1e-5
    assert factor.min() < lo + 0.02 and factor.max() > hi - 0.02 and len(torch.unique(factor)) > n * 0.9


@pytest.mark.parametrize("name", ["imagenet", "vit", "strong"])
def test_resized_crop_recipes_flip_per_image(name, monkeypatch):
    """The flip of a RandomResizedCrop recipe is drawn per image (RandomHorizontalFlip(0.5))."""
    calls = []
    real = A.resized_crop

    def spy(x, boxes, size, flip=None, mode="bilinear"):
        calls.append(flip.clone())
        return real(x, boxes, size, flip, mode)

    monkeypatch.setattr(A, "resized_crop", spy)
    x = torch.rand(300, 3, 8, 8, generator=gen(1))
    A.BUILTIN_RECIPES[name].train(x, A.Frame.unit(3), (8, 8), gen(4))
    flip, = calls
    assert flip.shape == (300,) and 100 < int(flip.sum()) < 200


def test_resized_crop_boxes_cover_the_scale_range_per_image():
    boxes = A.resized_crop_boxes(2000, 32, 32, (0.08, 1.0), (3 / 4, 4 / 3), gen(0))
    area = boxes[:, 2] * boxes[:, 3] / (32 * 32)
    assert area.min() < 0.1 and area.max() > 0.9                          # scale U(0.08, 1) per image
    top, left = boxes[:, 0], boxes[:, 1]
    assert (top >= 0).all() and (top + boxes[:, 2] <= 32).all() and (left + boxes[:, 3] <= 32).all()
    small = boxes[:, 2] <= 12
    assert (top[small] + boxes[small, 2] == 32).any() and (top[small] == 0).any()   # both edges reachable


# --- CLDyB: k-means makes ``clusters`` clusters; the k-NN uses ``knn_k`` (alg. 2 lines 5 and 10) ----------

def test_cldyb_kmeans_runs_with_the_number_of_clusters_and_the_knn_with_k(monkeypatch):
    from clharness.benchmarks.cldyb import clustering
    from clharness.benchmarks.cldyb.search import Search, SearchConfig
    from test_cldyb_pipeline import CPU, make_pool, methods
    cfg = SearchConfig(classes_per_task=3, steps=3, candidates=6, search_space=3, clusters=2, knn_k=4)
    pool = make_pool()
    search = Search(pool, methods(pool, cfg), cfg, seed=0, device=CPU)
    used = {}
    real_fv, real_ct = clustering.functional_vectors, clustering.cluster_tasks
    monkeypatch.setattr(clustering, "functional_vectors",
                        lambda tasks, feats, labels, k=5: used.setdefault("k", k) and real_fv(tasks, feats, labels, k))
    monkeypatch.setattr(clustering, "cluster_tasks",
                        lambda G, n, seed: used.setdefault("clusters", n) and real_ct(G, n, seed))
    tasks, _, labels, _ = search.propose({})
    assert used == {"k": 4, "clusters": 2}
    # and k-means itself: 3 well separated groups of functional vectors, asked for 3 -> 3 clusters
    G = np.array([[0.0, 0], [0.1, 0], [5, 5], [5.1, 5], [9, 0], [9, 0.1]])
    got = clustering.cluster_tasks(G, 3, seed=0)
    assert len(set(got)) == 3 and got[0] == got[1] and got[2] == got[3] and got[4] == got[5]
    assert len(set(clustering.cluster_tasks(G, 2, seed=0))) == 2


def test_cldyb_knn_nll_uses_k_neighbours_with_laplace_smoothing():
    from clharness.benchmarks.cldyb.clustering import knn_nll
    # 4 samples on a line; cosine neighbours of 2-D vectors at angles 0, 10, 80, 90 degrees
    ang = torch.tensor([0.0, 10.0, 80.0, 90.0]) * math.pi / 180
    feats = torch.stack([ang.cos(), ang.sin()], 1)
    labels = torch.tensor([0, 0, 1, 0])
    # k = 1: nearest other sample: 0->1 (hit), 1->0 (hit), 2->3 (miss), 3->2 (miss); p = (hits + 1) / (1 + 2)
    p1 = torch.tensor([2 / 3, 2 / 3, 1 / 3, 1 / 3])
    assert knn_nll(feats, labels, 2, 1) == pytest.approx(float(-p1.log().mean()), rel=1e-6)
    # k = 2: 0 -> {1, 2}: 1 hit; 1 -> {0, 2}: 1; 2 -> {3, 1}: 0; 3 -> {2, 1}: 1 (label 0 of 1); p = (h + 1) / 4
    p2 = torch.tensor([2 / 4, 2 / 4, 1 / 4, 2 / 4])
    assert knn_nll(feats, labels, 2, 2) == pytest.approx(float(-p2.log().mean()), rel=1e-6)


# --- the scorecard's central value is the seed mean ----------------------------------------------------

def test_scorecard_central_value_is_the_mean_of_the_seeds_not_the_median():
    from clharness.reporting.scorecard import summarize
    assert M.mean_ci([0.0, 0.0, 0.9])[0] == pytest.approx(0.3)               # median would be 0.0
    t = 4.302652729911275                                                      # t_{0.975, 2}
    sd = math.sqrt(((0.3) ** 2 * 2 + 0.6 ** 2) / 2)
    assert M.mean_ci([0.0, 0.0, 0.9])[1] == pytest.approx(t * sd / math.sqrt(3), rel=1e-6)
    records = [RunRecord("s", "sc", "m", seed, status="passed", key=str(seed), metrics={"final_acc": v})
               for seed, v in enumerate([0.1, 0.2, 0.9])]
    records.append(RunRecord("s", "sc", "m", 3, status="failed", key="3", metrics={"final_acc": 0.0}))
    row = summarize(records, ["final_acc"]).iloc[0]
    assert row.final_acc == pytest.approx(0.4) and row.seeds == 3 and row.failed == 1


# --- GTEP: configuration k of a method is seeded by the tuning, the method's name and k ----------------

def test_gtep_draw_is_seeded_by_the_method_name_too():
    space = {"lr": clh.Choice([0.001, 0.003, 0.01, 0.03, 0.1, 0.3]),
             "batch": clh.Choice([8, 16, 32, 64, 128, 256, 512])}
    er = [gtep_search.draw(space, "t", "er", k) for k in range(6)]
    assert er == [gtep_search.draw(space, "t", "er", k) for k in range(6)]       # a function of its inputs only
    # two methods with the same space do not share their configurations (42 values: chance 1/42 each)
    assert sum(a == b for a, b in zip(er, [gtep_search.draw(space, "t", "lwf", k) for k in range(6)])) <= 1
    assert len({tuple(c.items()) for c in er}) >= 4                           # k draws differ too
    # not global state: the stdlib's global random stream neither feeds nor is consumed by a draw
    random.seed(1)
    state = random.getstate()
    assert gtep_search.draw(space, "t", "er", 0) == er[0] and random.getstate() == state


# --- the optimizer is built with its arguments ---------------------------------------------------------

@pytest.mark.parametrize("name", ["sgd", "adam", "adamw"])
def test_make_optimizer_passes_weight_decay_and_momentum(name):
    w = torch.nn.Parameter(torch.tensor([2.0, -4.0]))
    opt = make_optimizer([w], name, lr=0.1, momentum=0.5, weight_decay=0.01)
    group = opt.param_groups[0]
    assert group["lr"] == 0.1 and group["weight_decay"] == 0.01
    if name == "sgd":
        assert group["momentum"] == 0.5
        w.grad = torch.zeros(2)
        opt.step()   # plain SGD step with a zero gradient: w -= lr * wd * w (L2 decay in the gradient)
        assert torch.allclose(w.detach(), torch.tensor([2.0, -4.0]) * (1 - 0.1 * 0.01))


def test_trainer_for_method_builds_the_methods_optimizer_arguments():
    torch.manual_seed(0)
    er = METHODS["er"](ctx(), optimizer="sgd", lr=0.05, momentum=0.3, weight_decay=0.002)
    group = Trainer.for_method(er).optimizer.param_groups[0]
    assert (group["lr"], group["momentum"], group["weight_decay"]) == (0.05, 0.3, 0.002)


# --- diverged records are reused, failed ones rerun -----------------------------------------------------

def test_diverged_and_not_applicable_records_are_reused_failed_and_error_are_not(tmp_path):
    store = ResultsStore(tmp_path / "r.sqlite")
    for status in ("passed", "diverged", "not-applicable", "failed", "error"):
        store.put(RunRecord("s", "sc", "m", 0, status=status, key=status))
    assert [s for s in ("passed", "diverged", "not-applicable", "failed", "error") if store.reusable(s)] == \
        ["passed", "diverged", "not-applicable"]


# --- L2P's batch-wise vote: a tie goes to the lowest prompt id (declared; the code's topk leaves it open) --

def test_batchwise_vote_breaks_ties_towards_the_lowest_prompt_id():
    from clharness.toolkit.vit_prompts import batchwise_vote
    # counts: id 0: 1, id 1: 2, id 2: 2, id 3: 2, id 4: 1 -> the top two of the three tied ids 1, 2, 3: 1 and 2
    idx = torch.tensor([[3, 2], [1, 3], [2, 1], [4, 0]])
    assert batchwise_vote(idx, 5).tolist() == [[1, 2]] * 4
    assert batchwise_vote(torch.tensor([[4], [3]]), 5).tolist() == [[3], [3]]   # 3 and 4 tied once: 3


# --- WA: the authors divide the weight decay by stage + 1 (bwbwzhao/Weight-Aligning iLearn.py:114) ----------

@pytest.mark.parametrize("schedule, expected", [("per-stage", [0.006, 0.003, 0.002]), ("constant", [0.006] * 3)])
def test_wa_weight_decay_is_divided_by_the_stage_plus_one(schedule, expected):
    from test_fidelity_exemplars import experience as uint8_experience, tiny_context
    torch.manual_seed(0)
    wa = METHODS["wa"](tiny_context(num_classes=6, epochs=1), weight_decay=0.006, weight_decay_schedule=schedule)
    decays = []
    real = wa.task_trainer

    def spy(*a, **k):
        trainer, epochs = real(*a, **k)
        decays.append({g["weight_decay"] for g in trainer.optimizer.param_groups})
        return trainer, epochs

    wa.task_trainer = spy
    for t, classes in enumerate([(0, 1), (2, 3), (4, 5)]):
        wa.learn(uint8_experience(classes, seed=t))
    assert [d.pop() for d in decays] == pytest.approx(expected) and not any(decays)


# --- PODNet's embedding is pre-ReLU (PyCIL resnet32 last=True; the authors' raw_features), others' is not --

def _resnet_context():
    from clharness.toolkit.backbones import resnet32
    return clh.Context(clh.Setting.CLASS_IL, 4, (3, 8, 8), seed=0, epochs=1, batch_size=4, memory_size=8,
                       backbone_factory=lambda: resnet32((3, 8, 8)))


def _last_block_by_hand(net, x):
    """resnet32 written out: stem, the first 14 blocks, then the last block's residual sum
    bn2(conv2(relu(bn1(conv1(h))))) + h (identity shortcut) with no ReLU after it, averaged globally."""
    h = net.layers[:-1](net.stem(x))
    b = net.layers[-1]
    s = b.bn2(b.conv2(F.relu(b.bn1(b.conv1(h))))) + h
    return s, s.mean((2, 3))


def test_podnet_embeds_before_the_last_relu_and_other_methods_after_it():
    torch.manual_seed(0)
    x = torch.randn(6, 3, 8, 8, generator=gen(2))
    podnet = METHODS["podnet"](_resnet_context())
    net = podnet.model.backbone.eval()
    with torch.no_grad():
        s, raw = _last_block_by_hand(net, x)
        assert (raw < 0).any()                                   # a pre-ReLU embedding has negative entries
        torch.testing.assert_close(podnet.model.features(x), raw, rtol=1e-5, atol=1e-6)
        maps, h, _ = podnet.model.forward_with_maps(x, podnet.map_names)
        torch.testing.assert_close(maps[-1], s, rtol=1e-5, atol=1e-6)   # POD-spatial's last-stage map
        torch.testing.assert_close(h, raw, rtol=1e-5, atol=1e-6)       # POD-flat, LSC, NME and imprinting
    post = METHODS["podnet"](_resnet_context(), embedding="post-relu").model.backbone.eval()
    er = METHODS["er"](_resnet_context()).model.backbone.eval()
    with torch.no_grad():
        for net in (post, er):
            s, _ = _last_block_by_hand(net, x)
            torch.testing.assert_close(net(x), F.relu(s).mean((2, 3)), rtol=1e-5, atol=1e-6)



# --- A-GEM: the authors' defaults (facebookresearch/agem) -------------------------------------------------

def test_agem_defaults_are_the_authors_plain_sgd_and_ring_memory():
    """replicate_results_iclr19.sh (CIFAR): OPTIM='SGD', A-GEM lr 0.03; conv_split_cifar.py: SAMPLES_PER_CLASS
    13, EPS_MEM_BATCH_SIZE 256."""
    torch.manual_seed(0)
    agem = METHODS["agem"](ctx())
    assert {k: agem.hp[k] for k in ("optimizer", "lr", "momentum", "memory", "per_class", "sample_size")} == \
        {"optimizer": "sgd", "lr": 0.03, "momentum": 0.0, "memory": "ring", "per_class": 13, "sample_size": 256}


def test_agem_ring_memory_keeps_the_last_samples_of_each_class_written_during_training():
    """conv_split_cifar.py:430-438: after each step the batch's samples go to their class's next slot
    (count_cls[c] = (count_cls[c] + 1) % mem_size); the task's memory is read from the next task on.
    Here 3 slots a class; the task's 8 samples come in the order 0, 1, 0, 1, ... (batches of 4), so
    class 0 keeps samples 2, 4, 6 and class 1 samples 3, 5, 7 (the raw views, not the trained ones)."""
    torch.manual_seed(0)
    agem = METHODS["agem"](ctx(num_classes=4), per_class=3)
    exp = experience([0, 1], n=8, batch_size=4, view=lambda x: x + 100.0, seed=3)
    x_all = exp.data.x
    refs = []
    real = agem.memory_batches
    agem.memory_batches = lambda: refs.append(len(agem.memory)) or real()
    agem.learn(exp)
    assert refs == []                                          # nothing read while the first task trains
    (mx, my), = agem.memory.tasks
    for c, rows in ((0, [2, 4, 6]), (1, [3, 5, 7])):
        got = sorted(mx[my == c].flatten(1).tolist())
        assert got == sorted(x_all[rows].flatten(1).tolist())
    agem.learn(experience([2, 3], n=8, batch_size=4, seed=4))
    assert refs == [1, 1]                                      # task 2's two steps read task 1's memory only
    assert len(agem.memory.tasks) == 2 and len(agem.memory.tasks[1][1]) == 6


def test_agem_ring_with_fewer_samples_than_slots_stores_what_was_written():
    from clharness.toolkit.gradient_projection import RingMemory
    ring = RingMemory(4, seed=0)
    x = torch.arange(6.0).view(6, 1)
    ring.write(x[:3], torch.tensor([5, 5, 7]))
    ring.write(x[3:], torch.tensor([5, 5, 5]))                # class 5: 5 writes into 4 slots, the first lost
    ring.add(None)
    (mx, my), = ring.tasks
    assert sorted(mx[my == 5].flatten().tolist()) == [1.0, 3.0, 4.0, 5.0] and mx[my == 7].flatten().tolist() == [2.0]


# --- iCaRL / BiC / WA: CE + KD at T over the old classes, weighted as each reference weighs it ------------

@pytest.mark.parametrize("name, hp, weights", [
    ("icarl", {"kd_lambda": 1.7}, lambda lam: (1.0, 1.7)),                 # PyCIL icarl: CE + KD (weight 1)
    ("bic", {"kd_lambda": 0.0}, lambda lam: (1 - lam, lam)),              # BiC eq. 4: lambda = n / (n + m)
    ("bic", {"kd_lambda": 1.3}, lambda lam: (1.0, 1.3)),
    ("wa", {"kd_lambda": 0.0}, lambda lam: (1 - lam, lam)),               # WA: (1 - lambda) CE + lambda KD
    ("wa", {"kd_lambda": 1.3}, lambda lam: (1.0, 1.3))])
def test_distillation_losses_weigh_ce_and_kd_at_temperature_by_hand(name, hp, weights):
    """Second task of classes (0, 1, 2) then (3), of 5 classes: lambda = 3 old / 4 seen = 0.75. KD (Hinton
    et al. 2015, PyCIL _KD_loss): -sum_k softmax(old_k / T) log softmax(new_k / T), batch mean, over the old
    classes; CE over the seen classes."""
    from test_fidelity_exemplars import experience as uint8_experience, tiny_context
    torch.manual_seed(0)
    T = 3.0
    method = METHODS[name](tiny_context(num_classes=5, epochs=1), temperature=T, **hp)
    x, y = torch.randn(6, 1, 2, 2, generator=gen(9)), torch.tensor([3, 3, 3, 3, 3, 3])
    got = []
    real = method.fit

    def spy(batches, loss_fn=None, params=None, trainer=None):
        if getattr(loss_fn, "__name__", "") == "loss" and method.old_model is not None and not got:
            got.append(loss_fn(x, y).item())
            with torch.no_grad():
                got.append((method.model(x), method.old_model(x)))
        return real(batches, loss_fn, params, trainer)

    method.fit = spy
    method.learn(uint8_experience((0, 1, 2), seed=0))
    method.learn(uint8_experience((3,), seed=1))
    loss, (new, old) = got
    old_classes = [0, 1, 2]
    target = F.softmax(old[:, old_classes] / T, 1)
    kd = -(target * F.log_softmax(new[:, old_classes] / T, 1)).sum(1).mean()
    w_ce, w_kd = weights(3 / 4)
    expected = w_ce * hand_ce(new, y, [0, 1, 2, 3]) + w_kd * kd
    assert loss == pytest.approx(expected.item(), rel=1e-5)


def test_foster_boosting_loss_by_hand():
    """PyCIL foster.py _feature_boosting: CE(logits / per_cls_weights) (logits adjustment with the beta_1
    weights) + lambda_fe CE(fe_logits) + lambda_kd _KD_loss(logits[:, :old], old_logits, T)."""
    from test_fidelity_exemplars import experience as uint8_experience, tiny_context
    torch.manual_seed(0)
    b1, T, fe_w, kd_w = 0.5, 2.0, 0.7, 1.9
    foster = METHODS["foster"](tiny_context(memory_size=6, epochs=1), beta1=b1, temperature=T, fe_weight=fe_w,
                               kd_weight=kd_w, compression_epochs=1)
    foster.learn(uint8_experience((0, 1), seed=0, per_class=5))
    x, y = torch.randn(4, 1, 2, 2, generator=gen(6)), torch.tensor([2, 3, 0, 3])
    got = {}
    real = foster.fit

    def spy(batches, loss_fn=None, params=None, trainer=None):
        if getattr(loss_fn, "__name__", "") == "boosting_loss":
            got["loss"] = loss_fn(x, y).item()
            with torch.no_grad():
                old_f, new_f = foster.model.branch_features(x)
                got["full"] = foster.model.head(torch.cat([old_f, new_f], 1))[:, :4]
                got["fe"] = foster.fe_head(new_f)[:, :4]
                got["old"] = foster.old_head(old_f)[:, :2]
        return real(batches, loss_fn, params, trainer)

    foster.fit = spy
    foster.learn(uint8_experience((2, 3), seed=1, per_class=5))
    n = torch.tensor([3.0, 3.0, 5.0, 5.0], dtype=torch.float64)       # 3 exemplars of 0, 1; 5 images of 2, 3
    w1 = (1 - b1) / (1 - b1 ** n)
    w1 = (w1 / w1.sum() * 4).float()
    target = F.softmax(got["old"] / T, 1)
    kd = -(target * F.log_softmax(got["full"][:, :2] / T, 1)).sum(1).mean()
    expected = hand_ce(got["full"] / w1, y) + fe_w * hand_ce(got["fe"], y) + kd_w * kd
    assert got["loss"] == pytest.approx(expected.item(), rel=1e-5)


@pytest.mark.parametrize("adaptive, expected", [(True, 2.0), (False, 1.0)])
def test_podnet_adaptive_factor_is_sqrt_of_seen_over_new_classes(adaptive, expected):
    """PODNet sec. 3 / PyCIL podnet.py: lambda_c and lambda_f are scaled by sqrt(|C_1:t| / |C_t|):
    classes (0, 1, 2) then (3): sqrt(4 / 1) = 2 (the old classes alone would give sqrt(3))."""
    from test_fidelity_exemplars import experience as uint8_experience, tiny_context
    torch.manual_seed(0)
    podnet = METHODS["podnet"](tiny_context(num_classes=5, epochs=1), adaptive_factor=adaptive, finetune_epochs=0)
    podnet.learn(uint8_experience((0, 1, 2), seed=0))
    assert podnet.factor == 1.0                                  # the first task distils nothing
    podnet.learn(uint8_experience((3,), seed=1))
    assert podnet.factor == pytest.approx(expected)


def test_augmentation_draws_are_seeded_by_the_experience_seed():
    """Experience's augmentation generator is derived from its seed (a run's seed and task): the same
    seed gives the same views, another seed other views."""
    from clharness.data.base import ArrayDataset, TensorData
    ds = ArrayDataset(torch.randint(0, 256, (16, 3, 8, 8), dtype=torch.uint8, generator=gen(0)), torch.arange(16) % 2,
                      list("ab"))
    views = []
    for seed in (0, 0, 1):
        data = TensorData(ds, [0.5] * 3, [0.25] * 3, recipe=A.get("cifar"))
        exp = clh.Experience(data, (0, 1), None, batch_size=16, seed=seed)
        views.append(exp.augment(data.prepare(data.images)))
    assert torch.equal(views[0], views[1]) and not torch.equal(views[0], views[2])


def test_cwr_past_weight_is_the_square_root_of_past_over_current_counts():
    """Avalanche cwr_star.py:82-88: w_past = sqrt(past_j / cur_j), cw = (cw w_past + (tw - mean)) / (w_past + 1),
    past_j += cur_j. Class 0 seen with 10 samples, then with 40: w_past = sqrt(10 / 40) = 0.5."""
    from clharness.toolkit.backbones import MLP
    cwr = METHODS["cwr"](ctx(backbone=lambda: MLP((1, 2, 2), hidden=2, layers=1)))
    classes = torch.tensor([0])
    with torch.no_grad():
        cwr.model.head.weight[classes] = torch.tensor([[2.0, 4.0]])      # mean 3: cw = [-1, 1]
    cwr.consolidate_classes(classes, torch.tensor([10.0]))
    with torch.no_grad():
        cwr.model.head.weight[classes] = torch.tensor([[0.0, 6.0]])      # mean 3: tw - mean = [-3, 3]
    cwr.consolidate_classes(classes, torch.tensor([40.0]))
    expected = (torch.tensor([[-1.0, 1.0]]) * 0.5 + torch.tensor([[-3.0, 3.0]])) / 1.5
    torch.testing.assert_close(cwr.cw_weight[classes], expected)
    assert cwr.past[0].item() == 50.0


# --- loss weights: each term scaled by its own hyperparameter ---------------------------------------------

def test_mas_penalty_is_lambda_times_importance_weighted_squared_drift():
    """MAS (Aljundi et al. 2018, eq. 3-4; Avalanche MASPlugin): L = CE + lambda sum_i Omega_i (theta_i - theta*_i)^2."""
    torch.manual_seed(0)
    mas = METHODS["mas"](ctx(), mas_lambda=3.0)
    name, p = next(iter(mas.model.named_parameters()))
    omega = torch.rand(p.shape, generator=gen(1))
    anchor = p.detach() + 0.5 * torch.randn(p.shape, generator=gen(2))
    x, y = torch.randn(4, 1, 2, 2, generator=gen(3)), torch.tensor([0, 1, 2, 3])
    plain = mas.loss(x, y).item()
    mas.importance, mas.anchor = {name: omega}, {name: anchor}
    penalty = (omega * (p.detach() - anchor) ** 2).sum().item()
    assert mas.loss(x, y).item() - plain == pytest.approx(3.0 * penalty, rel=1e-5)


def test_der_auxiliary_loss_is_weighted_and_targets_old_classes_as_zero():
    """DER (Yan et al. 2021, eq. 7; PyCIL der.py): L = L_{H_t} + lambda_a CE(aux(u_t), y_a), y_a = 0 for every
    old class and 1..|Y_t| for the new task's classes (in task order)."""
    from test_fidelity_exemplars import experience as uint8_experience, tiny_context
    torch.manual_seed(0)
    der = METHODS["der"](tiny_context(epochs=1), aux_weight=2.5)
    der.learn(uint8_experience((0, 1), seed=0))
    x, y = torch.randn(4, 1, 2, 2, generator=gen(4)), torch.tensor([2, 3, 0, 1])
    got = []
    real = der.fit

    def spy(batches, loss_fn=None, params=None, trainer=None):
        if not got:
            full = (loss_fn or der.loss)(x, y).item()
            with torch.no_grad():
                aux = der.aux_head(der.model.branch_features(x)[-1])
            der.hp["aux_weight"] = 0.0
            got.append((full, (loss_fn or der.loss)(x, y).item(), aux))
            der.hp["aux_weight"] = 2.5
        return real(batches, loss_fn, params, trainer)

    der.fit = spy
    der.learn(uint8_experience((2, 3), seed=1))
    full, without, aux = got[0]
    y_aux = [1, 2, 0, 0]
    assert full - without == pytest.approx(2.5 * hand_ce(aux, torch.tensor(y_aux)).item(), rel=1e-5)


def test_bic_holds_out_split_ratio_of_the_memory_per_old_class_for_every_class():
    """BiC (Wu et al. 2019, sec. 4.2; PyCIL bic.py): the validation set takes split_ratio x memory / old
    classes samples of every class, old and new: 0.2 x 20 / 2 = 2 each (one row always stays to train)."""
    from test_fidelity_exemplars import experience as uint8_experience, tiny_context
    torch.manual_seed(0)
    bic = METHODS["bic"](tiny_context(memory_size=20, epochs=1), split_ratio=0.2)
    bic.learn(uint8_experience((0, 1), seed=0, per_class=5))
    bic.known = [0, 1]
    (tx, ty), (vx, vy) = bic.split(uint8_experience((2, 3), seed=1, per_class=10))
    assert torch.bincount(vy, minlength=4).tolist() == [2, 2, 2, 2]
    assert len(ty) + len(vy) == 10 + 20                               # 2 x 5 exemplars + 2 x 10 new images


def test_gtep_configuration_score_is_the_mean_of_the_trials_harmonic_means():
    """GTEP Alg. 2 lines 9-10: P_s = H(Acc_s, AvgAcc_s) per trial, P_r = 1/S sum_s P_s (a mean, not a median)."""
    from clharness.benchmarks.gtep.selection import config_score
    pairs = [(0.2, 0.4), (0.3, 0.3), (0.9, 0.8)]
    records = [RunRecord("s", "sc", "m", seed, status="passed", key=str(seed),
                         metrics={"final_acc": a, "avg_inc_acc": b}) for seed, (a, b) in enumerate(pairs)]
    hm = [2 * a * b / (a + b) for a, b in pairs]                    # 0.2667, 0.3, 0.8471
    assert config_score(records) == pytest.approx(sum(hm) / 3)
    acc, avg = sum(a for a, _ in pairs) / 3, sum(b for _, b in pairs) / 3
    assert config_score(records, "hmean-of-means") == pytest.approx(2 * acc * avg / (acc + avg))


# --- X-DER: alpha weighs the logit replay, MSE over all heads (mammoth xder.py; DER eq. 2) --------------

def test_xder_alpha_weighs_the_mse_between_replayed_logits_and_the_stored_ones():
    """L = CE(current head) + alpha mean_{i,k} (h(x'_i)_k - z'_ik)^2 + (the other terms): on the second task
    the loss at alpha = 0.7 minus the loss at alpha = 0, with the same memory draws, is 0.7 x the mean
    squared error over every head between the network's logits of the first draw and the logits stored
    before this step (its second step: at the first, the network is the one that stored them)."""
    from test_fidelity_exemplars import experience as uint8_experience, tiny_context
    torch.manual_seed(0)
    xder = METHODS["xder"](tiny_context(memory_size=6, epochs=1), preset="custom", alpha=0.7, beta=0.8, lambd=0.0,
                            lr=0.5)   # a large step, so the logits move well away from the stored ones
    xder.learn(uint8_experience((0, 1), seed=0))
    got, calls = [], []
    real = type(xder).xder_loss.__get__(xder)

    def spy(x, y, view=None):
        calls.append(1)
        if len(calls) == 2:   # the second step: the network has moved since the logits were stored
            state, stored = xder.gen.get_state(), xder.buffer_logits.clone()
            slots = torch.randperm(len(xder.buffer), generator=xder.gen)[:len(y)]   # sample()'s first draw
            xder.gen.set_state(state)
            full = real(x, y).item()
            xder.gen.set_state(state)
            xder.buffer_logits = stored.clone()                 # the update of the first call undone
            xder.hp["alpha"] = 0.0
            without = real(x, y).item()
            xder.hp["alpha"] = 0.7
            with torch.no_grad():
                mse = ((xder.model(xder.buffer.x[slots]) - stored[slots]) ** 2).mean().item()
            got.append((full, without, mse))
        return real(x, y, view)

    xder.xder_loss = spy
    xder.learn(uint8_experience((2, 3), seed=1))
    full, without, mse = got[0]
    # float32 losses near 1 differ by ~1e-7: the difference is compared to that precision
    assert mse > 1e-3 and full - without == pytest.approx(0.7 * mse, rel=1e-3, abs=1e-6)


# --- BEEF: energy_weight weighs the energy term of the expansion loss (PyCIL beef_iso.py) --------------

def test_beef_energy_weight_weighs_the_energy_loss_beside_the_aligned_cross_entropy():
    """Expansion loss = CE(old tasks' backward-prototype logits / logits_alignment, new logits; task-level
    targets) + energy_weight x CE(energy): on the second task, with the same noise draws, the loss minus
    energy_weight x the energy loss is the aligned cross-entropy written out by hand."""
    from test_fidelity_exemplars import experience as uint8_experience, tiny_context
    torch.manual_seed(0)
    w, align = 0.3, 1.7
    beef = METHODS["beef"](tiny_context(memory_size=6, epochs=1), energy_weight=w, logits_alignment=align)
    beef.learn(uint8_experience((0, 1), seed=0))
    x, y = torch.randn(4, 1, 2, 2, generator=gen(6)), torch.tensor([2, 3, 0, 1])
    got = []
    real = beef.fit

    def spy(batches, loss_fn=None, params=None, trainer=None):
        if getattr(loss_fn, "__name__", "") == "expansion_loss" and not got:
            torch.manual_seed(11)
            full = loss_fn(x, y).item()
            targets = beef.task_targets(y)
            torch.manual_seed(11)                       # the negatives' noise, drawn again
            energy = beef.energy_loss(x, y, targets).item()
            with torch.no_grad():
                logits = beef.train_logits(beef.model.newest_features(x))
            got.append((full, energy, logits, targets))
        return real(batches, loss_fn, params, trainer)

    beef.fit = spy
    beef.learn(uint8_experience((2, 3), seed=1))
    full, energy, logits, targets = got[0]
    # one backward prototype (task 0) then the new classes 2, 3: targets 0 for classes 0, 1; 1 + position
    assert targets.tolist() == [1, 2, 0, 0]
    aligned = torch.cat([logits[:, :1] / align, logits[:, 1:]], 1)
    assert energy > 0 and full == pytest.approx(hand_ce(aligned, targets).item() + w * energy, rel=1e-5)
