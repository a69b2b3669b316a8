"""Issue 17: RanPAC, SLCA, L2P and DualPrompt as their papers and reference code run them, on the
tiny "pretrained" ViT of test_ptm_methods (its fixtures are reused here)."""
import copy

import pytest
import torch

from test_ptm_methods import (METHODS, PROMPTED, accuracy, context, data, experiences,  # noqa: F401
                              fresh_feature_pool, pretrained, tiny_vit)


def test_ranpac_gram_is_shared_by_clones_until_one_side_updates(data):
    exps = experiences(data)
    method = METHODS["ranpac"](context(), projection_dim=64)
    method.learn(exps[0])
    twin, snap = method.clone(), method.snapshot()
    assert twin.state is method.state and snap["state"] is method.state      # no copy of G, C or W
    assert twin.gram.data_ptr() == method.gram.data_ptr()
    gram, corr = method.gram.clone(), method.corr.clone()
    twin.learn(exps[1])                                                     # the twin updates: copy on write
    assert twin.state is not method.state
    assert torch.equal(method.gram, gram) and torch.equal(method.corr, corr)  # the original is unchanged
    assert not torch.equal(twin.gram, gram) and torch.equal(twin.projection, method.projection)
    method.learn(exps[1])                                                   # and the other way round
    torch.testing.assert_close(method.gram, twin.gram)
    method.restore(snap)
    assert torch.equal(method.gram, gram)
    assert method.memory_report().tensor_elements >= 192 * 64 + 64 * 64 + 64 * 6   # W, G, C counted


def test_ranpac_vpt_phase_one_trains_deep_prompts_then_freezes_them(data):
    method = METHODS["ranpac"](context(), projection_dim=64, adapter="vpt", prompt_tokens=3)
    method.learn(experiences(data)[0])
    vpt = method.frozen.backbone.vpt
    assert method.adaptation == "vpt" and vpt.shape == (2, 3, 192)      # one prompt set per block
    assert vpt.abs().sum() > 0 and not vpt.requires_grad
    none = METHODS["ranpac"](context(), projection_dim=64, adapter="none")
    none.learn(experiences(data)[0])
    assert none.adaptation == "none" and type(none.frozen.backbone).__name__ == "TimmBackbone"


def test_ranpac_tunes_gtep_table5_sets():
    from clharness.benchmarks.gtep.search import method_space
    space = method_space(METHODS["ranpac"], {"general": "table5"}).space
    assert list(space["ffn_num"].values) == [4, 8, 16, 32, 64]                  # "FFN num"
    assert list(space["prompt_tokens"].values) == [3, 5, 10, 20, 30, 50]        # "Prompt token num"
    assert list(space["projection_dim"].values) == [5000, 10000, 15000, 20000]  # M


def _spy(method, name, record):
    """Record the head's weight each time ``method.<name>`` is called, then call it."""
    original = getattr(method, name)

    def spied(*args, **kwargs):
        record.append((name, method.model.head.weight.detach().clone()))
        return original(*args, **kwargs)
    setattr(method, name, spied)


def test_slca_alignment_serves_evaluation_only_and_runs_from_the_second_task(data):
    exps = experiences(data)
    method = METHODS["slca"](context(), samples_per_class=16)
    calls = []
    for name in ("fit", "align", "sample"):
        _spy(method, name, calls)
    method.learn(exps[0])
    assert [c for c, _ in calls] == ["fit"]                                   # no alignment after task 1
    unaligned_1 = method.unaligned["weight"].clone()
    assert torch.equal(method.model.head.weight, unaligned_1)
    calls.clear()
    method.learn(exps[1])
    assert [c for c, _ in calls] == ["fit", "align"] + ["sample"] * 5         # resampled every CA epoch
    # the old task's head rows were frozen while task 2 trained (the head at align() is the trained one)
    at_align = calls[1][1]
    assert torch.equal(at_align[[0, 1]], unaligned_1[[0, 1]]) and not torch.equal(at_align[[2, 3]], unaligned_1[[2, 3]])
    aligned = method.model.head.weight.detach().clone()
    assert not torch.equal(aligned, at_align)                                 # alignment changed the head ...
    assert torch.equal(method.unaligned["weight"], at_align)
    calls.clear()
    method.learn(exps[2])
    assert torch.equal(calls[0][1], at_align)                                 # ... but task 3 trains from before it


