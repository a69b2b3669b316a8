"""Issue 28 (items 3, 6, 8 and WA from 12): the exemplar methods against their reference code.

- item 3: PyCIL (G-U-N/PyCIL ``models/*.py``) trains one shuffled DataLoader over the task's data and
  the exemplars (``appendent``) at the configured batch size, so an epoch is ceil((N + M) / B)
  optimizer steps; ``rehearsal = "joint"`` (default) does that, ``"balanced"`` keeps the old batches;
- item 6: MEMO trains the shared blocks (PyCIL ``exps/memo.json`` ``train_base: true``); X-DER ships
  mammoth's ``best_args`` (seq-cifar100, buffers 500 and 2000) as presets;
- item 8: FOSTER can predict with the student (default) or PyCIL's two-backbone teacher; BiC's
  stage 2 runs the network in train mode (PyCIL) or eval mode;
- item 12 (WA): the authors' code (bwbwzhao/Weight-Aligning ``iLearn.py``/``main.py``) aligns
  with L1 norms, clamps gamma at 1 and has no FC bias; PyCIL's L2/unclamped/bias are options.

Every expectation is written out by hand on a tiny case (a 2x2 one-channel input, a 2-layer MLP)."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import clharness as clh
from clharness.data.base import ArrayDataset, TensorData
from clharness.toolkit.backbones import MLP
from clharness.toolkit.exemplars import rehearsal_batches
from clharness.toolkit.training import listen_to_losses
from clharness_methods import REFERENCE_METHODS

METHODS = {cls.name: cls for cls in REFERENCE_METHODS}
BS = 4


def tiny_data(classes, per_class=5, seed=0):
    """uint8 2x2 images, normalised as x / 255 (mean 0, std 1); pixel 0 is the sample's id (distinct)."""
    g = torch.Generator().manual_seed(seed)
    n = per_class * len(classes)
    images = torch.randint(0, 256, (n, 1, 2, 2), generator=g, dtype=torch.uint8)
    images[:, 0, 0, 0] = torch.arange(n, dtype=torch.uint8) + 10 * seed
    labels = torch.tensor(list(classes) * per_class)
    return TensorData(ArrayDataset(images, labels, [str(c) for c in range(10)]), [0.0], [1.0])


def experience(classes, seed=0, per_class=5, task_id=None):
    return clh.Experience(tiny_data(classes, per_class, seed), tuple(classes), task_id, BS, seed)


def tiny_context(memory_size=6, epochs=2, num_classes=4, backbone=None):
    return clh.Context(clh.Setting.CLASS_IL, num_classes, (1, 2, 2), seed=0, epochs=epochs, batch_size=BS,
                       memory_size=memory_size,
                       backbone_factory=backbone or (lambda: MLP((1, 2, 2), hidden=6, layers=1)))


def count_steps(fn):
    losses = []
    with listen_to_losses(losses.append):
        fn()
    return len(losses)


# --- item 3: one shuffled loader over new data and exemplars ---------------------------------------------

def test_joint_rehearsal_is_one_shuffled_pass_over_the_union_per_epoch():
    exp = experience((0, 1))                                   # N = 10 task samples, ids 0..9 (x 255)
    mx = torch.full((5, 1, 2, 2), 0.5)
    mx[:, 0, 0, 0] = torch.arange(100, 105) / 255.0            # M = 5 exemplars, ids 100..104
    my = torch.tensor([2, 2, 3, 3, 3])
    gen = torch.Generator().manual_seed(0)
    epochs = 400
    batches = list(rehearsal_batches(exp, mx, my, epochs, gen))
    per_epoch = math.ceil((10 + 5) / BS)                       # ceil((N + M) / B) = 4 (today: ceil(N / B) = 3)
    assert len(batches) == epochs * per_epoch
    ids = lambda x: torch.round(x[:, 0, 0, 0] * 255).long().tolist()   # noqa: E731
    union = sorted(list(range(10)) + list(range(100, 105)))
    memory_share = torch.zeros(per_epoch)
    for e in range(epochs):
        epoch = batches[e * per_epoch:(e + 1) * per_epoch]
        assert [len(y) for _, y in epoch] == [4, 4, 4, 3]      # batches of B, the last one shorter
        assert sorted(i for x, _ in epoch for i in ids(x)) == union   # every sample exactly once
        for j, (x, y) in enumerate(epoch):
            is_memory = torch.tensor(ids(x)) >= 100
            assert torch.equal(y[is_memory], my[torch.tensor(ids(x))[is_memory] - 100])   # labels follow samples
            memory_share[j] += is_memory.float().mean() / epochs
    # a uniform shuffle of the union: each batch holds exemplars in proportion M / (N + M) = 1/3 on average
    assert torch.allclose(memory_share, torch.full((per_epoch,), 1 / 3), atol=0.06), memory_share


