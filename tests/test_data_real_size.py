"""Real-size data stays uint8 until a batch is drawn (issue 40 item 4): no float copy of a whole split
(statistics, the normalised-split cache, evaluation), IDX files read once into their tensor, and the
faster data path gives the same numbers bit for bit."""
from __future__ import annotations

import gzip
import math
import tracemalloc

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import clharness as clh
from clharness.data import load_split
from clharness.data.base import ArrayDataset, TensorData, pixel_stats
from clharness.data.torchvision_sources import read_idx
from clharness.engine.runner import Case, run_case
from clharness.engine.suites import ScenarioSpec


class FloatSizes(TorchDispatchMode):
    """Records the element count of every floating-point tensor an op returns."""

    def __init__(self):
        super().__init__()
        self.sizes: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                self.sizes.append(t.numel())
        return out


# ----------------------------------------------------------------------------- channel statistics
def test_pixel_stats_by_hand():
    # channel 0: 0, 255, 255, 0 -> mean 0.5, unbiased var = 4 * 0.25 / 3; channel 1: all 51 -> 0.2, std 0 -> 1e-3
    images = torch.tensor([0, 255, 255, 0], dtype=torch.uint8).view(4, 1, 1, 1)
    images = torch.cat([images, torch.full((4, 1, 1, 1), 51, dtype=torch.uint8)], 1)
    mean, std = pixel_stats(images)
    f32 = lambda v: torch.tensor(v, dtype=torch.float32).item()   # noqa: E731
    assert mean == [f32(0.5), f32(0.2)]
    assert std == [f32(math.sqrt(1 / 3)), f32(1e-3)]


def test_channel_stats_equal_the_float32_definition():
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (700, 3, 9, 9), dtype=torch.uint8, generator=g)
    x = images.float().div_(255).transpose(0, 1).reshape(3, -1)   # the definition, in float32
    mean, std = ArrayDataset(images, torch.zeros(700), ["a"]).channel_stats()
    torch.testing.assert_close(torch.tensor(mean), x.mean(1), rtol=2 ** -22, atol=0)
    torch.testing.assert_close(torch.tensor(std), x.std(1), rtol=2 ** -22, atol=0)


def test_channel_stats_make_no_float_copy_and_are_kept():
    images = torch.randint(0, 256, (500, 1, 16, 16), dtype=torch.uint8)
    ds = ArrayDataset(images, torch.zeros(500), ["a"])
    with FloatSizes() as seen:
        first = ds.channel_stats()
    assert seen.sizes and max(seen.sizes) <= 256   # histograms, never the images as float
    with FloatSizes() as again:
        assert ds.channel_stats() == first
    assert again.sizes == []                        # kept: a scenario built again does not recompute
    ds.images = images.flip(0)[:, :, :, :8].contiguous()   # replaced images: computed anew
    assert ds.channel_stats() != first


# --------------------------------------------------------------------------------- IDX files read once
def test_read_idx_holds_the_data_once(tmp_path):
    n, side = 4000, 28   # 3.1 MB of pixels
    pixels = torch.randint(0, 256, (n, side, side), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    body = bytes([0, 0, 8, 3]) + n.to_bytes(4, "big") + side.to_bytes(4, "big") * 2 + pixels.numpy().tobytes()
    (tmp_path / "x-idx3-ubyte").write_bytes(body)
    with gzip.open(tmp_path / "x-idx3-ubyte.gz", "wb") as out:
        out.write(body)
    for name in ("x-idx3-ubyte", "x-idx3-ubyte.gz"):
        tracemalloc.start()
        try:
            got = read_idx(tmp_path / name)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert torch.equal(got, pixels)
        # read into the tensor's own buffer: the file's bytes and a copy of them (2x) never coexist
        assert peak < 1.5 * pixels.numel(), (name, peak)
    (tmp_path / "x-idx3-ubyte").write_bytes(body + b"\0")
    try:
        read_idx(tmp_path / "x-idx3-ubyte")
    except ValueError as exc:
        assert "truncated or corrupt" in str(exc)
    else:
        raise AssertionError("a file longer than its header says was read")


# ------------------------------------------------------------------- the faster path, the same numbers
def test_normalisation_is_addcmul_bit_for_bit():
    g = torch.Generator().manual_seed(2)
    for shape, channels in (((64, 1, 28, 28), None), ((40, 3, 8, 8), None), ((30, 1, 6, 6), 3)):
        images = torch.randint(0, 256, shape, dtype=torch.uint8, generator=g)
        mean, std = [0.2860406, 0.48, 0.45][:shape[1]], [0.3530242, 0.24, 0.26][:shape[1]]
        data = TensorData(ArrayDataset(images, torch.arange(shape[0]) % 2, ["a", "b"]), mean, std, channels=channels)
        x = images.expand(-1, channels, -1, -1) if channels else images
        expected = torch.addcmul(data._shift, x, data._scale)   # one fused multiply-add, the definition
        assert torch.equal(data.prepare(images), expected)
        order = torch.randperm(shape[0], generator=torch.Generator().manual_seed(3))
        got = list(data.batches(16, shuffle=True, generator=torch.Generator().manual_seed(3)))
        assert torch.equal(torch.cat([x for x, _ in got]), expected[order])
        assert torch.equal(torch.cat([y for _, y in got]), data.labels[order])


# ------------------------------------------------------------------- a split run keeps its data uint8
def test_a_split_run_never_holds_a_split_as_float():
    # 5 tasks of 2 classes x 300 images of 1x32x32: each split's float copy (600 x 1024) is above the
    # normalised-split cache (2 MB) and larger than any batch (100 train, 512 evaluation), parameter
    # or activation of the run
    spec = ScenarioSpec(name="s", dataset="synthetic", tasks=5, epochs=1, batch_size=100, memory_size=50,
                        backbone="mlp", dataset_options={"train_per_class": 300, "test_per_class": 300,
                                                         "image_size": 32})
    split_floats = 600 * 32 * 32
    assert 4 * split_floats > TensorData.PREPARED_CACHE_BYTES
    harness = clh.Harness(entry_points=False)
    source = harness.datasets["synthetic"](**spec.dataset_options)
    source.name = "synthetic"
    load_split(source, None, True), load_split(source, None, False)   # generating the data is not the run's
    with FloatSizes() as seen:
        record = run_case(Case("s", spec, "er", 0, {}), harness, torch.device("cpu"))
    assert record.status == "passed", record.message
    assert max(seen.sizes) < split_floats, max(seen.sizes)   # an evaluation batch of 512 is the largest


def test_split_tasks_stay_uint8():
    from clharness.engine.scenario import build_scenario
    spec = ScenarioSpec(name="s", dataset="synthetic", tasks=5, epochs=1, batch_size=32, backbone="mlp",
                        dataset_options={"train_per_class": 300, "test_per_class": 300, "image_size": 32})
    scenario = build_scenario(spec, clh.Harness(entry_points=False).datasets, 0, torch.device("cpu"))
    for task in scenario.tasks:
        for data in (task.train, task.test):
            assert data.images.dtype == torch.uint8
            assert data._prepared() is None   # too large for the normalised-split cache
