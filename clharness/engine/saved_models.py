"""Trained methods on disk (``--clh-save-models DIR``): each case's final method, saved after its last
task passed, as ``DIR/<record key>.pt``; ``clharness.load_case(..., trained=True, models=DIR)`` loads it
back into a freshly built case, ready to evaluate.

The whole method object is pickled (its networks, optimizers, memories, random generators, the
extra modules an expansion method grew), except its ``Context``: that holds the backbone factory
and the device of the machine that trained it, so the loading case supplies its own. A file names
the key it belongs to, so a record and its weights cannot be mixed up.
"""
from __future__ import annotations

import io
import pickle
from pathlib import Path

import torch

FORMAT = 1


def model_path(folder: str | Path, key: str) -> Path:
    return Path(folder) / f"{key}.pt"


class _Pickler(pickle.Pickler):
    def __init__(self, file, context):
        super().__init__(file, protocol=4)
        self.context = context

    def persistent_id(self, obj):
        return "context" if obj is self.context else None


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, context, device):
        super().__init__(file)
        self.context, self.device = context, device

    def persistent_load(self, pid):
        if pid == "context":
            return self.context
        raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")

    def find_class(self, module, name):   # tensors saved on another device come back on this one
        if module == "torch.storage" and name == "_load_from_bytes":
            return lambda b: torch.load(io.BytesIO(b), map_location=self.device, weights_only=False)
        return super().find_class(module, name)


def save(method, context, folder: str | Path, key: str, case_id: str) -> Path:
    """Write ``method`` (without its context) as ``folder/<key>.pt``, atomically."""
    path = model_path(folder, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    _Pickler(buffer, context).dump({"format": FORMAT, "key": key, "case": case_id, "method": method})
    tmp = path.with_suffix(".pt.tmp")
    tmp.write_bytes(buffer.getvalue())
    tmp.replace(path)
    return path


def load(folder: str | Path, key: str, context, device) -> object:
    """The method saved for ``key``, its context replaced by ``context`` (on ``device``)."""
    path = model_path(folder, key)
    if not path.exists():
        raise FileNotFoundError(f"no saved model for record key {key} in {folder} ({path.name}); run the case with "
                                f"--clh-save-models {folder} (add --clh-fresh if its record is stored already)")
    with open(path, "rb") as fh:
        payload = _Unpickler(fh, context, device).load()
    if payload.get("key") != key:
        raise ValueError(f"{path}: holds the model of key {payload.get('key')}, not {key}")
    return payload["method"]