def test_balanced_rehearsal_keeps_the_task_batches_with_a_share_of_the_memory():
    from clharness.toolkit.exemplars import rehearsal_steps
    exp = experience((0, 1))
    mx, my = torch.zeros(5, 1, 2, 2), torch.tensor([2, 2, 3, 3, 3])
    batches = list(rehearsal_batches(exp, mx, my, 1, torch.Generator().manual_seed(0), "balanced"))
    assert [len(y) for _, y in batches] == [4 + 2, 4 + 2, 2 + 1]   # ceil(N / B) batches, ceil(M / 3) exemplars each
    assert rehearsal_steps(10, 5, BS, "balanced") == 3 and rehearsal_steps(10, 5, BS) == 4
    with pytest.raises(ValueError):
        rehearsal_steps(10, 5, BS, "mixed")


EXPECTED_PHASES = {   # optimizer steps of the second task, per epoch of each phase that rehearses
    "icarl": {}, "wa": {}, "der": {}, "memo": {},
    "foster": {"compression_epochs": 1},                         # boosting + 1 compression epoch
    "beef": {"fusion_epochs": 1, "energy_weight": 0.0},          # expansion (+ fusion on its balanced set)
}


@pytest.mark.parametrize("name", sorted(EXPECTED_PHASES))
@pytest.mark.parametrize("mode", ["joint", "balanced"])
def test_exemplar_methods_take_the_reference_steps_per_epoch(name, mode):
    """Task 2 of a 2 x 2-class split, N = 10 new samples, M = 6 exemplars (memory 6), B = 4, 2 epochs:
    PyCIL takes ceil(16 / 4) = 4 steps per epoch (joint), the balanced batches ceil(10 / 4) = 3."""
    torch.manual_seed(0)
    chosen = {"rehearsal": mode} if mode == "balanced" else {}    # joint: the default
    method = METHODS[name](tiny_context(), **chosen, **EXPECTED_PHASES[name])
    method.learn(experience((0, 1), seed=0))
    assert len(method.memory) == 6
    steps = count_steps(lambda: method.learn(experience((2, 3), seed=1)))
    per_epoch = 4 if mode == "joint" else 3
    assert method.labels.epoch_steps == per_epoch               # what the learning-rate schedules count
    expected = 2 * per_epoch
    if name == "foster":
        expected += 1 * per_epoch                                 # compression rehearses the same union
    if name == "beef":
        expected += math.ceil((3 * 2 + 6) / BS)                   # fusion: 3 per new class + 6 exemplars
    assert steps == expected


def test_rehearsal_default_is_joint_for_every_method_that_rehearses():
    for name in ("icarl", "wa", "der", "memo", "foster", "beef", "podnet"):
        assert METHODS[name].hparams["rehearsal"].default == "joint", name
    assert "rehearsal" not in METHODS["bic"].hparams    # BiC builds its own split of the union


# --- item 6: MEMO trains its shared blocks (PyCIL exps/memo.json train_base: true) ----------------------

def memo_after_two_tasks(**hp):
    torch.manual_seed(0)
    memo = METHODS["memo"](tiny_context(backbone=lambda: MLP((1, 2, 2), hidden=6, layers=2)),
                           specialised_share=0.5, **hp)       # trunk: the first Linear (30 of 72 weights)
    memo.learn(experience((0, 1), seed=0))
    trunk = {k: v.clone() for k, v in memo.model.trunk.state_dict().items()}
    memo.learn(experience((2, 3), seed=1))
    return memo, trunk


def test_memo_trains_the_shared_blocks_by_default():
    memo, before = memo_after_two_tasks()
    assert memo.hp["train_shared"] is True
    assert before and all(p.requires_grad for p in memo.model.trunk.parameters())
    after = memo.model.trunk.state_dict()
    assert all(not torch.equal(before[k], after[k]) for k in before)     # every shared tensor moved in task 2
    frozen, before = memo_after_two_tasks(train_shared=False)             # the option: frozen after task 1
    assert all(torch.equal(before[k], v) for k, v in frozen.model.trunk.state_dict().items())


# --- item 6: X-DER ships mammoth's best arguments (utils/best_args.py, seq-cifar100) ----------------------

