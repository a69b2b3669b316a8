"""Issue 40 item 4: EWC's separate-mode penalty as one autograd node (methods/ewc.py, _SeparatePenalty) is
autograd's own arithmetic bit for bit: the same losses, gradients and weights over Adam steps as the graph of
anchored_penalty (FUSED_PENALTY = False), with several finished tasks and a Fisher that skips a parameter; and
the FLOP meter sees none of its ops."""
import pytest
import torch
import torch.nn.functional as F

import clharness_methods.ewc as ewc_module
from clharness.engine import flops
from clharness.toolkit.training import anchored_penalty


class _Holder:   # what separate_penalty reads of the method
    pass


def _steps(fused: bool, monkeypatch, steps: int = 4, tasks: int = 3):
    monkeypatch.setattr(ewc_module, "FUSED_PENALTY", fused)
    torch.manual_seed(0)
    method = _Holder()
    method.model = torch.nn.Sequential(torch.nn.Linear(20, 16), torch.nn.ReLU(), torch.nn.Linear(16, 5))
    g = torch.Generator().manual_seed(1)
    named = dict(method.model.named_parameters())
    method.task_fishers = [{k: torch.rand(p.shape, generator=g) * 10 for k, p in named.items() if k != "0.bias"}
                           for _ in range(tasks)]
    method.task_anchors = [{k: p.detach() + torch.randn(p.shape, generator=g) for k, p in named.items()}
                           for _ in range(tasks)]
    opt = torch.optim.Adam(method.model.parameters(), lr=1e-2)
    out = []
    for _ in range(steps):
        x, y = torch.randn(32, 20, generator=g), torch.randint(5, (32,), generator=g)
        loss = F.cross_entropy(method.model(x), y) + 50.0 * ewc_module.EWC.separate_penalty(method)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        out.append((loss.detach(), [p.grad.clone() for p in method.model.parameters()]))
        opt.step()
    return out, [p.detach().clone() for p in method.model.parameters()]


@pytest.mark.parametrize("tasks", [1, 3])
def test_the_fused_penalty_is_autograds_arithmetic_bit_for_bit(monkeypatch, tasks):
    (graph, w_graph), (fused, w_fused) = _steps(False, monkeypatch, tasks=tasks), _steps(True, monkeypatch, tasks=tasks)
    for (l_g, g_g), (l_f, g_f) in zip(graph, fused):
        assert torch.equal(l_g, l_f)
        assert all(torch.equal(a, b) for a, b in zip(g_g, g_f))
    assert all(torch.equal(a, b) for a, b in zip(w_graph, w_fused))


def test_the_fused_penalty_value_is_the_sum_of_the_tasks_penalties(monkeypatch):
    monkeypatch.setattr(ewc_module, "FUSED_PENALTY", True)
    method = _Holder()
    method.model = torch.nn.Linear(2, 1)
    with torch.no_grad():
        method.model.weight.copy_(torch.tensor([[1.0, 2.0]]))
        method.model.bias.fill_(3.0)
    # task 1: F = 1 everywhere, anchor 0: 1 + 4 + 9 = 14; task 2: F = (2, 0) on the weight only, anchor 1: 2*0 + 0
    method.task_fishers = [{"weight": torch.ones(1, 2), "bias": torch.ones(1)}, {"weight": torch.tensor([[2.0, 0.0]])}]
    method.task_anchors = [{"weight": torch.zeros(1, 2), "bias": torch.zeros(1)}, {"weight": torch.ones(1, 2)}]
    with flops.RunMeter() as meter:
        penalty = ewc_module.EWC.separate_penalty(method)
        penalty.backward()
    assert penalty.item() == 14.0 + 0.0
    # d/dw: task 1: 2 (w - 0) = (2, 4); task 2: 2 F (w - 1) = (0, 0); d/db: 2 (b - 0) = 6
    assert method.model.weight.grad.tolist() == [[2.0, 4.0]] and method.model.bias.grad.tolist() == [6.0]
    assert meter.total_flops == 0
    reference = sum(anchored_penalty(method.model, f, a) for f, a in zip(method.task_fishers, method.task_anchors))
    assert torch.equal(penalty.detach(), reference.detach())


def _one_backward(method, fused, monkeypatch, scale=50.0):
    monkeypatch.setattr(ewc_module, "FUSED_PENALTY", fused)
    method.model.zero_grad(set_to_none=True)
    (scale * ewc_module.EWC.separate_penalty(method)).backward()
    return [p.grad.clone() for p in method.model.parameters()]


def test_the_kept_doubled_scale_follows_the_loss_scale_and_an_in_place_change_and_falls_back_on_overflow(monkeypatch):
    """The backward keeps 2 g F per Fisher tensor: a new loss scale g, a Fisher changed in place, and a 2 g F
    that overflows where g F does not (3e38 * 1: autograd's (g F) * (2 d) stays finite for |d| < 0.5) all give
    autograd's gradients."""
    method = _Holder()
    method.model = torch.nn.Linear(3, 2)
    g = torch.Generator().manual_seed(3)
    fisher = {k: torch.rand(p.shape, generator=g) for k, p in method.model.named_parameters()}
    method.task_fishers = [fisher]
    method.task_anchors = [{k: p.detach() + 0.1 * torch.randn(p.shape, generator=g)
                            for k, p in method.model.named_parameters()}]
    for scale in (50.0, 50.0, 7.0):   # the second reuses the kept 2 g F, the third must not
        assert all(torch.equal(a, b) for a, b in zip(_one_backward(method, True, monkeypatch, scale),
                                                     _one_backward(method, False, monkeypatch, scale)))
    fisher["weight"].mul_(3.0)        # in place: the kept value is stale
    assert all(torch.equal(a, b) for a, b in zip(_one_backward(method, True, monkeypatch, 7.0),
                                                 _one_backward(method, False, monkeypatch, 7.0)))
    fisher["bias"].fill_(3e38)        # 2 g F overflows at g = 1, g F does not
    fused, graph = _one_backward(method, True, monkeypatch, 1.0), _one_backward(method, False, monkeypatch, 1.0)
    assert torch.isfinite(graph[1]).all() and all(torch.equal(a, b) for a, b in zip(fused, graph))
