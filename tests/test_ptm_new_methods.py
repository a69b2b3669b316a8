"""The pretrained-model methods of issue 17 (CODA-Prompt, APER, EASE, LAE, ...) on the tiny
"pretrained" ViT of test_ptm_methods (2 blocks, 32x32 inputs, 8x8 patches, 6 synthetic classes in
3 tasks): each method's defining rule from its paper, checked by hand on the trained method."""
import pytest
import torch
import torch.nn.functional as F

import clharness as clh
from clharness.toolkit import training
from clharness.toolkit.vit_prompts import embed, forward_blocks
from clharness_methods import REFERENCE_METHODS
from test_ptm_methods import (CLASSES, accuracy, context, data, experiences, pretrained,  # noqa: F401
                              task_il_accuracy)

METHODS = {cls.name: cls for cls in REFERENCE_METHODS}
CODA = dict(lr=0.01, pool_size=6, num_tasks=3, prompt_length=4, layers="0-1")


def test_coda_prompt_is_the_attention_weighted_sum_of_components(data):
    method = METHODS["coda_prompt"](context(epochs=2), **CODA)
    exps = experiences(data)
    method.learn(exps[0])
    first = [t.detach().clone() for t in (method.pool.P, method.pool.K, method.pool.A)]
    method.learn(exps[1])
    P, K, A = (t.detach() for t in (method.pool.P, method.pool.K, method.pool.A))
    assert P.shape == (2, 4, 4, 192) and K.shape == A.shape == (2, 4, 192)     # 2 components per task
    for old, new in zip(first, (P, K, A)):
        assert torch.equal(new[:, :2], old)                                     # task 1's are frozen
    x, _ = next(data[2][1].batches(5, shuffle=False))
    q = method.frozen.backbone(x)
    layer = 1
    # by hand: alpha_m = cos(q * A_m, K_m); p = sum_m alpha_m P_m
    alpha = torch.tensor([[float(torch.dot(q[b] * A[layer, m], K[layer, m])
                                 / ((q[b] * A[layer, m]).norm() * K[layer, m].norm())) for m in range(4)]
                          for b in range(5)])
    p = sum(alpha[:, m, None, None] * P[layer, m][None] for m in range(4))
    torch.testing.assert_close(method.pool.prompt(q, layer), p, rtol=1e-5, atol=1e-6)
    # the prompt's halves are the key and value prefixes of the block's attention
    vit = method.frozen.backbone.model
    prefixes = {b: sum(alpha_b[:, m, None, None] * P[b, m][None] for m in range(4)).view(5, 2, 2, 192)
                for b, alpha_b in ((0, method.pool.weights(q, 0)[0]), (1, alpha))}
    expected = method.head(vit.forward_head(forward_blocks(vit, embed(vit, x), prefixes), pre_logits=True))
    torch.testing.assert_close(method.predict(x), expected.masked_fill(~method.seen, -1e4), rtol=1e-4, atol=1e-4)


def test_coda_prompt_new_components_are_gram_schmidt_orthogonal(data):
    method = METHODS["coda_prompt"](context(epochs=1), **CODA)
    method.learn(experiences(data)[0])
    method.pool.grow(2, method.gen)                     # what the next task does first
    for t in (method.pool.K, method.pool.A, method.pool.P.flatten(2)):
        new, old = t[:, 2:].detach(), t[:, :2].detach()
        torch.testing.assert_close(new @ new.transpose(1, 2), torch.eye(2).expand(2, 2, 2), atol=1e-5, rtol=0)
        assert (new @ F.normalize(old, dim=2).transpose(1, 2)).abs().max() < 1e-4


def test_coda_prompt_learns_and_checks_its_settings(data):
    method = METHODS["coda_prompt"](context(epochs=3), **{**CODA, "ortho_mu": 0.1})
    for exp in experiences(data):
        method.learn(exp)
    assert min(task_il_accuracy(method, data)) > 0.8
    assert accuracy(method, data) > 1 / CLASSES + 0.05
    assert method.memory_report().parameters >= 3 * 2 * 2 * (4 * 192 + 2 * 192)   # the components
    try:
        METHODS["coda_prompt"](context(), **{**CODA, "pool_size": 2})
    except clh.HParamError as e:
        assert "pool_size=2 gives no component to each of 3 tasks" in str(e)
    else:
        raise AssertionError("a pool smaller than the task count must be refused")


