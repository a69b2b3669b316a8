"""M2I / I2M curricula (Faber et al. 2024, "From MNIST to ImageNet and back: benchmarking continual
curriculum learning"): six tasks, one per dataset, ten classes each, in increasing (M2I) or
decreasing (I2M) order of difficulty.

Preprocessing, as in the paper's section 3 and 4.1 and its public code
(github.com/lifelonglab/M2I_I2M_benchmark, ``scenarios/``):

- every image resized to 64x64 (``image_size``), grey images replicated to 3 channels (``channels``);
- classes balanced within each task and split: majority classes are cut down to the minority size,
  at most ``max_train_per_class`` / ``max_test_per_class`` images (500 in the paper) per class (a
  seeded random subset, the same for a dataset whatever its position in the curriculum);
- each task normalised with its own train split's channel statistics under ``protocol = "textbook"``
  (the paper's text names no constants); under ``protocol = "authors"`` with the fixed constants of the
  public code (``AUTHORS_NORMALIZATION``, below);
- global labels 0..59 in curriculum order (task t owns 10t..10t+9); task-incremental evaluation masks
  the logits to the task's ten classes, i.e. one head per task.

Two protocols (``protocol``), because the authors' public code differs from the paper's text in ways
that move every table:

- ``"textbook"`` (default): the text above; BWT is eq. 2's.
- ``"authors"``: what lifelonglab/M2I_I2M_benchmark runs (Avalanche 0.2.1). Task-incremental runs have
  labels 0-9 in every task and one shared 10-way head (``nc_benchmark(...,
  class_ids_from_zero_in_each_exp=True)`` with a single-head model, ``scenarios/scenarios_providers.py``),
  trained and evaluated over those ten outputs; class-incremental runs are as in the textbook protocol
  (``class_ids_from_zero_from_first_exp=True``: labels 0..59). Their analysis code's BWT (mean of
  R[t,e] - R[t-1,e]) is every record's ``bwt_authors`` metric, shown beside eq. 2's ``bwt``. The
  strategy side of their code is set in the suites' ``[hparams]`` (Table 9): ``ewc_mode = "separate"``
  with ``ewc_fisher = "minibatch"`` (Avalanche's EWCPlugin) and ``lwf_loss = "avalanche"`` (Avalanche's
  LwFPlugin). Inputs are normalised with the public code's fixed constants per dataset
  (``AUTHORS_NORMALIZATION``, from ``scenarios/datasets/*.py``, the ``*_with_resize`` transforms its
  scenarios use), not each task's statistics: MNIST and Fashion-MNIST (0.1307, 0.3081), Omniglot and
  CIFAR-10 (0.9221, 0.2681), SVHN and Tiny ImageNet none ([0, 1] pixels), one value for all three
  channels. A task name outside the six (a suite's own ``sources``) keeps its own statistics, and an
  explicit ``normalize`` other than "dataset" wins over both. Deliberate difference: their models have ``num_classes: 60`` outputs in task-incremental
  runs too, 50 of which are never a target; we keep the ten that are.

The ten Tiny ImageNet classes are selected by wnid and the ten Omniglot characters by name, never by
directory-listing order. Omniglot: the public code takes Omniglot's background set, splits each
character's 20 drawings 80/20 into train and test, and keeps classes 0-9, which are characters 1-10
of the Alphabet of the Magi (the first alphabet); we do the same with a fixed split (first 16
drawings by file name to train, last 4 to test), so Omniglot has 16 train / 4 test images per class.
Tiny ImageNet's val split (our test split) holds 50 images per class, so that task is evaluated on
50 per class, not 500.
"""
from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import torch

from ...toolkit import augment
from ...data import ArrayDataset, DatasetMissing, TensorData, load_split
from ...method import Setting
from ...scenario_spec import ScenarioSpec
from ...kinds import Scenario, ScenarioError, Task
from ...data.subsets import normalization
from .names import CURRICULA, SHARED_SEP

MULTI_DATASET = True

