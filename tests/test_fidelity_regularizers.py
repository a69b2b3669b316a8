"""Issue 28 items 4, 5 and 11: SI, MAS, AFEC and Generative Replay against their references, each
rule written out by hand on a tiny case (a 2-layer network with a BatchNorm, a few samples) and
compared with the method's state, never with the method's own output."""
import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import clharness as clh
from clharness.method import Context, Experience, Setting
from clharness_methods.afec import AFEC
from clharness_methods.generative_replay import GenerativeReplay
from clharness_methods.mas import MAS
from clharness_methods.si import SI

BN_PARAMS = ("backbone.bn.weight", "backbone.bn.bias")


class Tiny(nn.Module):
    """Linear(2, 3) -> BatchNorm1d(3) -> tanh; the Classifier adds Linear(3, num_classes)."""

    def __init__(self):
        super().__init__()
        self.fc, self.bn, self.out_dim = nn.Linear(2, 3), nn.BatchNorm1d(3), 3

    def forward(self, x):
        return torch.tanh(self.bn(self.fc(x.flatten(1))))


class Data:
    """Hand-made inputs, batched in order (the tests replay the same order)."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def batches(self, batch_size, shuffle=True, generator=None, **_):
        for i in range(0, len(self.y), batch_size):
            yield self.x[i:i + batch_size], self.y[i:i + batch_size]


def _context(num_classes=4, batch_size=2, epochs=1, setting=Setting.CLASS_IL, input_shape=(2,), factory=Tiny):
    torch.manual_seed(0)
    return Context(setting=setting, num_classes=num_classes, input_shape=input_shape, batch_size=batch_size,
                   epochs=epochs, backbone_factory=factory)


def _tasks(n=4, batch_size=2, seed=1):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for t, classes in enumerate([(0, 1), (2, 3)]):
        x = torch.randn(n, 2, generator=gen) + 2 * t
        y = torch.tensor([classes[i % 2] for i in range(n)])
        out.append(Experience(Data(x, y), classes, None, batch_size=batch_size))
    return out


def _close(a, b, **kw):
    kw = {"rtol": 1e-4, "atol": 1e-7, **kw}
    return torch.allclose(a, b, **kw)


# --- SI -------------------------------------------------------------------------------------------

def _avalanche_si_by_hand(model, tasks, lr, lam, eps):
    """Avalanche 0.2.1 SynapticIntelligencePlugin with plain SGD, written out: trajectory += g * delta
    (g the full gradient), S += trajectory / (Delta^2 + eps), importance = min(-S, 1e-3), penalty
    lam / 2 sum importance (w - w~)^2, BatchNorm parameters excluded."""
    names = [k for k, _ in model.named_parameters() if k not in BN_PARAMS]
    params = dict(model.named_parameters())
    imp = {k: torch.zeros_like(params[k]) for k in names}
    anchor = {k: params[k].detach().clone() for k in names}
    cum = {k: torch.zeros_like(params[k]) for k in names}
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    model.train()
    for exp in tasks:
        start = {k: params[k].detach().clone() for k in names}
        traj = {k: torch.zeros_like(params[k]) for k in names}
        for x, y in exp.batches():
            old = {k: params[k].detach().clone() for k in names}
            loss = F.cross_entropy(model(x), y)
            loss = loss + lam / 2 * sum((imp[k] * (params[k] - anchor[k]) ** 2).sum() for k in names)
            opt.zero_grad()
            loss.backward()
            opt.step()
            for k in names:
                traj[k] += params[k].grad * (params[k].detach() - old[k])
        for k in names:
            cum[k] += traj[k] / ((params[k].detach() - start[k]) ** 2 + eps)
            imp[k] = torch.clamp(-cum[k], max=1e-3)
            anchor[k] = params[k].detach().clone()
    return imp, anchor


@pytest.mark.parametrize("eps", [1e-3, 1e-1])
def test_si_avalanche_variant_is_avalanche_021_plugin(eps):
    lr, lam = 0.5, 200.0
    si = SI(_context(), si_variant="avalanche", optimizer="sgd", lr=lr, momentum=0.0, si_lambda=lam, si_epsilon=eps)
    model = copy.deepcopy(si.model)
    tasks = _tasks()
    for exp in tasks:
        si.learn(exp)
    imp, anchor = _avalanche_si_by_hand(model, tasks, lr, lam, eps)
    assert set(si.omega_total) == set(imp) and not set(BN_PARAMS) & set(si.omega_total)   # BatchNorm left out
    for k in imp:
        assert _close(si.omega_total[k], imp[k]), k
        assert _close(si.anchor[k], anchor[k]), k
    assert _close(si.model.head.weight, model.head.weight)   # the same trajectory, the penalty's gradient included
    flat = torch.cat([v.flatten() for v in imp.values()])
    assert (flat == 1e-3).any() and (flat < 1e-3).any()     # the cap is reached by some, not all
    # the penalty: lam / 2 sum importance (w - w~)^2, at displaced weights
    with torch.no_grad():
        for p in si.model.parameters():
            p.add_(0.1)
    expected = sum((imp[k] * 0.1 ** 2).sum() for k in imp) / 2
    assert si.penalty().item() == pytest.approx(expected.item(), rel=1e-5)


def test_si_avalanche_lambda_weighs_half_the_penalty():
    si = SI(_context(), si_variant="avalanche", optimizer="sgd", lr=0.5, momentum=0.0)
    si.learn(_tasks()[0])
    with torch.no_grad():
        for p in si.model.parameters():
            p.add_(0.1)
    x, y = next(iter(_tasks()[1].batches()))
    si.model.eval()
    base = F.cross_entropy(si.model(x), y)
    quad = sum((w * 0.1 ** 2).sum() for w in si.omega_total.values())
    for lam in (1.0, 50.0):
        si.hp["si_lambda"] = lam
        assert si.loss(x, y).item() == pytest.approx((base + lam / 2 * quad).item(), rel=1e-5)


def test_si_pathint_variant_clamps_the_summed_importance_at_zero():
    """ganguli-lab/pathint: omega = relu(omega + grads2 / (Delta^2 + xi)). On the second task the
    penalty pulls some weights against their task gradient, so their path integral (and, here, their
    summed Omega) is negative: eq. 5 keeps it, the authors' code zeroes it. The first task's Omega is
    non-negative, so both variants follow the same trajectory."""
    hp = dict(optimizer="sgd", lr=0.1, momentum=0.0, si_lambda=10.0, si_epsilon=1e-3)
    paper = SI(_context(), **hp)
    pathint = SI(_context(), si_variant="pathint", **hp)
    for exp in _tasks():
        paper.learn(exp)
        pathint.learn(exp)
    assert any((v < 0).any() for v in paper.omega_total.values())
    for k, v in paper.omega_total.items():
        assert torch.allclose(pathint.omega_total[k], v.clamp(min=0), rtol=1e-5, atol=1e-8), k


# --- MAS ------------------------------------------------------------------------------------------

def _spy(method, attr):
    """Record a copy of the model just before ``method.<attr>`` runs."""
    original, seen = getattr(method, attr), []

    def spy(exp):
        seen.append(copy.deepcopy(method.model))
        return original(exp)
    setattr(method, attr, spy)
    return seen


def _avalanche_mas_by_hand(model, exp):
    """MASPlugin._get_importance: train mode, per batch |d mean_k ||out_k||_2 / d theta| * len((x, y, t))."""
    model.train()
    imp = {k: torch.zeros_like(p) for k, p in model.named_parameters()}
    batches = 0
    for x, _ in exp.batches():
        model.zero_grad()
        torch.norm(model(x), p="fro", dim=1).mean().backward()
        for k, p in model.named_parameters():
            imp[k] += p.grad.abs() * 3
        batches += 1
    return {k: v / batches for k, v in imp.items()}


@pytest.mark.parametrize("alpha", [0.5, 0.25])
def test_mas_avalanche_variant_is_avalanche_021_plugin(alpha):
    mas = MAS(_context(), mas_variant="avalanche", mas_alpha=alpha)
    snaps = _spy(mas, "avalanche_importance")
    t0, t1 = _tasks()
    mas.learn(t0)
    first = _avalanche_mas_by_hand(snaps[0], t0)
    for k, w in first.items():   # importance starts from zeros: the first task's is (1 - alpha) times its own
        assert _close(mas.importance[k], (1 - alpha) * w), k
    # train mode: the BatchNorm running statistics moved with the pass, as Avalanche's
    assert torch.allclose(mas.model.backbone.bn.running_mean, snaps[0].backbone.bn.running_mean)
    mas.learn(t1)
    second = _avalanche_mas_by_hand(snaps[1], t1)
    for k in first:
        assert _close(mas.importance[k], alpha * (1 - alpha) * first[k] + (1 - alpha) * second[k]), k


def test_mas_avalanche_differs_from_the_paper_where_the_issue_says():
    """Plain vs squared norm, all outputs vs the seen classes', train vs eval mode, batch vs sample."""
    torch.manual_seed(3)
    paper, aval = (MAS(_context(), mas_variant=v) for v in ("paper", "avalanche"))
    aval.model.load_state_dict(paper.model.state_dict())
    t0 = _tasks()[0]
    paper.labels.add(t0)
    aval.labels.add(t0)
    a = aval.avalanche_importance(t0)
    p = paper.task_importance(t0)
    ratio = (a["head.weight"] / p["head.weight"].clamp(min=1e-12))
    assert (p["head.weight"][2:] == 0).all() and (a["head.weight"][2:] > 0).all()   # unseen outputs count in Avalanche's
    assert not torch.allclose(ratio[:2], torch.ones_like(ratio[:2]), rtol=0.05)