def test_aper_prototypes_live_on_concatenated_frozen_and_adapted_features(data):
    method = METHODS["aper"](context(epochs=2), ffn_num=16, lr=0.1)
    vit = method.frozen.backbone.model
    w0 = vit.blocks[0].mlp.fc1.weight.clone()
    exps = experiences(data)
    method.learn(exps[0])
    adapters = [p.detach().clone() for p in method.adapted.backbone.adapters.parameters()]
    ups = [p for n, p in method.adapted.backbone.adapters.named_parameters() if n.endswith("up.weight")]
    assert len(ups) == 2 and all(p.abs().sum() > 0 for p in ups)        # zero-initialised, then trained
    for exp in exps[1:]:
        method.learn(exp)
    assert all(torch.equal(a, b) for a, b in zip(adapters, method.adapted.backbone.adapters.parameters()))
    assert torch.equal(vit.blocks[0].mlp.fc1.weight, w0)               # the pretrained ViT never moves
    assert method.sums.shape == (CLASSES, 2 * 192)
    # by hand: prototype = mean of [frozen(x), adapted(x)] over the class's training images
    x, y = next(data[1][1].batches(1000, shuffle=False))
    frozen, adapted = method.frozen.backbone(x), method.adapted.backbone(x)
    assert (frozen - adapted).abs().max() > 1e-5                       # the adapted branch differs
    feats = torch.cat([frozen, adapted], 1)
    proto = feats[y == 3].mean(0)
    torch.testing.assert_close(method.sums[3] / method.counts[3], proto, rtol=1e-4, atol=1e-4)
    logits = method.predict(x[:4])
    torch.testing.assert_close(logits[:, 3], F.cosine_similarity(feats[:4], proto[None]), rtol=1e-4, atol=1e-4)
    assert accuracy(method, data) > 0.8


def test_aper_finetune_and_vpt_variants_adapt_a_private_model(data):
    exps = experiences(data)
    tuned = METHODS["aper"](context(epochs=1), adapter="finetune")
    tuned.learn(exps[0])
    assert tuned.adapted.backbone is not tuned.frozen.backbone
    moved = [k for k, v in tuned.adapted.backbone.state_dict().items()
             if not torch.equal(v, tuned.frozen.backbone.state_dict()[k])]
    assert len(moved) > 10                                               # every weight could move
    # SSF: with scales 1 and shifts 0 the tuned forward is the frozen ViT's; the first session moves them
    from clharness.toolkit.vit_adapters import SSFViT
    vit = tuned.frozen.backbone.model
    ssf = SSFViT(vit)
    with torch.no_grad():
        for ss in ssf.modules():
            if hasattr(ss, "shift"):
                ss.scale.fill_(1.0)
                ss.shift.zero_()
    xs = next(data[2][0].batches(4, shuffle=False))[0]
    torch.testing.assert_close(ssf.eval()(xs), tuned.frozen.backbone(xs), rtol=1e-4, atol=1e-4)
    scaled = METHODS["aper"](context(epochs=1), adapter="ssf")
    rng = torch.get_rng_state()                        # the SSF parameters are drawn first when learning
    scaled.learn(exps[0])
    torch.set_rng_state(rng)
    initial = SSFViT(scaled.frozen.backbone.model)
    trained = scaled.adapted.backbone
    assert trained.vit is scaled.frozen.backbone.model                  # the pretrained ViT is shared
    own = lambda m: [p for n, p in m.named_parameters() if not n.startswith("vit.")]   # noqa: E731
    pairs = list(zip(own(initial), own(trained)))
    assert len(pairs) == 2 * (1 + 6 * 2 + 1)
    moves = [float((a - b).detach().abs().max()) for a, b in pairs]
    assert all(0 < m < 0.01 for m in moves), moves                     # trained, from that start
    for kind, shape in (("vpt_deep", (2, 3, 192)), ("vpt_shallow", (1, 3, 192))):
        vpt = METHODS["aper"](context(epochs=1), adapter=kind, prompt_token_num=3)
        vpt.learn(exps[0])
        assert vpt.adapted.backbone.vpt.shape == shape and vpt.adapted.backbone.vpt.abs().sum() > 0
        assert vpt.features(next(data[2][0].batches(4, shuffle=False))[0]).shape == (4, 384)


