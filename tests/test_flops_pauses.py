"""Issue 40 item 4: the FLOP meter steps aside around harness code that counts nothing
(``toolkit.metering.uncounted``: the data layer's batches and normalisation, a recipe's views, a buffer's
placement and sampling). A pause must hide no counted op: under ``PAUSES = "check"`` the regions run metered
and raise if one counted anything; real runs (data, buffers, recipes, EWC's Fisher pass) count the same
FLOPs, bit for bit, with the pauses on, off and checked."""
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import clharness as clh
from clharness.engine import flops
from clharness.engine.runner import Case, run_case
from clharness.engine.suites import ScenarioSpec
from clharness.toolkit import metering
from clharness.toolkit.buffers import ClassBalancedBuffer
from clharness.toolkit.metering import uncounted

A, B = torch.randn(3, 4), torch.randn(4, 5)
MM = 2 * 3 * 4 * 5   # FLOPs of A @ B


@pytest.fixture
def pauses(monkeypatch):
    def set_to(value):
        monkeypatch.setattr(metering, "PAUSES", value)
    return set_to


def test_a_pause_steps_the_meter_aside_and_it_counts_again_after():
    with flops.RunMeter() as meter:
        with uncounted("test"):
            A @ B
        assert meter.total_flops == 0
        A @ B
    assert meter.total_flops == MM


def test_a_counted_op_inside_a_checked_pause_raises_and_names_the_region(pauses):
    pauses("check")
    with flops.RunMeter() as meter:
        with uncounted("a region with a matmul"):
            A.abs()                     # no formula: fine
        with pytest.raises(RuntimeError, match="a region with a matmul"):
            with uncounted("a region with a matmul"):
                A @ B
    assert meter.total_flops == MM      # checked regions are metered


def test_with_the_pauses_off_a_region_is_metered(pauses):
    pauses("off")
    with flops.RunMeter() as meter, uncounted("test"):
        A @ B
    assert meter.total_flops == MM


def test_no_pause_under_another_dispatch_mode_nor_without_a_meter():
    with flops.RunMeter() as meter, FlopCounterMode(display=False) as torch_counter:
        with uncounted("test"):         # torch's counter is active too: it must see every op, so no pause
            A @ B
    assert meter.total_flops == torch_counter.get_total_flops() == MM
    with uncounted("test"):             # no meter: nothing to step aside
        assert (A @ B).shape == (3, 5)


def test_the_buffers_pause_keeps_its_placement():
    """The buffer's bookkeeping runs paused: no op reaches the meter's mode, and it stores what it would."""
    x, y = torch.arange(12.).view(6, 2), torch.tensor([0, 0, 1, 1, 2, 2])
    seen = []

    class Spy(flops._CountingMode):     # a meter's mode that lists the ops it is handed
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return super().__torch_dispatch__(func, types, args, kwargs)

    buffer = ClassBalancedBuffer(6, seed=0)   # room for all: every row stored in order
    with Spy():
        writes = buffer.add(x, y)
        bx, by = buffer.sample(2, torch.Generator().manual_seed(0))
    assert seen == []
    assert writes == {i: i for i in range(6)} and torch.equal(buffer.x, x) and torch.equal(buffer.y, y)
    drawn = torch.randperm(6, generator=torch.Generator().manual_seed(0))[:2]
    assert torch.equal(bx, x[drawn]) and torch.equal(by, y[drawn])


def _record(method, augment="none", hparams=None):
    spec = ScenarioSpec(name="s", dataset="digits", tasks=2, epochs=1, backbone="mlp", batch_size=32,
                        memory_size=40, augment=augment, backbone_options={"hidden": 16, "layers": 1},
                        dataset_options={})
    record = run_case(Case("t", spec, method, 0, hparams or {}), clh.Harness(), torch.device("cpu"))
    assert record.status == "passed", record.message
    return record


@pytest.mark.parametrize("method, augment, hparams", [
    ("er", "none", {}),                                          # data batches, buffer add and sample
    ("er", "cifar", {}),                                         # a recipe's training views, replay augmented
    ("ewc", "none", {"ewc_mode": "separate", "ewc_fisher": "minibatch"}),   # the Fisher pass's batches
    ("ewc", "none", {}),                                         # per-sample Fisher, accumulated penalty
])
def test_a_run_counts_the_same_flops_with_the_pauses_on_off_and_checked(pauses, method, augment, hparams):
    counted = {}
    for value in ("off", "check", "on"):
        pauses(value)
        record = _record(method, augment, hparams)
        counted[value] = (record.train_gflops, record.eval_gflops, record.metrics["final_acc"])
    assert counted["off"][0] > 0 and counted["off"][1] > 0
    assert counted["on"] == counted["check"] == counted["off"]
