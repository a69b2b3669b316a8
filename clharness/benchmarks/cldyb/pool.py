"""The CLDyB data pool (paper section 3.1, appendix A): classes from many datasets, each named
``dataset/class`` (its provenance), with per-class train/val/test splits.

Classes already used in the sequence are removed before sampling (alg. 1 line 3); the pool may
grow between steps (section 5, "CLDyB is expandable over time"). In-memory datasets are brought
to one image shape (resize, grey->RGB) when added; one normalisation, fixed by the first datasets
added, serves every class, so growing the pool never changes how earlier tasks are presented.
File trees (ImageFolder) stream from disk with ImageNet statistics.

The paper's pool (appendix A, table 2) is read by the ``cldyb-pool`` dataset source below, one
ImageFolder tree per dataset under ``<data root>/cldyb-pool/<folder>/`` (docs/cldyb-pool.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ...data import ArrayDataset, FileDataset, StreamData, TensorData, load_split
from ...data.base import DatasetMissing, DatasetSource
from ...data.imagefolder import IMAGE_EXTS, ImageFolder

SPLITS = ("train", "val", "test")


class PoolError(ValueError):
    """A pool that cannot serve what was asked of it."""


@dataclass
class PoolClass:
    name: str                 # "dataset/class": provenance, the name sequences are written with
    source: int               # index of its dataset in DataPool.sources
    index: dict               # split -> indices into that dataset's train ("train", "val") or test split


@dataclass
class _Source:
    name: str
    identity: str
    train: ArrayDataset | FileDataset
    test: ArrayDataset | FileDataset


class DataPool:
    """Classes of several datasets behind one name space; see the module docstring."""

    def __init__(self, device: torch.device | str = "cpu", image_size: tuple[int, int] | None = None,
                 channels: int | None = None, validation: float = 0.2, max_train_per_class: int | None = None,
                 max_test_per_class: int | None = None, probe_per_class: int = 10, seed: int = 0):
        if not 0 < validation < 1:
            raise PoolError(f"validation = {validation}: the pool needs a validation fraction in (0, 1) "
                            "(the search scores tasks on validation data)")
        self.device = torch.device(device)
        self.image_size = tuple(image_size) if image_size else None
        self.channels = channels
        self.recipe = None   # clharness.toolkit.augment recipe of every split served (set from the suite's augment)
        self.validation, self.seed = validation, seed
        self.max_train, self.max_test, self.probe_per_class = max_train_per_class, max_test_per_class, probe_per_class
        self.sources: list[_Source] = []
        self.classes: dict[str, PoolClass] = {}
        self.used: set[str] = set()
        self.files: bool | None = None          # file trees or in-memory arrays (one kind per pool)
        # (mean, std) from the first dataset's statistics callable; make_pool sets the scenario's normalize
        self.normalization = _dataset_statistics
        self.mean: list[float] | None = None
        self.std: list[float] | None = None

    # ------------------------------------------------------------------ building / growing
    def add(self, name: str, source, data_root: Path | None = None, download: bool = False) -> list[str]:
        """Add every class of a registered dataset source (or a (train, test) pair of datasets);
        returns the new class names. Used to grow the pool mid-search."""
        if isinstance(source, tuple):
            train, test = source
            identity = name
        else:
            train = load_split(source, data_root, True, download)
            test = load_split(source, data_root, False, download)
            identity = source.identity()
        if any(s.name == name for s in self.sources):
            raise PoolError(f"dataset {name!r} is already in the pool ({', '.join(s.name for s in self.sources)}); "
                            "give each pool entry a distinct name")
        files = isinstance(train, FileDataset)
        if self.files is not None and files != self.files:
            raise PoolError(f"dataset {name!r} is a {'file tree' if files else 'in-memory dataset'}, but the pool "
                            f"holds {'file trees' if self.files else 'in-memory datasets'}; one pool takes one kind")
        self.files = files
        if not files:
            train, test = self._conform(train), self._conform(test)
        if self.mean is None:
            self.mean, self.std = self.normalization(dataset_stats=train.channel_stats)
        src = len(self.sources)
        self.sources.append(_Source(name, identity, train, test))
        rng = np.random.default_rng([self.seed, src, 7])   # splits depend on the seed and the pool order only
        train_labels, test_labels = train.labels.numpy(), test.labels.numpy()
        added = []
        for label, cls in enumerate(train.classes):
            idx = np.flatnonzero(train_labels == label)
            test_idx = np.flatnonzero(test_labels == label)
            if len(idx) < 2 or len(test_idx) == 0:
                continue   # a class needs train, val and test images
            idx = rng.permutation(idx)
            if self.max_train is not None:
                idx = idx[:self.max_train + max(1, int(round(self.max_train * self.validation)))]
            n_val = min(len(idx) - 1, max(1, int(round(len(idx) * self.validation))))
            if self.max_test is not None and len(test_idx) > self.max_test:
                test_idx = rng.choice(test_idx, self.max_test, replace=False)
            full = f"{name}/{cls}"
            self.classes[full] = PoolClass(full, src, {"train": np.sort(idx[n_val:]), "val": np.sort(idx[:n_val]),
                                                        "test": np.sort(test_idx)})
            added.append(full)
        return added

    def _conform(self, ds: ArrayDataset) -> ArrayDataset:
        """uint8 images at the pool's shape (the first dataset's, unless image_size/channels say)."""
        if self.image_size is None:
            self.image_size = tuple(ds.images.shape[2:])
        if self.channels is None:
            self.channels = ds.images.shape[1]
        x = ds.images
        if x.shape[1] != self.channels:
            if x.shape[1] != 1:
                raise PoolError(f"dataset {ds.name!r} has {x.shape[1]} channels; the pool has {self.channels} "
                                "(only grey -> RGB conversion is supported; set channels = 3)")
            x = x.expand(-1, self.channels, -1, -1)
        if tuple(x.shape[2:]) != self.image_size:
            x = F.interpolate(x.float(), size=self.image_size, mode="bilinear", align_corners=False, antialias=True)
            x = x.round().clamp(0, 255).to(torch.uint8)
        return ArrayDataset(x.contiguous(), ds.labels, ds.classes, ds.name)

    # ------------------------------------------------------------------ queries
    @property
    def input_shape(self) -> tuple[int, int, int]:
        if self.files:
            return (3, *(self.image_size or (224, 224)))
        return (self.channels, *self.image_size)

    def available(self) -> list[str]:
        """Classes not used yet, in pool order (alg. 1 line 3: C = D minus C^{<t})."""
        return [c for c in self.classes if c not in self.used]

    def check_names(self, names, what: str = "the sequence") -> None:
        missing = [n for n in names if n not in self.classes]
        if missing:
            datasets = ", ".join(f"{s.name} ({sum(c.source == i for c in self.classes.values())} classes)"
                                 for i, s in enumerate(self.sources))
            example = next(iter(self.classes), "none")
            raise PoolError(f"{what} names {len(missing)} class(es) absent from the pool: {missing[:5]}"
                            f"{' ...' if len(missing) > 5 else ''}; the pool holds {datasets} "
                            f"(names read 'dataset/class', e.g. {example!r}). Add the missing datasets to the pool.")

    def take(self, names) -> None:
        """Mark classes as used: later sampling never offers them again."""
        self.check_names(names)
        self.used.update(names)

    def data(self, names, split: str, first_label: int = 0, limit: int | None = None):
        """The images of ``names`` in ``split``, labelled first_label + position in ``names``, as
        device-resident TensorData (or StreamData for file trees). ``limit``: at most that many
        per class (the first ones of the class's fixed, seeded order)."""
        if split not in SPLITS:
            raise PoolError(f"split {split!r}; allowed: {', '.join(SPLITS)}")
        self.check_names(names)
        parts: dict[int, list] = {}
        for pos, name in enumerate(names):
            cls = self.classes[name]
            idx = cls.index[split][:limit] if limit is not None else cls.index[split]
            parts.setdefault(cls.source, []).append((idx, first_label + pos))
        pieces = []
        for src, items in parts.items():
            ds = self.sources[src].test if split == "test" else self.sources[src].train
            index = torch.from_numpy(np.concatenate([i for i, _ in items])).long()
            sub = ds.subset(index)
            sub.labels = torch.cat([torch.full((len(i),), lab, dtype=torch.long) for i, lab in items])
            pieces.append(sub)
        if self.files:
            paths = [p for ds in pieces for p in ds.paths]
            joined = FileDataset(paths, torch.cat([ds.labels for ds in pieces]), list(names), "pool",
                                 self.image_size or (224, 224), 3)
            return StreamData(joined, self.mean, self.std, self.device, recipe=self.recipe)
        joined = ArrayDataset(torch.cat([ds.images for ds in pieces]), torch.cat([ds.labels for ds in pieces]),
                              list(names), "pool")
        return TensorData(joined, self.mean, self.std, self.device, recipe=self.recipe)

    def identity(self) -> str:
        return "cldyb-pool[" + "; ".join(s.identity for s in self.sources) + "]"


def _dataset_statistics(dataset_stats):
    """The default normalisation of a pool: the first dataset's own statistics."""
    return dataset_stats()


# ---------------------------------------------------------------------------------- the paper's pool
POOL_DIR = "cldyb-pool"       # <data root>/cldyb-pool/<folder>/ holds the pool's datasets
POOL_DOC = "docs/cldyb-pool.md"
# Appendix A, table 2: the 22 real-world datasets of CLDyB-pool (2,043 classes in the paper's copy),
# folder name -> (the paper's name, its # class in table 2). The four SDXL-generated datasets of
# section 5.2 are not public data and stay out (they join through pool_growth like any dataset).
POOL_DATASETS: dict[str, tuple[str, int]] = {
    "fruits-vegetable": ("Fruits-Vegetable", 35),
    "jute-pest": ("Jute-Pest", 17),
    "animal-90": ("Animal-90", 90),
    "sea-animal": ("Sea-animal", 23),
    "rock": ("Rock", 9),
    "butterfly-75": ("Butterfly-75", 75),
    "clothing-20": ("Clothing-20", 17),
    "apparel": ("Apparel", 37),
    "food-101": ("Food101", 101),
    "cnfood-241": ("CNFOOD241", 240),
    "indian-food": ("Indian-Food", 80),
    "foodx-251": ("FoodX251", 250),
    "oxford5k": ("Oxford5k", 17),
    "places365": ("Places365", 365),
    "sun397": ("SUN397", 339),
    "eurosat-rgb": ("EuroSAT-RGB", 10),
    "mlrsnet": ("MLRSNet", 46),
    "resisc45": ("RESISC45", 45),
    "fgvc-aircraft": ("FGVC-Aircraft", 100),
    "sports-100": ("Sports100", 100),
    "one-piece-anime": ("One-piece-Anime", 18),
    "balls-30": ("Balls30", 29),
}
# The standard benchmarks CLDyB is compared against (table 1) are never pool datasets.
KEPT_OUT = {"imagenet-r": "ImageNet-R", "cifar-100": "CIFAR-100", "cifar100": "CIFAR-100"}


class PoolFolder(DatasetSource):
    """One real-world dataset of the CLDyB pool (appendix A, table 2) as an ImageFolder tree."""
    layout = (f"<root>/{POOL_DIR}/<folder>/train/<class>/*.jpg and .../test/<class>/*.jpg (or val/), or "
              f"<root>/{POOL_DIR}/<folder>/<class>/*.jpg split per class by test_fraction; the folder names, "
              f"where each dataset comes from and how to lay it out: {POOL_DOC}")
    defaults = {**{k: v for k, v in ImageFolder.defaults.items() if k != "path"}, "folder": "", "min_images": 0}

    def __init__(self, **options):
        folder = options.get("folder", "")
        if folder in KEPT_OUT:
            raise ValueError(f"cldyb-pool folder {folder!r}: {KEPT_OUT[folder]} is a standard benchmark CLDyB is "
                             "compared against (table 1) and is kept out of the pool; see " + POOL_DOC)
        if folder not in POOL_DATASETS:
            raise ValueError(f"cldyb-pool folder {folder!r} is not one of the pool's datasets "
                             f"({', '.join(POOL_DATASETS)}); see {POOL_DOC}")
        super().__init__(**options)
        if isinstance(self.options["image_size"], list):   # options are cache keys: keep them hashable
            self.options["image_size"] = tuple(self.options["image_size"])

    def load(self, root, train, download=False):
        folder = self.options["folder"]
        base = Path(root or "") / POOL_DIR / folder
        name = f"{POOL_DIR}/{folder} ({POOL_DATASETS[folder][0]})"
        if not base.is_dir():
            raise DatasetMissing(name, base, self.layout, download=False)
        tree = ImageFolder(**{k: v for k, v in self.options.items() if k not in ("folder", "min_images")},
                           path=str(base.resolve()))
        tree.name = self.name
        try:
            ds = tree.load(None, train)
        except DatasetMissing:   # a folder without images: name the pool dataset and the docs
            raise DatasetMissing(name, base, self.layout, download=False) from None
        if self.options["min_images"]:
            ds = _keep_classes(ds, _large_classes(base, self.options["min_images"]), name)
        return ds


def _large_classes(base: Path, min_images: int) -> set[str]:
    """Classes of the tree at ``base`` with at least ``min_images`` images over all its splits
    (table 2's footnote: the pool leaves out classes with fewer than 45 images)."""
    splits = [base / d for d in ("train", "test", "val") if (base / d).is_dir()] if (base / "train").is_dir() else [base]
    counts: dict[str, int] = {}
    for split in splits:
        for cls in (p for p in split.iterdir() if p.is_dir() and not p.name.startswith(".")):
            n = sum(1 for f in cls.rglob("*") if f.suffix.lower() in IMAGE_EXTS and f.is_file())
            counts[cls.name] = counts.get(cls.name, 0) + n
    return {c for c, n in counts.items() if n >= min_images}


def _keep_classes(ds, keep: set[str], name: str):
    """``ds`` with only the classes in ``keep``, relabelled 0.. in their original order."""
    kept = [c for c in ds.classes if c in keep]
    if not kept:
        raise PoolError(f"{name}: none of its {len(ds.classes)} classes has min_images images; lower "
                        f"min_images in the suite's pool entry or check the tree ({POOL_DOC})")
    new = torch.full((len(ds.classes),), -1, dtype=torch.long)
    for i, c in enumerate(ds.classes):
        if c in keep:
            new[i] = kept.index(c)
    labels = new[ds.labels]
    index = torch.nonzero(labels >= 0).flatten()
    sub = ds.subset(index)
    sub.labels, sub.classes = labels[index], kept
    return sub
