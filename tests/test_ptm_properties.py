"""Shown and kept (issue 29): every pretrained-model method, on a tiny randomly initialised timm ViT
(``pretrained=False``, 2 blocks, 8x8 patches on 32x32 inputs), learns two class-incremental tasks of
synthetic images fed as [0, 1] tensors (the PTM suites' ``normalize = "none"``), and the property
its paper states holds on what it learned, checked by hand from its tensors:

SimpleCIL's prototypes are the class means of the frozen features; RanPAC's random projection and
adapted model are fixed after phase 1; L2P and DualPrompt never move the pretrained ViT, and
DualPrompt's earlier expert prompt stays as its task left it; SLCA keeps the class statistics of a
finished task and stores the means of the features; CODA-Prompt's new components are orthogonal to
the old ones; APER's adapted branch is frozen after task 1 and its prototypes are the means of the
concatenated features; EASE freezes each task's adapter set; PGP's prompt and key gradients are
orthogonal to the stored subspaces; LAE's offline PET is an EMA that moves; HiDe-Prompt's new
E-prompt equals the old one before training.

Item 8 of issue 29: APER, RanPAC and EASE use SGD with momentum 0.9, as LAMDA-PILOT
(models/aper_adapter.py, ranpac.py, ease.py) and the RanPAC authors' RanPAC.py build it.
"""
import functools

import pytest
import torch
import torch.nn.functional as F

import clharness as clh
from clharness.data.base import TensorData
from clharness.data.synthetic import Synthetic
from clharness.toolkit.backbones import timm_backbone
from clharness_methods import REFERENCE_METHODS

