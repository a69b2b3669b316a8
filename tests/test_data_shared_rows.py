"""Issue 40 item 4 (peak memory): a scenario's tasks on the CPU read their rows from the loaded split
(data.base.SplitRows) instead of each holding a uint8 copy beside the cached split; nothing a method can
reach through the task's data shares storage with the loaded split, and ``images`` is still a copy of
exactly its rows when asked for."""
import copy
import gc
import pickle

import numpy as np
import torch

from clharness.data import ArrayDataset, TensorData, base
from clharness.data.subsets import on_device, relabel

IMAGES = torch.arange(10 * 1 * 2 * 2, dtype=torch.uint8).view(10, 1, 2, 2)
SPLIT = ArrayDataset(IMAGES, torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 0]), ["a", "b", "c"], "toy")
ROWS = np.array([1, 4, 7, 2])
MAPPING = np.array([5, 6, 7])   # dataset class -> global class


def _task(device="cpu") -> TensorData:
    return on_device(device, [0.0], [1.0], None, None)(relabel(SPLIT, ROWS, MAPPING))


def _copied(rows=ROWS) -> torch.Tensor:
    """What a task that holds its own copy (ArrayDataset.subset) hands out for these rows, in order."""
    return next(iter(TensorData(SPLIT.subset(torch.from_numpy(rows)), [0.0], [1.0]).batches(len(rows))))[0]


def _storages(obj) -> set:
    return {v.untyped_storage().data_ptr() for v in vars(obj).values() if isinstance(v, torch.Tensor)}


def test_a_task_reads_its_rows_from_the_loaded_split_without_a_copy():
    data = _task()
    assert "images" not in vars(data)
    assert IMAGES.untyped_storage().data_ptr() not in _storages(data)
    assert data.labels.tolist() == [6, 6, 6, 7] and data.input_shape == (1, 2, 2) and len(data) == 4
    xs, ys = zip(*data.batches(3))                          # in order: rows 1, 4, 7 | 2 (dataset classes 1, 1, 1 | 2)
    assert [y.tolist() for y in ys] == [[6, 6, 6], [7]]
    assert torch.equal(torch.cat(xs), _copied())
    gen = torch.Generator().manual_seed(0)
    order = torch.randperm(4, generator=torch.Generator().manual_seed(0))
    x, y = next(iter(data.batches(4, shuffle=True, generator=gen)))
    assert torch.equal(x, _copied(ROWS[order.numpy()])) and torch.equal(y, data.labels[order])
    assert "images" not in vars(data)


def test_images_asked_for_are_a_copy_of_its_rows():
    data = _task()
    images = data.images
    assert torch.equal(images, IMAGES[ROWS]) and images.untyped_storage().data_ptr() != IMAGES.untyped_storage().data_ptr()
    assert data.images is images                            # kept once made
    assert torch.equal(next(iter(data.batches(4)))[0], _copied())


def test_a_copied_or_pickled_task_holds_its_own_rows_and_the_table_is_released():
    data = _task()
    key = data._shared
    assert base._shared[key][0] is IMAGES
    for other in (copy.deepcopy(data), pickle.loads(pickle.dumps(data))):
        assert "_rows" not in vars(other) and torch.equal(other.images, IMAGES[ROWS])
    del data, other
    gc.collect()
    assert key not in base._shared                          # the last task reading the split is gone


def test_an_array_split_wrapped_whole_keeps_its_images():
    whole = TensorData(SPLIT, [0.0], [1.0])
    assert whole.images is SPLIT.images


def test_a_family_that_rewrites_its_task_images_gets_its_own_rows():
    # docs/families.md's family darkens a task's test images (task.images = ...): the task's data then holds
    # and batches the rewritten rows, and the loaded split is left as it was
    rows = relabel(SPLIT, ROWS, MAPPING)
    rows.images = rows.images // 2
    data = on_device("cpu", [0.0], [1.0], None, None)(rows)
    x, _ = next(iter(data.batches(len(ROWS))))
    assert (x * 255).round().flatten(1).tolist() == (IMAGES[torch.from_numpy(ROWS)] // 2).float().flatten(1).tolist()
    assert IMAGES.flatten().tolist() == list(range(40))
