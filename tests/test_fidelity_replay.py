"""Issue 28 (items 1, 2, 9, 12): ER-ACE, CWR*, CLS-ER, A-GEM, GMED and LwF's Avalanche option against
their references, each pinned on a tiny hand-made case whose expected value is the reference's
formula written out by hand (never our own output)."""
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import clharness as clh
from clharness.toolkit.backbones import MLP
from clharness_methods import REFERENCE_METHODS

METHODS = {cls.name: cls for cls in REFERENCE_METHODS}


class Rows:
    """A tiny training set whose batches come in a fixed order (no shuffling). ``view`` (optional)
    plays the suite's augmentation recipe: a training view of a raw batch."""

    def __init__(self, x, y, view=None):
        self.x, self.labels, self.view = x, y, view
        self.recipe = view            # Experience.augmenting: a recipe is set

    def __len__(self):
        return len(self.labels)

    def batches(self, batch_size, shuffle=True, generator=None, augment=None):
        for i in range(0, len(self.labels), batch_size):
            x = self.x[i:i + batch_size]
            yield (self.view(x) if augment is not None else x), self.labels[i:i + batch_size]

    def augment(self, x, generator):
        return self.view(x)


def experience(classes, n=8, batch_size=4, task_id=None, view=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.tensor(classes).repeat(n // len(classes))
    x = torch.randn(len(y), 1, 2, 2, generator=g)
    return clh.Experience(Rows(x, y, view), tuple(classes), task_id, batch_size, seed)


def ctx(num_classes=4, memory_size=100, setting=clh.Setting.CLASS_IL, backbone=None, **kw):
    return clh.Context(setting, num_classes, (1, 2, 2), seed=0, epochs=1, batch_size=4, memory_size=memory_size,
                       backbone_factory=backbone or (lambda: MLP((1, 2, 2), hidden=5, layers=1)), **kw)


def hand_ce(logits, y, classes=None):
    """-log softmax(logits[:, classes])[y], averaged: the cross-entropy over ``classes`` written out."""
    classes = list(range(logits.shape[1])) if classes is None else classes
    kept = logits[:, classes]
    col = torch.tensor([classes.index(int(c)) for c in y])
    return (torch.logsumexp(kept, 1) - kept[torch.arange(len(y)), col]).mean()


# --- ER-ACE (Caccia et al. 2022; pclucas14/AML methods/er_ace.py, Mammoth models/er_ace.py) -----------

def test_ace_incoming_loss_masks_only_the_old_classes_absent_from_the_batch():
    torch.manual_seed(0)
    ace = METHODS["ace"](ctx())
    first, second = torch.randn(2, 4), torch.randn(3, 4)
    # nothing seen before: no class is old, every logit competes (AML: mask[:, seen.max():] = 1)
    assert ace.incoming_loss(first, torch.tensor([0, 1])).item() == pytest.approx(
        hand_ce(first, torch.tensor([0, 1])).item(), rel=1e-6)
    # classes 0, 1 are old and absent: masked; 2 is present; 3 was never seen: it keeps its logit
    y = torch.tensor([2, 2, 2])
    assert ace.incoming_loss(second, y).item() == pytest.approx(hand_ce(second, y, [2, 3]).item(), rel=1e-6)


def test_ace_replay_loss_is_the_masked_incoming_ce_plus_the_replayed_ce_over_all_classes():
    torch.manual_seed(0)
    ace = METHODS["ace"](ctx())
    mx, my = torch.randn(2, 1, 2, 2), torch.tensor([0, 1])
    ace.buffer.add(mx, my)
    ace.seen[[0, 1]] = True
    x, y = torch.randn(2, 1, 2, 2), torch.tensor([2, 2])
    with torch.no_grad():
        expected = hand_ce(ace.model(x), y, [2, 3]) + hand_ce(ace.model(mx), my)
        assert ace.replay_loss(x, y).item() == pytest.approx(expected.item(), rel=1e-6)


def _spy_on_replay(ace):
    """Record, at every replay draw, the labels the memory holds."""
    held, sample = [], ace.buffer.sample

    def spy(n, gen=None):
        held.append(ace.buffer.tensors()[1].tolist())
        return sample(n, gen)
    ace.buffer.sample = spy
    return held


def test_ace_memory_takes_each_incoming_batch_after_its_step():
    torch.manual_seed(0)
    ace = METHODS["ace"](ctx())
    held = _spy_on_replay(ace)
    ace.learn(experience([0, 1]))                       # 2 steps of 4
    assert held == [[0, 1, 0, 1]]                       # the second step replays the first batch
    ace.learn(experience([2, 3], seed=1))
    # task 2, step 2: the memory already holds task 2's first batch (the references add after every step)
    assert held[2] == [0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3]
    assert len(ace.buffer) == 16


def test_ace_first_task_plain_trains_the_first_task_without_mask_or_replay():
    torch.manual_seed(0)
    ace = METHODS["ace"](ctx(), first_task="plain")     # Mammoth: replay and mask from task 2
    held = _spy_on_replay(ace)
    ace.learn(experience([0, 1]))
    assert held == [] and len(ace.buffer) == 8          # filled, never drawn
    ace.learn(experience([2, 3], seed=1))
    assert len(held) == 2                               # task 2 replays from its first step
    # under "plain" the first task's loss is the ordinary cross-entropy, old absent classes included
    ace.plain = True
    ace.seen[:] = True
    x, y = torch.randn(2, 1, 2, 2), torch.tensor([1, 1])
    with torch.no_grad():
        assert ace.replay_loss(x, y).item() == pytest.approx(hand_ce(ace.model(x), y).item(), rel=1e-6)


def test_ace_learns_under_augmentation_and_keeps_raw_views():
    torch.manual_seed(0)
    ace = METHODS["ace"](ctx())
    seen_inputs = []
    ace.model.register_forward_pre_hook(lambda module, args: seen_inputs.append(args[0].detach().clone()))
    exp = experience([0, 1], view=lambda x: x + 100.0)
    ace.learn(exp)                                      # raised TypeError (augment=) before
    raw = exp.data.x
    # every forward during training saw augmented views (the incoming and the replayed batch alike)
    assert len(seen_inputs) == 3 and all((v > 50).all() for v in seen_inputs)
    assert torch.equal(ace.buffer.tensors()[0], raw)    # the memory keeps the raw views


# --- CWR* (Lomonaco et al. 2020; Avalanche avalanche/training/plugins/cwr_star.py) ------------------------

def test_cwr_consolidation_subtracts_the_scalar_mean_of_the_task_weights():
    cwr = METHODS["cwr"](ctx(backbone=lambda: MLP((1, 2, 2), hidden=2, layers=1)))
    classes = torch.tensor([0, 1])
    tw = torch.tensor([[1.0, 2.0], [3.0, 6.0]])            # np.average(weight[cur_class]) = 3
    with torch.no_grad():
        cwr.model.head.weight[classes] = tw
    cwr.consolidate_classes(classes, torch.tensor([10.0, 10.0]))
    first = torch.tensor([[-2.0, -1.0], [0.0, 3.0]])         # first visit (past 0): cw = tw - 3
    assert torch.equal(cwr.cw_weight[classes], first)
    # second visit with past = cur = 10: w_past = 1, cw = (cw + tw2 - mean(tw2)) / 2, mean(tw2) = 1
    tw2 = torch.tensor([[0.0, 0.0], [0.0, 4.0]])
    with torch.no_grad():
        cwr.model.head.weight[classes] = tw2
    cwr.consolidate_classes(classes, torch.tensor([10.0, 10.0]))
    assert torch.equal(cwr.cw_weight[classes], (first + tw2 - 1.0) / 2)
    assert torch.equal(cwr.model.head.weight[classes], cwr.cw_weight[classes])


def test_cwr_never_resets_or_consolidates_the_bias():
    torch.manual_seed(0)
    cwr = METHODS["cwr"](ctx())
    bias = torch.tensor([0.5, -1.0, 2.0, 0.25])
    with torch.no_grad():
        cwr.model.head.bias.copy_(bias)
    at_start = []
    cwr.fit = lambda batches, params=None, loss_fn=None: at_start.append(cwr.model.head.bias.detach().clone())
    cwr.learn(experience([0, 1]))                   # training skipped: what the head holds before and after
    cwr.learn(experience([2, 3], seed=1))
    assert all(torch.equal(b, bias) for b in at_start)        # not zeroed before a task
    assert torch.equal(cwr.model.head.bias, bias)             # not replaced after it


# --- CLS-ER (Arani et al. 2022; NeurAI-Lab/CLS-ER models/clser.py) -----------------------------------------

class NormFlat(nn.Module):
    """Flatten, then BatchNorm1d: the normalised input is the feature."""
    out_dim = 4

    def __init__(self):
        super().__init__()
        self.norm = nn.BatchNorm1d(4)

    def forward(self, x):
        return self.norm(x.flatten(1))


@pytest.mark.parametrize("ema_buffers", ["own-forwards", "copy-working"])
def test_clser_ema_batchnorm_statistics_come_from_their_own_forwards_on_the_memory(ema_buffers):
    torch.manual_seed(0)
    option = {} if ema_buffers == "own-forwards" else {"ema_buffers": ema_buffers}   # the default, or the option
    clser = METHODS["clser"](ctx(memory_size=2, backbone=NormFlat), stable_update_freq=1.0,
                             plastic_update_freq=1.0, **option)
    mx = torch.tensor([[1.0, 2.0, 3.0, 4.0], [3.0, 0.0, 1.0, 8.0]]).view(2, 1, 2, 2)
    clser.buffer.add(mx, torch.tensor([0, 1]))                    # full: the replay draw is these two rows
    clser.observe(clh.Batch(torch.randn(3, 1, 2, 2), torch.tensor([2, 3, 3])))
    flat = mx.flatten(1)
    # one training-mode forward of each EMA model on the memory batch (momentum 0.1, unbiased variance),
    # from the initial statistics (mean 0, var 1); the EMA update leaves them alone
    mean = 0.9 * 0.0 + 0.1 * flat.mean(0)
    var = 0.9 * 1.0 + 0.1 * flat.var(0, unbiased=True)
    for ema in (clser.stable_model, clser.plastic_model):
        norm, work = ema.backbone.norm, clser.model.backbone.norm
        if ema_buffers == "own-forwards":
            assert torch.allclose(norm.running_mean, mean) and torch.allclose(norm.running_var, var)
            assert not torch.allclose(norm.running_mean, work.running_mean)
        else:   # the option: the working model's statistics (its forwards on [x; x_m] and x_m)
            assert torch.equal(norm.running_mean, work.running_mean)
            assert torch.equal(norm.running_var, work.running_var)


# --- A-GEM (Chaudhry et al. 2019; facebookresearch/agem EPS_MEM_BATCH_SIZE) --------------------------------

@pytest.mark.parametrize("sample_size, rows", [(None, 256), (10, 10), (1000, 600)])
def test_agem_reference_gradient_batch_is_sample_size_rows_of_the_memory(sample_size, rows):
    agem = METHODS["agem"](ctx(num_classes=4), **({} if sample_size is None else {"sample_size": sample_size}))
    for t in range(2):                                  # two finished tasks of 300 stored samples each
        agem.memory.tasks.append((torch.randn(300, 1, 2, 2), torch.full((300,), t)))
    (mx, my), = agem.memory_batches()
    assert len(mx) == len(my) == rows                   # 256 by default (the authors' EPS_MEM_BATCH_SIZE)
    stored = torch.cat([x for x, _ in agem.memory.tasks]).flatten(1)
    assert len({tuple(r.tolist()) for r in mx.flatten(1)}) == rows           # without replacement
    assert all((stored == r).all(1).any() for r in mx.flatten(1))            # drawn from the memory


# --- GMED (Jin et al. 2021; INK-USC/GMED ocl/ver_approx.py) --------------------------------------------------

def test_gmed_loss_is_the_incoming_mean_plus_the_replayed_mean():
    torch.manual_seed(0)
    gmed = METHODS["gmed"](ctx(memory_size=2))
    mx, my = torch.randn(2, 1, 2, 2), torch.tensor([0, 1])
    gmed.buffer.add(mx, my)
    gmed.edit = lambda x, y, mx, my, ages: mx            # no edit: the weighting alone
    x, y = torch.randn(4, 1, 2, 2), torch.tensor([2, 3, 2, 3])
    with torch.no_grad():
        expected = hand_ce(gmed.model(x), y) + hand_ce(gmed.model(mx), my)   # loss_tmp[:B].mean() + [B:].mean()
        assert gmed.gmed_loss(x, y).item() == pytest.approx(expected.item(), rel=1e-6)


@pytest.mark.parametrize("stride", [None, 0.5])
def test_gmed_edit_moves_by_alpha_times_the_editing_gradient(monkeypatch, stride):
    """With theta' = theta (the virtual step a no-op), d = 0 and the edit is x_m + alpha * beta *
    grad_x l(x_m); alpha defaults to 0.1 and beta to 0.01, the authors' documented run (README)."""
    import clharness_methods.gmed as gmed_module
    monkeypatch.setattr(gmed_module, "virtual_step",
                        lambda model, loss, lr: {k: p.detach() for k, p in model.named_parameters()})
    torch.manual_seed(0)
    gmed = METHODS["gmed"](ctx(memory_size=4), **({} if stride is None else {"edit_stride": stride}))
    x, y = torch.randn(4, 1, 2, 2), torch.tensor([0, 1, 2, 0])
    mx, my = torch.randn(3, 1, 2, 2), torch.tensor([1, 2, 0])
    probe = mx.clone().requires_grad_(True)
    grad, = torch.autograd.grad(hand_ce(gmed.model(probe), my), probe)
    alpha = 0.1 if stride is None else stride
    torch.testing.assert_close(gmed.edit(x, y, mx, my, torch.zeros(3)), mx + alpha * 0.01 * grad)


def test_gmed_offline_task_offers_each_batch_to_the_memory_after_its_step():
    torch.manual_seed(0)
    gmed = METHODS["gmed"](ctx(memory_size=100))
    held, edit = [], gmed.edit

    def spy(x, y, mx, my, ages):
        held.append(gmed.buffer.tensors()[1].tolist())
        return edit(x, y, mx, my, ages)
    gmed.edit = spy
    gmed.learn(experience([0, 1]))                      # 2 steps of 4
    gmed.learn(experience([2, 3], seed=1))
    # replay from the second step; task 2's second step already holds task 2's first batch
    assert held == [[0, 1, 0, 1], [0, 1] * 4, [0, 1] * 4 + [2, 3, 2, 3]]


# --- LwF's Avalanche options (Avalanche 0.2.1 plugins/lwf.py, 0.6 training/regularization.py) --------------

def _units_while_training(lwf, tasks, setting):
    """Avalanche's distilled units as each task's training starts (training itself skipped)."""
    during = []
    lwf.fit = lambda batches, *a, **k: during.append(list(lwf.distilled_units) if lwf.old_model else None)
    for t, classes in enumerate(tasks):
        lwf.learn(experience(list(classes), task_id=t if setting is clh.Setting.TASK_IL else None, seed=t))
    return during


@pytest.mark.parametrize("setting, loss, expected", [
    # 0.2.1: prev_classes["0"] rewritten after every experience: the latest finished one's classes
    (clh.Setting.CLASS_IL, "avalanche-0.2.1", [None, [0, 1], [2, 3]]),
    # 0.6: prev_classes_by_task[0], the union of the finished experiences: every old class
    (clh.Setting.CLASS_IL, "avalanche-0.6", [None, [0, 1], [0, 1, 2, 3]]),
    # task labels on a single head: task label 0 only, the first experience's classes, in both releases
    (clh.Setting.TASK_IL, "avalanche-0.2.1", [None, [0, 1], [0, 1]]),
    (clh.Setting.TASK_IL, "avalanche-0.6", [None, [0, 1], [0, 1]]),
])
def test_lwf_avalanche_distils_the_units_of_the_finished_experiences(setting, loss, expected):
    tasks = ((0, 1), (2, 3), (4, 5))
    torch.manual_seed(0)
    lwf = METHODS["lwf"](ctx(num_classes=6, setting=setting, task_classes=tasks if setting is clh.Setting.TASK_IL
                             else ()), lwf_loss=loss)
    assert _units_while_training(lwf, tasks, setting) == expected


def test_lwf_avalanche_loss_on_the_distilled_units_by_hand():
    torch.manual_seed(0)
    lwf = METHODS["lwf"](ctx(num_classes=6), lwf_loss="avalanche-0.6", lwf_lambda=2.0, temperature=2.0)
    _units_while_training(lwf, ((0, 1), (2, 3), (4, 5)), clh.Setting.CLASS_IL)
    x, y = torch.randn(3, 1, 2, 2), torch.tensor([4, 5, 4])
    with torch.no_grad():
        new, old = lwf.model(x), lwf.old_model(x)
        u = [0, 1, 2, 3]
        q, log_p = F.softmax(old[:, u] / 2.0, 1), F.log_softmax(new[:, u] / 2.0, 1)
        expected = hand_ce(new, y) + 2.0 * (q * (q.log() - log_p)).sum(1).mean()   # CE + alpha KL(q || p)
        assert lwf.loss(x, y).item() == pytest.approx(expected.item(), rel=1e-5)


def test_lwf_old_avalanche_spelling_is_read_as_0_2_1_with_a_warning():
    from clharness.engine.runner import resolve_hparams
    with pytest.warns(FutureWarning, match="avalanche-0.2.1"):
        hp = resolve_hparams(METHODS["lwf"], {"lwf_loss": "avalanche"})
    assert hp["lwf_loss"] == "avalanche-0.2.1"          # the record key holds the new name
    with pytest.warns(FutureWarning):
        lwf = METHODS["lwf"](ctx(), lwf_loss="avalanche")
    assert lwf.hp["lwf_loss"] == "avalanche-0.2.1"
