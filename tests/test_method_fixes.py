"""Fixes to reference methods after a review against their reference code (issue 16): SI under
mixed precision, GMED's edit sign, CBRS's "full" classes, GDumb's sampling order, EWC's separate
mode. Each test fails on the code before its fix."""
import importlib
import warnings

import pytest
import torch

import clharness as clh
from clharness.toolkit.backbones import MLP
from clharness.data.base import ArrayDataset, TensorData
from clharness.toolkit.training import Trainer
from test_methods_reference import METHODS, context, digits, split  # noqa: F401  (digits: fixture)


# --- SI: steps the AMP scaler skips add nothing to the path integral ---------------------------

class _Overflow(torch.autograd.Function):
    """Identity forward; backward multiplies the gradient by inf, as an fp16 overflow does."""

    @staticmethod
    def forward(ctx, loss):
        return loss.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * float("inf")


class _ScaledTrainer(Trainer):
    """The AMP path of Trainer on CPU with a real GradScaler; every third backward pass overflows
    (inf gradients), so the scaler skips that step (weights unmoved) and lowers its scale, as fp16
    training on a GPU does."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.amp = True
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
        self.skipped = 0

    def step(self, loss_fn, *args):
        overflow = self.steps % 3 == 0
        loss = super().step(lambda *a: _Overflow.apply(loss_fn(*a)) if overflow else loss_fn(*a), *args)
        self.skipped += not self.step_taken()
        return loss


def test_trainer_reports_skipped_amp_steps():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    ctx = clh.Context(clh.Setting.CLASS_IL, 3, (4,))
    trainer = _ScaledTrainer("probe", torch.optim.SGD(model.parameters(), lr=0.1), ctx)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    before = model.weight.detach().clone()
    with pytest.warns(UserWarning):   # autocast("cuda") on a CPU-only machine is disabled, with a warning
        trainer.step(lambda a, b: torch.nn.functional.cross_entropy(model(a), b), x, y)
        assert not trainer.step_taken() and torch.equal(model.weight, before)   # step 0 overflows
        trainer.step(lambda a, b: torch.nn.functional.cross_entropy(model(a), b), x, y)
    assert trainer.step_taken() and not torch.equal(model.weight, before)
    assert Trainer("probe", torch.optim.SGD(model.parameters(), lr=0.1), ctx).step_taken()   # no AMP


def _si_after_two_tasks(digits, monkeypatch, trainer_cls):  # noqa: F811
    si_module = importlib.import_module("clharness_methods.si")
    made, make = [], Trainer.for_method.__func__

    def for_method(method, params=None, **overrides):
        trainer = make(trainer_cls, method, params, **overrides)
        made.append(trainer)
        return trainer
    monkeypatch.setattr(si_module.Trainer, "for_method", for_method)
    tasks, exps, _ = split(digits, 0)
    torch.manual_seed(0)
    si = METHODS["si"](context(0, tasks=tasks, epochs=1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")    # autocast("cuda") disabled on a CPU-only machine
        si.learn(exps[0])
        si.learn(exps[1])
    return si, made


def test_si_path_integral_ignores_steps_the_scaler_skipped(digits, monkeypatch):  # noqa: F811
    si, trainers = _si_after_two_tasks(digits, monkeypatch, _ScaledTrainer)
    assert trainers[0].skipped == -(-trainers[0].steps // 3)   # every third step overflowed
    for k, w in si.omega_total.items():
        assert torch.isfinite(w).all(), k
        assert torch.isfinite(si.last_omega[k]).all(), k
    assert sum(float(w.sum()) for w in si.omega_total.values()) > 0


# --- GMED: the edit ascends d + beta * loss ------------------------------------------------------

def test_gmed_edit_ascends_the_memory_loss_with_positive_beta(monkeypatch):
    """With the virtual step a no-op (theta' = theta), d = 0 and the edit is exactly
    x_m + alpha * beta * grad_x l(x_m): the memory example's own loss must go up."""
    gmed_module = importlib.import_module("clharness_methods.gmed")
    monkeypatch.setattr(gmed_module, "virtual_step",
                        lambda model, loss, lr: {k: p.detach() for k, p in model.named_parameters()})
    torch.manual_seed(0)
    ctx = clh.Context(clh.Setting.CLASS_IL, 3, (1, 2, 2), memory_size=4,
                      backbone_factory=lambda: MLP((1, 2, 2)))
    gmed = METHODS["gmed"](ctx, edit_stride=0.5, reg_strength=2.0)
    gmed.labels.seen = [0, 1, 2]
    x, y = torch.randn(4, 1, 2, 2), torch.tensor([0, 1, 2, 0])
    mx, my = torch.randn(3, 1, 2, 2), torch.tensor([1, 2, 0])
    edited = gmed.edit(x, y, mx, my, torch.zeros(3))
    probe = mx.clone().requires_grad_(True)
    loss = torch.nn.functional.cross_entropy(gmed.model(probe), my)
    grad, = torch.autograd.grad(loss, probe)
    torch.testing.assert_close(edited, mx + 0.5 * 2.0 * grad)
    with torch.no_grad():
        assert torch.nn.functional.cross_entropy(gmed.model(edited), my) > loss


# --- CBRS: a class is full if it is or ever was the largest ------------------------------------

def _offer(buffer, labels):
    for c in labels:
        buffer.add(torch.zeros(1, 1), torch.tensor([c]))


def test_cbrs_class_that_was_largest_stays_full():
    """Capacity 4, stream A A B B | C C | A x 20. After C C the memory holds A:1 B:1 C:2; A and B
    were largest when the memory filled, so A's later instances only replace A's own slot
    (reservoir within the class) and never take C's: A keeps 1 slot. The 'currently largest' rule
    would let A (1 < 2) evict a C instance."""
    cbrs = METHODS["cbrs"](clh.Context(clh.Setting.ONLINE, 4, (1,), memory_size=4,
                                       backbone_factory=lambda: MLP((1,))))
    buffer = cbrs.buffer
    _offer(buffer, [0, 0, 1, 1, 2, 2])
    assert buffer.class_counts() == {0: 1, 1: 1, 2: 2}
    _offer(buffer, [0] * 20)
    assert buffer.class_counts() == {0: 1, 1: 1, 2: 2}
    assert buffer.full == {0, 1, 2}
    _offer(buffer, [3])            # a new class is not full: it takes a slot from the largest (C)
    assert buffer.class_counts() == {0: 1, 1: 1, 2: 1, 3: 1}


# --- GDumb: offline tasks feed the sampler in a seeded random order ------------------------------

def _gdumb_memory_indices(experience_seed):
    """GDumb (memory 20) after one task of 60 class-0 then 60 class-1 images in folder order; each
    image's single pixel is its file index. Returns the memory's file indices per class."""
    images = torch.arange(120, dtype=torch.uint8).view(120, 1, 1, 1)
    labels = torch.tensor([0] * 60 + [1] * 60)
    data = TensorData(ArrayDataset(images, labels, ["a", "b"]), [0.0], [1.0])
    ctx = clh.Context(clh.Setting.CLASS_IL, 2, (1, 1, 1), epochs=1, memory_size=20,
                      backbone_factory=lambda: MLP((1, 1, 1)))
    gdumb = METHODS["gdumb"](ctx)
    gdumb.learn(clh.Experience(data, (0, 1), None, 16, experience_seed))
    x, y = gdumb.memory.tensors()
    index = (x.flatten() * 255).round().long()
    return {c: sorted(index[y == c].tolist()) for c in (0, 1)}


def test_gdumb_offline_memory_is_not_the_first_files_of_a_class():
    kept = _gdumb_memory_indices(experience_seed=3)
    assert [len(v) for v in kept.values()] == [10, 10]
    # Folder order would fill the memory with files 0..19 of class 0 and keep 10 of those.
    assert max(kept[0]) >= 30, kept[0]
    assert kept == _gdumb_memory_indices(experience_seed=3)          # seeded: reproducible
    assert kept != _gdumb_memory_indices(experience_seed=4)


# --- EWC: separate mode, one penalty per task ------------------------------------------------

def test_ewc_separate_mode_keeps_one_anchor_and_fisher_per_task(digits):  # noqa: F811
    tasks, exps, _ = split(digits, 0)
    torch.manual_seed(0)
    ewc = METHODS["ewc"](context(0, tasks=tasks, epochs=1), ewc_mode="separate", ewc_lambda=100.0)
    after = []
    for exp in exps[:3]:
        ewc.learn(exp)
        after.append({k: p.detach().clone() for k, p in ewc.model.named_parameters()})
    assert len(ewc.task_anchors) == len(ewc.task_fishers) == 3 and not ewc.fisher
    for anchor, weights in zip(ewc.task_anchors, after):
        assert all(torch.equal(anchor[k], weights[k]) for k in anchor)
    assert not torch.equal(ewc.task_fishers[0]["head.weight"], ewc.task_fishers[1]["head.weight"])
    # the penalty at perturbed weights is the sum of the three tasks' own quadratic terms
    with torch.no_grad():
        for p in ewc.model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    params = {k: p.detach() for k, p in ewc.model.named_parameters()}
    by_hand = sum(float((f[k] * (params[k] - a[k]) ** 2).sum())
                  for f, a in zip(ewc.task_fishers, ewc.task_anchors) for k in f)
    assert by_hand > 0
    assert float(ewc.separate_penalty()) == pytest.approx(by_hand, rel=1e-5)
    x, y = next(iter(exps[3].batches()))
    ce = torch.nn.functional.cross_entropy(ewc.model(x), y)
    assert float(ewc.loss(x, y)) == pytest.approx(float(ce) + 100.0 / 2 * by_hand, rel=1e-5)
    assert ewc.memory_report().tensor_elements == 6 * sum(p.numel() for p in ewc.model.parameters())


def test_ewc_default_mode_accumulates_one_fisher():
    """The default (accumulated) mode is unchanged: one summed Fisher and one anchor."""
    torch.manual_seed(0)
    ctx = clh.Context(clh.Setting.CLASS_IL, 2, (1, 1, 1), backbone_factory=lambda: MLP((1, 1, 1)))
    ewc = METHODS["ewc"](ctx)
    assert ewc.hp["ewc_mode"] == "accumulated"
    images = torch.arange(0, 200, 10, dtype=torch.uint8).view(20, 1, 1, 1)
    data = TensorData(ArrayDataset(images, torch.tensor([0, 1] * 10), ["a", "b"]), [0.5], [0.3])
    exp = clh.Experience(data, (0, 1), None, 8, 0)
    ewc.learn(exp)
    first = {k: f.clone() for k, f in ewc.fisher.items()}
    ewc.learn(exp)
    second = ewc.task_fisher(exp)
    assert not ewc.task_fishers and set(ewc.fisher) == set(first)
    for k in first:
        torch.testing.assert_close(ewc.fisher[k], first[k] + second[k])