# Paper, Table 2 / section 3: Tiny ImageNet classes by name -> their ImageNet (WordNet) ids, as in
# Tiny ImageNet's wnids.txt and words.txt ("n02124075<TAB>Egyptian cat").
TINYIMAGENET_CLASSES = {
    "n02124075": "Egyptian cat", "n04067472": "reel", "n04540053": "volleyball", "n04099969": "rocking chair",
    "n07749582": "lemon", "n01641577": "bullfrog", "n02802426": "basketball", "n09246464": "cliff",
    "n07920052": "espresso", "n03970156": "plunger",
}
MAGI_CHARACTERS = tuple(f"Alphabet_of_the_Magi/character{i:02d}" for i in range(1, 11))
CLASSES_PER_TASK = 10

# task name -> the registered dataset and its options (a suite's ``sources`` table replaces an entry)
DEFAULT_SOURCES = {
    "mnist": {"dataset": "mnist"},
    "omniglot": {"dataset": "omniglot", "background": True, "characters": list(MAGI_CHARACTERS),
                 "train_per_class": 16},
    "fashion-mnist": {"dataset": "fashion-mnist"},
    "svhn": {"dataset": "svhn"},
    "cifar10": {"dataset": "cifar10"},
    "tinyimagenet": {"dataset": "tinyimagenet", "wnids": list(TINYIMAGENET_CLASSES)},
}
assert tuple(DEFAULT_SOURCES) == CURRICULA["m2i"], "names.M2I_ORDER and DEFAULT_SOURCES disagree"

# protocol = "authors": the public code's Normalize(mean, std) per dataset, applied after ToTensor
# (pixels in [0, 1]) and the grey-to-RGB copy, one value broadcast over the channels
# (lifelonglab/M2I_I2M_benchmark scenarios/datasets/{mnist,omniglot,fashion_mnist,svhn,cifar,
# load_imagenet}.py; CIFAR-10 reuses Omniglot's constants and Fashion-MNIST MNIST's, as there).
AUTHORS_NORMALIZATION = {
    "mnist": ([0.1307], [0.3081]),
    "omniglot": ([0.9221], [0.2681]),
    "fashion-mnist": ([0.1307], [0.3081]),
    "svhn": ([0.0], [1.0]),            # ToTensor and Resize only
    "cifar10": ([0.9221], [0.2681]),
    "tinyimagenet": ([0.0], [1.0]),    # ToTensor only
}

OPTIONS = {
    "curriculum": ((str, list), "m2i"),   # "m2i", "i2m" or a list of task names in learning order
    "sources": (dict, {}),                # task name -> {dataset = "...", <its options>}
    "balance": (bool, True),              # cut majority classes to the minority size (per task and split)
    "protocol": (str, "textbook"),        # "textbook" (the paper's text) or "authors" (their public code)
}
PROTOCOLS = ("textbook", "authors")
LATER_OPTIONS = {"protocol": "textbook"}   # added after records were stored: left out of keys at its default


def task_names(spec: ScenarioSpec) -> tuple[str, ...]:
    order = spec.options["curriculum"]
    return CURRICULA[order] if isinstance(order, str) else tuple(order)


def check(spec: ScenarioSpec) -> None:
    order, sources = spec.options["curriculum"], spec.options["sources"]
    if isinstance(order, str) and order not in CURRICULA:
        raise ValueError(f"curriculum = {order!r}; allowed: {', '.join(map(repr, CURRICULA))} or a list of task names")
    names = task_names(spec)
    if not names or not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        raise ValueError(f"curriculum = {order!r} must list distinct task names")
    unknown = [n for n in names if n not in DEFAULT_SOURCES and n not in sources]
    if unknown:
        raise ValueError(f"curriculum task(s) {unknown} have no source; known tasks: {', '.join(DEFAULT_SOURCES)}, "
                         "or add sources.<name> = {{ dataset = \"...\" }}")
    for name, entry in sources.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("dataset"), str):
            raise ValueError(f"sources.{name} = {entry!r} must be a table with dataset = \"<registered name>\"")
    if spec.setting_enum is Setting.ONLINE:
        raise ValueError("the curriculum is offline: setting must be class-incremental or task-incremental")
    if spec.channels not in (None, 1, 3):
        raise ValueError(f"channels = {spec.channels} must be 1 or 3")
    if spec.options["protocol"] not in PROTOCOLS:
        raise ValueError(f"protocol = {spec.options['protocol']!r}; allowed: {', '.join(map(repr, PROTOCOLS))} "
                         "(\"authors\": the public code's shared task-incremental head and BWT)")


