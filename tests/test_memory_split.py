"""memory_mb in three parts (model, replay memory, other state) and per-run peaks (issue 41 item 2),
against hand-computed byte counts."""
import pytest
import torch
from torch import nn

import clharness as clh
from clharness.engine import peak_memory
from clharness.engine.runner import Case, run_case
from clharness.engine.suites import ScenarioSpec
from clharness.reporting.scorecard import render, summarize

MB = 2**20


class LinearBN(nn.Module):
    """Flatten, Linear(48 -> 5), BatchNorm1d(5): 245 + 10 parameters, 11 BatchNorm buffer elements."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(48, 5), nn.BatchNorm1d(5))
        self.out_dim = 5

    def forward(self, x):
        return self.net(x)


def test_er_memory_splits_into_model_buffer_and_other():
    er = clh.Harness().methods["er"]
    context = clh.Context(clh.Setting.ONLINE, 4, (3, 4, 4), seed=0, batch_size=8, memory_size=12,
                          backbone_factory=LinearBN)
    method = er(context)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):   # 24 stream samples offered: the 12-image memory is full
        method.observe(clh.Batch(torch.randn(8, 3, 4, 4, generator=gen), torch.randint(0, 4, (8,), generator=gen)))
    report = method.memory_report()
    params = (48 * 5 + 5) + (5 + 5) + (5 * 4 + 4)   # linear, BatchNorm affine, head over 4 classes
    assert report.model_mb == 4 * params / MB
    assert report.buffer_mb == 12 * 3 * 4 * 4 / MB          # 12 images of 3x4x4, one byte per element (B.4)
    assert report.other_mb == 4 * (5 + 5 + 1) / MB           # running mean, var, batches tracked, as fp32
    assert report.mb == pytest.approx((4 * params + 576 + 44) / MB)


def test_the_record_and_the_scorecard_carry_the_split():
    spec = ScenarioSpec(name="s", dataset="digits", tasks=5, epochs=1, backbone="mlp", memory_size=30,
                        backbone_options={"hidden": 16, "layers": 1})
    record = run_case(Case("t", spec, "er", 0), clh.Harness(), torch.device("cpu"))
    assert record.status == "passed", record.message
    params = 64 * 16 + 16 + 16 * 10 + 10
    assert record.memory_model_mb == 4 * params / MB
    assert record.memory_buffer_mb == 30 * 64 / MB              # 30 digits of 8x8, uint8
    assert record.memory_other_mb == 0.0                        # an MLP holds no other tensor
    assert record.memory_mb == pytest.approx(record.memory_model_mb + record.memory_buffer_mb)
    assert record.peak_rss_mb > 0 and record.peak_cuda_mb == 0.0
    columns = ["memory_model_mb", "memory_buffer_mb", "memory_other_mb", "peak_rss_mb"]
    table = render(summarize([record], columns), columns)
    assert "model MB" in table and "buffer MB" in table and "other MB" in table and "peak RSS MB" in table
    assert f"{30 * 64 / MB:.2f}" in table


def test_peak_resident_memory_is_this_runs_own(monkeypatch):
    device = torch.device("cpu")
    if not peak_memory.reset(device):
        pytest.skip("this system cannot reset the resident peak (/proc/self/clear_refs); it reports the lifetime peak")
    block = bytearray(200 * MB)
    block[::4096] = b"x" * len(block[::4096])   # touch every page: 200 MB resident
    big, _ = peak_memory.read(device)
    del block
    peak_memory.reset(device)
    small, _ = peak_memory.read(device)
    assert big - small > 150


def test_peak_gpu_memory_is_reset_for_every_run(monkeypatch):
    """A fake allocator: the first run peaks at 100 MB, the second at 10 MB; without the reset the
    second would report the first's 100 MB."""
    state = {"now": 0, "peak": 0, "resets": 0}

    def allocate(mb):
        state["now"] = mb * MB
        state["peak"] = max(state["peak"], state["now"])
        state["now"] = 0

    def reset(device):
        state["peak"], state["resets"] = state["now"], state["resets"] + 1

    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: state["peak"])
    cuda = torch.device("cuda")
    peaks = []
    for mb in (100, 10):
        peak_memory.reset(cuda)
        allocate(mb)
        peaks.append(peak_memory.read(cuda)[1])
    assert peaks == [100.0, 10.0] and state["resets"] == 2


def test_ensemble_members_carry_the_shared_processes_peaks():
    """--clh-ensemble: the members run as threads of one process, each reset at its start; every member
    still has its memory split and a resident peak (the ensemble's, see engine/peak_memory.py)."""
    from clharness.engine.ensemble import run_ensemble
    spec = ScenarioSpec(name="s", dataset="digits", tasks=5, epochs=1, backbone="mlp", memory_size=30,
                        backbone_options={"hidden": 16, "layers": 1})
    cases = [Case("t", spec, "er", seed) for seed in (0, 1)]
    records = run_ensemble(cases, clh.Harness(), torch.device("cpu"))
    assert [r.status for r in records] == ["passed", "passed"] and records[0].extra["executor"] == "ensemble:2"
    for r in records:
        assert r.peak_rss_mb > 0 and r.peak_cuda_mb == 0.0
        assert r.memory_buffer_mb == 30 * 64 / MB and r.memory_model_mb == 4 * (64 * 16 + 16 + 16 * 10 + 10) / MB