METHODS = {cls.name: cls for cls in REFERENCE_METHODS}
SHAPE = (3, 32, 32)
CLASSES = 4
VIT = dict(model="vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2)
# the tiny-ViT settings of ptm-mini (2 blocks: prompt layers 0-1, G-prompt on 0 and E-prompts on 1)
HP = {"simplecil": {}, "ranpac": {"projection_dim": 300},
      "l2p": {"lr": 0.16, "pool_size": 4, "top_n": 2, "prompt_length": 3},
      "pgp": {"lr": 0.16, "pool_size": 4, "top_n": 2, "prompt_length": 3},
      "dualprompt": {"lr": 0.16, "g_layers": "0-0", "e_layers": "1-1"},
      "slca": {"ca_epochs": 1, "samples_per_class": 16},
      "coda_prompt": {"layers": "0-1", "num_tasks": 2, "pool_size": 4, "prompt_length": 4},
      "aper": {"ffn_num": 8, "lr": 0.05}, "ease": {"ffn_num": 8, "lr": 0.05},
      "lae": {"layers": "0-1", "freeze_epochs": 0}, "hide_prompt": {"lr": 0.01, "layers": "0-1", "ca_epochs": 1}}
PTM = sorted(HP)


def tiny_vit():
    torch.manual_seed(0)   # the same random "pretrained" ViT for every method
    return timm_backbone(SHAPE, **VIT)


@pytest.fixture(scope="module")
def tasks():
    """Two tasks of two classes, [0, 1] inputs (normalize = "none": mean 0, std 1)."""
    src = Synthetic(num_classes=CLASSES, channels=3, image_size=32, similarity=0.3, noise=0.15,
                    train_per_class=12, test_per_class=4, seed=5)
    train = src.load(None, True)

    def part(classes):
        idx = torch.isin(train.labels, torch.tensor(classes)).nonzero().squeeze(1)
        return TensorData(train.subset(idx), [0.0], [1.0])
    return [clh.Experience(part(c), c, None, 8, t) for t, c in enumerate([(0, 1), (2, 3)])]


def make(name, epochs=1, **hp):
    ctx = clh.Context(clh.Setting.CLASS_IL, CLASSES, SHAPE, seed=0, epochs=epochs, batch_size=8, memory_size=0,
                      backbone_factory=tiny_vit)
    return METHODS[name](ctx, **{**HP[name], **hp})


def state(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def images(exp):
    return next(exp.data.batches(1000, shuffle=False))


def test_every_ptm_method_learns_two_tasks_of_a_random_tiny_vit(tasks):
    """The list below is every method of ptm-mini that needs a ViT; each trains and predicts."""
    for name in PTM:
        method = make(name)
        for exp in tasks:
            method.learn(exp)
        x, _ = images(tasks[0])
        logits = method.predict(x)
        assert logits.shape == (len(x), CLASSES) and torch.isfinite(logits).all(), name


def test_simplecil_prototypes_are_the_class_means_of_the_frozen_features(tasks):
    method = make("simplecil")
    for exp in tasks:
        method.learn(exp)
    backbone = tiny_vit().eval()
    protos = method.sums / method.counts[:, None]
    for exp in tasks:
        x, y = images(exp)
        with torch.no_grad():
            f = backbone(x)
        for c in exp.classes:
            torch.testing.assert_close(protos[c], f[y == c].mean(0), rtol=1e-5, atol=1e-5)
    # prediction: cosine similarity to the prototypes
    x, _ = images(tasks[1])
    with torch.no_grad():
        expected = F.normalize(backbone(x), dim=1) @ F.normalize(protos, dim=1).T
    torch.testing.assert_close(method.predict(x), expected, rtol=1e-4, atol=1e-5)


def test_ranpac_projection_and_adapted_model_are_fixed_after_phase_one(tasks):
    method = make("ranpac")
    method.learn(tasks[0])
    projection, adapted = method.projection.clone(), state(method.frozen)
    x, _ = images(tasks[1])
    h = method.features(x)
    method.learn(tasks[1])
    assert method.adaptation == "adapter"
    assert torch.equal(method.projection, projection)
    assert_same(state(method.frozen), adapted)
    torch.testing.assert_close(method.features(x), h, rtol=0, atol=0)
    assert projection.shape == (192, 300)


@pytest.mark.parametrize("name", ["l2p", "dualprompt"])
def test_prompt_methods_never_move_the_pretrained_vit(tasks, name):
    method = make(name)
    before = state(method.frozen)
    method.learn(tasks[0])
    if name == "dualprompt":
        e0, k0 = method.e_prompts[0].detach().clone(), method.e_keys[0].detach().clone()
    method.learn(tasks[1])
    assert_same(state(method.frozen), before)
    if name == "dualprompt":   # task 0's expert prompt and key are as task 0 left them
        assert torch.equal(method.e_prompts[0], e0) and torch.equal(method.e_keys[0], k0)
        assert not torch.equal(method.e_prompts[1], e0)   # task 1's learned


def test_slca_keeps_finished_class_statistics_and_stores_feature_means(tasks):
    method = make("slca")
    method.learn(tasks[0])
    kept = {c: method.means[c].clone() for c in (0, 1)}
    method.learn(tasks[1])
    for c in (0, 1):   # the slow learner moved the backbone, the old statistics stay
        assert torch.equal(method.means[c], kept[c])
    x, y = images(tasks[1])
    method.model.eval()
    with torch.no_grad():
        f = method.features(x)
    for c in (2, 3):
        torch.testing.assert_close(method.means[c], f[y == c].mean(0), rtol=1e-4, atol=1e-5)


def test_coda_prompt_new_components_start_orthogonal_to_the_old(tasks):
    method = make("coda_prompt")
    method.learn(tasks[0])
    grown = {}
    pool_grow = method.pool.grow

    def spy(n, gen):
        pool_grow(n, gen)
        grown.update({k: getattr(method.pool, k).detach().clone() for k in ("P", "K", "A")})
    method.pool.grow = spy
    method.learn(tasks[1])
    assert grown, "the second task grew no components"
    for key, t in grown.items():
        t = t.flatten(2)
        old, new = t[:, :2], t[:, 2:]
        gram = new @ new.transpose(1, 2)
        torch.testing.assert_close(gram, torch.eye(2).expand_as(gram), atol=1e-5, rtol=0)
        assert (new @ F.normalize(old, dim=2).transpose(1, 2)).abs().max() < 1e-4, key


def test_aper_adapted_branch_is_frozen_after_task_one_and_prototypes_are_feature_means(tasks):
    method = make("aper")
    method.learn(tasks[0])
    adapted = state(method.adapted)
    method.learn(tasks[1])
    assert_same(state(method.adapted), adapted)
    protos = method.sums / method.counts[:, None]
    for exp in tasks:
        x, y = images(exp)
        f = torch.cat([method.frozen(x), method.adapted(x)], 1)
        for c in exp.classes:
            torch.testing.assert_close(protos[c], f[y == c].mean(0), rtol=1e-4, atol=1e-5)


def test_ease_freezes_each_tasks_adapter_set(tasks):
    method = make("ease")
    method.learn(tasks[0])
    first = state(method.subspaces[0])
    method.learn(tasks[1])
    assert len(method.subspaces) == 2
    assert_same(state(method.subspaces[0]), first)
    a0 = [v for k, v in state(method.subspaces[0]).items() if "adapter" in k]
    a1 = [v for k, v in state(method.subspaces[1]).items() if "adapter" in k]
    assert a0 and any(not torch.equal(u, v) for u, v in zip(a0, a1))   # task 1 trained its own set


def test_pgp_gradients_are_orthogonal_to_the_stored_subspaces(tasks):
    method = make("pgp")
    method.learn(tasks[0])
    U_prompt, U_key = method.prompt_space.basis.clone(), method.key_space.basis.clone()
    seen = []
    project = method.project_gradients

    def spy():
        project()
        seen.append((method.pool.prompts.grad.clone(), method.pool.keys.grad.clone()))
    method.project_gradients = spy
    method.learn(tasks[1])
    assert seen
    for g_prompt, g_key in seen:
        assert (g_prompt @ U_prompt).abs().max() < 1e-5 * max(1.0, float(g_prompt.abs().max()))
        assert (g_key @ U_key).abs().max() < 1e-5 * max(1.0, float(g_key.abs().max()))
    assert any(float(g.abs().max()) > 0 for g, _ in seen)


# ------------------------------------------------------------------------------------ item 8: momentum

@pytest.mark.parametrize("name", ["aper", "ranpac", "ease"])
def test_aper_ranpac_ease_default_to_pilots_sgd_momentum(tasks, monkeypatch, name):
    built = []
    sgd = torch.optim.SGD

    class Spy(sgd):
        def __init__(self, params, **kw):
            built.append(kw)
            super().__init__(params, **kw)
    monkeypatch.setattr(torch.optim, "SGD", Spy)
    assert METHODS[name].hparams["momentum"].default == 0.9
    make(name).learn(tasks[0])
    assert built and all(kw["momentum"] == 0.9 for kw in built)
    built.clear()
    make(name, momentum=0.5).learn(tasks[0])    # the knob reaches the optimizer
    assert built and all(kw["momentum"] == 0.5 for kw in built)


# ---------------------------------------------------------- LAE and HiDe-Prompt (being changed by another helper)

def test_lae_offline_pet_is_an_ema_that_moves(tasks):
    method = make("lae")
    method.learn(tasks[0])
    start = state(method.offline if method.offline is not None else method.online)
    method.learn(tasks[1])
    offline, online = state(method.offline), state(method.online)
    moved = [k for k in offline if not torch.equal(offline[k], start[k])]
    assert moved, "the offline PET did not move during task 1"
    assert any(not torch.equal(offline[k], online[k]) for k in offline)   # an EMA lags its online twin


def test_hide_prompt_new_e_prompt_equals_the_old_before_training(tasks):
    method = make("hide_prompt")
    method.learn(tasks[0])
    learned = method.e_prompts.detach().clone()
    at_start = []
    represent = method.represent

    def spy(x, task):
        if not at_start:
            at_start.append(method.e_prompts.detach().clone())
        return represent(x, task)
    method.represent = spy
    method.learn(tasks[1])
    first = at_start[0]
    assert first.shape[0] == 2
    assert torch.equal(first[1], first[0]) and torch.equal(first[0], learned[0])
    assert not torch.equal(method.e_prompts[1], first[1])   # then it trains
