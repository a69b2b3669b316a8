"""Searched sequences as artifacts: the JSON file (docs/cldyb-sequence-format.md) and its replay as a
static class-incremental scenario for any method, searched with or held out (figure 3 protocol)."""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from ...method import Setting
from ...kinds import Scenario, Task
from .pool import DataPool, PoolError

FORMAT = "clharness-cldyb-sequence"
VERSION = 1


class SequenceError(ValueError):
    """A sequence file that cannot be read or replayed."""


def save(path: str | Path, sequence: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + f".tmp{time.time_ns()}")
    tmp.write_text(json.dumps({"format": FORMAT, "version": VERSION, **sequence}, indent=1))
    tmp.replace(path)   # atomic: a reader (another xdist worker) never sees half a file
    return path


def load(path: str | Path) -> dict:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise SequenceError(f"sequence file {str(path)!r} does not exist; run the search that writes it "
                            "(a cldyb scenario without `sequence`), or give the path of a published sequence") from None
    except ValueError as exc:
        raise SequenceError(f"sequence file {str(path)!r} is not JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise SequenceError(f"{path}: not a CLDyB sequence (expected \"format\": \"{FORMAT}\")")
    if data.get("version") != VERSION:
        raise SequenceError(f"{path}: sequence format version {data.get('version')!r}; this clharness reads {VERSION}")
    for key in ("steps", "classes_per_task", "pool"):
        if key not in data:
            raise SequenceError(f"{path}: missing key {key!r}; see docs/cldyb-sequence-format.md")
    sizes = {len(s["classes"]) for s in data["steps"]}
    if sizes != {data["classes_per_task"]}:
        raise SequenceError(f"{path}: every step must list classes_per_task = {data['classes_per_task']} classes; "
                            f"found step sizes {sorted(sizes)}")
    return data


def task_names(sequence: dict) -> list[list[str]]:
    return [list(step["classes"]) for step in sequence["steps"]]


def replay(sequence: dict, pool: DataPool, spec, seed: int, where: str = "the sequence") -> Scenario:
    """The sequence as a static scenario: task t = its K classes with global ids t*K .. t*K+K-1,
    train/val from the pool classes' train/val splits, test from their test splits."""
    tasks = task_names(sequence)
    flat = [c for t in tasks for c in t]
    if len(set(flat)) != len(flat):
        raise SequenceError(f"{where}: a class appears in more than one task")
    try:
        pool.check_names(flat, where)
    except PoolError as exc:
        raise SequenceError(str(exc)) from None
    K = sequence["classes_per_task"]
    built = [Task(tuple(range(t * K, (t + 1) * K)), pool.data(names, "train", t * K), pool.data(names, "test", t * K),
                  pool.data(names, "val", t * K)) for t, names in enumerate(tasks)]
    return Scenario(spec, seed, Setting.CLASS_IL, built, flat, pool.input_shape, pool.identity(),
                    extra={"sequence": sequence.get("use_case", ""), "search_seed": sequence.get("seed")})


def describe_device(device: torch.device) -> str:
    return str(device) if device.type != "cuda" else f"{device} ({torch.cuda.get_device_name(device)})"