def test_ease_adds_one_frozen_adapter_set_per_task_and_complements_old_prototypes(data):
    method = METHODS["ease"](context(epochs=2), ffn_num=8, lr=0.1)
    exps = experiences(data)
    snapshots = []
    for t, exp in enumerate(exps):
        method.learn(exp)
        assert len(method.subspaces) == t + 1                           # one adapter subspace per task
        snapshots.append([p.detach().clone() for p in method.subspaces[t].backbone.adapters.parameters()])
    for space, snap in zip(method.subspaces, snapshots):                # earlier ones bit-identical
        assert all(torch.equal(a, b) for a, b in zip(space.backbone.adapters.parameters(), snap))
    assert len({id(s.backbone.adapters) for s in method.subspaces}) == 3
    assert method.features(next(data[2][0].batches(4, shuffle=False))[0]).shape == (4, 3 * 192)
    # complement by hand: task 0's classes in subspace 2 from the classes of task 2 (the only ones
    # with data-made prototypes in subspaces 0 and 2)
    P = method.prototypes
    x, y = next(data[1][2].batches(1000, shuffle=False))
    torch.testing.assert_close(P[2][4], method.subspaces[2].backbone(x[y == 4]).mean(0), rtol=1e-4, atol=1e-4)
    sim = torch.tensor([[F.cosine_similarity(P[0][c], P[0][k], dim=0).item() for k in (4, 5)] for c in (0, 1)])
    torch.testing.assert_close(P[2][[0, 1]], sim.softmax(1) @ P[2][[4, 5]], rtol=1e-5, atol=1e-6)
    # task 0's classes in subspace 1 come from the classes of tasks 1 and 2
    sim = torch.tensor([[F.cosine_similarity(P[0][c], P[0][k], dim=0).item() for k in (2, 3, 4, 5)] for c in (0, 1)])
    torch.testing.assert_close(P[1][[0, 1]], sim.softmax(1) @ P[1][[2, 3, 4, 5]], rtol=1e-5, atol=1e-6)
    # subspace reweighting: class 2 (task 1) counts subspace 1 fully, the others with alpha / (T - 1)
    xt, _ = next(data[2][1].batches(4, shuffle=False))
    cos = [F.cosine_similarity(s.backbone(xt), P[j][2][None]) for j, s in enumerate(method.subspaces)]
    torch.testing.assert_close(method.predict(xt)[:, 2], cos[1] + 0.1 / 2 * (cos[0] + cos[2]), rtol=1e-4, atol=1e-5)
    assert accuracy(method, data) > 0.8


def test_lae_offline_pet_is_the_ema_of_the_online_one_and_predictions_ensemble_both(data):
    method = METHODS["lae"](context(epochs=1), layers="0-1", ema_decay=0.9, freeze_epochs=0, lr=0.01,
                            variant="pilot")   # the offline PET exists before any task (PILOT)
    from clharness.toolkit.training import Trainer
    exp = experiences(data)[0]
    method.labels.add(exp)
    method.seen[list(exp.classes)] = True
    trainer = Trainer.for_method(method, [*method.online.parameters(), *method.head.parameters()])
    x, y = next(exp.batches(16, shuffle=False))
    for _ in range(2):
        off = [p.clone() for p in method.offline.parameters()]
        method.train_step(trainer, x, y)
        moved = 0
        for old, new, on in zip(off, method.offline.parameters(), method.online.parameters()):
            torch.testing.assert_close(new, 0.9 * old + 0.1 * on.detach(), rtol=1e-6, atol=1e-7)
            moved += int(not torch.equal(new, old))
        assert moved == len(off)                      # every offline tensor followed its online twin
    # ensemble: class-wise max of the two models' softmax over the seen classes
    xt, _ = next(data[2][0].batches(6, shuffle=False))
    p_on = F.softmax(method.head(method.represent(xt, method.online))[:, :2], 1)
    p_off = F.softmax(method.head(method.represent(xt, method.offline))[:, :2], 1)
    assert not torch.allclose(p_on, p_off, atol=1e-4)
    torch.testing.assert_close(method.predict(xt)[:, :2], torch.maximum(p_on, p_off), rtol=1e-5, atol=1e-6)
    assert (method.predict(xt)[:, 2:] == -1e4).all()


