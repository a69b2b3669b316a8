"""Dataset sources and the two ways their images reach a method.

A *source* knows where a dataset lives and how to read it; ``load(root, train)`` gives an
``ArrayDataset`` (small datasets: every image in memory as uint8) or a ``FileDataset``
(large ImageFolder trees: paths, decoded on the fly). Scenarios slice these by class and
wrap them as ``TensorData`` (uint8 on the run's device, batched there, no DataLoader
workers) or ``StreamData`` (a DataLoader over files).
"""
from __future__ import annotations

import abc
import math
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Iterator, Sequence

import torch
import torch.nn.functional as F
import torch.utils.data

from ..toolkit.metering import uncounted


class DatasetMissing(FileNotFoundError):
    """A dataset is not where it was looked for."""

    def __init__(self, name: str, path: Path | str | None, layout: str, download: bool = True):
        where = f"at {path}" if path is not None else "because no data root was given"
        fix = ("pass --clh-data-root DIR (or CLH_DATA_ROOT) pointing at the folder that holds it"
               + (", or add --clh-download to fetch it" if download else ""))
        super().__init__(f"dataset {name!r} not found {where}. Expected layout: {layout}. Fix: {fix}.")
        self.name, self.path = name, path


@dataclass
class ArrayDataset:
    """One split held in memory: uint8 images (N, C, H, W), int64 labels, class names."""
    images: torch.Tensor
    labels: torch.Tensor
    classes: list[str]
    name: str = ""

    def __post_init__(self):
        if self.images.dtype != torch.uint8 or self.images.dim() != 4:
            raise ValueError(f"{self.name}: images must be uint8 (N, C, H, W), got {self.images.dtype} "
                             f"{tuple(self.images.shape)}")
        if len(self.images) != len(self.labels):
            raise ValueError(f"{self.name}: {len(self.images)} images but {len(self.labels)} labels")
        self.labels = self.labels.long()

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return tuple(self.images.shape[1:])

    def subset(self, index: torch.Tensor) -> "ArrayDataset":
        return ArrayDataset(self.images[index], self.labels[index], self.classes, self.name)

    def channel_stats(self) -> tuple[list[float], list[float]]:
        """Per-channel mean and (unbiased) standard deviation of the pixels scaled to [0, 1], the std
        at least 1e-3; kept for these images (each scenario built on a cached split asks again)."""
        cached = self.__dict__.get("_channel_stats")
        if cached is None or cached[0] is not self.images:
            self._channel_stats = cached = (self.images, pixel_stats(self.images))
        return cached[1][0][:], cached[1][1][:]


def pixel_stats(images: torch.Tensor) -> tuple[list[float], list[float]]:
    """Exact per-channel mean and std of uint8 ``images`` / 255, from each channel's 256-bin histogram.

    No float copy of the images (issue 40: converting Fashion-MNIST's train split to float for its
    statistics took 188 MB, the session's largest allocation): the sums are exact integers, the moments
    computed in float64 and rounded to float32 as the float32 reduction they replace gave them (equal
    bit for bit on Fashion-MNIST and digits, and never further than float32's rounding of the exact
    value)."""
    values = torch.arange(256, dtype=torch.float64)
    means, stds = [], []
    for c in range(images.shape[1]):
        counts = torch.bincount(images[:, c].reshape(-1), minlength=256).double()
        n = counts.sum()
        mean = (counts * values).sum() / n
        var = (counts * (values - mean) ** 2).sum() / (n - 1) if n > 1 else torch.tensor(float("nan"))
        means.append((mean / 255).float())
        stds.append((var.sqrt() / 255).float())
    return torch.stack(means).tolist(), torch.stack(stds).clamp_min(1e-3).tolist()