def shared_head(spec: ScenarioSpec) -> bool:
    """The authors' task-incremental protocol: labels 0-9 in every task, one 10-way head."""
    return spec.options["protocol"] == "authors" and spec.setting_enum is Setting.TASK_IL


def task_normalization(spec: ScenarioSpec, name: str, train_sub) -> tuple[list[float], list[float]]:
    """(mean, std) of one curriculum task: the authors' constants for the six datasets under
    ``protocol = "authors"`` (unless the scenario sets its own ``normalize``), else the scenario's
    ``normalize`` (default "dataset": this task's train statistics)."""
    if spec.options["protocol"] == "authors" and spec.normalize == "dataset" and name in AUTHORS_NORMALIZATION:
        mean, std = AUTHORS_NORMALIZATION[name]
        return list(mean), list(std)
    return normalization(spec, train_sub)


def _load(name: str, entry: dict, t: int, T: int, datasets, root, download):
    options = {k: v for k, v in entry.items() if k != "dataset"}
    where = f"curriculum task {t + 1} of {T} ({name})"
    try:
        source = datasets[entry["dataset"]](**options)
    except (LookupError, ValueError) as exc:   # unknown dataset name (RegistryError) or option
        raise ScenarioError(f"{where}: {exc}") from None
    source.name = entry["dataset"]
    try:
        train, test = (load_split(source, root, split, download) for split in (True, False))
    except DatasetMissing as exc:
        raise ScenarioError(f"{where}: {exc}") from None
    except ValueError as exc:
        text = str(exc)
        missing = [f"{w} ({c})" for w, c in TINYIMAGENET_CLASSES.items() if w in text]
        if missing:   # name the paper's class, not only its wnid
            text += f". Missing M2I class(es): {', '.join(missing)}; the tree needs all ten of {list(TINYIMAGENET_CLASSES)}"
        raise ScenarioError(f"{where}: {text}") from None
    for ds in (train, test):
        if not isinstance(ds, ArrayDataset):
            raise ScenarioError(f"{where}: dataset {entry['dataset']!r} streams its images from files; the curriculum "
                                "needs them in memory (ImageFolder: in_memory = true)")
    classes = sorted(set(train.labels.tolist()))
    if len(classes) != CLASSES_PER_TASK or len(train.classes) != CLASSES_PER_TASK:
        raise ScenarioError(f"{where}: dataset {source.identity()} has {len(train.classes)} classes "
                            f"({len(classes)} with train images); every curriculum task needs exactly "
                            f"{CLASSES_PER_TASK}: select them with the dataset's options")
    return source, train, test


def _balanced_index(labels: torch.Tensor, cap: int | None, balance: bool, rng: np.random.Generator, what: str):
    """Per class: a seeded random subset of size min(minority class size, cap) (balance) or min(own, cap)."""
    labels = labels.numpy()
    groups = [np.flatnonzero(labels == c) for c in range(CLASSES_PER_TASK)]
    empty = [c for c, g in enumerate(groups) if len(g) == 0]
    if empty:
        raise ScenarioError(f"{what}: class(es) {empty} have no images")
    keep = min(len(g) for g in groups) if balance else None
    out = []
    for g in groups:
        n = min(x for x in (len(g), keep, cap) if x is not None)
        out.append(np.sort(rng.choice(g, n, replace=False)) if n < len(g) else g)
    return np.concatenate(out)


