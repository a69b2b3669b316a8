"""Replay buffers: reservoir sampling probabilities, class balance, capacity, copies, accounting."""
import copy

import pytest
import torch

from clharness.toolkit.buffers import ClassBalancedBuffer, DataStore, ReservoirBuffer
from clharness.data.base import ArrayDataset, TensorData


def stream(labels, chunk=7):
    """Stream elements i = 0..n-1 as (x, y) batches; x encodes i so alignment can be checked."""
    labels = torch.as_tensor(labels)
    ids = torch.arange(len(labels), dtype=torch.float32)
    for s in range(0, len(labels), chunk):
        yield ids[s:s + chunk, None, None, None].expand(-1, 1, 2, 2).clone(), labels[s:s + chunk]


def stored_ids(buffer):
    x, _ = buffer.tensors()
    return x[:, 0, 0, 0].long()


def test_reservoir_keeps_each_element_with_probability_capacity_over_n():
    n, capacity, runs = 120, 12, 1500
    hits = torch.zeros(n)
    for seed in range(runs):
        buf = ReservoirBuffer(capacity, seed=seed)
        for x, y in stream(torch.arange(n), chunk=5):
            buf.add(x, y)
        assert len(buf) == capacity and buf.seen == n
        ids = stored_ids(buf)
        assert len(set(ids.tolist())) == capacity                 # no element stored twice
        assert torch.equal(buf.tensors()[1], ids)                 # x and y stay aligned
        hits[ids] += 1
    freq = hits / runs
    # each element: p = 0.1, sd of the estimate = sqrt(.1*.9/1500) ~ 0.0077; 4.5 sd tolerance
    assert (freq - capacity / n).abs().max() < 0.035
    # early, middle and late parts of the stream are equally likely to survive
    thirds = freq.view(3, -1).mean(1)
    assert (thirds - 0.1).abs().max() < 0.01


def test_reservoir_first_replacement_and_fill_phase_survival_are_exact():
    """Algorithm R keeps the (capacity+1)-th element w.p. capacity/(capacity+1) and every element,
    the ones stored while filling included, w.p. capacity/n. An off-by-one (randrange(seen)) always
    keeps element capacity+1 and leaves the fill-phase ones (capacity-1)/(n-1) = 0.0909 instead of 0.1."""
    capacity, n, runs = 10, 100, 3000
    ids, x = torch.arange(n), torch.zeros(n, 1)
    kept_next = kept_fill = 0
    for seed in range(runs):
        buf = ReservoirBuffer(capacity, seed=seed)
        buf.add(x[:capacity + 1], ids[:capacity + 1])
        kept_next += int(capacity in buf.tensors()[1].tolist())
        buf.add(x[capacity + 1:], ids[capacity + 1:])
        kept_fill += int((buf.tensors()[1] < capacity).sum())
    # 10/11 = 0.909, sd sqrt(.909*.091/3000) = 0.0053: 3.5 sd
    assert kept_next / runs == pytest.approx(capacity / (capacity + 1), abs=0.019)
    # 0.100, sd about sqrt(.1*.9/30000) = 0.0017: 3.5 sd, below the off-by-one's 0.0909 by 1.8 sd more
    assert kept_fill / (capacity * runs) == pytest.approx(capacity / n, abs=0.006)


def test_reservoir_fill_phase_and_capacity():
    buf = ReservoirBuffer(50)
    for i, (x, y) in enumerate(stream(torch.arange(200), chunk=16)):
        buf.add(x, y)
        assert len(buf) == min(50, (i + 1) * 16) <= 50
    assert buf.exemplar_images() == (50, 50 * 4)   # 2x2 one-channel images, one byte per element


@pytest.mark.parametrize("chunk", [1, 10, 64])
def test_class_balanced_counts_stay_within_one(chunk):
    capacity, per_class = 200, 250
    buf = ClassBalancedBuffer(capacity, seed=chunk)
    seen = 0
    for task in range(5):
        labels = torch.tensor([2 * task, 2 * task + 1]).repeat_interleave(per_class)
        labels = labels[torch.randperm(len(labels), generator=torch.Generator().manual_seed(task))]
        for x, y in stream(labels, chunk):
            buf.add(x, y)
            seen += len(y)
            assert len(buf) == min(capacity, seen) <= capacity
        counts = buf.class_counts()
        assert sorted(counts) == list(range(2 * task + 2))        # every class seen keeps slots
        assert max(counts.values()) - min(counts.values()) <= 1
        assert sum(counts.values()) == capacity
        _, y = buf.tensors()
        assert {c: int((y == c).sum()) for c in counts} == counts   # bookkeeping matches storage


