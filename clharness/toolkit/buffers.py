"""Replay memories: fixed-budget exemplar buffers and the unbounded store of a joint learner.

Buffers keep (x, y) tensors on the data's device, preallocated at capacity on the first
``add``. Which slots change is decided with plain Python integers (one ``random.Random``
per buffer, so ``copy.deepcopy`` and snapshots carry the sampling state), then written with
one indexed copy per batch. ``exemplar_images()`` reports storage as CLDyB appendix B.4 counts
it: every stored image as uint8, one byte per element of x.
"""
from __future__ import annotations

import abc
import math
import random
from typing import Iterator

import torch

from .metering import uncounted


class _Buffer(abc.ABC):
    """Shared storage and sampling of the fixed-capacity buffers."""

    def __init__(self, capacity: int, seed: int = 0):
        if capacity < 0:
            raise ValueError(f"buffer capacity must be >= 0, got {capacity}")
        self.capacity = int(capacity)
        self.rng = random.Random(seed)
        self.x: torch.Tensor | None = None
        self.y: torch.Tensor | None = None
        self.size = 0
        self.seen = 0            # stream elements offered so far

    def __len__(self) -> int:
        return self.size

    def _allocate(self, x: torch.Tensor, y: torch.Tensor) -> None:
        if self.x is None:
            self.x = torch.empty((self.capacity, *x.shape[1:]), dtype=x.dtype, device=x.device)
            self.y = torch.empty((self.capacity,), dtype=y.dtype, device=y.device)

    def add(self, x: torch.Tensor, y: torch.Tensor) -> dict[int, int]:
        """Offer a batch to the buffer, row by row in order; ``_place`` is the policy. Returns
        slot -> batch row of the rows stored, so a caller can keep per-slot extras in parallel
        tensors (DER++'s logits). The FLOP meter steps aside (placement and copies: nothing to count)."""
        with uncounted("buffer add"):
            return self._add(x, y)

    def _add(self, x: torch.Tensor, y: torch.Tensor) -> dict[int, int]:
        labels = y.tolist()
        if self.capacity == 0 or not labels:
            self.seen += len(labels)
            return {}
        self._allocate(x, y)
        writes = self._place(labels)
        self._write(x, y, writes)
        return writes

    @abc.abstractmethod
    def _place(self, labels: list[int]) -> dict[int, int]:
        """The policy: slot -> batch row for the rows kept (later rows win a slot over earlier
        ones); updates ``size``, ``seen`` and the policy's own bookkeeping."""

    def _write(self, x: torch.Tensor, y: torch.Tensor, writes: dict[int, int]) -> None:
        """``writes`` maps slot -> row of the batch (later rows already won over earlier ones)."""
        if writes:
            slots = torch.tensor(list(writes.keys()), device=self.x.device)
            rows = torch.tensor(list(writes.values()), device=x.device)
            self.x[slots] = x.detach()[rows].to(self.x.dtype)
            self.y[slots] = y[rows].to(self.y.dtype)

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Everything stored, (x, y) views of the filled slots."""
        if self.x is None:
            return torch.empty(0), torch.empty(0, dtype=torch.long)
        return self.x[:self.size], self.y[:self.size]

    def sample(self, n: int, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``min(n, len(self))`` stored exemplars drawn uniformly without replacement."""
        size = self.size
        if size <= n:
            return self.tensors()
        with uncounted("buffer sample"):   # index ops only: the FLOP meter steps aside
            idx = torch.randperm(size, generator=generator)[:n]
            if idx.device != self.x.device:
                idx = idx.to(self.x.device)
            return self.x.index_select(0, idx), self.y.index_select(0, idx)   # cheaper than x[:size][idx]

    def exemplar_images(self) -> tuple[int, int]:
        per_image = math.prod(self.x.shape[1:]) if self.x is not None else 0
        return self.size, self.size * per_image

    def __repr__(self) -> str:
        return f"{type(self).__name__}(capacity={self.capacity}, size={self.size}, seen={self.seen})"


class ReservoirBuffer(_Buffer):
    """Reservoir sampling (Vitter 1985, Algorithm R): after n stream elements every one of them
    is in the buffer with probability capacity / n."""

    def _place(self, labels: list[int]) -> dict[int, int]:
        writes: dict[int, int] = {}
        for row in range(len(labels)):
            if self.size < self.capacity:          # fill phase
                slot = self.size
                self.size += 1
            else:                                  # keep the (seen+1)-th element w.p. capacity/(seen+1)
                slot = self.rng.randrange(self.seen + 1)
                if slot >= self.capacity:
                    self.seen += 1
                    continue
            writes.pop(slot, None)
            writes[slot] = row
            self.seen += 1
        return writes