def test_xder_defaults_are_mammoths_best_args_for_seq_cifar100():
    from clharness.engine.runner import resolve_hparams
    xder_cls = METHODS["xder"]
    ctx = tiny_context(memory_size=8)
    hp = xder_cls(ctx).hp
    # mammoth best_args['seq-cifar100']['xder'][500], written out (m is our margin)
    assert {k: hp[k] for k in ("alpha", "beta", "gamma", "eta", "margin", "lambd", "simclr_temp",
                               "simclr_batch_size", "simclr_num_aug", "lr", "momentum", "weight_decay")} == \
        {"alpha": 0.3, "beta": 0.8, "gamma": 0.85, "eta": 0.001, "margin": 0.7, "lambd": 0.05, "simclr_temp": 5.0,
         "simclr_batch_size": 64, "simclr_num_aug": 2, "lr": 0.03, "momentum": 0.0, "weight_decay": 0.0}
    big = xder_cls(ctx, preset="seq-cifar100-2000").hp                   # ...[2000]
    assert (big["alpha"], big["beta"], big["eta"], big["margin"], big["lambd"]) == (0.6, 0.9, 0.01, 0.2, 0.05)
    # the record names the preset, not values it would ignore; custom weights need preset="custom"
    assert resolve_hparams(xder_cls, {}) == {**resolve_hparams(xder_cls, {"preset": "seq-cifar100-500"})}
    assert "eta" not in resolve_hparams(xder_cls, {}) and resolve_hparams(xder_cls, {"preset": "custom"})["eta"] == 0.001
    assert xder_cls(ctx, preset="custom", eta=0.2).hp["eta"] == 0.2
    with pytest.raises(clh.MethodError, match="preset='custom'"):
        xder_cls(ctx, eta=0.2)


def test_xder_eta_and_margin_weigh_the_constraints_as_the_preset_says():
    """The future constraint on a hand case: eta mean[max(0, max h_future + m - max h_own)] over the
    positive hinges. Stream batch only (empty memory), the first task (no past heads), no SupCon term."""
    ctx = clh.Context(clh.Setting.CLASS_IL, 4, (1, 2, 2), seed=0, epochs=1, batch_size=2, memory_size=4,
                      backbone_factory=lambda: MLP((1, 2, 2), hidden=3, layers=1))
    x, y = torch.randn(2, 1, 2, 2, generator=torch.Generator().manual_seed(0)), torch.tensor([0, 1])

    def loss(**hp):
        torch.manual_seed(0)
        xder = METHODS["xder"](ctx, **hp)
        exp = experience((0, 1))
        xder.labels.add(exp)
        xder.class_task[[0, 1]] = 0
        xder.consistency_loss = lambda *args: None                # the SupCon term has its own tests
        with torch.no_grad():
            logits = xder.model(x)
            return float(xder.xder_loss(x, y)), logits
    for preset, (eta, m) in {"seq-cifar100-500": (0.001, 0.7), "seq-cifar100-2000": (0.01, 0.2)}.items():
        got, z = loss(preset=preset)
        ce = float(F.cross_entropy(z[:, :2], y))
        hinge = z[:, 2:].max(1).values + m - z[:, :2].max(1).values
        assert (hinge > 0).any()                                   # the constraint is active here
        expected = ce + eta * float(hinge[hinge > 0].mean())
        assert got == pytest.approx(expected, rel=1e-5, abs=1e-7), preset


# --- item 8: FOSTER's student (the paper's single-backbone model) or PyCIL eval_task's teacher ----------

def mlp_features(branch, x):
    """relu(A x + c) of a 1-layer MLP branch, written out."""
    lin = branch.net[1]
    return torch.relu(x.flatten(1) @ lin.weight.T + lin.bias)


def hand_logits(net, x, seen, num_classes):
    feats = torch.cat([mlp_features(b, x) for b in net.branches], 1)
    z = feats @ net.head.weight.T + net.head.bias
    unseen = torch.ones(num_classes, dtype=torch.bool)
    unseen[seen] = False
    return z.masked_fill(unseen, -1e4)


@pytest.mark.parametrize("predictor", ["student", "teacher"])
def test_foster_predicts_with_the_chosen_network(predictor):
    torch.manual_seed(0)
    foster = METHODS["foster"](tiny_context(num_classes=6), compression_epochs=1, predictor=predictor)
    x = torch.randn(5, 1, 2, 2, generator=torch.Generator().manual_seed(3))
    for t, classes in enumerate([(0, 1), (2, 3), (4, 5)]):
        foster.learn(experience(classes, seed=t))
        seen = [c for cs in [(0, 1), (2, 3), (4, 5)][:t + 1] for c in cs]
        # the first task has no compression: one backbone either way; later tasks: the teacher has the
        # old (frozen) and the new backbone, the student one; each next task starts from the student
        assert len(foster.model.branches) == (2 if predictor == "teacher" and t else 1)
        assert (foster.student is not None) == (predictor == "teacher" and t > 0)
        expected = hand_logits(foster.model, x, seen, 6)
        assert torch.allclose(foster.predict(x), expected, atol=1e-5)
    if predictor == "teacher":     # the teacher is not the student: the choice changes the predictions
        assert not torch.allclose(foster.predict(x), hand_logits(foster.student, x, seen, 6), atol=1e-3)


