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


# --- the run meter: what the runner counts in every record -----------------------------------------
import threading

import pytest
from torch.utils.flop_counter import FlopCounterMode

import clharness as clh
from clharness.engine import flops
from clharness.engine.runner import Case, run_case, set_cpu_threads
from clharness.engine.suites import ScenarioSpec


def _torch_count(fn) -> int:
    with FlopCounterMode(display=False) as mode:
        fn()
    return mode.get_total_flops()


def _meter_count(fn) -> int:
    with flops.RunMeter() as meter:
        fn()
    return meter.total_flops


class _Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.out = torch.nn.Linear(16, 48), torch.nn.Linear(16, 16)

    def forward(self, x):
        q, k, v = self.qkv(x).view(x.shape[0], x.shape[1], 3, 2, 8).permute(2, 0, 3, 1, 4)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return self.out(a.transpose(1, 2).flatten(2)).mean(1)


def _cases(device="cpu"):
    torch.manual_seed(0)
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                               torch.nn.Flatten(), torch.nn.Linear(4 * 8 * 8, 5)).to(device)
    attn, mlp = _Attention().to(device), _mlp().to(device)
    x_img, x_seq = torch.randn(6, 3, 8, 8, device=device), torch.randn(6, 5, 16, device=device)
    y, x = torch.tensor([0, 1, 2, 3, 4, 0], device=device), torch.randn(6, 4, device=device)
    ce = torch.nn.functional.cross_entropy

    def inference():
        with torch.inference_mode():   # composite ops reach the mode undecomposed here
            conv(x_img), attn(x_seq)
    return {"mlp train": lambda: ce(mlp(x), y % 3).backward(),
            "conv train": lambda: ce(conv(x_img), y).backward(),
            "attention train": lambda: ce(attn(x_seq)[:, :5], y).backward(),
            "inference mode": inference}


# fused attention on CPU, which torch's counter leaves at 0 (b=6 sequences, h=2 heads, s=5 tokens, d=8):
# forward Q K^T and A V, 2*b*h*s*s*d each; backward as torch's formula for the CUDA kernels (Q K^T
# recomputed, then the gradients of A, V, Q and K): five such products
_BHSSD = 2 * 6 * 2 * 5 * 5 * 8                         # 4800
_CPU_ATTENTION = {"mlp train": 0, "conv train": 0, "attention train": 2 * _BHSSD + 5 * _BHSSD,
                  "inference mode": 2 * _BHSSD}


@pytest.mark.parametrize("name", list(_cases()))
def test_the_run_meter_counts_what_torchs_flop_counter_counts(name):
    """Equal to torch's FlopCounterMode, plus CPU attention, which the meter counts as CUDA's is counted."""
    fn = _cases()[name]
    expected = _torch_count(fn)
    assert expected > 0 and _meter_count(fn) == expected + _CPU_ATTENTION[name]


def test_evaluating_splits_eval_from_train_and_nests():
    model, x = _mlp(), torch.randn(5, 4)
    fwd = 2 * 5 * (4 * 8 + 8 * 3)        # 560, as above
    with flops.RunMeter() as meter:
        model(x)                          # training work
        with flops.evaluating():
            model(x)
            with flops.evaluating():      # an accuracy inside an evaluation: counted once
                model(x)
            assert meter.eval_flops == 2 * fwd   # read while evaluating
        model(x)
    assert (meter.train_flops, meter.eval_flops) == (2 * fwd, 2 * fwd)
    with flops.evaluating():              # no meter: nothing to do
        model(x)


def test_the_meter_sees_only_its_own_thread():
    model = _mlp()
    with flops.RunMeter() as meter:
        t = threading.Thread(target=lambda: model(torch.randn(5, 4)))
        t.start()
        t.join()
    assert meter.total_flops == 0


# a record of an MLP finetune run, counted by hand: digits (64 inputs), hidden 32, 10 classes
_IN, _H, _C = 64, 32, 10
_FWD = 2 * (_IN * _H + _H * _C)                       # per sample: 2*in*out per linear
# backward: weight gradients of both linears, the input gradient of the second only (the first layer's
# input needs none), each 2*in*out per sample (test_mlp_train_step_counts_forward_and_backward)
_TRAIN = _FWD + 2 * _IN * _H + 2 * (2 * _H * _C)
_TRAIN_N, _TEST_N, _TASKS, _EPOCHS, _BATCH = 1257, 540, 5, 2, 32


def _finetune_record(threads: int = 1):
    spec = ScenarioSpec(name="s", dataset="digits", tasks=_TASKS, epochs=_EPOCHS, backbone="mlp",
                        batch_size=_BATCH, backbone_options={"hidden": _H, "layers": 1})
    set_cpu_threads(threads)
    try:
        return run_case(Case("t", spec, "finetune", 0), clh.Harness(), torch.device("cpu"))
    finally:
        set_cpu_threads(1)


