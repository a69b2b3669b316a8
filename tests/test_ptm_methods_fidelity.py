"""Issue 29 items 3-7: LAE, HiDe-Prompt, L2P and DualPrompt as their reference code runs them, on
the tiny "pretrained" ViT of test_ptm_methods (2 blocks, 32x32 inputs, 8x8 patches, 6 synthetic
classes in 3 tasks). Each test writes the reference's rule out by hand on the trained method."""
import pytest
import torch
import torch.nn.functional as F

import clharness as clh
from clharness.toolkit.training import Trainer
from clharness.toolkit.vit_prompts import embed, vit_of
from clharness_methods import REFERENCE_METHODS
from test_ptm_methods import context, data, experiences, pretrained  # noqa: F401

METHODS = {cls.name: cls for cls in REFERENCE_METHODS}
LAE = dict(layers="0-1", lr=0.01)


def params(module):
    return [p.detach().clone() for p in module.parameters()]


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


# ----------------------------------------------------------------------------------------------- LAE
def test_lae_offline_pet_is_the_trained_online_pet_when_the_second_task_starts(data):
    """gqk/LAE main.py: no offline PET during task 1; setup of task 2 makes ModelEmaV2(self.pets), a
    copy of the online PET trained on task 1; from then on θ_off ← m θ_off + (1 − m) θ_on."""
    exps = experiences(data)
    method = METHODS["lae"](context(epochs=1), ema_decay=1.0, freeze_epochs=0, **LAE)
    method.learn(exps[0])
    assert method.offline is None
    trained = params(method.online)
    method.learn(exps[1])
    assert same(params(method.offline), trained)                # m = 1: the copy, unchanged by the EMA
    assert not same(params(method.online), trained)             # while the online PET moved on
    # m = 0: θ_off ← θ_on after every step, so the offline PET ends as the online one
    follow = METHODS["lae"](context(epochs=1), ema_decay=0.0, freeze_epochs=0, **LAE)
    follow.learn(exps[0])
    follow.learn(exps[1])
    assert same(params(follow.offline), params(follow.online))
    # PILOT's variant: the offline PET is the untrained PET from the start
    pilot = METHODS["lae"](context(epochs=1), ema_decay=1.0, freeze_epochs=0, variant="pilot", **LAE)
    untrained = params(pilot.online)
    pilot.learn(exps[0])
    assert same(params(pilot.offline), untrained) and not same(params(pilot.online), untrained)


def test_lae_freezes_the_pet_for_the_first_epochs_of_later_tasks_only(data):
    """The authors' pre_train_epoch returns on task 0; PILOT freezes on every task."""
    exps = experiences(data)
    method = METHODS["lae"](context(epochs=1), freeze_epochs=1, **LAE)
    start = params(method.online)
    method.learn(exps[0])
    after_first = params(method.online)
    assert not any(torch.equal(a, b) for a, b in zip(start, after_first))   # task 1 trains the PET at once
    head = method.head.weight.detach().clone()
    method.learn(exps[1])
    assert same(params(method.online), after_first)                          # task 2: its one epoch frozen
    assert not torch.equal(method.head.weight, head)                          # the classifier learned
    pilot = METHODS["lae"](context(epochs=1), freeze_epochs=1, variant="pilot", **LAE)
    start = params(pilot.online)
    pilot.learn(exps[0])
    assert same(params(pilot.online), start)


