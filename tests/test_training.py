"""clharness.toolkit.training.make_optimizer: every optimizer applies the hyperparameters it is given."""
import pytest
import torch

from clharness.toolkit.training import make_optimizer


@pytest.mark.parametrize("name, expected", [
    ("sgd", 1 - 0.1 * 0.5),     # coupled L2: p <- p - lr (g + wd p), g = 0
    ("adam", 1 - 0.1),          # coupled L2 through Adam: the first step moves by lr in the gradient's sign
    ("adamw", 1 - 0.1 * 0.5),   # decoupled: p <- p (1 - lr wd); a zero gradient adds no Adam step
])
def test_weight_decay_shrinks_weights_under_a_zero_gradient(name, expected):
    p = torch.nn.Parameter(torch.ones(3))
    opt = make_optimizer([p], name, lr=0.1, weight_decay=0.5)
    assert opt.param_groups[0]["weight_decay"] == 0.5 and opt.param_groups[0]["lr"] == 0.1
    p.grad = torch.zeros(3)
    opt.step()
    torch.testing.assert_close(p.detach(), torch.full((3,), expected))


def test_sgd_momentum_accumulates_and_frozen_parameters_are_left_out():
    p, frozen = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1), requires_grad=False)
    opt = make_optimizer([p, frozen], "sgd", lr=1.0, momentum=0.9)
    assert [q for g in opt.param_groups for q in g["params"]] == [p]
    for _ in range(2):
        p.grad = torch.ones(1)
        opt.step()
    torch.testing.assert_close(p.detach(), torch.tensor([-(1 + 1.9)]))   # buffers 1, then 0.9 * 1 + 1


def test_unknown_optimizer_names_the_choices():
    with pytest.raises(ValueError, match="unknown optimizer 'rmsprop'; choose sgd, adam or adamw"):
        make_optimizer([torch.nn.Parameter(torch.zeros(1))], "rmsprop")


def test_eval_mode_reaches_a_submodule_left_in_training_mode_and_skips_a_model_already_in_eval():
    from clharness.toolkit.training import eval_mode
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    model.eval()
    model[1].train()               # a method switched one part back, the root still says eval
    eval_mode(model)
    assert not any(m.training for m in model.modules())
    x = torch.randn(8, 3)
    with torch.no_grad():
        model(x)
    assert torch.equal(model[1].running_mean, torch.zeros(3))   # in training mode the batch would move it

    calls = []
    model.train = lambda mode=True: calls.append(mode)   # already all in eval: nothing to walk
    eval_mode(model)
    assert calls == []