def test_a_finetune_record_holds_its_hand_computed_flops():
    record = _finetune_record()
    assert record.status == "passed", record.message
    # training: every train sample, every epoch, one forward + backward
    assert record.train_gflops == _EPOCHS * _TRAIN_N * _TRAIN / 1e9 == 0.025421568
    # evaluation: the dry predict on a first batch (engine.contract_check), then all test data after each task
    assert record.eval_gflops == (_BATCH + _TASKS * _TEST_N) * _FWD / 1e9


def test_the_same_run_counts_the_same_flops_under_one_and_two_threads():
    one, two = _finetune_record(1), _finetune_record(2)
    assert two.cpu_threads == 2 and one.cpu_threads == 1
    assert (one.train_gflops, one.eval_gflops) == (two.train_gflops, two.eval_gflops)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here: CPU vs CUDA FLOPs need a GPU")
def test_cpu_and_cuda_count_the_same_flops():
    spec = ScenarioSpec(name="s", dataset="digits", tasks=_TASKS, epochs=1, backbone="mlp",
                        backbone_options={"hidden": _H, "layers": 1})
    cpu = run_case(Case("t", spec, "er", 0), clh.Harness(), torch.device("cpu"))
    cuda = run_case(Case("t", spec, "er", 0), clh.Harness(), torch.device("cuda"))
    assert cpu.status == cuda.status == "passed"
    assert (cpu.train_gflops, cpu.eval_gflops) == (cuda.train_gflops, cuda.eval_gflops)
    on_cpu, on_cuda = _cases("cpu"), _cases("cuda")   # a conv net and fused attention too
    for name in on_cpu:
        assert _meter_count(on_cpu[name]) == _meter_count(on_cuda[name]), name


def test_features_another_run_cached_are_charged_as_if_this_run_computed_them():
    """The shared feature cache (toolkit.feature_cache) serves a frozen backbone's features across runs of
    one process; a run's FLOPs must not depend on what ran before it (serial vs -n vs Ray)."""
    from pathlib import Path
    from clharness.engine.suites import load_suite
    from clharness.toolkit import feature_cache
    spec = load_suite(Path(__file__).parent.parent / "suites" / "ptm-mini.toml").scenarios[0]
    harness = clh.Harness()
    feature_cache.clear_shared()
    alone = run_case(Case("ptm", spec, "simplecil", 0), harness, torch.device("cpu"))
    table = feature_cache.shared_tables()[-1]
    computed = table.images
    again = run_case(Case("ptm", spec, "simplecil", 0), harness, torch.device("cpu"))
    assert alone.status == again.status == "passed"
    assert table.images == computed > 0          # the second run computed no feature: all from the cache
    assert alone.train_gflops > 0 and alone.eval_gflops > 0
    assert (again.train_gflops, again.eval_gflops) == (alone.train_gflops, alone.eval_gflops)
    feature_cache.clear_shared()


def test_the_meters_step_aside_for_a_built_in_optimizer_but_count_a_closure_and_a_custom_step():
    """Built-in updates are elementwise (nothing to count) and skipped for speed; LBFGS's closure runs
    forward and backward inside step(), and an optimizer defined elsewhere may multiply matrices:
    both stay counted. 2*4*3 = 24 FLOPs a forward of Linear(3, 4) on one sample (no bias term counted)."""
    import torch.utils._python_dispatch as pd

    from clharness.engine.flops import RunMeter

    lin = torch.nn.Linear(3, 4, bias=False)
    x = torch.ones(1, 3)

    class Projecting(torch.optim.SGD):          # a step that multiplies matrices
        def step(self, closure=None):
            with torch.no_grad():
                lin.weight.copy_(lin.weight @ torch.eye(3))
            return super().step(closure)

    Projecting.__module__ = "my_plugin.optim"
    with RunMeter() as meter:
        torch.optim.Adam(lin.parameters()).step()
    assert meter.total_flops == 0
    with RunMeter() as meter:
        Projecting(lin.parameters(), lr=0.1).step()
    assert meter.total_flops == 2 * 4 * 3 * 3                # (4x3) @ (3x3)
    opt = torch.optim.LBFGS(lin.parameters(), max_iter=1)

    def closure():
        opt.zero_grad()
        loss = lin(x).sum()
        loss.backward()
        return loss

    with RunMeter() as meter:
        opt.step(closure)
    assert meter.total_flops >= 24                           # the closure's forward at least

    class Failing(torch.optim.SGD):
        def step(self, closure=None):
            raise RuntimeError("boom")

    Failing.__module__ = "torch.optim.failing"               # paused like a built-in, then it raises
    with pytest.raises(RuntimeError):
        with RunMeter() as meter:
            Failing(lin.parameters(), lr=0.1).step()
    assert pd._get_current_dispatch_mode_stack() == []      # the meter left no mode behind
    with RunMeter() as meter:
        lin(x)
    assert meter.total_flops == 24
