"""Issue 28 items 7 and 10. PODNet as the authors' code trains it (arthurdouillard/
incremental_learning.pytorch): their NCA loss, imprinted proxies for new classes, classifier-only
class-balanced fine-tuning. DER++'s forward option: mammoth's three forward passes or Avalanche's
single forward over the concatenated batch (shared BatchNorm statistics). Each definition is
written out by hand on a tiny case."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import clharness as clh
from clharness.data.base import ArrayDataset, TensorData
from clharness_methods.derpp import DERpp
from clharness_methods.podnet import PODNet, nca_loss


# --- PODNet: the NCA loss ------------------------------------------------------------------------

def authors_nca(z, y, margin, scale=1.0):
    """incremental_learning.pytorch losses/base.py ``nca`` (exclude_pos_denominator, no hinge), by
    hand for one sample: z' = z - scale * margin for every class, shifted by its max; the true
    class's denominator slot is zeroed after the shift and so counts exp(0)."""
    zs = [v - scale * margin for v in z]
    m = max(zs)
    zs = [v - m for v in zs]
    denominator = sum(math.exp(0.0 if i == y else v) for i, v in enumerate(zs))
    return -(zs[y] - math.log(denominator))


def test_nca_default_is_the_authors_loss_by_hand():
    logits = torch.tensor([[2.0, 1.0, 0.5]])
    y = torch.tensor([0])
    # true class the max: z' = (1.4, 0.4, -0.1) -> -0 + log(1 + e^-1 + e^-1.5)
    expected = math.log(1 + math.exp(-1.0) + math.exp(-1.5))
    assert authors_nca([2.0, 1.0, 0.5], 0, 0.6) == pytest.approx(expected)
    assert float(nca_loss(logits, y, 0.6)) == pytest.approx(expected, rel=1e-6)
    # true class not the max: z' - M = (-0.8, 0, -0.5) -> 0.8 + log(1 + 1 + e^-0.5)
    expected = 0.8 + math.log(2 + math.exp(-0.5))
    assert float(nca_loss(torch.tensor([[0.2, 1.0, 0.5]]), y, 0.6)) == pytest.approx(expected, rel=1e-6)
    # no hinge: a confident sample keeps a small positive loss (the paper's form gives 0)
    confident = torch.tensor([[9.0, 1.0, 0.5]])
    assert float(nca_loss(confident, y, 0.6)) == pytest.approx(authors_nca([9.0, 1.0, 0.5], 0, 0.6), rel=1e-4)   # float32
    assert float(nca_loss(confident, y, 0.6)) > 0
    assert float(nca_loss(confident, y, 0.6, form="paper")) == 0.0
    # a masked class (very low logit) drops out of the sums
    masked = torch.tensor([[2.0, 1.0, 0.5, -1e4]])
    assert float(nca_loss(masked, y, 0.6)) == pytest.approx(math.log(1 + math.exp(-1.0) + math.exp(-1.5)), rel=1e-6)


def test_nca_margin_cancels_in_the_code_form_and_scales_with_eta_in_the_paper_form():
    z = torch.tensor([[0.3, 1.1, -0.4], [2.0, 0.5, 1.5]])
    y = torch.tensor([2, 0])
    code = [float(nca_loss(z, y, m, scale=2.0)) for m in (0.0, 0.6, 1.5)]
    assert code == pytest.approx([code[0]] * 3, rel=1e-6)          # the code's margin is a no-op
    hand = sum(authors_nca(row.tolist(), int(t), 0.6, 2.0) for row, t in zip(z, y)) / 2
    assert code[1] == pytest.approx(hand, rel=1e-6)
    # paper, sec. 3.2: [-log exp(eta (y_y - delta)) / sum_{i != y} exp(eta y_i)]_+ with z = eta * y
    eta, delta = 2.0, 0.6
    def paper(row, t):
        others = math.log(sum(math.exp(v) for i, v in enumerate(row) if i != t))
        return max(0.0, -(row[t] - eta * delta) + others)
    hand = sum(paper(row.tolist(), int(t)) for row, t in zip(z, y)) / 2
    assert float(nca_loss(z, y, delta, form="paper", scale=eta)) == pytest.approx(hand, rel=1e-6)
    assert float(nca_loss(z, y, 1.0, form="paper", scale=eta)) > float(nca_loss(z, y, 0.0, form="paper", scale=eta))


def test_lsc_squared_distance_similarity_is_the_authors_config_by_hand():
    from clharness_methods.podnet import LocalSimilarityClassifier
    h = torch.tensor([[3.0, 4.0]])                                 # cosines 0.6 and 0.8 with the proxies
    out = {}
    for similarity in ("cosine", "neg_sq_distance"):
        lsc = LocalSimilarityClassifier(2, 1, 2, similarity)
        with torch.no_grad():
            lsc.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 3.0]]))
            lsc.eta.fill_(2.0)
        out[similarity] = lsc(h).item()
    # -||theta/|theta| - h/|h|||^2 = 2 cos - 2: (-0.8, -0.4), merged by a softmax over the proxies
    d = [-0.8, -0.4]
    w = [math.exp(v) / sum(math.exp(u) for u in d) for v in d]
    assert out["neg_sq_distance"] == pytest.approx(2.0 * sum(wi * v for wi, v in zip(w, d)), rel=1e-6)
    c = [0.6, 0.8]
    w = [math.exp(v) / sum(math.exp(u) for u in c) for v in c]
    assert out["cosine"] == pytest.approx(2.0 * sum(wi * v for wi, v in zip(w, c)), rel=1e-6)