class ClassBalancedBuffer(_Buffer):
    """Equal slots per seen class (the class-balanced memories of GDumb, Prabhu et al. 2020,
    and CBRS, Chrysakis & Moens 2020). While there is free space every element is stored. When
    full, an element of a class that holds fewer slots than the largest class evicts a random
    exemplar of a largest class (so new classes take their share and counts stay within one of
    each other); an element of a largest class replaces a random exemplar of its own class with
    probability (its class's slots) / (its class's elements seen), i.e. reservoir sampling within
    the class, so each class keeps a uniform sample of its own stream."""

    def __init__(self, capacity: int, seed: int = 0):
        super().__init__(capacity, seed)
        self.slots: dict[int, list[int]] = {}      # class -> its slots
        self.class_seen: dict[int, int] = {}       # class -> elements offered

    def _place(self, labels: list[int]) -> dict[int, int]:
        writes: dict[int, int] = {}
        slots, class_seen, randrange = self.slots, self.class_seen, self.rng.randrange   # hot loop: locals
        free = self.capacity - self.size
        largest = victims = None   # the largest class size and its classes: change only on an eviction
        for row, c in enumerate(labels):
            class_seen[c] = class_seen.get(c, 0) + 1
            own = slots.setdefault(c, [])
            if free:
                slot = self.size
                self.size += 1
                free -= 1
            else:
                if largest is None:
                    largest = max(map(len, slots.values()))
                if len(own) < largest:
                    if victims is None:
                        victims = [k for k, s in slots.items() if len(s) == largest]
                    donor = slots[self.rng.choice(victims)]
                    slot = donor.pop(randrange(len(donor)))
                    largest = victims = None
                else:
                    j = randrange(class_seen[c])
                    if j >= len(own):
                        continue
                    slot = own.pop(j)      # a uniformly random slot of this class
            own.append(slot)
            writes.pop(slot, None)
            writes[slot] = row
        self.seen += len(labels)
        return writes

    def class_counts(self) -> dict[int, int]:
        return {c: len(s) for c, s in sorted(self.slots.items()) if s}


class DataStore:
    """Every training set seen so far (a joint learner's memory), kept as the experiences'
    own data objects (uint8 images on the device) and batched as one shuffled union."""

    def __init__(self):
        self.parts: list = []

    def add(self, data) -> None:
        self.parts.append(data)

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)

    def exemplar_images(self) -> tuple[int, int]:
        return len(self), sum(len(p) * math.prod(p.input_shape) for p in self.parts)

    def batches(self, batch_size: int, generator: torch.Generator | None = None
                ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """One shuffled pass over the union. Parts with in-memory images (``TensorData``) are mixed
        within every batch; other parts (file streams) contribute whole batches, interleaved at
        random in proportion to their size."""
        if all(hasattr(p, "images") and hasattr(p, "prepare") for p in self.parts):
            yield from self._mixed(batch_size, generator)
        else:
            yield from self._interleaved(batch_size, generator)

    def _mixed(self, batch_size, generator):
        sizes = torch.tensor([len(p) for p in self.parts])
        bounds = torch.cumsum(sizes, 0)
        order = torch.randperm(int(bounds[-1]), generator=generator)
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            part = torch.bucketize(idx, bounds, right=True)
            xs, ys = [], []
            for k in part.unique().tolist():
                local = idx[part == k] - (bounds[k] - sizes[k])
                data = self.parts[k]
                local = local.to(data.images.device)
                xs.append(data.prepare(data.images[local]))
                ys.append(data.labels[local])
            yield torch.cat(xs), torch.cat(ys)

    def _interleaved(self, batch_size, generator):
        iters = [iter(p.batches(batch_size, shuffle=True, generator=generator)) for p in self.parts]
        left = [math.ceil(len(p) / batch_size) for p in self.parts]
        while sum(left):
            k = int(torch.multinomial(torch.tensor(left, dtype=torch.float), 1, generator=generator))
            left[k] -= 1
            batch = next(iters[k], None)
            if batch is not None:
                yield batch
