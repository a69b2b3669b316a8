"""The ``domain`` scenario kind: domain-incremental learning (van de Ven et al., "Three types of
incremental learning", Nature MI 2022): every task has the same classes, under a new input distribution;
the task identity is never given, one head covers the classes (``setting = "domain-incremental"``).

``shift`` says where the domains come from:
- ``"permute"``: Permuted MNIST (Goodfellow et al. 2013; Kirkpatrick et al. 2017): task 0 is the data
  as it is, task t > 0 a fixed random permutation of the pixels (the same for every channel), drawn from
  the run's seed;
- ``"rotate"``: Rotated MNIST (Lopez-Paz and Ranzato 2017): task t rotated by ``angles[t]`` degrees
  (default: evenly spaced from 0 to 180 over the tasks, first 0);
- ``"split"``: domain-incremental Split MNIST (van de Ven et al. 2022): the dataset's classes in ``tasks``
  consecutive groups of the class order (``class_order``: "seed" shuffles it per seed as their
  data/load.py does, "fixed" keeps the dataset's), task t holds group t relabelled 0..k-1, so one head
  of k outputs answers "which class of its task" without the task id;
- ``"datasets"``: one dataset source per task (``domains = [{ dataset = "domainnet", options = { domain =
  "clipart" } }, ...]``, or CORe50's sessions): every domain must have the same classes.
Each task's test data carries its own domain, so R[i][j] is accuracy on domain j after domain i: the
metrics are per domain. Inputs are normalised with the first domain's statistics (the learner does not
know the later domains), or as the scenario's ``normalize`` says.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ...data import ArrayDataset, load_split
from ...kinds import Scenario, ScenarioError, Task
from ...scenario_spec import ScenarioSpec
from ...method import Setting
from ...toolkit import augment
from ...data.subsets import normalization, on_device, per_class_index

MULTI_DATASET = True
SHIFTS = ("permute", "rotate", "split", "datasets")

OPTIONS = {
    "shift": (str, "permute"),
    "angles": (list, []),        # rotate: degrees per task (default: 0 .. 180 evenly spaced)
    "domains": (list, []),       # datasets: [{dataset = "...", options = {...}}] one per task
}


def check(spec: ScenarioSpec) -> None:
    o = spec.options
    if spec.setting != Setting.DOMAIN_IL.value:
        raise ValueError(f"kind \"domain\" runs setting = \"domain-incremental\" (the same classes every task), "
                         f"not {spec.setting!r}")
    if o["shift"] not in SHIFTS:
        raise ValueError(f"shift = {o['shift']!r}; allowed: {', '.join(SHIFTS)}")
    if o["shift"] == "datasets":
        if len(o["domains"]) < 2 or not all(isinstance(d, dict) and isinstance(d.get("dataset"), str)
                                            for d in o["domains"]):
            raise ValueError("shift = \"datasets\" needs domains = [{ dataset = \"...\", options = { ... } }, ...] "
                             "with at least two entries")
        return
    if not spec.tasks or spec.tasks < 2:
        raise ValueError(f"shift = {o['shift']!r} needs tasks = T >= 2 (the number of domains)")
    if o["angles"] and len(o["angles"]) != spec.tasks:
        raise ValueError(f"angles has {len(o['angles'])} entries for {spec.tasks} tasks; give one angle per task")


def _source(datasets, name: str, options: dict):
    source = datasets[name](**options)
    source.name = name
    return source


def _limited(ds, limit, rng):
    if limit is None:
        return ds
    index = np.concatenate(per_class_index(ds.labels, range(len(ds.classes)), limit, rng))
    return ds.subset(torch.from_numpy(np.sort(index)).long())


def _shifted(ds: ArrayDataset, shift: str, t: int, seed: int, angle: float) -> ArrayDataset:
    images = ds.images
    if shift == "permute" and t > 0:
        n, c, h, w = images.shape
        perm = torch.randperm(h * w, generator=torch.Generator().manual_seed(seed * 1000 + t))
        images = images.reshape(n, c, h * w)[:, :, perm].reshape(n, c, h, w)
    elif shift == "rotate" and angle:
        from torchvision.transforms.v2 import functional as TF
        images = TF.rotate(images, float(angle))
    return ArrayDataset(images, ds.labels, ds.classes, ds.name)


def _group(ds: ArrayDataset, t: int, k: int, rank: torch.Tensor, classes: list[str]) -> ArrayDataset:
    """Task t of the "split" shift: the classes at positions t*k .. t*k+k-1 of the class order
    (``rank[c]``: class c's position), relabelled 0..k-1 by position."""
    position = rank[ds.labels]
    index = ((position >= t * k) & (position < (t + 1) * k)).nonzero().flatten()
    return ArrayDataset(ds.images[index], position[index] - t * k, classes, ds.name)


def build(spec: ScenarioSpec, datasets, seed: int, device: torch.device, data_root: Path | None = None,
          download: bool = False) -> Scenario:
    o = spec.options
    rng = np.random.default_rng([seed, 3])
    if o["shift"] == "datasets":
        sources = [_source(datasets, d["dataset"], d.get("options", {})) for d in o["domains"]]
        splits = [(load_split(s, data_root, True, download), load_split(s, data_root, False, download))
                  for s in sources]
        classes = list(splits[0][0].classes)
        for source, (train, _) in zip(sources, splits):
            if list(train.classes) != classes:
                raise ScenarioError(f"scenario {spec.name!r}: domain {source.identity()} has classes "
                                    f"{list(train.classes)[:5]}...; every domain needs the same classes as the first")
        identity = "+".join(s.identity() for s in sources)
    else:
        source = _source(datasets, spec.dataset, spec.dataset_options)
        train, test = load_split(source, data_root, True, download), load_split(source, data_root, False, download)
        if not isinstance(train, ArrayDataset):
            raise ScenarioError(f"scenario {spec.name!r}: shift = {o['shift']!r} transforms images in memory; "
                                f"dataset {spec.dataset!r} is read from files (use in_memory = true)")
        angles = o["angles"] or [180.0 * t / (spec.tasks - 1) for t in range(spec.tasks)]
        if o["shift"] == "split":
            k, rest = divmod(len(train.classes), spec.tasks)
            if rest:
                raise ScenarioError(f"scenario {spec.name!r}: shift = \"split\" needs tasks to divide the "
                                    f"{len(train.classes)} classes of {spec.dataset!r}; tasks = {spec.tasks}")
            order = (np.random.default_rng([seed, 5]).permutation(len(train.classes))
                     if spec.class_order == "seed" else np.arange(len(train.classes)))
            rank = torch.empty(len(order), dtype=torch.long)
            rank[torch.from_numpy(order)] = torch.arange(len(order))
            # class j of the shared head: the j-th class of every task, e.g. "T-shirt/top|Pullover|..."
            names = ["|".join(train.classes[order[t * k + j]] for t in range(spec.tasks)) for j in range(k)]
            splits = [(_group(train, t, k, rank, names), _group(test, t, k, rank, names)) for t in range(spec.tasks)]
        else:
            splits = [(_shifted(train, o["shift"], t, seed, angles[t]),
                       _shifted(test, o["shift"], t, seed, angles[t])) for t in range(spec.tasks)]
        classes = list(splits[0][0].classes)
        identity = f"{source.identity()}~{o['shift']}" + (f"{angles}" if o["shift"] == "rotate" else "") \
            + (f"{spec.tasks}" if o["shift"] == "split" else "")
    mean, std = normalization(spec, splits[0][0])
    wrap = on_device(device, mean, std, tuple(spec.image_size) if spec.image_size else None, spec.channels,
                    augment.get(spec.augment))
    tasks = []
    for train, test in splits:
        train = _limited(train, spec.max_train_per_class, rng)
        test = _limited(test, spec.max_test_per_class, rng)
        val = None
        if spec.validation:
            perm = torch.from_numpy(rng.permutation(len(train)))
            n_val = int(round(len(train) * spec.validation))
            val, train = train.subset(perm[:n_val].sort().values), train.subset(perm[n_val:].sort().values)
        tasks.append(Task(tuple(range(len(classes))), wrap(train), wrap(test), val and wrap(val)))
    return Scenario(spec, seed, Setting.DOMAIN_IL, tasks, classes, tasks[0].train.input_shape, identity)