def test_mas_authors_code_variant_is_the_running_average_of_batch_gradients():
    """rahafaljundi/MAS MAS_Omega_update: omega <- (omega * b * n_b + |g_b|) / ((b + 1) * n_b) with g_b
    the gradient of MSELoss(sum) of the seen outputs against zeros, eval mode; 5 samples, batches
    2, 2, 1 (the last one weighs in by its own size)."""
    mas = MAS(_context(), mas_variant="aljundi-code")
    t0 = _tasks(n=5)[0]
    mas.labels.add(t0)
    model = copy.deepcopy(mas.model).eval()
    grads = []
    for x, _ in t0.batches():
        model.zero_grad()
        model(x)[:, [0, 1]].pow(2).sum().backward()
        grads.append({k: p.grad.abs().clone() for k, p in model.named_parameters()})
    got = mas.minibatch_importance(t0)
    for k in got:
        omega = grads[0][k] / 2
        omega = (omega * 2 + grads[1][k]) / 4
        omega = (omega * 2 * 1 + grads[2][k]) / 3
        assert _close(got[k], omega), k


# --- AFEC -----------------------------------------------------------------------------------------

def _afec_fisher_by_hand(model, exp, classes=None):
    """lywang3081/AFEC utils.fisher_matrix_diag: train mode, batches of 20 in order, 20 * grad^2 of the
    mean cross-entropy, divided by N."""
    model.train()
    x_all, y_all = exp.data.x, exp.data.y
    fisher = {k: torch.zeros_like(p) for k, p in model.named_parameters()}
    for i in range(0, len(y_all), 20):
        x, y = x_all[i:i + 20], y_all[i:i + 20]
        model.zero_grad()
        logits = model(x)
        if classes is not None:
            logits = logits.masked_fill(~torch.isin(torch.arange(logits.shape[1]), torch.tensor(classes)), -1e4)
        F.cross_entropy(logits, y).backward()
        for k, p in model.named_parameters():
            fisher[k] += 20 * p.grad.pow(2)
    return {k: f / len(y_all) for k, f in fisher.items()}


