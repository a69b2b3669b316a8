"""Sources read by torchvision's own dataset classes (their real parsing code), converted to uint8 NCHW."""
from __future__ import annotations

import gzip
import math
import os
import struct
from pathlib import Path

import numpy as np
import torch
import torchvision.datasets as tvd

from .base import ArrayDataset, DatasetMissing, DatasetSource


def _files_only(cls, **attrs):
    """``cls`` with its md5 sums dropped, so its integrity check becomes an existence check.

    torchvision verifies md5 sums of CIFAR/SVHN files (and of Omniglot's zips) before reading them.
    Re-packed local copies and the tests' fabricated files cannot match, and hashing every load is
    slow, so without --clh-download we only check that the files are there. With download the
    original class is used and verifies what it fetches."""
    return type(f"{cls.__name__}Files", (cls,), attrs)


_CIFAR10 = _files_only(tvd.CIFAR10, train_list=[[f, None] for f, _ in tvd.CIFAR10.train_list],
                       test_list=[[f, None] for f, _ in tvd.CIFAR10.test_list], meta={**tvd.CIFAR10.meta, "md5": None})
_CIFAR100 = _files_only(tvd.CIFAR100, train_list=[[f, None] for f, _ in tvd.CIFAR100.train_list],
                        test_list=[[f, None] for f, _ in tvd.CIFAR100.test_list],
                        meta={**tvd.CIFAR100.meta, "md5": None})
_SVHN = _files_only(tvd.SVHN, split_list={k: [url, f, None] for k, (url, f, _) in tvd.SVHN.split_list.items()})
# Omniglot checks the md5 of images_background.zip even when the extracted folder is there.
_Omniglot = _files_only(tvd.Omniglot, _check_integrity=lambda self: os.path.isdir(
    os.path.join(self.root, self._get_target_folder())))


class _TorchvisionSource(DatasetSource):
    can_download = True

    def _required(self, root: Path, train: bool) -> list[Path]:
        """The files torchvision checks for, in order; the first missing one is named in the error."""
        raise NotImplementedError

    def _open(self, root: Path, train: bool, download: bool):
        raise NotImplementedError

    def _convert(self, ds, train: bool) -> ArrayDataset:
        raise NotImplementedError

    def load(self, root, train, download=False):
        root = Path(root)
        required = self._required(root, train)
        missing = [p for p in required if not p.exists()]
        if missing and not download:
            raise DatasetMissing(self.name, missing[0], self.layout, download=self.can_download)
        try:
            ds = self._open(root, train, download)
        except RuntimeError as e:   # torchvision's generic "Dataset not found or corrupted"
            if "not found" not in str(e):
                raise
            raise DatasetMissing(self.name, (missing or required)[0], self.layout, self.can_download) from e
        return self._convert(ds, train)