# --- item 8: BiC's stage 2 with the network in train mode (PyCIL _run calls train() every epoch) --------

class BNBackbone(nn.Module):
    """Flatten, Linear(4, 3), BatchNorm1d(3), ReLU."""

    def __init__(self):
        super().__init__()
        self.lin, self.bn, self.out_dim = nn.Linear(4, 3), nn.BatchNorm1d(3), 3

    def forward(self, x):
        return torch.relu(self.bn(self.lin(x.flatten(1))))


def bic_stage2(mode):
    """BiC after task 1 (classes 0, 1), set up for task 2 (classes 2, 3); stage 2 on 4 held-out samples
    (one batch, one epoch). Returns the method before and after, and the validation set."""
    from clharness_methods.bic import BiasLayer
    torch.manual_seed(0)
    bic = METHODS["bic"](tiny_context(epochs=1, backbone=BNBackbone), stage2_mode=mode)
    bic.learn(experience((0, 1)))
    bic.known = [0, 1]
    exp = experience((2, 3), seed=1)
    bic.labels.add(exp)
    bic.seen_mask[[2, 3]] = True
    bic.model.bias_layers.append(BiasLayer([2, 3]))
    vx = torch.randn(4, 1, 2, 2, generator=torch.Generator().manual_seed(5))
    vy = torch.tensor([0, 1, 2, 3])
    before = {k: v.clone() for k, v in bic.model.state_dict().items()}
    bic.correct_bias(vx, vy)
    return bic, before, vx, vy


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_bic_stage2_network_mode(mode):
    bic, before, vx, vy = bic_stage2(mode)
    w, b = before["backbone.lin.weight"], before["backbone.lin.bias"]
    u = vx.flatten(1) @ w.T + b
    rm, rv = before["backbone.bn.running_mean"], before["backbone.bn.running_var"]
    if mode == "train":        # batch statistics (biased variance) normalise; running ones move by 0.1
        mean, var = u.mean(0), u.var(0, unbiased=False)
        assert torch.allclose(bic.model.backbone.bn.running_mean, 0.9 * rm + 0.1 * mean, atol=1e-6)
        assert torch.allclose(bic.model.backbone.bn.running_var, 0.9 * rv + 0.1 * u.var(0, unbiased=True), atol=1e-6)
    else:                      # running statistics normalise and stay put
        mean, var = rm, rv
        assert torch.equal(bic.model.backbone.bn.running_mean, rm)
    h = torch.relu((u - mean) / torch.sqrt(var + 1e-5) * before["backbone.bn.weight"] + before["backbone.bn.bias"])
    z = h @ before["head.weight"].T + before["head.bias"]
    z = z.clone()
    z[:, [0, 1]] = before["bias_layers.0.alpha"] * z[:, [0, 1]] + before["bias_layers.0.beta"]  # task 1's layer
    alpha = torch.tensor(1.0, requires_grad=True)
    beta = torch.tensor(0.0, requires_grad=True)
    q = torch.cat([z[:, :2], alpha * z[:, 2:] + beta], 1)               # eq. 5 on the new classes 2, 3
    F.cross_entropy(q, vy).backward()                                   # eq. 6
    lr, wd = bic.hp["lr"], bic.hp["weight_decay"]
    layer = bic.model.bias_layers[-1]
    # one SGD step from alpha = 1, beta = 0 (the momentum buffer starts at the gradient)
    assert layer.alpha.item() == pytest.approx(1.0 - lr * (alpha.grad.item() + wd * 1.0), abs=1e-6)
    assert layer.beta.item() == pytest.approx(0.0 - lr * beta.grad.item(), abs=1e-6)
    for k in ("backbone.lin.weight", "head.weight", "bias_layers.0.alpha"):   # frozen in stage 2
        assert torch.equal(bic.model.state_dict()[k], before[k])


def test_bic_stage2_defaults_to_train_mode():
    assert METHODS["bic"].hparams["stage2_mode"].default == "train"


# --- item 12 (WA): the authors' L1 norm, gamma <= 1 and no FC bias; PyCIL's variant as options ----------

