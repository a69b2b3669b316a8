"""Sources of domain-incremental benchmarks: the same classes under a changing input distribution.

- ``core50``: CORe50 (Lomonaco and Maltoni, CoRL 2017), 50 objects in 10 categories filmed in 11
  sessions (backgrounds and lighting); option ``session`` (1-11) picks one session, the benchmark's
  domain. Its frames of each object are split into train and test by ``test_fraction`` (fixed per
  object and session), so accuracy is measured per domain; the NI protocol's fixed test sessions (3, 7,
  10) are a suite with those sessions as their own domains. ``label``: "object" (50) or "category" (10).
- ``domainnet``: DomainNet (Peng et al., ICCV 2019), 345 classes in six domains (clipart, infograph,
  painting, quickdraw, real, sketch), read with the official per-domain split files; option ``domain``.
"""
from __future__ import annotations

from pathlib import Path

from .base import DatasetMissing, DatasetSource
from .imagefolder import IMAGE_EXTS, _dataset, _split_per_class

CORE50_SESSIONS = tuple(range(1, 12))
DOMAINNET_DOMAINS = ("clipart", "infograph", "painting", "quickdraw", "real", "sketch")


class CORe50(DatasetSource):
    """CORe50: one acquisition session (a domain) of 50 objects / 10 categories, 128x128 frames."""
    layout = ("<root>/core50/core50_128x128/s<session>/o<object>/C_<ss>_<oo>_<fff>.png "
              "(the official core50_128x128.zip unpacked under <root>/core50/)")
    defaults = {"session": 1, "label": "object", "image_size": 128, "test_fraction": 0.2, "split_seed": 0,
                "in_memory": False}

    def __init__(self, **options):
        super().__init__(**options)
        if self.options["session"] not in CORE50_SESSIONS:
            raise ValueError(f"core50: session = {self.options['session']!r}; the sessions are 1-11")
        if self.options["label"] not in ("object", "category"):
            raise ValueError(f"core50: label = {self.options['label']!r}; give \"object\" (50 classes) or "
                             "\"category\" (10 classes, 5 objects each)")
        if isinstance(self.options["image_size"], list):
            self.options["image_size"] = tuple(self.options["image_size"])

    def load(self, root, train, download=False):
        folder = Path(root or "") / "core50" / "core50_128x128" / f"s{self.options['session']}"
        if not folder.is_dir():
            raise DatasetMissing(self.name, folder, self.layout, download=False)
        objects = [f"o{i}" for i in range(1, 51)]
        files = [sorted(str(p) for p in (folder / o).glob("*") if p.suffix.lower() in IMAGE_EXTS)
                 if (folder / o).is_dir() else [] for o in objects]
        if not any(files):
            raise DatasetMissing(self.name, folder, self.layout, download=False)
        paths, labels = _split_per_class(files, train, self.options["test_fraction"],
                                         self.options["split_seed"] * 100 + self.options["session"], objects)
        if self.options["label"] == "category":   # objects o1-o5 are category 0, o6-o10 category 1, ...
            labels = [label // 5 for label in labels]
            classes = [f"category{i}" for i in range(10)]
        else:
            classes = objects
        return _dataset(self, paths, labels, classes, self.options["in_memory"])


class DomainNet(DatasetSource):
    """DomainNet: one of its six domains, 345 classes, the official train/test split files."""
    layout = ("<root>/domainnet/<domain>/<class>/<image>.jpg with <root>/domainnet/<domain>_train.txt and "
              "<domain>_test.txt (lines '<domain>/<class>/<image>.jpg <label>'), as the official archives unpack")
    defaults = {"domain": "real", "image_size": 224, "in_memory": False}

    def __init__(self, **options):
        super().__init__(**options)
        if self.options["domain"] not in DOMAINNET_DOMAINS:
            raise ValueError(f"domainnet: domain = {self.options['domain']!r}; the domains are "
                             f"{', '.join(DOMAINNET_DOMAINS)}")
        if isinstance(self.options["image_size"], list):   # options are cache keys: keep them hashable
            self.options["image_size"] = tuple(self.options["image_size"])

    def load(self, root, train, download=False):
        base = Path(root or "") / "domainnet"
        listing = base / f"{self.options['domain']}_{'train' if train else 'test'}.txt"
        if not listing.is_file():
            raise DatasetMissing(self.name, listing, self.layout, download=False)
        paths, labels, names = [], [], {}
        for line in listing.read_text().splitlines():
            if not line.strip():
                continue
            rel, label = line.rsplit(maxsplit=1)
            paths.append(str(base / rel))
            labels.append(int(label))
            names.setdefault(int(label), Path(rel).parts[1])
        classes = [names.get(i, str(i)) for i in range(max(names) + 1)] if names else []
        return _dataset(self, paths, labels, classes, self.options["in_memory"])