@pytest.mark.parametrize("seed", range(5))
def test_class_balanced_stores_every_element_of_a_class_below_the_largest(seed):
    """CBRS: an element whose class is not (one of) the largest is always stored, evicting an exemplar
    of a largest class; so one class short of the largest still takes its slot, for every seed."""
    buf = ClassBalancedBuffer(5, seed=seed)
    buf.add(torch.zeros(5, 1), torch.tensor([0, 0, 0, 1, 1]))     # full: 3 of class 0, 2 of class 1
    buf.add(torch.ones(1, 1), torch.tensor([1]))                   # class 1 is one short of the largest
    assert buf.class_counts() == {0: 2, 1: 3}
    assert 1.0 in buf.tensors()[0].ravel().tolist()                # the new element is in the memory


def test_class_balanced_is_uniform_within_each_class():
    # one class, 100 elements, 20 slots once a second class arrives: every element of class 0
    # should survive with the same probability (reservoir sampling inside the class).
    runs, hits = 800, torch.zeros(100)
    for seed in range(runs):
        buf = ClassBalancedBuffer(40, seed=seed)
        for x, y in stream(torch.zeros(100, dtype=torch.long), chunk=9):
            buf.add(x, y)
        x1 = torch.full((100, 1, 2, 2), -1.0)
        buf.add(x1, torch.ones(100, dtype=torch.long))
        assert buf.class_counts() == {0: 20, 1: 20}
        ids = stored_ids(buf)
        hits[ids[ids >= 0]] += 1
    freq = hits / runs
    assert (freq - 0.2).abs().max() < 0.07          # sd ~ 0.014 per element
    assert (freq.view(4, -1).mean(1) - 0.2).abs().max() < 0.02


def test_sampling_is_without_replacement_and_reproducible():
    buf = ClassBalancedBuffer(30)
    for x, y in stream(torch.arange(100) % 3):
        buf.add(x, y)
    x, y = buf.sample(10, torch.Generator().manual_seed(0))
    x2, y2 = buf.sample(10, torch.Generator().manual_seed(0))
    assert torch.equal(x, x2) and torch.equal(y, y2)
    ids = x[:, 0, 0, 0].long()
    assert len(set(ids.tolist())) == 10 and set(ids.tolist()) <= set(stored_ids(buf).tolist())
    assert torch.equal(y, ids % 3)
    assert len(buf.sample(1000)[1]) == 30         # asking for more than stored gives everything


def test_empty_and_zero_capacity_buffers():
    for kind in (ReservoirBuffer, ClassBalancedBuffer):
        buf = kind(0)
        for x, y in stream(torch.arange(20)):
            buf.add(x, y)
        assert len(buf) == 0 and buf.exemplar_images() == (0, 0)
        assert len(buf.sample(5)[0]) == 0
        assert len(kind(10).sample(5)[0]) == 0


@pytest.mark.parametrize("kind", [ReservoirBuffer, ClassBalancedBuffer])
def test_deepcopy_is_independent_and_carries_the_sampling_state(kind):
    buf = kind(20, seed=3)
    batches = list(stream(torch.arange(300) % 4, chunk=11))
    for x, y in batches[:10]:
        buf.add(x, y)
    twin = copy.deepcopy(buf)
    before = stored_ids(buf).clone()
    for x, y in batches[10:]:
        twin.add(x, y)
    assert torch.equal(stored_ids(buf), before)    # the original did not move
    for x, y in batches[10:]:
        buf.add(x, y)
    assert torch.equal(stored_ids(buf), stored_ids(twin))   # same RNG state -> same future


def test_buffers_store_on_the_data_device_and_count_uint8_bytes():
    buf = ClassBalancedBuffer(10)
    buf.add(torch.randn(6, 3, 8, 8), torch.arange(6))
    assert buf.tensors()[0].device == torch.zeros(1).device
    assert buf.exemplar_images() == (6, 6 * 3 * 8 * 8)


def test_data_store_batches_the_union_once_per_pass():
    def part(labels):
        n = len(labels)
        images = torch.arange(n * 4, dtype=torch.uint8).view(n, 1, 2, 2)
        return TensorData(ArrayDataset(images, torch.tensor(labels), ["a"] * 10), [0.0], [1.0])
    store = DataStore()
    store.add(part([0] * 7 + [1] * 5))
    store.add(part([2] * 9))
    assert len(store) == 21 and store.exemplar_images() == (21, 21 * 4)
    labels = torch.cat([y for _, y in store.batches(4, torch.Generator().manual_seed(0))])
    assert sorted(labels.tolist()) == [0] * 7 + [1] * 5 + [2] * 9
    first = next(iter(store.batches(21, torch.Generator().manual_seed(0))))
    assert first[0].shape == (21, 1, 2, 2) and first[0].dtype == torch.float32