def test_align_weights_by_hand_l1_l2_and_the_clamp():
    from clharness_methods.wa import align_weights
    w = torch.tensor([[3.0, 4.0], [0.0, 1.0], [6.0, 8.0], [0.0, 10.0]])
    # L1: old norms 7, 1 (mean 4), new 14, 10 (mean 12): gamma = 1/3
    a = w.clone()
    assert align_weights(a, [0, 1], [2, 3], p=1, max_gamma=1.0) == pytest.approx(1 / 3)
    assert torch.allclose(a[2:], w[2:] / 3) and torch.equal(a[:2], w[:2])
    # L2: old 5, 1 (mean 3), new 10, 10: gamma = 0.3
    a = w.clone()
    assert align_weights(a, [0, 1], [2, 3], p=2) == pytest.approx(0.3)
    # new rows weaker than the old ones: L1 gamma = 12 / 4 = 3, clamped to 1 (the authors) or not (PyCIL)
    v = torch.tensor([[6.0, 8.0], [0.0, 10.0], [3.0, 4.0], [0.0, 1.0]])
    a = v.clone()
    assert align_weights(a, [0, 1], [2, 3], p=1, max_gamma=1.0) == 1.0 and torch.equal(a, v)
    a = v.clone()
    assert align_weights(a, [0, 1], [2, 3], p=1) == pytest.approx(3.0) and torch.allclose(a[2:], 3 * v[2:])


def wa_before_alignment(**hp):
    """WA after two tasks, and its head's weights just before the second task's alignment."""
    torch.manual_seed(0)
    wa = METHODS["wa"](tiny_context(), **hp)
    wa.learn(experience((0, 1)))
    seen = {}
    align = wa.after_training

    def spy(exp):
        seen["w"] = wa.model.head.weight.detach().clone()
        align(exp)
    wa.after_training = spy
    wa.learn(experience((2, 3), seed=1))
    return wa, seen["w"]


@pytest.mark.parametrize("hp, p, clamp", [({}, 1, True), ({"align_norm": 2, "clamp_gamma": False}, 2, False)])
def test_wa_aligns_with_the_configured_norm_and_clamp(hp, p, clamp):
    wa, w = wa_before_alignment(**hp)
    gamma = w[[0, 1]].norm(p=p, dim=1).mean() / w[[2, 3]].norm(p=p, dim=1).mean()
    gamma = min(float(gamma), 1.0) if clamp else float(gamma)
    assert wa.gammas == [pytest.approx(gamma, rel=1e-6)]
    assert torch.allclose(wa.model.head.weight[[2, 3]], gamma * w[[2, 3]], atol=1e-7)
    assert torch.equal(wa.model.head.weight[[0, 1]], w[[0, 1]])


def test_wa_head_has_no_bias_by_default():
    wa, _ = wa_before_alignment()
    assert not wa.model.head.bias.requires_grad and torch.equal(wa.model.head.bias, torch.zeros(4))
    assert torch.equal(wa.old_model.head.bias, torch.zeros(4))
    with_bias, _ = wa_before_alignment(head_bias=True)                 # PyCIL's head: a trained bias
    assert with_bias.model.head.bias.requires_grad and with_bias.model.head.bias.abs().sum() > 0


def test_beef_fusion_schedule_counts_epochs_of_the_balanced_set(monkeypatch):
    """PyCIL beef_iso.py: CosineAnnealingLR(T_max=fusion_epochs) stepped once per epoch of the fusion
    loader. Fusion set: 3 samples per new class + 6 exemplars = 12, B = 4: 3 steps per epoch (the
    expansion's epoch is 6), so with 2 fusion epochs the lr is fusion_lr for 3 steps, then
    fusion_lr (1 + cos(pi / 2)) / 2 = fusion_lr / 2 for 3."""
    import clharness_methods.beef as beef_module
    trainers = []
    real = beef_module.phase_trainer

    def spy(*args, **kw):
        trainers.append(real(*args, **kw))
        return trainers[-1]
    monkeypatch.setattr(beef_module, "phase_trainer", spy)
    torch.manual_seed(0)
    beef = METHODS["beef"](tiny_context(), fusion_epochs=2, energy_weight=0.0, fusion_lr=0.04)
    beef.learn(experience((0, 1)))
    lrs = []
    fusion_loss = beef.fusion_loss

    def recording(x, y):
        lrs.append(trainers[-1].optimizer.param_groups[0]["lr"])
        return fusion_loss(x, y)
    beef.fusion_loss = recording
    beef.learn(experience((2, 3), seed=1, per_class=9))       # expansion: ceil((18 + 6) / 4) = 6 steps an epoch
    assert lrs == pytest.approx([0.04] * 3 + [0.02] * 3)