def test_lae_compensated_prefix_adds_the_prefix_attention_to_the_damped_block_attention(data):
    from clharness_methods.lae import Prefix, compensated_prefix_attention
    method = METHODS["lae"](context(), layers="0-1")
    attn = method.frozen.backbone.model.blocks[0].attn
    torch.manual_seed(1)
    prefix = Prefix(4, 192)
    with torch.no_grad():
        prefix.key.normal_()
        prefix.value.normal_()
    h = torch.randn(2, 5, 192)
    q, k, v = attn.qkv(h).reshape(2, 5, 3, 3, 64).permute(2, 0, 3, 1, 4).unbind(0)
    pk, pv = prefix.key.reshape(4, 3, 64).transpose(0, 1), prefix.value.reshape(4, 3, 64).transpose(0, 1)
    s_tok, s_pre = q @ k.transpose(-2, -1) / 8, q @ pk.transpose(-2, -1) / 8
    lam = s_pre.exp().sum(-1, keepdim=True) / (s_pre.exp().sum(-1, keepdim=True) + s_tok.exp().sum(-1, keepdim=True))
    # (1 - λ) Attn(x) + Attn_prefix(x): the plain block attention damped, the prefix's at full weight
    mixed = (1 - lam) * (s_tok.softmax(-1) @ v) + s_pre.softmax(-1) @ pv
    expected = attn.proj(mixed.transpose(1, 2).reshape(2, 5, 192))
    torch.testing.assert_close(compensated_prefix_attention(attn, h, prefix), expected, rtol=1e-4, atol=1e-5)


def test_lae_learns_with_either_pet(data):
    for pet in ("prefix", "adapter"):
        method = METHODS["lae"](context(epochs=3), layers="0-1", pet=pet, freeze_epochs=1, lr=0.01)
        start = [p.detach().clone() for p in method.online.parameters()]
        for exp in experiences(data):
            method.learn(exp)
        assert all(not torch.equal(a, b) for a, b in zip(start, method.online.parameters()))
        assert min(task_il_accuracy(method, data)) > 0.8


def test_pgp_prompt_and_key_gradients_are_orthogonal_to_the_stored_subspaces(data):
    method = METHODS["pgp"](context(epochs=1), lr=0.01, pool_size=6, top_n=2, prompt_length=3, memory_images=24)
    exps = experiences(data)
    method.learn(exps[0])
    U, V = method.prompt_space.basis, method.key_space.basis
    assert U is not None and V is not None and U.shape[0] == V.shape[0] == 192
    torch.testing.assert_close(U.T @ U, torch.eye(U.shape[1]), atol=1e-5, rtol=0)   # orthonormal
    # the basis holds at least the threshold's share of the patch embeddings' energy
    x, _ = next(exps[0].batches(24, shuffle=False))
    R = method.frozen.backbone.model.patch_embed(x).flatten(0, 1)
    assert (R @ U).pow(2).sum() / R.pow(2).sum() >= 0.5 - 1e-4
    Q = method.frozen(x)
    assert (Q @ V).pow(2).sum() / Q.pow(2).sum() >= 0.97 - 1e-4
    # a task-2 gradient before and after projection
    method.labels.add(exps[1])
    xb, yb = next(exps[1].batches(8, shuffle=False))
    method.loss(xb, yb).backward()
    raw_p, raw_k = method.pool.prompts.grad.clone(), method.pool.keys.grad.clone()
    method.project_gradients()
    g_p, g_k = method.pool.prompts.grad, method.pool.keys.grad
    assert (raw_p @ U).abs().max() > 1e-3 and (g_p @ U).abs().max() < 1e-6 * max(1.0, raw_p.abs().max().item())
    assert (g_k @ V).abs().max() < 1e-6 * max(1.0, raw_k.abs().max().item())
    torch.testing.assert_close(g_p, raw_p - raw_p @ U @ U.T)
    torch.testing.assert_close(g_k + raw_k @ V @ V.T, raw_k)            # only the subspace part is removed
    method.pool.zero_grad()
    method.labels = training.TaskLabels(method.context)
    method.labels.add(exps[0])
    method.learn(exps[1])                                              # the subspaces grow with the task
    assert method.prompt_space.basis.shape[1] >= U.shape[1] and method.key_space.basis.shape[1] >= V.shape[1]
    plain = METHODS["l2p"](context(), lr=0.01, pool_size=6, top_n=2, prompt_length=3).memory_report()
    extra = method.prompt_space.basis.numel() + method.key_space.basis.numel()
    assert method.memory_report().tensor_elements - plain.tensor_elements == extra   # the bases are counted


