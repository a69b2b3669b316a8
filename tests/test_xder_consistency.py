"""X-DER's future-heads consistency term (methods/xder.py): the supervised contrastive loss (Khosla
et al. 2020, eq. 2) on a hand case and a property it states, the future-head chunks, BatchNorm
statistics untouched by the consistency forward, the term's composition, and no term on the last task."""
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import clharness as clh
from clharness.data import ArrayDataset, TensorData
from clharness_methods.xder import XDER, frozen_bn_stats, future_heads, supcon_loss

CLASSES, TASKS = 6, 3


# ------------------------------------------------------------------------------ SupCon
def test_supcon_on_a_hand_computed_case():
    # sample 0 (label 0): views a = (1, 0), b = (0, 1); sample 1 (label 1): c = (1, 0), d = (-1, 0).
    # temperature 1; each anchor's positive is its other view (labels differ), A(i) = the 3 others:
    #   a: -log(e^{a.b} / (e^{a.c} + e^{a.b} + e^{a.d})) = log(e + 1 + 1/e)
    #   c: -log(e^{-1} / (e + 1 + 1/e))                  = 1 + log(e + 1 + 1/e)
    #   b: all three dot products 0                      = log 3
    #   d: -log(e^{-1} / (e^{-1} + e^{-1} + 1))          = 1 + log(1 + 2/e)
    # summed over anchors, divided by the 2 views
    e = math.e
    expected = (2 * math.log(e + 1 + 1 / e) + 1 + math.log(3) + 1 + math.log(1 + 2 / e)) / 2
    features = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [-1.0, 0.0]]])
    labels = torch.tensor([0, 1])
    assert supcon_loss(features, labels, 1.0).item() == pytest.approx(expected, rel=1e-6)
    # same labels: every other view is a positive; anchor b: all three dots 0 -> log 3 each
    same = supcon_loss(features, torch.tensor([0, 0]), 1.0).item()
    pos_a = -(0 - math.log(e + 1 + 1 / e) + 1 - math.log(e + 1 + 1 / e) - 1 - math.log(e + 1 + 1 / e)) / 3
    pos_c = pos_a                                   # c's dot products are a's: 1 (a), 0 (b), -1 (d)
    pos_d = -(-1 - 1 + 0 - 3 * math.log(2 / e + 1)) / 3
    assert same == pytest.approx((pos_a + pos_c + math.log(3) + pos_d) / 2, rel=1e-6)
    # temperature divides the dot products; base temperature only rescales
    assert supcon_loss(features, labels, 2.0, base_temperature=1.0).item() == pytest.approx(
        2 * supcon_loss(features / math.sqrt(2), labels, 1.0).item(), rel=1e-6)


def test_supcon_is_lower_when_same_label_views_align():
    torch.manual_seed(0)
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    prototypes = F.normalize(torch.randn(3, 8), dim=1)
    aligned = prototypes[labels][:, None].expand(6, 2, 8) + 0.05 * torch.randn(6, 2, 8)
    misaligned = torch.randn(6, 2, 8)
    for t in (0.1, 1.0, 5.0):
        assert supcon_loss(F.normalize(aligned, dim=2), labels, t) < supcon_loss(F.normalize(misaligned, dim=2), labels, t)


def test_supcon_needs_two_views():
    with pytest.raises(ValueError, match="at least 2 views"):
        supcon_loss(torch.randn(4, 1, 3), torch.arange(4), 1.0)


def test_future_heads_are_id_order_chunks_of_the_task_size():
    future = torch.zeros(10, dtype=torch.bool)
    future[[8, 2, 7, 3, 6]] = True
    assert [h.tolist() for h in future_heads(future, 2)] == [[2, 3], [6, 7], [8]]
    assert future_heads(torch.zeros(10, dtype=torch.bool), 2) == []


# ------------------------------------------------------------------------------ the method
class BNNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 16), nn.BatchNorm1d(16), nn.ReLU())
        self.out_dim = 16

    def forward(self, x):
        return self.net(x)


def experiences():
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (CLASSES * 12, 3, 8, 8), dtype=torch.uint8, generator=g)
    labels = torch.arange(CLASSES).repeat_interleave(12)
    ds = ArrayDataset(images, labels, [str(c) for c in range(CLASSES)])
    out = []
    for t in range(TASKS):
        classes = (2 * t, 2 * t + 1)
        part = ds.subset(torch.isin(labels, torch.tensor(classes)).nonzero().squeeze(1))
        out.append(clh.Experience(TensorData(part, [0.5] * 3, [0.25] * 3), classes, None, 8, t))
    return out