class SplitRows:
    """Rows ``index`` of a loaded in-memory split (``subsets.relabel``: a scenario's task), not yet copied.

    ``TensorData`` on the CPU reads its batches straight from the loaded split's images (kept by
    ``load_split``'s cache for the next case anyway) instead of holding a copy of its rows: one uint8 copy
    of a dataset in memory, not two (issue 40: split Fashion-MNIST's tasks copied 55 MB beside the cached
    52 MB). The split's images are never an attribute of the task's data (a method must not reach the test
    split or later tasks through storage: tests/test_no_test_data_leak.py): TensorData holds its row
    indices and a key to the images (``_shared``), a module-level table, as the cache itself is. Anything
    else that asks for ``images`` gets a copy of the rows, as ``ArrayDataset.subset`` makes."""

    def __init__(self, ds: ArrayDataset, index: torch.Tensor) -> None:
        self.source, self.index = ds.images, index
        self.labels, self.classes, self.name = ds.labels[index], ds.classes, ds.name

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def images(self) -> torch.Tensor:
        return self.source if self.index is None else self.source[self.index]

    @images.setter
    def images(self, value: torch.Tensor) -> None:
        # a family that rewrites its task's images (docs/families.md darkens test images): its own rows now
        self.source, self.index = value, None

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return tuple(self.source.shape[1:])


_shared: dict[int, list] = {}   # key -> [a loaded split's images, how many TensorData read them]
_shared_lock = threading.RLock()


def _share(images: torch.Tensor) -> int:
    with _shared_lock:
        entry = _shared.setdefault(id(images), [images, 0])   # id: unique while the table holds the tensor
        entry[1] += 1
        return id(images)


def _release(key: int) -> None:
    with _shared_lock:
        entry = _shared[key]
        entry[1] -= 1
        if not entry[1]:
            del _shared[key]


