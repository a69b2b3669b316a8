"""FLOP counting (issue 41 item 1): hand-computed counts for an MLP step, shape ledger, threads."""
import torch

from clharness.engine.flops import StepLedger, eval_step_flops, train_step_flops


def _mlp(inp=4, hidden=8, out=3):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(inp, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, out))


def test_mlp_eval_step_is_two_in_out_per_sample_per_linear():
    # forward of Linear(in, out) on a batch of b: b*in*out multiply-adds = 2*b*in*out FLOPs
    b = 5
    assert eval_step_flops(_mlp(), torch.randn(b, 4)) == 2 * b * (4 * 8 + 8 * 3)  # 560


def test_mlp_train_step_counts_forward_and_backward():
    b = 5
    fwd = 2 * b * (4 * 8 + 8 * 3)          # 560
    # backward: the weight gradient of each linear costs as much as its forward (2*b*in*out);
    # the input gradient too, except for the first layer, whose input needs no gradient
    bwd = 2 * b * 4 * 8 + 2 * (2 * b * 8 * 3)  # 320 + 480 = 800
    model = _mlp()
    got = train_step_flops(model, torch.nn.functional.cross_entropy, torch.randn(b, 4),
                           torch.tensor([0, 1, 2, 0, 1]))
    assert got == fwd + bwd == 1360
    assert all(p.grad is None for p in model.parameters())  # counting leaves no gradients behind


def test_ledger_measures_each_shape_once_and_multiplies():
    calls = []

    def measure(v):
        def m():
            calls.append(v)
            return v
        return m

    ledger = StepLedger()
    for key, v in [((32, 4), 100), ((32, 4), 100), ((7, 4), 30), ((32, 4), 100)]:
        ledger.record(key, measure(v))
    assert calls == [100, 30]                 # each distinct shape measured once
    assert ledger.total_flops == 3 * 100 + 30
    assert ledger.gflops == 330 / 1e9


def test_count_is_the_same_under_one_and_two_threads():
    before = torch.get_num_threads()
    try:
        counts = []
        for n in (1, 2):
            torch.set_num_threads(n)
            counts.append(train_step_flops(_mlp(), torch.nn.functional.cross_entropy,
                                           torch.randn(6, 4), torch.tensor([0, 1, 2, 0, 1, 2])))
        assert counts[0] == counts[1] == 2 * 6 * 56 + 2 * 6 * 32 + 4 * 6 * 24
    finally:
        torch.set_num_threads(before)