def make_xder(**hp):
    context = clh.Context(clh.Setting.CLASS_IL, CLASSES, (3, 8, 8), seed=0, epochs=1, batch_size=8,
                          memory_size=12, backbone_factory=BNNet)
    return XDER(context, **({"preset": "custom", **hp} if hp else {}))   # weights by hand need preset="custom"


def begin(xder, exp):
    """learn()'s bookkeeping for ``exp`` without training on it."""
    xder.labels.add(exp)
    xder.class_task[list(exp.classes)] = xder.task
    xder.classes_per_task, xder.frame = len(exp.classes), exp.data.frame


def bn_state(model):
    return {k: v.clone() for k, v in model.state_dict().items() if "running" in k or "num_batches" in k}


def test_consistency_forward_leaves_batchnorm_statistics_unchanged():
    exps = experiences()
    xder = make_xder()
    xder.learn(exps[0])                    # a memory to draw from
    begin(xder, exps[1])
    xder.model.train()
    x, y = next(iter(exps[1].batches(augment=False)))
    before = bn_state(xder.model)
    loss = xder.consistency_loss(x, y, xder.heads()[2])
    assert loss is not None and torch.isfinite(loss) and loss > 0
    after = bn_state(xder.model)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(m.track_running_stats for m in xder.model.modules() if isinstance(m, nn.BatchNorm1d))
    xder.model(x)                          # an ordinary train-mode forward does move them
    assert not torch.equal(bn_state(xder.model)["backbone.net.2.running_mean"], before["backbone.net.2.running_mean"])


def test_frozen_bn_stats_normalises_with_batch_statistics():
    bn = nn.BatchNorm1d(3).train()
    x = torch.randn(16, 3) * 4 + 2
    with frozen_bn_stats(bn):
        out = bn(x)
    assert torch.allclose(out, (x - x.mean(0)) / torch.sqrt(x.var(0, unbiased=False) + bn.eps), atol=1e-5)
    assert torch.equal(bn.running_mean, torch.zeros(3)) and int(bn.num_batches_tracked) == 0 and bn.track_running_stats


def test_consistency_term_is_lambd_times_supcon_per_future_head_over_samples():
    exps = experiences()
    xder = make_xder(lambd=0.3, simclr_batch_size=5, simclr_num_aug=3)
    xder.learn(exps[0])
    begin(xder, exps[1])
    xder.model.train()
    x, y = next(iter(exps[1].batches(augment=False)))
    gen_state, strong_state = xder.gen.get_state(), xder.strong_gen.get_state()
    loss = xder.consistency_loss(x, y, xder.heads()[2])
    # again by hand, from the same random draws: 5 memory samples first, then the first 5 stream ones
    xder.gen.set_state(gen_state)
    xder.strong_gen.set_state(strong_state)
    bx, by, _, _ = xder.sample(5)
    xs, ys = torch.cat([bx, x[:5]]), torch.cat([by, y[:5]])
    views = xder.strong.train(xs.repeat_interleave(3, 0), exps[1].data.frame, (8, 8), xder.strong_gen)
    with frozen_bn_stats(xder.model):
        out = xder.model(views).view(10, 3, CLASSES)
    heads = [[4, 5]]                       # task 1 holds classes 2, 3: the one future head is task 2
    assert [h.tolist() for h in future_heads(xder.heads()[2], 2)] == heads
    expected = 0.3 * sum(supcon_loss(F.normalize(out[:, :, h], dim=2), ys, 5.0) for h in heads) / (1 * 10)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    # only the future heads' logits enter: the seen classes' head rows get no gradient from it
    xder.model.zero_grad()
    loss.backward()
    grad = xder.model.head.weight.grad
    assert grad[:4].abs().max() == 0 and grad[4:].abs().max() > 0


def test_no_consistency_term_on_the_last_task_or_with_lambd_zero():
    exps = experiences()
    xder = make_xder()
    for exp in exps[:-1]:
        xder.learn(exp)
    begin(xder, exps[-1])
    x, y = next(iter(exps[-1].batches(augment=False)))
    assert not xder.heads()[2].any() and xder.consistency_loss(x, y, xder.heads()[2]) is None
    off = make_xder(lambd=0.0)
    begin(off, exps[0])
    assert off.consistency_loss(x, y, off.heads()[2]) is None

