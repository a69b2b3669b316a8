"""Evaluation never changes a method (issue 38 item 4): the method's state is fingerprinted before an
evaluation and compared after it, so a ``predict`` that trains on test data (entropy minimisation on the
test batch, a BatchNorm left in train mode, test images written into a replay buffer) fails its case.

The state is every tensor the method holds: parameters, buffers and gradients of its modules, optimizer
state, and tensors in its attributes, lists, dicts and plain objects (replay buffers). A tensor's
fingerprint is cheap, read without touching its values: torch's version counter ``_version`` (bumped by
every in-place op on the tensor or a ``detach()``/view of it, under ``no_grad`` too, so optimizer steps
and ``+=`` are seen), its storage address, shape, dtype and device (a tensor replaced by another, e.g.
``p.data = new``, moves its address). What a version counter misses: writes through ``p.data`` (``.data``
is a new alias with its own counter: ``p.data.add_(1)`` leaves ``p._version`` as it was) and writes inside
a fused kernel that does not bump it (BatchNorm's running mean and variance; its ``num_batches_tracked``
is bumped by Python's ``+=``, so a BatchNorm in train mode is still caught). A gradient step usually
leaves gradients behind, which are fingerprinted too. Module attributes that are not registered
parameters or buffers are not walked: they hold caches (``FrozenFeatures``' feature table fills at
evaluation by design, without changing any output).
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator

import torch
from torch import nn

from .method import MethodError

_MAX_DEPTH = 6                                          # plain objects inside plain objects, at most
_SCALARS = (int, float, complex, str, bytes, bool, type(None))
_FOREIGN = ("torch", "numpy", "builtins", "random", "pandas", "sklearn", "timm")   # library objects: not walked


def _tensor_print(t: torch.Tensor) -> tuple:
    try:
        version = t._version
    except RuntimeError:          # an inference-mode tensor keeps no counter: it cannot be changed in place
        version = None
    try:
        address = t.data_ptr()
    except RuntimeError:          # sparse and other storage-less layouts
        address = id(t)
    return version, address, tuple(t.shape), t.dtype, t.device


def fingerprint(method) -> dict[str, tuple | None]:
    """Name -> fingerprint of every tensor of ``method``'s state (names as a reader finds them:
    ``model.head.weight``, ``model.head.weight.grad``, ``opt.state[model.head.weight].exp_avg``,
    ``buffer.x``, ``fisher['head.weight']``)."""
    out: dict[str, tuple | None] = {}
    names: dict[int, str] = {}          # id(parameter) -> its first name, for optimizer state
    optimizers: list[tuple[str, torch.optim.Optimizer]] = []
    seen: set[int] = set()
    for attr, value in vars(method).items():
        if attr != "context":
            _walk(value, attr, out, names, optimizers, seen, 0)
    for path, opt in optimizers:
        for i, (param, state) in enumerate(opt.state.items()):
            label = names.get(id(param), f"param {i}")
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    out[f"{path}.state[{label}].{key}"] = _tensor_print(value)
    return out


def _walk(obj: Any, path: str, out: dict, names: dict, optimizers: list, seen: set, depth: int) -> None:
    if isinstance(obj, _SCALARS) or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        out[path] = _tensor_print(obj)
        if obj.requires_grad:
            out[f"{path}.grad"] = None if obj.grad is None else _tensor_print(obj.grad)
    elif isinstance(obj, nn.Module):
        for name, p in obj.named_parameters(prefix=path):
            names.setdefault(id(p), name)
            if id(p) not in seen:
                seen.add(id(p))
                out[name] = _tensor_print(p)
                out[f"{name}.grad"] = None if p.grad is None else _tensor_print(p.grad)
        for name, b in obj.named_buffers(prefix=path):
            if id(b) not in seen:
                seen.add(id(b))
                out[name] = _tensor_print(b)
    elif isinstance(obj, torch.optim.Optimizer):
        optimizers.append((path, obj))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _walk(v, f"{path}[{k!r}]", out, names, optimizers, seen, depth)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _walk(v, f"{path}[{i}]", out, names, optimizers, seen, depth)
    elif depth < _MAX_DEPTH and hasattr(obj, "__dict__") and not isinstance(obj, type) \
            and not callable(obj) and type(obj).__module__.split(".")[0] not in _FOREIGN:
        for attr, value in vars(obj).items():
            _walk(value, f"{path}.{attr}", out, names, optimizers, seen, depth + 1)


def first_change(before: dict, after: dict) -> str | None:
    """The first tensor name whose fingerprint differs (added or gone included), or None."""
    for name in dict.fromkeys([*before, *after]):
        if before.get(name, "absent") != after.get(name, "absent"):
            return name
    return None


@contextlib.contextmanager
def unchanged(method, call: str = "predict()") -> Iterator[None]:
    """Fail (MethodError) when ``method``'s state differs after the block from before it."""
    before = fingerprint(method)
    yield
    name = first_change(before, fingerprint(method))
    if name is not None:
        raise MethodError(f"{call} changed {name}: evaluation must not change the method; "
                          "test data must not train it")


def never_trains(evaluate):
    """Decorator of an evaluation function whose first argument is the method: the method's state is
    fingerprinted before the call (after ``consolidate``, which may change it) and checked after it."""
    @functools.wraps(evaluate)
    def guarded(method, *args, **kwargs):
        with unchanged(method):
            return evaluate(method, *args, **kwargs)
    return guarded