@dataclass
class FileDataset:
    """One split of a large image tree: file paths and labels, decoded when batched."""
    paths: list[str]
    labels: torch.Tensor
    classes: list[str]
    name: str = ""
    image_size: tuple[int, int] = (224, 224)
    channels: int = 3

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (self.channels, *self.image_size)

    def subset(self, index: torch.Tensor) -> "FileDataset":
        idx = index.tolist()
        return FileDataset([self.paths[i] for i in idx], self.labels[index], self.classes, self.name,
                           self.image_size, self.channels)

    def channel_stats(self) -> tuple[list[float], list[float]]:
        # ImageNet statistics: what pretrained backbones on such trees expect.
        return [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


class TensorData:
    """uint8 images resident on the device; batches normalised there (no workers, no copies)."""

    def __init__(self, ds: ArrayDataset | SplitRows, mean: Sequence[float], std: Sequence[float],
                 device: torch.device | str = "cpu", image_size: tuple[int, int] | None = None,
                 channels: int | None = None, recipe=None):
        self.device = torch.device(device)
        if (isinstance(ds, SplitRows) and ds.index is not None and self.device.type == "cpu"
                and ds.source.device.type == "cpu"):
            self._rows = ds.index   # batches gather from the loaded split itself (SplitRows)
            self._shared = _share(ds.source)
            weakref.finalize(self, _release, self._shared)
        else:
            self.images = ds.images.to(device)
        self.labels = ds.labels.to(device)
        c, *native = ds.input_shape
        self.channels = channels or c
        self.image_size = tuple(image_size) if image_size else tuple(native)
        mean = torch.tensor(_per_channel(mean, self.channels), device=device).view(1, -1, 1, 1)
        std = torch.tensor(_per_channel(std, self.channels), device=device).view(1, -1, 1, 1)
        # (x/255 - mean)/std as one fused multiply-add on the hot path
        self._scale, self._shift = 1 / (255 * std), -mean / std
        self._resize = self.image_size != tuple(native)
        # clharness.toolkit.augment: ``recipe`` (None = no augmentation) acts in the normalised space
        self.recipe = recipe
        self.frame = _frame(self._shift, self._scale)

    def __len__(self) -> int:
        return len(self.labels)

    def __getattr__(self, name: str):
        # ``images`` of data that reads a loaded split's rows (SplitRows): a copy of them, made on first use
        # (DataStore's mixed batches, a family's checks) and kept, as before the rows were shared
        if name == "images" and "_rows" in self.__dict__:
            self.images = self._take()
            return self.images
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __getstate__(self) -> dict:
        """Pickled or deep-copied with its own copy of the rows (the shared table is this process's)."""
        state = dict(self.__dict__)
        if "_rows" in state:
            state["images"] = state.get("images", self._take())
            del state["_rows"], state["_shared"]
        return state

    def _take(self, idx: torch.Tensor | None = None, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Rows of the images: ``idx`` (positions in this split), else ``start:stop`` (a view where this
        split holds its own images, else a copy gathered from the loaded split)."""
        images = self.__dict__.get("images")
        if images is not None:
            return images.index_select(0, idx) if idx is not None else images[start:stop]
        rows = self._rows.index_select(0, idx) if idx is not None else self._rows[start:stop]
        return _shared[self._shared][0].index_select(0, rows)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (self.channels, *self.image_size)

    def prepare(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 (N, C, H, W) -> normalised float at the scenario's size and channel count
        (through the recipe's test-time view where it defines one)."""
        with uncounted("TensorData.prepare"):   # a gather and an elementwise normalisation: nothing to count
            return self._prepare(images)

    def _prepare(self, images: torch.Tensor) -> torch.Tensor:
        x = images   # stays uint8 when nothing else is needed: addcmul promotes it in the same pass
        if x.shape[1] != self.channels:   # grey -> RGB replication (M2I), the only case allowed
            x = x.expand(-1, self.channels, -1, -1)
        if self.recipe is not None and self.recipe.resizes:
            return self.recipe.eval(self._normalise(x), self.frame, self.image_size)
        if self._resize:
            x = F.interpolate(x.float(), size=self.image_size, mode="bilinear", align_corners=False,
                              antialias=True)
        return self._normalise(x)

    def _normalise(self, x: torch.Tensor) -> torch.Tensor:
        """``torch.addcmul(shift, x, scale)`` (one fused multiply-add, one rounding) with the (1, C, 1, 1)
        shift and scale spread to planes of the image's shape: the same values bit for bit, but CPU
        kernels vectorise contiguous float operands and not broadcast or uint8 ones (a batch of 128
        Fashion-MNIST images: 0.58 ms -> 0.06 ms, the largest data cost of a real-size run)."""
        x = x.float()
        planes = self.__dict__.setdefault("_planes", {})
        key = (tuple(x.shape[1:]), x.device)
        if key not in planes:
            planes[key] = tuple(t.expand(1, *x.shape[1:]).contiguous() for t in (self._shift, self._scale))
        shift, scale = planes[key]
        return torch.addcmul(shift, x, scale)

    def augmented(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """uint8 images -> a random training view under the recipe (normalised, at image_size)."""
        if self.recipe.resizes or not self._resize:   # from the native pixels (a resizing recipe resamples itself)
            x = images.expand(-1, self.channels, -1, -1) if images.shape[1] != self.channels else images
            return self.recipe.train_pixels(x, self._shift, self._scale, self.frame, self.image_size, generator)
        return self.recipe.train(self.prepare(images), self.frame, self.image_size, generator)

    def augment(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """A random training view of an already prepared batch (replayed samples, second views)."""
        if self.recipe is None:
            return x
        with uncounted("TensorData.augment"):   # the recipes' ops: gathers, flips, crops, colour (no FLOP formula)
            return self.recipe.train(x, self.frame, self.image_size, generator)

    def batches(self, batch_size: int, shuffle: bool = False, generator: torch.Generator | None = None,
                augment: torch.Generator | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Minibatches; with ``augment`` (the generator of the random draws) training views under
        the recipe. Test and validation data are only ever batched without it."""
        # each batch is drawn with the FLOP meter stepped aside (gathers, normalisation and the recipes' ops have
        # no FLOP formula: toolkit.metering); the meter is back before the batch is handed out
        n = len(self)
        with uncounted("TensorData.batches"):
            order = torch.randperm(n, generator=generator).to(self.device) if shuffle else None
            prepared = self._prepared() if augment is None or self.recipe is None else None
        if prepared is not None:   # the hot path: rows of the split normalised once
            labels = self.labels
            for start in range(0, n, batch_size):
                with uncounted("TensorData.batches"):
                    if order is None:
                        batch = prepared[start:start + batch_size], labels[start:start + batch_size]
                    else:
                        idx = order[start:start + batch_size]
                        batch = prepared.index_select(0, idx), labels.index_select(0, idx)
                yield batch
            return
        view = self.prepare if augment is None or self.recipe is None else \
            (lambda images: self.augmented(images, augment))
        for start in range(0, n, batch_size):
            with uncounted("TensorData.batches"):
                if order is None:
                    batch = view(self._take(start=start, stop=start + batch_size)), self.labels[start:start + batch_size]
                else:   # index_select, not images[idx]: the same rows, ~100x faster on uint8 (N, C, H, W)
                    idx = order[start:start + batch_size]
                    batch = view(self._take(idx)), self.labels.index_select(0, idx)
            yield batch

    # Splits whose normalised copy is at most this many bytes keep it (digits: 0.4 MB); larger ones are
    # normalised batch by batch, so their images stay uint8 until a batch is drawn (issue 40: at 16 MB the
    # five test splits of split Fashion-MNIST kept 31 MB of floats beside 8 MB of pixels, for a saving of
    # one fused multiply-add per evaluation batch).
    PREPARED_CACHE_BYTES = 2 * 2**20

    def _prepared(self) -> torch.Tensor | None:
        """``prepare(images)`` of the whole split, computed on first use and kept when small, else
        None. The normalisation is elementwise, so its rows equal ``prepare`` of any batch bit for
        bit; saves one kernel call per batch (the profile's largest data cost on small inputs)."""
        images = self.__dict__.get("images", self.__dict__.get("_rows"))   # what the split reads its rows from
        source, cached = self.__dict__.get("_prepared_images", (None, None))
        if source is not images:   # first use, or the images were replaced
            cached = None
            if not self._resize and not (self.recipe is not None and self.recipe.resizes) \
                    and 4 * len(self) * self.channels * math.prod(self.image_size) <= self.PREPARED_CACHE_BYTES:
                cached = self.prepare(self._take())
            self._prepared_images = (images, cached)
        return cached


def decode_file(path: str, channels: int = 3) -> torch.Tensor:
    """One image file -> uint8 (C, H, W) RGB or grey, whatever its stored mode (palette, RGBA, CMYK, grey).

    PIL, not torchvision.io: torchvision 0.29 deprecates its image decoders (warning on every call)."""
    import numpy as np
    from PIL import Image

    with Image.open(path) as im:
        arr = np.asarray(im.convert("RGB" if channels == 3 else "L"))
    return torch.from_numpy(arr.copy()).reshape(arr.shape[0], arr.shape[1], -1).permute(2, 0, 1)


class _FileImages(torch.utils.data.Dataset):
    """Module-level (not a closure) so DataLoader workers can pickle it under spawn/forkserver."""

    def __init__(self, ds: FileDataset):
        self.paths, self.labels = ds.paths, ds.labels
        self.size, self.channels = list(ds.image_size), ds.channels

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        from torchvision.transforms.v2 import functional as TF
        img = decode_file(self.paths[i], self.channels)
        return TF.resize(img, self.size, antialias=True), self.labels[i]


class StreamData:
    """A file tree streamed through a DataLoader (decode + resize on CPU workers)."""

    # Starting workers costs more than decoding a batch or two, so tiny splits decode in-process.
    def __init__(self, ds: FileDataset, mean, std, device="cpu", workers: int = 2, recipe=None):
        self.ds, self.device, self.workers, self.recipe = ds, torch.device(device), workers, recipe
        self.channels, self.image_size = ds.channels, tuple(ds.image_size)
        self._files = _FileImages(ds)
        self._mean = torch.tensor(_per_channel(mean, self.channels), device=device).view(1, -1, 1, 1)
        self._std = torch.tensor(_per_channel(std, self.channels), device=device).view(1, -1, 1, 1)
        self.frame = _frame(-self._mean / self._std, 1 / (255 * self._std))

    def __len__(self) -> int:
        return len(self.ds)

    @property
    def labels(self) -> torch.Tensor:
        return self.ds.labels

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return self.ds.input_shape

    def augment(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """A random training view of an already prepared batch (replayed samples, second views)."""
        return x if self.recipe is None else self.recipe.train(x, self.frame, self.image_size, generator)

    def batches(self, batch_size: int, shuffle: bool = False, generator: torch.Generator | None = None,
                augment: torch.Generator | None = None):
        """Decoded batches, normalised on the device; the recipe (train view with ``augment``, else
        its test view) runs there on the whole batch, at the image size the workers resized to."""
        from torch.utils.data import DataLoader
        loader = DataLoader(self._files, batch_size=batch_size, shuffle=shuffle, generator=generator,
                            num_workers=self.workers if len(self) >= batch_size * self.workers else 0,
                            pin_memory=self.device.type == "cuda",
                            persistent_workers=False)
        for images, labels in loader:
            x = images.to(self.device, non_blocking=True).float().div_(255)
            x = (x - self._mean) / self._std
            if self.recipe is not None and augment is not None:
                x = self.recipe.train(x, self.frame, self.image_size, augment)
            elif self.recipe is not None and self.recipe.resizes:
                x = self.recipe.eval(x, self.frame, self.image_size)
            yield x, labels.to(self.device, non_blocking=True)


def _frame(shift: torch.Tensor, scale: torch.Tensor):
    """The augmentation frame of normalised data x = shift + scale * pixel (pixel in 0..255)."""
    from ..toolkit.augment import Frame
    return Frame(shift, shift + 255 * scale)


def _per_channel(values: Sequence[float], channels: int) -> list[float]:
    values = list(values)
    return values * channels if len(values) == 1 else values[:channels] if len(values) >= channels \
        else [sum(values) / len(values)] * channels


class DatasetSource(abc.ABC):
    """Base of a registered dataset. The registry holds the class; a scenario builds it with
    the suite's ``dataset_options`` and calls ``load(root, train, download)`` per split."""
    name: str = ""                        # set to the registry name when built
    layout: ClassVar[str] = ""            # the on-disk layout, shown when the data is missing
    needs_root: ClassVar[bool] = True     # False for bundled / generated data
    can_download: ClassVar[bool] = False
    # folders a system package fills (Debian's dataset-fashion-mnist), searched after the data root: a
    # source that has some loads without a data root
    system_folders: ClassVar[tuple[str, ...]] = ()
    defaults: ClassVar[dict] = {}         # accepted options and their defaults

    def __init__(self, **options):
        unknown = set(options) - set(self.defaults)
        if unknown:
            raise ValueError(f"dataset {self.name or type(self).__name__}: unknown option(s) {sorted(unknown)}; "
                             f"allowed: {sorted(self.defaults) or 'none'}")
        self.options = {**self.defaults, **options}

    @abc.abstractmethod
    def load(self, root: Path | None, train: bool, download: bool = False) -> ArrayDataset | FileDataset:
        """Read one split; raise DatasetMissing (naming path and layout) when it is not there."""

    def identity(self) -> str:
        """What defines this dataset for result keys: name plus options."""
        opts = ",".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        return f"{self.name}({opts})" if opts else self.name

    @classmethod
    def describe(cls) -> str:
        return (cls.__doc__ or cls.__name__).strip().splitlines()[0]