def test_lae_first_task_predicts_with_the_online_model_alone(data):
    exps = experiences(data)
    xt, _ = next(data[2][0].batches(6, shuffle=False))
    method = METHODS["lae"](context(epochs=1), **LAE)
    method.learn(exps[0])
    p_on = F.softmax(method.head(method.represent(xt, method.online))[:, :2], 1)
    torch.testing.assert_close(method.predict(xt)[:, :2], p_on, rtol=1e-5, atol=1e-6)
    pilot = METHODS["lae"](context(epochs=1), variant="pilot", **LAE)
    pilot.learn(exps[0])
    p_on = F.softmax(pilot.head(pilot.represent(xt, pilot.online))[:, :2], 1)
    p_off = F.softmax(pilot.head(pilot.represent(xt, pilot.offline))[:, :2], 1)
    torch.testing.assert_close(pilot.predict(xt)[:, :2], torch.maximum(p_on, p_off), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------- HiDe-Prompt
HIDE = dict(lr=0.01, layers="0-1", prompt_length=4, ca_epochs=0, prompt_momentum=0.0, scale_lr=False)   # lrs as given


def test_hide_prompt_new_e_prompt_is_the_previous_tasks(data):
    """thu-ml/HiDe-Prompt (shared_prompt_pool, on by default): prompt[task t] = prompt[task t-1]
    before task t trains."""
    exps = experiences(data)
    for init, copied in (("previous", True), ("uniform", False)):
        method = METHODS["hide_prompt"](context(epochs=1), prompt_init=init, **HIDE)
        method.learn(exps[0])
        first = method.e_prompts.detach()[0].clone()
        method.context.epochs = 0                   # no training: the new task's prompt as initialised
        method.learn(exps[1])
        assert torch.equal(method.e_prompts[0], first)
        assert torch.equal(method.e_prompts[1], first) is copied


def test_hide_prompt_task_inference_trains_apart_at_its_own_learning_rate(data):
    """The TII stage is a separate run at lr 0.0005 (x batch / 256 unless scale_lr is off; Adam). One step
    of Adam moves every weight with a gradient by lr · g / (|g| + eps) = ± lr: the step size is the lr."""
    tasks, trains, _ = data
    one_step = clh.Experience(trains[0], tasks[0], None, 64, 0)        # 48 images: one batch, one step
    for hp, lr in (({}, 0.0005), ({"tii_lr": 1e-3}, 1e-3)):
        method = METHODS["hide_prompt"](context(epochs=1), **HIDE, **hp)
        before = method.tii_head.weight.detach().clone()
        method.learn(one_step)
        step = (method.tii_head.weight.detach() - before).abs()
        assert step[:2].max().item() == pytest.approx(lr, rel=1e-3)     # the task's two classes' rows
        assert step[2:].max().item() == 0                                 # masked classes: no gradient
    assert METHODS["hide_prompt"].hparams["reg"].default == 0.5          # the authors' ImageNet-R script
    trainer = Trainer.for_method(method, [method.e_prompts])
    assert trainer.clip_grad == 1.0                                       # --clip-grad 1.0


def test_hide_prompt_alignment_samples_per_class_and_learning_rates(data, monkeypatch):
    """TII alignment (hide_tii_engine): batch_size = 24 samples per class, SGD at ca_lr (scaled by
    batch / 256 unless scale_lr is off); TAP (hide_promtp_wtp_and_tap_engine): batch_size x 5 = 120 per
    class, ca_lr 0.005 (never scaled)."""
    from clharness_methods.hide_prompt import ClassGaussians
    exps = experiences(data)
    method = METHODS["hide_prompt"](context(epochs=1), **{**HIDE, "ca_epochs": 1})
    draws, lrs = [], []
    sample, sgd = ClassGaussians.sample, torch.optim.SGD

    def spy_sample(stats, n, gen):
        draws.append(("tii" if stats is method.uninstructed else "tap", n))
        return sample(stats, n, gen)

    def spy_sgd(params, lr, **kw):
        lrs.append(lr)
        return sgd(params, lr=lr, **kw)
    monkeypatch.setattr(ClassGaussians, "sample", spy_sample)
    monkeypatch.setattr(torch.optim, "SGD", spy_sgd)
    method.learn(exps[0])
    assert draws == [] and lrs == []                                      # nothing to align after task 1
    method.learn(exps[1])
    assert draws == [("tii", 24), ("tap", 120)]
    assert lrs == pytest.approx([0.005, 0.005])
    # the knobs: each stage draws its own count at its own lr
    method = METHODS["hide_prompt"](context(epochs=1), **{**HIDE, "ca_epochs": 1}, tii_samples_per_class=7,
                                    samples_per_class=9, tii_ca_lr=0.002, ca_lr=0.003)
    draws.clear(), lrs.clear()
    for exp in exps[:2]:
        method.learn(exp)
    assert draws == [("tii", 7), ("tap", 9)] and lrs == pytest.approx([0.002, 0.003])


# --- HiDe-Prompt: every stage's lr x the run's batch size / 256, per-dataset script configs ---------------

@pytest.mark.parametrize("batch", [16, 64])
def test_hide_prompt_scales_its_learning_rates_by_the_batch_size(data, batch, monkeypatch):
    """thu-ml/HiDe-Prompt trainers/tii_trainer.py:75-80 and hideprompt_trainer.py:101-105 (--unscale_lr on:
    the per-device batch): lr, the TII lr and the TII alignment's ca_lr are multiplied by batch / 256; TAP's
    ca_lr is not. Adam's first step moves a weight with a gradient by its lr exactly."""
    exps = [clh.Experience(e.data, e.classes, None, batch, e.seed) for e in experiences(data)]
    ctx_ = context(epochs=1)
    ctx_ = clh.Context(ctx_.setting, ctx_.num_classes, ctx_.input_shape, seed=0, epochs=1, batch_size=batch,
                       memory_size=24, backbone_factory=ctx_.backbone_factory)
    hide = METHODS["hide_prompt"](ctx_, layers="0-1", prompt_length=4, ca_epochs=1, prompt_momentum=0.0)
    s = batch / 256
    sgd_lrs, real_sgd = [], torch.optim.SGD
    monkeypatch.setattr(torch.optim, "SGD", lambda params, lr, **kw: sgd_lrs.append(lr) or real_sgd(params, lr=lr, **kw))
    trainers, real = [], Trainer.for_method
    monkeypatch.setattr(Trainer, "for_method", classmethod(lambda cls, m, params=None, **o: trainers.append(
        real.__func__(cls, m, params, **o)) or trainers[-1]))
    hide.learn(exps[0])
    hide.learn(exps[1])
    wtp, tii = trainers[0].optimizer.param_groups, trainers[1].optimizer.param_groups
    assert [g["lr"] for g in wtp] == pytest.approx([0.03 * s, 0.003 * s])      # prompts, classifier at 0.1 lr
    assert tii[0]["lr"] == pytest.approx(0.0005 * s)
    assert sgd_lrs == pytest.approx([0.005 * s, 0.005])                         # TII alignment scaled, TAP not


@pytest.mark.parametrize("config, expected", [
    ("cifar100", {"prompt_length": 5, "reg": 0.1, "tii_lr": 0.0005, "head_lr_scale": 0.1}),
    ("imr", {"prompt_length": 20, "reg": 0.5, "tii_lr": 0.0005, "head_lr_scale": 0.1}),
    ("cub", {"prompt_length": 20, "reg": 0.01, "tii_lr": 0.01, "head_lr_scale": 1.0}),
    ("custom", {"prompt_length": 20, "reg": 0.5, "tii_lr": 0.0005, "head_lr_scale": 0.1})])
def test_hide_prompt_configs_are_the_authors_scripts(config, expected):
    """training_scripts/train_cifar100_vit.sh: --length 5 --reg 0.1, TII --lr 0.0005, --larger_prompt_lr;
    train_imr_vit.sh: --length 20 --reg 0.5, 0.0005, --larger_prompt_lr; train_cub_vit.sh: --length 20
    --reg 0.01, TII --lr 0.01, no --larger_prompt_lr (one lr for prompts and classifier). The default
    (custom) is the ImageNet-R script's."""
    hide = METHODS["hide_prompt"](context(epochs=1), config=config, layers="0-1")
    assert {k: hide.hp[k] for k in expected} == expected
    assert hide.e_prompts.shape[3] == expected["prompt_length"]



def test_hide_prompt_contrastive_regulariser_by_hand(data):
    """hide_promtp_wtp_and_tap_engine.py's reg term: rows M = [old class means; batch features],
    S = M Mᵀ / 0.8, cross-entropy of row i against class i, batch mean."""
    method = METHODS["hide_prompt"](context(epochs=1), **HIDE)
    g = torch.Generator().manual_seed(1)
    means = torch.randn(2, 192, generator=g) / 14     # norms ~1: S is not dominated by its diagonal
    method.instructed.means = {0: means[0], 1: means[1]}
    feats = torch.randn(3, 192, generator=g) / 14
    M = torch.cat([means, feats])
    S = M @ M.T / 0.8
    expected = (torch.logsumexp(S, 1) - S.diagonal()).mean()
    torch.testing.assert_close(method.contrastive(feats), expected, rtol=1e-5, atol=1e-5)
    S1 = M @ M.T                                       # another temperature gives another loss here
    assert abs((torch.logsumexp(S1, 1) - S1.diagonal()).mean() - expected) > 1e-2

# ------------------------------------------------------------------------------- L2P and DualPrompt
def by_hand_l2p_features(method, x, idx):
    """The reference forward: [CLS] + pos[0], the selected prompts + pos[0] (the resized pos_embed
    copies the [CLS] entry to the prompt slots), the patches + their positions; blocks, norm; the
    mean output at the prompt positions."""
    vit = vit_of(method.frozen, "l2p")
    pos = vit.pos_embed
    prompts = method.pool.prompts[idx].flatten(1, 2) + pos[:, :1]
    h = torch.cat([(vit.cls_token + pos[:, :1]).expand(len(x), -1, -1), prompts,
                   vit.patch_embed(x) + pos[:, 1:]], 1)
    for block in vit.blocks:
        h = block(h)
    return vit.norm(h)[:, 1:1 + prompts.shape[1]].mean(1)


def test_l2p_prompt_tokens_carry_the_cls_position_embedding(data):
    method = METHODS["l2p"](context(), lr=0.01, pool_size=6, top_n=2, prompt_length=3)
    x, _ = next(data[2][1].batches(5, shuffle=False))
    q = method.frozen(x)
    idx = (F.normalize(q, dim=1) @ F.normalize(method.pool.keys, dim=1).T).topk(2, dim=1).indices
    with torch.no_grad():
        torch.testing.assert_close(method.features(x), by_hand_l2p_features(method, x, idx), rtol=1e-5, atol=1e-5)
        assert torch.equal(embed(vit_of(method.frozen, "l2p"), x)[:, :1],
                           (vit_of(method.frozen, "l2p").cls_token + vit_of(method.frozen, "l2p").pos_embed[:, :1])
                           .expand(5, -1, -1))


def test_batchwise_prompt_selection_votes_the_batchs_most_chosen_prompts(data):
    """l2p-pytorch prompt.py, batchwise_prompt: unique ids of the batch's top-k choices, the k with
    the highest counts, expanded to the batch."""
    from clharness_methods.l2p import PromptPool
    pool = PromptPool(4, 1, 4)
    with torch.no_grad():
        pool.keys.copy_(torch.eye(4))
    q = torch.tensor([[0.1, 0, 1, 0.2], [0, 0.2, 1, 0.1], [0.3, 0, 1, 0], [1, 0, 0, 0.5], [0, 0, 0.2, 1]])
    cos = F.normalize(q, dim=1) @ torch.eye(4)
    own, _ = pool.select(q, 2)
    assert own.tolist() == [[2, 3], [2, 1], [2, 0], [0, 3], [3, 2]]      # per sample (the paper)
    # counts over the batch: id 0: 2, id 1: 1, id 2: 4, id 3: 3 -> ids 2 and 3 for every sample
    idx, sim = pool.select(q, 2, batchwise=True)
    assert idx.tolist() == [[2, 3]] * 5
    torch.testing.assert_close(sim, cos[:, [2, 3]])
    assert pool.select(q, 1, batchwise=True)[0].tolist() == [[2]] * 5
    # in the method: every image of the batch is prompted with the voted prompts
    method = METHODS["l2p"](context(), lr=0.01, pool_size=6, top_n=2, prompt_length=3, prompt_selection="batchwise")
    x = torch.cat([next(data[2][t].batches(3, shuffle=False))[0] for t in range(3)])
    qx = method.frozen(x)
    top = (F.normalize(qx, dim=1) @ F.normalize(method.pool.keys, dim=1).T).topk(2, dim=1).indices
    counts = torch.bincount(top.flatten(), minlength=6).tolist()
    voted = sorted(range(6), key=lambda i: (-counts[i], i))[:2]
    with torch.no_grad():
        torch.testing.assert_close(method.features(x), by_hand_l2p_features(method, x, torch.tensor([voted] * 9)),
                                   rtol=1e-5, atol=1e-5)


def test_dualprompt_batchwise_selection_gives_the_batch_its_most_matched_e_prompt(data):
    PROMPT = dict(lr=0.16, g_layers="0-0", e_layers="1-1")
    exps = experiences(data)
    method = METHODS["dualprompt"](context(epochs=1), prompt_selection="batchwise", **PROMPT)
    for exp in exps:
        method.learn(exp)
    x = torch.cat([next(data[2][t].batches(n, shuffle=False))[0] for t, n in ((0, 2), (1, 5), (2, 3))])
    q = method.frozen(x)
    own = (F.normalize(q, dim=1) @ F.normalize(method.e_keys, dim=1).T).argmax(1)
    counts = torch.bincount(own, minlength=3).tolist()
    mode = max(range(3), key=lambda i: (counts[i], -i))
    assert len(set(own.tolist())) > 1                      # the images disagree: the vote decides
    with torch.no_grad():
        expected = method.represent(x, torch.full((10,), mode, dtype=torch.long))
        torch.testing.assert_close(method.features(x), expected, rtol=1e-5, atol=1e-5)
        per_sample = METHODS["dualprompt"](context(epochs=1), **PROMPT)
        per_sample.__dict__.update({k: v for k, v in method.__dict__.items() if k != "hp"})
        torch.testing.assert_close(per_sample.features(x), method.represent(x, own), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("config,lr,length", [("custom", 0.005, 20), ("imr", 0.005, 20), ("cifar100", 0.03, 5)])
def test_dualprompt_ships_each_datasets_reference_config(config, lr, length):
    """dualprompt-pytorch configs/imr_dualprompt.py: lr 0.005, --length 20; cifar100_dualprompt.py:
    lr 0.03, --length 5 (both: G-prompt 5 on layers 0-1, E on 2-4, batch 24, lr x 24 / 256)."""
    method = METHODS["dualprompt"](context(), config=config, g_layers="0-0", e_layers="1-1")
    assert method.e_prompts.shape[3] == length
    trainer = Trainer.for_method(method, list(method.head.parameters()))
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(lr * 16 / 256)


# ------------------------------------------------------------------------------------------------ PGP
PGP = dict(lr=0.01, pool_size=6, top_n=2, prompt_length=3, memory_images=1)


def outside(rows, basis):
    """Norm of the part of ``rows`` outside span(basis) (0 when the rows lie in the subspace)."""
    return (rows - rows @ basis @ basis.T).norm().item()


def test_pgp_prompt_memory_holds_the_prompt_space_from_the_second_task_on(data):
    """PGP sec. 4 / l2p-pgp engine.py: from task 2 on the prompt representation adds the prompt
    space (the pool's rows at the task's start) to the input space (the task's patch embeddings)."""
    exps = experiences(data)
    method = METHODS["pgp"](context(epochs=1), prompt_threshold=0.999999, **PGP)   # ~the whole span is kept
    init = method.pool.prompts.detach().reshape(-1, 192).clone()
    method.learn(exps[0])
    U0 = method.prompt_space.basis
    assert U0.shape[1] <= 16                        # one image: its 16 patch embeddings, no prompt rows
    assert outside(init, U0) > 0.5 * init.norm().item()
    start = method.pool.prompts.detach().reshape(-1, 192).clone()            # task 2's start
    method.learn(exps[1])
    U1 = method.prompt_space.basis
    assert outside(start, U1) < 1e-2 * start.norm().item()                   # the prompt space is held
    x, _ = next(exps[1].batches(1, shuffle=False, augment=False))
    patches = vit_of(method.frozen, "pgp").patch_embed(x).flatten(0, 1)
    assert outside(patches, U1) < 1e-2 * patches.norm().item()               # and the input space


def test_pgp_pca_subspace_keeps_the_top_principal_directions_of_the_centred_queries(data):
    """The code reduces the queries with PCA(n_components=5) before its threshold: the key memory
    is spanned by the leading principal axes of the centred queries, at most 5 per task."""
    exps = experiences(data)
    x, _ = exps[0].tensors()
    exact = METHODS["pgp"](context(epochs=1), **{**PGP, "memory_images": 48})
    exact.remember(exps[0])
    pca = METHODS["pgp"](context(epochs=1), **{**PGP, "memory_images": 48}, subspace="pca")
    pca.remember(exps[0])
    Q = pca.frozen(x).double()
    _, S, Vh = torch.linalg.svd(Q - Q.mean(0), full_matrices=False)
    share = (S[:5] ** 2).cumsum(0) / (S[:5] ** 2).sum()
    r = int((share < 0.97).sum()) + 1                        # GPM: the fewest leading axes reaching 0.97
    V = pca.key_space.basis.double()
    assert V.shape[1] == r <= 5 < exact.key_space.basis.shape[1]
    torch.testing.assert_close(V @ V.T, Vh[:r].T @ Vh[:r], rtol=0, atol=1e-4)
    assert pca.key_space.basis.dtype == torch.float32
    # key_components = 2: at most the two leading axes
    two = METHODS["pgp"](context(epochs=1), **{**PGP, "memory_images": 48}, subspace="pca", key_components=2)
    two.remember(exps[0])
    share = (S[:2] ** 2).cumsum(0) / (S[:2] ** 2).sum()
    r = int((share < 0.97).sum()) + 1
    V = two.key_space.basis.double()
    assert V.shape[1] == r <= 2
    torch.testing.assert_close(V @ V.T, Vh[:r].T @ Vh[:r], rtol=0, atol=1e-4)



def test_pgp_pca_stacks_the_input_and_prompt_parts_up_to_twice_the_components(data):
    """Issue 39 item 9, declared: l2p-pgp/engine.py:210-224 adds the two PCA score matrices (768 x 9 each,
    ``rep = rep + p``), so the code's memory gains at most 9 directions a task; here the k leading
    principal directions of the patch embeddings and of the prompt rows are stacked (the sum of their
    spans), up to 2k directions. With k = 2 and a threshold keeping the whole span, task 2 adds 4."""
    exps = experiences(data)
    pgp = METHODS["pgp"](context(epochs=1), **{**PGP, "memory_images": 8}, subspace="pca", prompt_components=2,
                         prompt_threshold=0.999999)
    pgp.remember(exps[0])
    first = pgp.prompt_space.basis.shape[1]
    assert first == 2                                               # the embeddings' two leading axes
    prompts = torch.randn(6, 3, 192, generator=torch.Generator().manual_seed(0))
    pgp.remember(exps[1], prompts)
    assert pgp.prompt_space.basis.shape[1] - first == 4             # 2 input + 2 prompt directions, stacked


def test_l2p_pull_term_is_lambda_times_the_selected_keys_cosine_distance(data):
    """L2P eq. 5: L = CE + lambda sum_{i in K_x} gamma(q(x), k_{s_i}), gamma = 1 - cosine, over the top-N keys,
    mean over the batch."""
    exps = experiences(data)
    method = METHODS["l2p"](context(epochs=1), lr=0.01, pool_size=6, top_n=2, prompt_length=3, pull_lambda=0.7)
    method.labels.add(exps[0])
    x, y = next(exps[0].batches(5, shuffle=False, augment=False))
    with torch.no_grad():
        full = method.loss(x, y).item()
        method.hp["pull_lambda"] = 0.0
        plain = method.loss(x, y).item()
        cos = F.normalize(method.frozen(x), dim=1) @ F.normalize(method.pool.keys, dim=1).T
        pull = (1 - cos.topk(2, dim=1).values).sum(1).mean().item()
    assert full - plain == pytest.approx(0.7 * pull, rel=1e-4)

# --------------------------------------------------------------------------------------------- RanPAC
def test_ranpac_ssf_first_phase_scales_and_shifts_every_operation_then_freezes(data):
    """RanPAC/RanPAC args/imagenetr_publish.csv: model ssf, pretrained_vit_b16_224_ssf: phase 1
    trains SSF's y = γ ⊙ x + β after the ViT's operations (vit_adapters.SSFViT) on task 1, then
    the projection reads the SSF-tuned ViT's features, h = ReLU(f(x) W)."""
    from clharness.toolkit.vit_adapters import ScaleShift, SSFViT
    exps = experiences(data)
    method = METHODS["ranpac"](context(epochs=1), projection_dim=64, adapter="ssf")
    vit = vit_of(method.frozen, "ranpac")
    method.learn(exps[0])
    model = method.frozen.backbone
    assert method.adaptation == "ssf" and isinstance(model, SSFViT) and model.vit is vit
    shifts = [m for m in model.modules() if isinstance(m, ScaleShift)]
    assert len(shifts) == 2 + 6 * len(vit.blocks)
    assert all(not m.scale.requires_grad for m in shifts)                 # frozen after the first task
    assert vit.blocks[0].attn.qkv.weight.requires_grad is False             # the ViT itself never learns
    moved = sum(float((m.scale - 1).abs().max()) > 0.05 for m in shifts)   # init N(1, 0.02²): trained away
    assert moved > 0
    x, _ = next(data[2][1].batches(4, shuffle=False))
    with torch.no_grad():
        # the last SSF by hand: the pooled [CLS] of the norm's output, scaled and shifted
        tokens = model.patch(vit.patch_embed(x))
        tokens = vit._pos_embed(tokens)
        for block, ssf in zip(vit.blocks, model.blocks):
            tokens = tokens + SSFViT._attention(block.attn, ssf["norm1"](block.norm1(tokens)), ssf)
            h = block.mlp.act(ssf["fc1"](block.mlp.fc1(ssf["norm2"](block.norm2(tokens)))))
            tokens = tokens + ssf["fc2"](block.mlp.fc2(h))
        f = (vit.norm(tokens) * model.norm.scale + model.norm.shift)[:, 0]
        torch.testing.assert_close(method.features(x), F.relu(f @ method.projection), rtol=1e-4, atol=1e-4)


def test_hide_prompt_classifier_learns_at_a_tenth_of_the_prompt_lr(data):
    """--larger_prompt_lr (both scripts): param groups prompts at lr, the rest at 0.1 lr. One Adam
    step moves each weight with a gradient by its group's lr."""
    tasks, trains, _ = data
    one_step = clh.Experience(trains[0], tasks[0], None, 64, 0)
    for hp, scale in (({}, 0.1), ({"head_lr_scale": 1.0}, 1.0)):
        method = METHODS["hide_prompt"](context(epochs=1), **HIDE, **hp)
        head = method.head.weight.detach().clone()
        method.learn(one_step)
        head_step = (method.head.weight.detach() - head).abs()
        assert head_step[:2].max().item() == pytest.approx(0.01 * scale, rel=1e-3)
        assert head_step[2:].max().item() == 0
    # the prompts at the full lr: their first step is lr (the prompt starts uniform; compare a twin)
    a = METHODS["hide_prompt"](context(epochs=1), **HIDE)
    b = METHODS["hide_prompt"](context(epochs=0), **HIDE)
    a.learn(one_step)
    b.learn(one_step)
    assert (a.e_prompts.detach() - b.e_prompts.detach()).abs().max().item() == pytest.approx(0.01, rel=1e-3)