def build(spec: ScenarioSpec, datasets, seed: int, device: torch.device,
          data_root: Path | None = None, download: bool = False) -> Scenario:
    names = task_names(spec)
    sources = spec.options["sources"]
    image_size = tuple(spec.image_size) if spec.image_size else (64, 64)
    channels = spec.channels or 3
    recipe = augment.get(spec.augment)   # M2I's public code: none (scenarios/datasets/*)
    shared = shared_head(spec)
    tasks, class_names, identities, counts = [], [], [], {}
    for t, name in enumerate(names):
        entry = sources.get(name) or DEFAULT_SOURCES[name]
        source, train, test = _load(name, entry, t, len(names), datasets, data_root, download)
        # the same images for a dataset in M2I and I2M: the draw depends on the seed and the task's name
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
        where = f"curriculum task {t + 1} ({name})"
        train_idx = _balanced_index(train.labels, spec.max_train_per_class, spec.options["balance"], rng,
                                    f"{where}, train split")
        test_idx = _balanced_index(test.labels, spec.max_test_per_class, spec.options["balance"], rng,
                                   f"{where}, test split")
        offset = 0 if shared else t * CLASSES_PER_TASK
        train_sub, test_sub = (ds.subset(torch.from_numpy(idx).long()) for ds, idx in
                               ((train, train_idx), (test, test_idx)))
        train_sub.labels = train_sub.labels + offset
        test_sub.labels = test_sub.labels + offset
        mean, std = task_normalization(spec, name, train_sub)
        wrap = [TensorData(ds, mean, std, device, image_size=image_size, channels=channels, recipe=recipe)
                for ds in (train_sub, test_sub)]
        if wrap[0].images.shape[1] not in (1, channels):
            raise ScenarioError(f"{where}: images have {wrap[0].images.shape[1]} channels; expected 1 or {channels}")
        tasks.append(Task(tuple(range(offset, offset + CLASSES_PER_TASK)), *wrap))
        class_names += [f"{name}/{c}" for c in train.classes]
        identities.append(f"{name}={source.identity()}")
        counts[name] = {"train": len(train_idx), "test": len(test_idx)}
    dataset = f"curriculum({'; '.join(identities)}; balance={spec.options['balance']})"
    if shared:   # output k stands for class k of every task: named by those, in learning order
        dataset = dataset[:-1] + "; shared 10-way head)"
        class_names = [SHARED_SEP.join(class_names[k::CLASSES_PER_TASK]) for k in range(CLASSES_PER_TASK)]
    return Scenario(spec, seed, spec.setting_enum, tasks, class_names, (channels, *image_size), dataset,
                    extra={"task_names": list(names), "task_counts": counts})


def report_sections(records, fmt, harness) -> list[tuple[str, str]]:
    """``clharness report``: the paper's metrics per method (ACC eq. 1, BWT eq. 2 and the authors'
    code's BWT beside it, FWT eq. 3 for task-incremental runs), then the curriculum effect table
    (M2I minus I2M) when records hold paired runs."""
    from . import report_html
    return report_html.text_sections(records, fmt)


def html_sections(records, harness, drawing) -> list[tuple[str, str]]:
    """The HTML report: the effect table with one bar chart per metric, and the M2I / I2M heatmaps."""
    from . import report_html
    return report_html.html_sections(records, drawing)


def page_html_sections(records, page, harness, drawing) -> list[tuple[str, str]]:
    """As html_sections, for one suite of a page: its runs paired with the other direction's runs of
    any suite of the page (an ``m2i`` suite with an ``i2m`` suite), each pair drawn once."""
    from . import report_html
    return report_html.html_sections(records, drawing, page)


def terminal_summary(clh, terminalreporter) -> None:
    """The paper's metrics and the curriculum effect of the session's curriculum runs at session end."""
    from . import report_html
    for title, text in report_html.text_sections(clh.records, "github"):
        terminalreporter.section(f"clharness {title}")
        terminalreporter.write_line(text)


def write_scorecard(path, records, harness) -> None:
    """A .md --clh-scorecard gets the paper's metrics and the curriculum effect appended (.json and .csv
    already hold every run's acc, bwt, bwt_authors and fwt)."""
    from . import report_html
    path = Path(path)
    sections = report_html.text_sections(records, "github") if path.suffix == ".md" else []
    if sections:
        with open(path, "a") as fh:
            fh.write("".join(f"\n## {title}\n\n{text}\n" for title, text in sections))