class MNIST(_TorchvisionSource):
    """MNIST handwritten digits (torchvision): 28x28 grey, 10 classes, 60,000 train / 10,000 test.

    The four IDX files are looked for in the data root (``<root>/MNIST/raw/``), then in the system
    folders a distribution package fills (``system_folders``; Debian's ``dataset-fashion-mnist`` for
    Fashion-MNIST), each file uncompressed or as the ``.gz`` it is published as. A gzip file is read as
    it is (never unpacked beside it: a system folder is read-only). With download, torchvision fetches
    the files into the data root and checks their md5 sums."""
    tv_class = tvd.MNIST
    layout = ("<root>/MNIST/raw/{train,t10k}-images-idx3-ubyte and {train,t10k}-labels-idx1-ubyte "
              "(uncompressed IDX files, as torchvision's MNIST downloads them, or the published .gz files)")
    system_folders: tuple[str, ...] = ()
    FILES = tuple(f"{s}-{k}" for s in ("train", "t10k") for k in ("images-idx3-ubyte", "labels-idx1-ubyte"))

    def _required(self, root, train):
        raw = root / self.tv_class.__name__ / "raw"   # torchvision checks all four files for either split
        return [raw / name for name in self.FILES]

    def copies(self, root: Path | None) -> list[tuple[str, Path]]:
        """Where the files are looked for, in order: (which copy, folder)."""
        places = [("data root", Path(root) / self.tv_class.__name__ / "raw")] if root is not None else []
        return places + [("system copy", Path(folder)) for folder in self.system_folders]

    def locate(self, root: Path | None) -> tuple[str, dict[str, Path]] | None:
        """The first copy that holds all four files (each raw, else .gz): (which copy, name -> path)."""
        for label, folder in self.copies(root):
            found = {}
            for name in self.FILES:
                path = next((p for p in (folder / name, folder / f"{name}.gz") if p.is_file()), None)
                if path is None:
                    break
                found[name] = path
            else:
                return label, found
        return None

    def load(self, root, train, download=False):
        root = Path(root) if root is not None else None
        located = self.locate(root)
        if located is None and download and root is not None:
            try:
                self.tv_class(str(root), train=train, download=True)   # torchvision checks each file's md5
            except RuntimeError as e:   # torchvision's generic "Dataset not found or corrupted"
                if "not found" not in str(e):
                    raise
                raise DatasetMissing(self.name, self._first_missing(root), self.layout, self.can_download) from e
            located = self.locate(root)
        if located is None:
            raise DatasetMissing(self.name, self._first_missing(root), self.layout + self._elsewhere(),
                                 self.can_download)
        prefix = "train" if train else "t10k"
        images = read_idx(located[1][f"{prefix}-images-idx3-ubyte"])
        labels = read_idx(located[1][f"{prefix}-labels-idx1-ubyte"])
        if images.dim() != 3 or labels.dim() != 1 or len(images) != len(labels):
            raise ValueError(f"{self.name}: {located[1][f'{prefix}-images-idx3-ubyte']} holds {tuple(images.shape)} "
                             f"images for {tuple(labels.shape)} labels; expected (N, H, W) and (N,)")
        return ArrayDataset(images.unsqueeze(1), labels.long(), list(self.tv_class.classes), self.name)

    def _first_missing(self, root):
        if root is None:
            return None
        raw = root / self.tv_class.__name__ / "raw"
        return next((raw / n for n in self.FILES if not (raw / n).is_file() and not (raw / f"{n}.gz").is_file()),
                    raw / self.FILES[0])

    def _elsewhere(self) -> str:
        if not self.system_folders:
            return ""
        return (f"; also looked in the system copy {', '.join(self.system_folders)} "
                f"(Debian: apt-get install {self.system_package}), or run `clharness data fetch {self.name} "
                "--root DIR`")