def test_afec_fisher_is_the_reference_minibatch_fisher():
    afec = AFEC(_context(batch_size=8))
    original_fit = afec.fit
    after_fit = []

    def fit(batches, *a, **kw):   # the main model right after its training, before the Fisher pass
        out = original_fit(batches, *a, **kw)
        after_fit.append(copy.deepcopy(afec.model))
        return out
    afec.fit = fit
    t0 = _tasks(n=26, batch_size=8)[0]       # Fisher batches of 20 and 6 (the 6 still weighed by 20)
    afec.learn(t0)
    expected = _afec_fisher_by_hand(after_fit[0], t0)
    for k, f in expected.items():
        assert _close(afec.fisher[k], f), k
    # train mode: the Fisher pass moved the BatchNorm running statistics, as the reference's
    assert torch.allclose(afec.model.backbone.bn.running_mean, after_fit[0].backbone.bn.running_mean)
    # the per-sample option is the mean of per-sample squared gradients in eval mode
    model = copy.deepcopy(after_fit[0]).eval()
    x, y = t0.data.x, t0.data.y
    per_sample = {k: torch.zeros_like(p) for k, p in model.named_parameters()}
    for i in range(len(y)):
        model.zero_grad()
        F.cross_entropy(model(x[i:i + 1]), y[i:i + 1]).backward()
        for k, p in model.named_parameters():
            per_sample[k] += p.grad.pow(2) / len(y)
    other = AFEC(_context(batch_size=8), afec_fisher="per-sample")
    other.model.load_state_dict(after_fit[0].state_dict())
    other.labels.add(t0)
    got = other.task_fisher(other.model, t0, other.labels.mask)
    for k in per_sample:
        assert _close(got[k], per_sample[k]), k
    assert not _close(got["head.weight"], expected["head.weight"], rtol=0.05)