def test_slca_mean_scaling_logit_norm_and_milestone(data):
    exps = experiences(data)
    method = METHODS["slca"](context(epochs=5), samples_per_class=4, ca_epochs=0)
    for exp in exps:
        method.learn(exp)
    # the code's mean scaling after task T = 2: 0.9 + 0.1 (t + 1) / 3 for a class of task t
    scales = method.mean_scales()
    assert scales == pytest.approx({0: 0.9 + 0.1 / 3, 1: 0.9 + 0.1 / 3, 2: 0.9 + 0.2 / 3, 3: 0.9 + 0.2 / 3, 4: 1.0, 5: 1.0})
    torch.manual_seed(0)
    method.means = {c: torch.randn(192) for c in range(6)}
    method.covs = {c: 1e-8 * torch.eye(192) for c in range(6)}              # nearly no spread: samples = s_c μ_c
    feats, labels = method.sample()
    for c in range(6):
        torch.testing.assert_close(feats[labels == c].mean(0), scales[c] * method.means[c], rtol=0, atol=1e-3)
    # logit normalisation by hand: per-task norms of [3, 4 | 0, 0 | 6, 8] are 5, 0, 10 -> mean 5, τ = 0.1
    logits = torch.tensor([[3.0, 4.0, 0.0, 0.0, 6.0, 8.0]])
    torch.testing.assert_close(method.normalised_logits(logits), logits / 5 / 0.1, rtol=1e-5, atol=1e-5)
    # MultiStepLR: lr x 0.1 after int(0.8 x 5) = 4 epochs, for both parameter groups
    trainer = method.slow_learner()
    base = [g["initial_lr"] for g in trainer.optimizer.param_groups]
    lr = lambda e: [b * f(e) for b, f in zip(base, trainer.scheduler.lr_lambdas)]   # noqa: E731
    assert lr(3) == pytest.approx([1e-4, 1e-2]) and lr(4) == pytest.approx([1e-5, 1e-3])


@pytest.mark.parametrize("name,base", [("l2p", 0.03), ("dualprompt", 0.005)])
def test_prompt_methods_scale_lr_by_batch_over_256_and_clip_gradients(name, base):
    from clharness.toolkit.training import Trainer
    layers = {k: v for k, v in PROMPTED[name].items() if k.endswith("layers")}   # a 2-block ViT
    method = METHODS[name](context(), **layers)                         # batch size 16
    params = list(method.head.parameters())
    trainer = Trainer.for_method(method, params)
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(base * 16 / 256)   # L2P: 0.001875
    assert trainer.clip_grad == 1.0
    unscaled = METHODS[name](context(), scale_lr=False, **layers)
    assert Trainer.for_method(unscaled, params).optimizer.param_groups[0]["lr"] == pytest.approx(base)
    # the clipping itself: plain SGD at lr 1 on a huge gradient moves by exactly norm 1
    w = torch.nn.Parameter(torch.zeros(5))
    step = Trainer(name, torch.optim.SGD([w], lr=1.0), method.context)
    step.clip_grad = 1.0
    step.step(lambda: (1000 * torch.arange(5.0) * w).sum())
    assert w.detach().norm().item() == pytest.approx(1.0, rel=1e-5)


def test_dualprompt_new_e_prompt_starts_from_the_previous_tasks(data):
    exps = experiences(data)
    method = METHODS["dualprompt"](context(epochs=1), **PROMPTED["dualprompt"])
    method.learn(exps[0])
    first = method.e_prompts.detach()[0].clone()
    method.context.epochs = 0                       # no training: the new task's prompt as initialised
    method.learn(exps[1])
    assert torch.equal(method.e_prompts[1], first) and torch.equal(method.e_prompts[0], first)
    assert not torch.equal(method.e_keys[1], method.e_keys[0])   # the key starts afresh (no shared key)


def test_frozen_backbone_methods_share_one_backbone_pass_per_image(data):
    """SimpleCIL and RanPAC (no phase 1) on the same frozen weights: one forward per image for
    both, none at all when a finished method is run again; other weights get their own pass."""
    images = []

    def counted(**extra):
        backbone = tiny_vit(**extra)
        backbone.register_forward_hook(lambda m, i, o: images.append(len(i[0])))
        return backbone

    def run(name, factory=counted, **hp):
        method = METHODS[name](context(factory=factory), **hp)
        for exp in experiences(data):
            method.learn(exp)
        return method

    simple = run("simplecil")
    assert sum(images) == 6 * 24                                # every training image once
    ranpac = run("ranpac", projection_dim=64, adapter="none")
    again = run("simplecil")                                    # a finished method run again
    assert sum(images) == 6 * 24 and ranpac.frozen.backbone is simple.frozen.backbone
    acc = [accuracy(m, data) for m in (simple, ranpac, again)]
    assert sum(images) == 6 * 24 + 6 * 12 and acc[0] == acc[2]  # the test images once, for all three
    assert simple.frozen.features.calls == len(images)          # the shared table counts every pass

    def other_weights():
        backbone = counted()
        with torch.no_grad():
            backbone.model.blocks[0].mlp.fc1.weight.add_(1e-3)
        return backbone
    run("simplecil", factory=other_weights)
    assert sum(images) == 2 * 6 * 24 + 6 * 12                   # other weights: their own pass