# --- PODNet: a 2-d backbone that is the identity -------------------------------------------------

class Identity2d(nn.Module):
    """Features = the two input pixels (a Linear fixed to the identity)."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(2, 2))
        with torch.no_grad():
            self.net[1].weight.copy_(torch.eye(2))
            self.net[1].bias.zero_()
        self.out_dim = 2

    def forward(self, x):
        return self.net(x)


def tiny_podnet(**hp):
    ctx = clh.Context(clh.Setting.CLASS_IL, 2, (1, 1, 2), seed=0, epochs=1, batch_size=4, memory_size=8,
                      backbone_factory=Identity2d)
    return PODNet(ctx, **hp)


# class 1: two well-separated pairs of directions; normalised: (1, 0), (0.96, 0.28) and (0, 1), (0.28, 0.96)
NEW_X = torch.tensor([[5.0, 0.0], [24.0, 7.0], [0.0, 5.0], [7.0, 24.0]]).view(4, 1, 1, 2)
CENTRES = torch.tensor([[0.98, 0.14], [0.14, 0.98]])     # k-means centres (K = 2) of the normalised features


def sort_rows(w):
    return w[w[:, 0].argsort()]


def test_imprinted_proxies_are_kmeans_centres_of_normalised_features_times_the_old_mean_norm():
    pod = tiny_podnet(proxies=2)
    head = pod.model.head
    with torch.no_grad():
        head.weight[0:2] = torch.tensor([[3.0, 0.0], [0.0, 5.0]])   # class 0 (old): norms 3 and 5, mean 4
    pod.known = [0]
    pod.imprint(NEW_X, torch.ones(4, dtype=torch.long), [1])
    assert torch.allclose(sort_rows(head.weight.detach()[2:4]), sort_rows(CENTRES * 4.0), atol=1e-5)
    assert torch.equal(head.weight.detach()[0:2], torch.tensor([[3.0, 0.0], [0.0, 5.0]]))   # old rows kept
    # one proxy per class: the normalised mean of the normalised features, times the old norm
    pod1 = tiny_podnet(proxies=1)
    with torch.no_grad():
        pod1.model.head.weight[0] = torch.tensor([0.0, 2.0])
    pod1.known = [0]
    pod1.imprint(NEW_X, torch.ones(4, dtype=torch.long), [1])
    mean = torch.tensor([0.56, 0.56])
    assert torch.allclose(pod1.model.head.weight.detach()[1], 2.0 * mean / mean.norm(), atol=1e-5)


def experience(x, label, seed):
    images = x.to(torch.uint8)
    ds = ArrayDataset(images, torch.full((len(x),), label), ["a", "b"])
    return clh.Experience(TensorData(ds, [0.0], [1 / 255]), (label,), None, 4, seed)


@pytest.mark.parametrize("weight_init", ["imprinted", "random"])
def test_learn_imprints_the_new_classes_before_training_only_when_asked(weight_init):
    pod = tiny_podnet(proxies=2, weight_init=weight_init, finetune_epochs=0)
    pod.fit = lambda *a, **k: None                    # isolate the initialisation from training
    old_x = torch.tensor([[9.0, 1.0], [8.0, 2.0]]).view(2, 1, 1, 2)
    pod.learn(experience(old_x, 0, 0))
    before = pod.model.head.weight.detach().clone()
    pod.learn(experience(NEW_X, 1, 1))
    after = pod.model.head.weight.detach()
    assert torch.equal(after[0:2], before[0:2])
    if weight_init == "imprinted":
        norm = before[0:2].norm(dim=1).mean()
        assert torch.allclose(sort_rows(after[2:4]), sort_rows(CENTRES * norm), atol=1e-5)
    else:
        assert torch.equal(after[2:4], before[2:4])


def finetune_setup(**hp):
    pod = tiny_podnet(proxies=1, finetune_epochs=1, **hp)
    pod.seen_mask[:] = True
    pod.known = [0]
    xs = torch.tensor([[3.0, 1.0], [2.0, 2.0], [1.0, 3.0], [0.5, 2.0]]).view(4, 1, 1, 2)
    pod.memory.x = {0: xs[:2], 1: xs[2:]}
    frozen = torch.tensor([True, False])
    pod.model.head.frozen = frozen
    return pod, xs, torch.tensor([0, 0, 1, 1])


def test_balanced_finetuning_trains_the_classifier_only_with_the_authors_step():
    pod, xs, ys = finetune_setup()
    w0 = pod.model.head.weight.detach().clone()
    eta, backbone = pod.model.head.eta.detach().clone(), [p.detach().clone() for p in pod.model.backbone.parameters()]
    # one step on the 4 exemplars (batch 4): SGD, lr 0.05, weight decay 5e-4, on the authors' NCA of
    # the LSC logits eta * sum_k softmax_k(s) s with K = 1: eta * cos(theta_c, h); every class's proxies
    w = w0.clone().requires_grad_(True)
    h = xs.view(4, 2)
    z = eta * F.normalize(h, dim=1) @ F.normalize(w, dim=1).T
    zs = z - 0.6 * eta
    zs = zs - zs.max(1, keepdim=True).values
    pos = zs[torch.arange(4), ys]
    rest = zs.clone()
    rest[torch.arange(4), ys] = 0.0
    loss = (-pos + torch.log(torch.exp(rest).sum(1))).mean()
    (grad,) = torch.autograd.grad(loss, w)
    expected = w0 - 0.05 * (grad + 5e-4 * w0)
    pod.balanced_finetune()
    assert torch.allclose(pod.model.head.weight.detach(), expected, atol=1e-6)
    assert not torch.allclose(F.normalize(pod.model.head.weight.detach()[0], dim=0), F.normalize(w0[0], dim=0))
    assert torch.equal(pod.model.head.eta.detach(), eta)
    assert all(torch.equal(p, q) for p, q in zip(pod.model.backbone.parameters(), backbone))


def test_pycil_finetuning_trains_all_but_the_old_proxies():
    pod, _, _ = finetune_setup(finetune_params="all_but_old", finetune_lr=0.005, finetune_scheduler="cosine")
    w0 = pod.model.head.weight.detach().clone()
    backbone = [p.detach().clone() for p in pod.model.backbone.parameters()]
    pod.balanced_finetune()
    w = pod.model.head.weight.detach()
    assert torch.allclose(F.normalize(w[0], dim=0), F.normalize(w0[0], dim=0), atol=1e-6)   # old: direction kept
    assert not torch.allclose(w[1], w0[1])
    assert not all(torch.equal(p, q) for p, q in zip(pod.model.backbone.parameters(), backbone))


# --- DER++: separate or concatenated forward ------------------------------------------------------

class BNNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(4, 3), nn.BatchNorm1d(3), nn.ReLU())
        self.out_dim = 3

    def forward(self, x):
        return self.net(x)


def derpp_with_bn(**hp):
    torch.manual_seed(0)
    ctx = clh.Context(clh.Setting.CLASS_IL, 4, (1, 2, 2), seed=0, epochs=1, batch_size=4, memory_size=2,
                      backbone_factory=BNNet)
    return DERpp(ctx, alpha=0.3, beta=0.7, **hp)


def hand_ce(logits, y):
    return (torch.logsumexp(logits, 1) - logits[torch.arange(len(y)), y]).mean()


def test_derpp_concat_forward_is_one_pass_over_stream_and_both_memory_draws():
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 1, 2, 2, generator=g), torch.tensor([0, 1, 0, 1])
    xm, ym, zm = torch.randn(2, 1, 2, 2, generator=g), torch.tensor([2, 3]), torch.randn(2, 4, generator=g)
    losses = {}
    for forward in ("concat", "separate"):
        d = derpp_with_bn(forward=forward)
        d.store(xm, ym, zm)          # a two-slot memory: each draw returns both (in some order; the loss is a mean)
        d.model.train()
        loss, logits = d.step_loss(x, y)
        losses[forward] = float(loss.detach())
        with torch.no_grad():
            if forward == "concat":                  # BatchNorm over the 6 rows together
                out = d.model(torch.cat([x, xm, xm]))
                s, o1, o2 = out[:4], out[4:6], out[6:8]
            else:                                    # each batch normalised alone
                s, o1, o2 = d.model(x), d.model(xm), d.model(xm)
        hand = hand_ce(s, y) + 0.3 * ((o1 - zm) ** 2).mean() + 0.7 * hand_ce(o2, ym)
        assert float(loss.detach()) == pytest.approx(float(hand), rel=1e-5)
        assert torch.allclose(logits, s, atol=1e-6)
    assert losses["concat"] != pytest.approx(losses["separate"], rel=1e-3)   # BatchNorm sees other batches


def test_derpp_forward_modes_agree_without_batchnorm():
    from clharness.toolkit.backbones import MLP
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(4, 1, 2, 2, generator=g), torch.tensor([0, 1, 0, 1])
    xm, ym, zm = torch.randn(3, 1, 2, 2, generator=g), torch.tensor([2, 3, 2]), torch.randn(3, 4, generator=g)
    losses = []
    for forward in ("concat", "separate"):
        torch.manual_seed(0)
        ctx = clh.Context(clh.Setting.CLASS_IL, 4, (1, 2, 2), seed=0, epochs=1, batch_size=4, memory_size=3,
                          backbone_factory=lambda: MLP((1, 2, 2), hidden=5, layers=1))
        d = DERpp(ctx, forward=forward)
        d.store(xm, ym, zm)
        losses.append(float(d.step_loss(x, y)[0].detach()))
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
