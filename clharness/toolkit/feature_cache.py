"""Frozen-backbone features computed once per image and cached.

A method built on a frozen pretrained backbone (SimpleCIL, RanPAC, the queries of L2P and
DualPrompt) passes the same images through it again and again: once per epoch, once per
evaluation, and, in a CLDyB search, once more in every look-ahead clone. ``FrozenFeatures``
wraps the backbone and remembers the features of every image it has seen, keyed by the image
itself: a 128-bit fingerprint of the exact bits of the normalised input, computed on the input's
device with exact integer arithmetic (wrap-around int64 sums do not depend on the batch
composition or summation order, so an image gets the same key in any batch).

``copy.deepcopy`` returns the same object: the backbone never changes, so snapshots and clones
of a method share the backbone and the cache instead of copying a ViT per look-ahead.

Across methods and runs: caches over backbones with the same weights share one backbone and one
feature table (``share=True``, the default), found in a small process-wide pool by a digest of the
backbone's module structure and the exact bytes of its weights. So several methods on one frozen
pretrained ViT run it once per image, and re-running a finished frozen-backbone method (another
seed of a suite, a CLDyB look-ahead, a stored run redone) does no backbone forward pass at all.
A randomly initialised backbone has other weights per seed, hence its own entry.

FLOPs (engine/flops.py): a run's count must not depend on what ran before it in the process, so inside a
counted run (``counted_run``) a lookup served by rows this run did not compute is charged to the run as the
backbone passes it would have made alone: the FLOPs per image measured when the table computed those rows.
"""
from __future__ import annotations

import contextlib
import hashlib
import threading
from collections import OrderedDict

import torch
from torch import nn

_KEY_SEED = 0x5EED
POOL_SIZE = 8        # backbones (with their feature tables) the shared pool keeps, least recently used out


class FeatureTable:
    """Cached features of one backbone's weights: fingerprint -> row of ``table``. ``calls`` and
    ``images`` count the backbone passes and the images they computed, whoever asked."""

    def __init__(self):
        self.rows: dict[int, int] = {}
        self.table: torch.Tensor | None = None
        self.size = 0
        self.calls = self.images = 0
        self.flops_per_image: dict[tuple, int] = {}   # input shape -> backbone FLOPs of one image

    def append(self, keys: list[int], feats: torch.Tensor) -> None:
        need = self.size + len(keys)
        if self.table is None or need > self.table.shape[0]:
            grown = torch.empty(max(need, 2 * (0 if self.table is None else self.table.shape[0]), 256),
                                feats.shape[1], dtype=feats.dtype, device=feats.device)
            if self.table is not None:
                grown[:self.size] = self.table[:self.size]
            self.table = grown
        self.table[self.size:need] = feats
        for j, k in enumerate(keys):
            self.rows[k] = self.size + j
        self.size = need


_run = threading.local()   # the counted run of this thread (engine.flops.RunMeter): meter and paid rows


@contextlib.contextmanager
def counted_run(meter):
    """While ``meter`` counts a run in this thread (it has ``total_flops`` and ``add(flops)``): features served
    from rows the run did not compute itself are charged to it once per image, as if it ran alone. Where the
    FLOPs per image of those rows are unknown (computed outside any counted run), ``meter.incomplete`` says so."""
    previous = getattr(_run, "state", None)
    _run.state = (meter, set())
    try:
        yield
    finally:
        _run.state = previous


def current_run():
    """The counted run of this thread (what ``counted_run`` set), or None: lent to another thread that
    works for the run while this one waits (``counted_as``)."""
    return getattr(_run, "state", None)


@contextlib.contextmanager
def counted_as(state):
    """In this thread, charge served features to the counted run ``state`` (``current_run()`` of another thread,
    its meter and the rows it paid for), as that thread would: a seed ensemble's coordinator training a paused member."""
    previous = getattr(_run, "state", None)
    _run.state = state
    try:
        yield
    finally:
        _run.state = previous


_POOL: "OrderedDict[str, tuple[nn.Module, FeatureTable]]" = OrderedDict()


def clear_shared() -> None:
    """Empty the process-wide pool (backbones already wrapped keep their tables)."""
    _POOL.clear()


def shared_tables() -> list[FeatureTable]:
    """The feature tables in the pool, oldest first (benchmarks read their counters)."""
    return [table for _, table in _POOL.values()]


def weights_digest(module: nn.Module) -> str:
    """Digest of a module's structure (module types and their plain settings, e.g. a ViT's pooling
    or a VPT's depth flag) and the exact bytes of every parameter and buffer."""
    h = hashlib.sha1(usedforsecurity=False)   # identity, not security: the fastest here (hardware SHA)
    for name, m in module.named_modules():
        plain = sorted((k, repr(v)) for k, v in vars(m).items()
                       if not k.startswith("_") and k != "training" and isinstance(v, (bool, int, float, str, tuple, type(None))))
        h.update(f"{name}:{type(m).__module__}.{type(m).__qualname__}:{plain};".encode())
    for name, t in module.state_dict(keep_vars=True).items():
        t = t.detach()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}:{t.device};".encode())
        h.update(t.contiguous().reshape(-1).view(torch.uint8).cpu().numpy())   # the buffer itself, no copy
    return h.hexdigest()