HIDE = dict(lr=0.01, layers="0-1", prompt_length=4, ca_epochs=5, samples_per_class=16, scale_lr=False)


def test_hide_prompt_infers_the_task_from_stored_statistics_only(data):
    method = METHODS["hide_prompt"](context(epochs=2), **HIDE)
    exps = experiences(data)
    for exp in exps[:2]:
        method.learn(exp)
    # nothing image-shaped is kept: the statistics are class means and covariances
    report = method.memory_report()
    assert report.exemplars == 0
    kept = [t for s in (method.instructed, method.uninstructed) for t in s.tensors()]
    assert sorted(method.uninstructed.means) == [0, 1, 2, 3] and all(t.shape[-1] == 192 for t in kept)
    assert report.tensor_elements >= 2 * 4 * (192 + 192 * 192)
    x, y = next(data[1][0].batches(1000, shuffle=False))
    q = method.frozen.backbone(x)[y == 1]
    torch.testing.assert_close(method.uninstructed.means[1], q.mean(0), rtol=1e-4, atol=1e-4)
    # TII by hand: the task of the seen class the TII head ranks first
    xt = torch.cat([next(d.batches(12, shuffle=False))[0] for d in data[2][:2]])
    ranked = method.tii_head(method.frozen.backbone(xt))[:, :4].argmax(1)
    assert torch.equal(method.infer_task(xt), ranked // 2)
    # the TII head is re-fitted from the statistics alone: give the four classes new, well separated
    # Gaussians and the head follows them, without any image
    gen = torch.Generator().manual_seed(0)
    centres = 5 * torch.randn(4, 192, generator=gen)
    for c in range(4):
        method.uninstructed.means[c], method.uninstructed.covs[c] = centres[c], 0.01 * torch.eye(192)
    method.align(method.tii_head, method.uninstructed, method.hp["ca_lr"], method.hp["samples_per_class"])
    assert torch.equal(method.tii_head(centres)[:, :4].argmax(1), torch.arange(4))


def test_hide_prompt_learns_task_prompts_and_keeps_old_ones(data):
    method = METHODS["hide_prompt"](context(epochs=3), **HIDE)
    exps = experiences(data)
    method.learn(exps[0])
    e0 = method.e_prompts.detach().clone()
    for exp in exps[1:]:
        method.learn(exp)
    assert method.e_prompts.shape[:3] == (3, 2, 2) and torch.equal(method.e_prompts[0], e0[0])
    assert min(task_il_accuracy(method, data)) > 0.8
    assert accuracy(method, data) > 1 / CLASSES + 0.2


@pytest.mark.parametrize("name,hp", [("coda_prompt", CODA), ("aper", {"ffn_num": 8, "lr": 0.1}),
                                     ("ease", {"ffn_num": 8, "lr": 0.1}), ("lae", {"layers": "0-1", "freeze_epochs": 0}),
                                     ("pgp", {"lr": 0.01, "pool_size": 6, "top_n": 2, "prompt_length": 3}),
                                     ("hide_prompt", {**HIDE, "ca_epochs": 1})])
def test_new_methods_clone_independently_and_count_their_state(name, hp, data):
    exps = experiences(data)
    method = METHODS[name](context(epochs=1), **hp)
    bare = method.memory_report()
    method.learn(exps[0])
    x, _ = next(data[2][1].batches(16, shuffle=False))
    before = method.predict(x).clone()
    twin = method.clone()
    twin.learn(exps[1])
    assert torch.equal(method.predict(x), before)          # the original is untouched by its clone
    assert not torch.equal(twin.predict(x), before)
    assert twin.frozen is method.frozen                     # the frozen ViT and its cache are shared
    grown, report = twin.memory_report(), method.memory_report()
    size = lambda r: r.parameters + r.tensor_elements   # noqa: E731
    assert report.exemplars == 0
    if name == "lae":                                       # the offline PET appears with task 2 (the authors')
        parts = (method.head, method.online)                  # the shared frozen ViT is not counted (B.4)
        assert size(report) == size(bare) == sum(p.numel() for m in parts for p in m.parameters()) + CLASSES   # + seen
        assert size(grown) == size(report) + sum(p.numel() for p in twin.offline.parameters())
    else:                                                   # components, branches, bases, statistics
        assert size(report) > size(bare)
    assert size(grown) >= size(report)