def test_afec_expanded_fisher_is_the_reference_one_on_the_new_task_head():
    afec = AFEC(_context(batch_size=8))
    t0, t1 = _tasks(n=26, batch_size=8)
    afec.learn(t0)
    seen = []
    original = afec.task_fisher

    def spy(model, exp, mask):
        if model is afec.expanded:
            seen.append(copy.deepcopy(model))
        return original(model, exp, mask)
    afec.task_fisher = spy
    afec.learn(t1)
    expected = _afec_fisher_by_hand(seen[0], t1, classes=[2, 3])
    for k, f in expected.items():
        assert _close(afec.expanded_fisher[k], f), k


# --- Generative Replay ----------------------------------------------------------------------------

def test_generative_replay_vae_is_avalanche_mlpvae_and_vae_loss():
    gr = GenerativeReplay(_context(input_shape=(1, 2, 2)), latent_dim=3)
    vae = gr.generator
    kinds = [type(m).__name__ for m in vae.encoder] + ["|"] + [type(m).__name__ for m in vae.decoder]
    assert kinds == ["Flatten", "Linear", "BatchNorm1d", "LeakyReLU", "Linear", "BatchNorm1d", "ReLU", "|",
                     "Linear", "BatchNorm1d", "ReLU", "Linear", "BatchNorm1d", "ReLU", "Linear", "BatchNorm1d",
                     "ReLU", "Linear", "Sigmoid"]
    assert [m.out_features for m in vae.decoder if isinstance(m, nn.Linear)] == [64, 128, 256, 4]
    assert vae.mean.out_features == vae.logvar.out_features == 3
    # VAE_loss on MlpVAE.forward: sum ||x^ - x||^2 + 1/2 sum (-1 - logvar + e^logvar + mu^2), sigma = 0.5 e^logvar
    x = torch.randn(5, 1, 2, 2, generator=torch.Generator().manual_seed(0))
    vae.train()
    got = vae.loss(x, torch.Generator().manual_seed(7))
    h = vae.encoder(x)
    mu, logvar = vae.mean(h), vae.logvar(h)
    eps = torch.randn(mu.shape, generator=torch.Generator().manual_seed(7))
    xhat = (vae.decoder(mu + eps * 0.5 * torch.exp(logvar)).view(5, 1, 2, 2) - 0.1307) / 0.3081
    expected = ((xhat - x) ** 2).sum() + 0.5 * torch.sum(-1 - logvar + torch.exp(logvar) + mu ** 2)
    assert got.item() == pytest.approx(expected.item(), rel=1e-5)
    vae.eval()
    out = vae.generate(50, torch.Generator().manual_seed(1))
    assert out.min() >= (0 - 0.1307) / 0.3081 - 1e-6 and out.max() <= (1 - 0.1307) / 0.3081 + 1e-6