class FrozenFeatures(nn.Module):
    """``forward(x)``: the frozen backbone's features of ``x``, from the cache where known.

    ``backbone``: a module mapping normalised inputs to (N, out_dim) features; it is frozen
    (``requires_grad_(False)``, eval mode) here. ``store``: device that keeps the cached
    features (default: where they are computed). ``amp``: run the backbone under float16 autocast
    on CUDA (features are stored as float32 either way, the same whoever asks first).
    ``share``: use the pool's backbone and feature table when one with the same weights (and the
    same ``amp`` and ``store``) is there, else enter this one (see the module docstring).
    ``calls``/``hits``/``misses`` count this wrapper's backbone forward calls and per-image lookups;
    ``features.calls``/``features.images`` count those of everyone sharing the table."""
    # The shared pretrained encoder: Method.memory_report leaves its weights out (CLDyB B.4).
    frozen_shared = True

    def __init__(self, backbone: nn.Module, store: torch.device | str | None = None, amp: bool = False,
                 share: bool = True):
        super().__init__()
        self.amp = amp
        backbone = backbone.requires_grad_(False).eval()
        self.out_dim = backbone.out_dim
        self.store = None if store is None else torch.device(store)
        self.features = FeatureTable()
        if share:
            key = f"{weights_digest(backbone)}|amp={amp}|store={self.store}"
            if key in _POOL:
                _POOL.move_to_end(key)
                backbone, self.features = _POOL[key]   # the same weights: one backbone, one table
            else:
                _POOL[key] = (backbone, self.features)
                while len(_POOL) > POOL_SIZE:
                    _POOL.popitem(last=False)
        self.backbone = backbone
        self.calls = self.hits = self.misses = 0
        self._weights: dict[tuple[str, int], torch.Tensor] = {}

    def __deepcopy__(self, memo):
        memo[id(self)] = self
        return self

    def train(self, mode: bool = True):
        super().train(mode)
        self.backbone.eval()     # frozen: fixed normalisation statistics, no dropout
        return self

    def fingerprints(self, x: torch.Tensor) -> list[int]:
        """One 128-bit integer per image: two wrap-around int64 dot products of the input's float32
        bit patterns with fixed random int64 weights (exact, so identical bits give identical keys)."""
        bits = x.detach().float().contiguous().view(torch.int32).flatten(1).long()
        key = (str(x.device), bits.shape[1])
        if key not in self._weights:
            gen = torch.Generator().manual_seed(_KEY_SEED)
            w = torch.randint(-2**62, 2**62, (2, bits.shape[1]), generator=gen, dtype=torch.long)
            self._weights[key] = w.to(x.device)
        w = self._weights[key]
        h = torch.stack([(bits * w[0]).sum(1), (bits * w[1]).sum(1)], 1).cpu().tolist()
        return [(a << 64) ^ (b & 0xFFFFFFFFFFFFFFFF) for a, b in h]

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keys = self.fingerprints(x)
        cache = self.features
        missing = [i for i, k in enumerate(keys) if k not in cache.rows]
        self.hits += len(keys) - len(missing)
        self.misses += len(missing)
        if missing:
            # duplicates inside one batch are computed once
            first: dict[int, int] = {}
            for i in missing:
                first.setdefault(keys[i], i)
            idx = torch.tensor(list(first.values()), device=x.device)
            self.calls += 1
            cache.calls += 1
            cache.images += len(first)
            run = getattr(_run, "state", None)
            before = run[0].total_flops if run else 0
            with torch.autocast("cuda", dtype=torch.float16, enabled=self.amp and x.is_cuda):
                feats = self.backbone(x.index_select(0, idx)).float()
            if run:   # a pass's FLOPs are linear in the batch (per-image matmuls and convolutions)
                spent, n = run[0].total_flops - before, len(first)
                if spent % n == 0:
                    cache.flops_per_image[tuple(x.shape[1:])] = spent // n
                run[1].update((id(cache), k) for k in first)
            cache.append(list(first), feats.to(self.store) if self.store is not None else feats)
        self._charge(keys, tuple(x.shape[1:]))
        rows = torch.tensor([cache.rows[k] for k in keys], device=cache.table.device)
        return cache.table.index_select(0, rows).to(x.device)

    def _charge(self, keys: list[int], shape: tuple) -> None:
        """Charge the counted run for the images of ``keys`` it has not paid for (computed by another run)."""
        run = getattr(_run, "state", None)
        if run is None:
            return
        meter, paid = run
        unpaid = {(id(self.features), k) for k in keys} - paid
        if not unpaid:
            return
        per_image = self.features.flops_per_image.get(shape)
        if per_image is None:
            meter.incomplete = ("FLOPs not counted: cached features of a frozen backbone computed outside a counted "
                                "run served this one")
        else:
            meter.add(per_image * len(unpaid))
        paid.update(unpaid)

    @property
    def size(self) -> int:
        """Number of images whose features are cached."""
        return self.features.size

    def clear(self) -> None:
        """Forget every cached feature (call after changing the backbone's weights): this wrapper
        gets a table of its own, out of the pool (the other holders keep the old one)."""
        self.features = FeatureTable()


def frozen_features(module: nn.Module, store: torch.device | str | None = None) -> FrozenFeatures:
    """``module`` wrapped in a cache (an existing ``FrozenFeatures`` is returned as is)."""
    return module if isinstance(module, FrozenFeatures) else FrozenFeatures(module, store)