def read_idx(path: Path) -> torch.Tensor:
    """An IDX file of unsigned bytes (MNIST's format: magic 0x0000 0x08 ndim, big-endian dims, data),
    raw or gzip-compressed, as a uint8 tensor; read in memory, nothing written anywhere. The data is read
    straight into the tensor's own buffer (``f.read()`` then a copy held the file twice: 94 MB of
    transient peak for Fashion-MNIST's train images)."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as f:
        magic = f.read(4)
        if len(magic) < 4 or magic[0] or magic[1] or magic[2] != 0x08:
            raise ValueError(f"{path}: not an IDX file of unsigned bytes (magic {magic.hex()}, expected 000008NN)")
        ndim = magic[3]
        header = f.read(4 * ndim)
        if len(header) < 4 * ndim:
            raise ValueError(f"{path}: the header of {ndim} dimensions is cut short; the file is truncated or corrupt")
        dims = struct.unpack(f">{ndim}I", header)
        data = bytearray(math.prod(dims))
        view, got = memoryview(data), 0
        while got < len(data):
            if opener is open:   # straight into the buffer
                n = f.readinto(view[got:])
            else:                # in pieces: GzipFile.readinto(whole) makes a full-size copy first
                chunk = f.read(min(2 ** 18, len(data) - got))
                n = len(chunk)
                view[got:got + n] = chunk
            if not n:
                break
            got += n
        extra = len(f.read(1)) if got == len(data) else 0
    if got != len(data) or extra:
        held = f"{got}" if not extra else f"more than {got}"
        raise ValueError(f"{path}: header says {dims} ({math.prod(dims)} bytes), the file holds "
                         f"{held}; the file is truncated or corrupt")
    return torch.frombuffer(data, dtype=torch.uint8).view(*dims) if data else torch.empty(dims, dtype=torch.uint8)


class FashionMNIST(MNIST):
    """Fashion-MNIST clothing images (torchvision): 28x28 grey, 10 classes, 60,000 train / 10,000 test."""
    tv_class = tvd.FashionMNIST
    layout = MNIST.layout.replace("MNIST/", "FashionMNIST/").replace("MNIST downloads", "FashionMNIST downloads")
    system_folders = ("/usr/share/datasets/fashion-mnist",)   # Debian's dataset-fashion-mnist
    system_package = "dataset-fashion-mnist"


class KMNIST(MNIST):
    """Kuzushiji-MNIST cursive Japanese characters (torchvision): 28x28 grey, 10 classes, 60,000 / 10,000."""
    tv_class = tvd.KMNIST
    layout = MNIST.layout.replace("MNIST/", "KMNIST/").replace("MNIST downloads", "KMNIST downloads")


class EMNIST(_TorchvisionSource):
    """EMNIST handwritten characters and digits (torchvision): 28x28 grey, option split (default balanced, 47 classes).

    The EMNIST files store every image transposed; we transpose back so characters stand upright.
    The letters split labels 1..26 (torchvision's class 0 is an empty "N/A"); we shift them to 0..25."""
    layout = ("<root>/EMNIST/raw/emnist-<split>-{train,test}-images-idx3-ubyte and "
              "emnist-<split>-{train,test}-labels-idx1-ubyte (uncompressed, as torchvision's EMNIST extracts them)")
    defaults = {"split": "balanced"}

    def __init__(self, **options):
        super().__init__(**options)
        if self.options["split"] not in tvd.EMNIST.splits:
            raise ValueError(f"emnist: split must be one of {tvd.EMNIST.splits}, got {self.options['split']!r}")

    def _required(self, root, train):
        prefix = root / "EMNIST" / "raw" / f"emnist-{self.options['split']}-{'train' if train else 'test'}"
        return [Path(f"{prefix}-images-idx3-ubyte"), Path(f"{prefix}-labels-idx1-ubyte")]

    def _open(self, root, train, download):
        return tvd.EMNIST(str(root), split=self.options["split"], train=train, download=download)

    def _convert(self, ds, train):
        images, labels, classes = ds.data.transpose(1, 2).unsqueeze(1).contiguous(), ds.targets.long(), list(ds.classes)
        if self.options["split"] == "letters":
            labels, classes = labels - 1, classes[1:]
        return ArrayDataset(images, labels, classes, self.name)


class CIFAR10(_TorchvisionSource):
    """CIFAR-10 (torchvision): 32x32 RGB, 10 classes, 50,000 train / 10,000 test."""
    layout = ("<root>/cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta} "
              "(the python pickle batches of cifar-10-python.tar.gz)")
    tv_classes = (tvd.CIFAR10, _CIFAR10)

    def _required(self, root, train):
        cls = self.tv_classes[0]
        return [root / cls.base_folder / f for f, _ in cls.train_list + cls.test_list] + \
            [root / cls.base_folder / cls.meta["filename"]]

    def _open(self, root, train, download):
        return self.tv_classes[0 if download else 1](str(root), train=train, download=download)

    def _convert(self, ds, train):
        images = torch.from_numpy(np.ascontiguousarray(ds.data)).permute(0, 3, 1, 2).contiguous()   # NHWC -> NCHW
        return ArrayDataset(images, torch.as_tensor(ds.targets, dtype=torch.long), list(ds.classes), self.name)


class CIFAR100(CIFAR10):
    """CIFAR-100 (torchvision): 32x32 RGB, 100 fine classes, 50,000 train / 10,000 test."""
    layout = ("<root>/cifar-100-python/{train,test,meta} (the python pickle files of cifar-100-python.tar.gz; "
              "fine labels are used)")
    tv_classes = (tvd.CIFAR100, _CIFAR100)


class SVHN(_TorchvisionSource):
    """SVHN street-view house numbers (torchvision): 32x32 RGB, 10 digits, 73,257 train / 26,032 test."""
    layout = ("<root>/svhn/{train,test}_32x32.mat (or directly in <root>, where torchvision's SVHN(root) "
              "puts them): X of shape (32, 32, 3, N), y in 1..10 with 10 meaning digit 0")

    def _folder(self, root, train):
        name = f"{'train' if train else 'test'}_32x32.mat"
        # Prefer <root>/svhn/; accept files left directly in <root> by a plain torchvision download.
        return root if (root / name).exists() and not (root / "svhn" / name).exists() else root / "svhn"

    def _required(self, root, train):
        return [self._folder(root, train) / f"{'train' if train else 'test'}_32x32.mat"]

    def _open(self, root, train, download):
        cls = tvd.SVHN if download else _SVHN
        return cls(str(self._folder(root, train)), split="train" if train else "test", download=download)

    def _convert(self, ds, train):
        # torchvision already maps label 10 -> 0 and transposes X to (N, 3, 32, 32); it has no class names.
        return ArrayDataset(torch.from_numpy(np.ascontiguousarray(ds.data)), torch.from_numpy(ds.labels).long(),
                            [str(d) for d in range(10)], self.name)


class Omniglot(_TorchvisionSource):
    """Omniglot handwritten characters (torchvision): 105x105 grey, one class per alphabet/character, 20 drawings each.

    Option background picks images_background (964 characters) or images_evaluation (659). Omniglot has
    no train/test split: each character's drawings, sorted by file name, give the first train_per_class
    to train and the rest to test. Images are inverted (invert=True) so strokes are bright on a dark
    background, like MNIST. Option characters (a list of "Alphabet/characterNN" names) keeps only those
    classes, in that order; a name not in the tree is an error naming it."""
    layout = ("<root>/omniglot-py/images_background/<alphabet>/<character>/*.png "
              "(images_evaluation/ with background=False), as torchvision's Omniglot extracts them")
    defaults = {"background": True, "train_per_class": 15, "invert": True, "characters": None}

    def __init__(self, **options):
        super().__init__(**options)
        chars = self.options["characters"]
        if chars is not None:   # a tuple: options are cache keys
            self.options["characters"] = (chars,) if isinstance(chars, str) else tuple(chars)

    def _required(self, root, train):
        return [root / "omniglot-py" / ("images_background" if self.options["background"] else "images_evaluation")]

    def _open(self, root, train, download):
        cls = tvd.Omniglot if download else _Omniglot
        return cls(str(root), background=self.options["background"], download=download)

    def _convert(self, ds, train):
        # torchvision lists alphabets and characters in directory order; sort them (and drawings) explicitly.
        chars = [c.replace(os.sep, "/") for c in ds._characters]
        classes = sorted(chars)
        if self.options["characters"] is not None:   # selected by name, never by listing order
            missing = [c for c in self.options["characters"] if c not in set(chars)]
            if missing:
                raise ValueError(f"{self.name}: character(s) {missing} are not in {ds.target_folder}; "
                                 f"names are 'Alphabet/characterNN', e.g. {classes[0] if classes else 'none found'!r}")
            classes = list(self.options["characters"])
        drawings = {c: [] for c in classes}
        for i, (file, c) in enumerate(ds._flat_character_images):
            if chars[c] in drawings:
                drawings[chars[c]].append((file, i))
        k = self.options["train_per_class"]
        part = slice(None, k) if train else slice(k, None)
        picked = [(i, label) for label, c in enumerate(classes) for _, i in sorted(drawings[c])[part]]
        images = [torch.from_numpy(np.array(ds[i][0], dtype=np.uint8)) for i, _ in picked]   # PIL "L" images
        images = torch.stack(images) if images else torch.zeros(0, 105, 105, dtype=torch.uint8)
        if self.options["invert"]:
            images = 255 - images
        labels = torch.tensor([label for _, label in picked], dtype=torch.long)
        return ArrayDataset(images.unsqueeze(1), labels, classes, self.name)

    def load(self, root, train, download=False):
        if self.options["train_per_class"] < 1:
            raise ValueError("omniglot: train_per_class must be at least 1")
        return super().load(root, train, download)