def _reference_class_balanced_place(buf, labels):
    """The class-balanced policy row by row with the largest class recomputed on every row (the
    definition; the buffer caches it between evictions). Same RNG calls in the same order."""
    writes, slots, seen = {}, buf.slots, buf.class_seen
    for row, c in enumerate(labels):
        seen[c] = seen.get(c, 0) + 1
        own = slots.setdefault(c, [])
        if buf.size < buf.capacity:
            slot, buf.size = buf.size, buf.size + 1
        else:
            largest = max(map(len, slots.values()))
            if len(own) < largest:
                donor = slots[buf.rng.choice([k for k, s in slots.items() if len(s) == largest])]
                slot = donor.pop(buf.rng.randrange(len(donor)))
            else:
                j = buf.rng.randrange(seen[c])
                if j >= len(own):
                    continue
                slot = own.pop(j)
        own.append(slot)
        writes.pop(slot, None)
        writes[slot] = row
    buf.seen += len(labels)
    return writes


@pytest.mark.parametrize("seed", range(4))
def test_class_balanced_placement_matches_the_row_by_row_definition(seed):
    # imbalanced classes arriving task by task and interleaved, uneven chunks: every eviction path
    g = torch.Generator().manual_seed(seed)
    labels = torch.cat([torch.randint(0, 2, (90,), generator=g), torch.randint(2, 7, (150,), generator=g),
                        torch.randint(0, 9, (200,), generator=g)])
    fast, ref = ClassBalancedBuffer(37, seed=seed), ClassBalancedBuffer(37, seed=seed)
    for x, y in stream(labels, chunk=11 + seed):
        assert fast._place(y.tolist()) == _reference_class_balanced_place(ref, y.tolist())
        assert fast.slots == ref.slots and fast.size == ref.size and fast.rng.getstate() == ref.rng.getstate()


def test_sample_equals_indexing_the_filled_slots():
    buf = ClassBalancedBuffer(30, seed=1)
    for x, y in stream(torch.arange(50) % 4):
        buf.add(x, y)
    x, y = buf.sample(8, torch.Generator().manual_seed(5))
    idx = torch.randperm(30, generator=torch.Generator().manual_seed(5))[:8]
    assert torch.equal(x, buf.tensors()[0][idx]) and torch.equal(y, buf.tensors()[1][idx])


@pytest.mark.parametrize("shape", [(1, 8, 8), (3, 5, 7), (1, 3, 3)])
def test_tensor_data_batches_from_the_cached_split_equal_per_batch_normalisation(shape):
    # odd sizes put rows across vector-width boundaries; the cached rows must match bit for bit
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (101, *shape), generator=g, dtype=torch.uint8)
    data = TensorData(ArrayDataset(images, torch.arange(101) % 5, list("abcde")), [0.3, 0.4, 0.5], [0.2, 0.25, 0.3],
                      channels=3 if shape[0] == 3 else None)
    assert data._prepared() is not None
    for shuffle in (False, True):
        got = list(data.batches(16, shuffle=shuffle, generator=torch.Generator().manual_seed(2)))
        order = torch.randperm(101, generator=torch.Generator().manual_seed(2)) if shuffle else torch.arange(101)
        assert len(got) == 7
        for k, (x, y) in enumerate(got):
            idx = order[16 * k:16 * k + 16]
            assert torch.equal(x, data.prepare(images[idx])) and torch.equal(y, data.labels[idx])
    data.images = images.flip(0)   # replaced images: the cache follows
    assert torch.equal(next(iter(data.batches(4)))[0], data.prepare(images.flip(0)[:4]))


def test_tensor_data_large_splits_are_not_cached(monkeypatch):
    monkeypatch.setattr(TensorData, "PREPARED_CACHE_BYTES", 100)
    data = TensorData(ArrayDataset(torch.zeros(10, 1, 4, 4, dtype=torch.uint8), torch.zeros(10), ["a"]), [0.5], [0.5])
    assert data._prepared() is None
    assert torch.equal(next(iter(data.batches(3)))[0], data.prepare(data.images[:3]))
