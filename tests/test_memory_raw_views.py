"""Memories keep raw views: under a suite's augmentation recipe, the online-capable methods that
fill a memory from an offline task (GDumb, MIR, GMED, GEM, A-GEM) store the un-augmented images, as ER does
(PyCIL keeps raw exemplars and augments them when they are replayed)."""
import pytest
import torch

import clharness.toolkit.augment as A
from clharness.data.base import ArrayDataset, TensorData
from clharness.method import Context, Experience, Setting
from clharness_methods import REFERENCE_METHODS

METHODS = {cls.name: cls for cls in REFERENCE_METHODS}


class _Flat(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.out_dim = dim

    def forward(self, x):
        return x.flatten(1)


def _memory(method):
    store = getattr(method, "memory", None) or method.buffer
    if hasattr(store, "tasks"):                       # GEM / A-GEM: one sample per past task
        return torch.cat([x for x, _ in store.tasks])
    return store.tensors()[0]


@pytest.mark.parametrize("name", ["gdumb", "mir", "gmed", "gem", "agem"])
def test_memory_holds_raw_views_under_augmentation(name):
    torch.manual_seed(0)
    ds = ArrayDataset(torch.randint(0, 256, (40, 3, 16, 16), dtype=torch.uint8), torch.arange(40) % 4, list("abcd"))
    data = TensorData(ds, [0.5] * 3, [0.25] * 3, recipe=A.get("cifar"))
    context = Context(Setting.CLASS_IL, 4, (3, 16, 16), memory_size=12, epochs=1,
                      backbone_factory=lambda: _Flat(3 * 16 * 16))
    method = METHODS[name](context)
    method.learn(Experience(data, (0, 1, 2, 3), None, batch_size=8, seed=0))
    raw = data.prepare(data.images).flatten(1)
    stored = _memory(method).flatten(1)
    assert len(stored) == (12 if name in ("gdumb", "mir", "gmed") else 4 * min(10, method.hp["per_class"])
                           if name == "agem" else min(40, method.hp["patterns_per_task"]))   # A-GEM: ring per class
    if name == "gmed":   # GMED edits its memory during the task (issue 28): the rows not edited since stored
        stored = stored[method.edits == 0]
        assert len(stored) > 0
    # every stored row is exactly one of the raw images (an augmented view would match none)
    assert all((raw == row).all(1).any() for row in stored)