def test_generative_replay_generator_trains_after_the_solver_with_adam_001():
    """One generator step (2 samples, batch 2, generator_epochs 1) is Adam(lr, weight_decay) on the
    summed VAE loss, taken after the solver's steps; generator_lr is that lr."""
    for lr in (1e-2, 1e-3):
        ctx = _context(input_shape=(2,))
        gr = GenerativeReplay(ctx, generator_epochs=1, generator_lr=lr)
        vae = copy.deepcopy(gr.generator)
        exp = _tasks(n=2)[0]
        gr.learn(exp)
        opt = torch.optim.Adam(vae.parameters(), lr=lr, weight_decay=1e-4)
        vae.train()
        x = exp.data.x
        h = vae.encoder(x)
        mu, logvar = vae.mean(h), vae.logvar(h)
        eps = torch.randn(mu.shape, generator=torch.Generator().manual_seed(ctx.seed))
        xhat = (vae.decoder(mu + eps * 0.5 * torch.exp(logvar)).view(2, 2) - 0.1307) / 0.3081
        loss = ((xhat - x) ** 2).sum() + 0.5 * torch.sum(-1 - logvar + torch.exp(logvar) + mu ** 2)
        opt.zero_grad()
        loss.backward()
        opt.step()
        for (k, p), q in zip(gr.generator.named_parameters(), vae.parameters()):
            assert _close(p, q, rtol=1e-5, atol=1e-6), (lr, k)


def test_generative_replay_schedule_and_replay_sizes():
    """Solver: its epochs, each minibatch + replay_size samples of G' from the second task; then the
    generator: generator_epochs epochs of the same minibatches, + replay_size samples of G' too."""
    gr = GenerativeReplay(_context(input_shape=(2,), epochs=2), replay_size=5, generator_epochs=3)
    calls = []
    solver_loss, gen_loss = gr.loss, gr.generator.loss
    gr.loss = lambda x, y: calls.append(("solver", len(x))) or solver_loss(x, y)
    gr.generator.loss = lambda x, g=None: calls.append(("generator", len(x))) or gen_loss(x, g)
    t0, t1 = _tasks()
    gr.learn(t0)
    assert calls == [("solver", 2)] * 4 + [("generator", 2)] * 6
    calls.clear()
    gr.learn(t1)
    assert calls == [("solver", 7)] * 4 + [("generator", 7)] * 6


def test_generative_replay_labels_are_the_previous_solvers_argmax_over_all_outputs():
    gr = GenerativeReplay(_context(input_shape=(2,)), replay_size=16, generator_epochs=1)
    t0, t1 = _tasks()
    gr.learn(t0)
    gr.previous_generator = copy.deepcopy(gr.generator).eval()
    gr.previous_solver = copy.deepcopy(gr.model).eval()
    gr.previous_classes = [0, 1]
    with torch.no_grad():
        gr.previous_solver.head.bias[3] = 100.0   # an unseen class wins everywhere
    x, y = gr.replay(16)
    assert (y == 3).all()
    gr.hp["replay_labels"] = "seen"
    x, y = gr.replay(16)
    assert set(y.tolist()) <= {0, 1}
    assert torch.equal(y, gr.previous_solver(x)[:, :2].argmax(1))


def test_generative_replay_defaults_are_the_m2i_authors():
    hp = GenerativeReplay.hparams
    assert (hp["replay_size"].default, hp["latent_dim"].default, hp["generator_lr"].default,
            hp["generator_weight_decay"].default, hp["generator_epochs"].default,
            hp["replay_labels"].default) == (200, 16, 0.01, 1e-4, 16, "all")
    assert not math.isnan(hp["generator_lr"].default)
