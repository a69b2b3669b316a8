"""Nothing within a method's reach holds test data, a later task's data, or a hidden task id.

The adversary is ``plugin_leak_spy.LeakSpy``: it passes everything the runner hands it (context,
the backbone it builds, experiences, batches) to ``reachable``, a generic, bounded walk of the
object graph (attributes, slots, containers, closure cells, defaults, ``__self__`` of bound
methods, partials, generator frames, a tensor's ``_base`` and ``grad``). Every tensor and array
found is checked against the scenario's secrets at that moment: it must not share storage with,
nor equal, a test (or validation) split or the train data of a task (or stream instances) still
to come; and where the setting hides task ids, no ``task_id`` anywhere may hold one. Every
scenario kind is covered (splits in class-IL and task-IL, the STF online protocol, the M2I
curriculum, both GTEP phases, a CLDyB search and its replay), on the offline suites' quick budgets.

Not covered, by design: ``gc.get_objects()``, frame introspection and module globals (``import``
reaches anything in-process); the harness cannot sandbox Python code, only not hand data over.
"""
from __future__ import annotations

import collections
import dataclasses
import enum
import functools
import types
import weakref
from dataclasses import replace

import numpy as np
import pytest
import torch

import clharness as clh
from clharness.engine.family_session import FamilyServices
from clharness.engine import runner
from clharness.benchmarks.gtep import protocol as gtep
from clharness.benchmarks.cldyb import kind as cldyb_kind
from clharness.benchmarks.cldyb import sequence as cldyb_sequence
from clharness.method import Context, Setting
from clharness.engine.runner import Case, run_case
from clharness.engine.suites import load_suite

import plugin_leak_spy
from plugin_leak_spy import LeakSpy

CPU = torch.device("cpu")
LIMIT = 200_000   # objects per walk; exceeding it fails the test rather than truncating the search
_ATOMS = (type(None), bool, int, float, complex, str, bytes, bytearray, range, slice, enum.Enum,
          torch.device, torch.dtype, torch.Generator, types.ModuleType, type, np.generic, np.dtype)


# ------------------------------------------------------------------------------ the object-graph walk
@dataclasses.dataclass
class Found:
    tensors: list = dataclasses.field(default_factory=list)    # (path, tensor or ndarray)
    task_ids: list = dataclasses.field(default_factory=list)   # (path, value) of attributes named task_id*


def _children(obj, path):
    """(child, path) pairs one step away from ``obj``: everything a method could follow without
    ``import``, ``gc`` or frame introspection."""
    if isinstance(obj, collections.abc.Mapping) or isinstance(obj, types.MappingProxyType):
        for k, v in list(obj.items()):
            yield k, f"{path}[key {k!r}]"
            yield v, f"{path}[{k!r}]"
        return
    if isinstance(obj, (list, tuple, set, frozenset, collections.deque)):
        for i, v in enumerate(list(obj)):
            yield v, f"{path}[{i}]"
        return
    if isinstance(obj, types.CellType):
        try:
            yield obj.cell_contents, f"{path}.cell_contents"
        except ValueError:   # an empty cell
            pass
        return
    if isinstance(obj, types.FunctionType):
        for i, cell in enumerate(obj.__closure__ or ()):
            yield cell, f"{path}.__closure__[{i}]"
        yield obj.__defaults__, f"{path}.__defaults__"
        yield obj.__kwdefaults__, f"{path}.__kwdefaults__"
    if isinstance(obj, (types.MethodType, types.BuiltinMethodType, types.MethodWrapperType)):
        yield getattr(obj, "__self__", None), f"{path}.__self__"
        yield getattr(obj, "__func__", None), f"{path}.__func__"
    if isinstance(obj, functools.partial):
        yield obj.func, f"{path}.func"
        yield obj.args, f"{path}.args"
        yield obj.keywords, f"{path}.keywords"
    if isinstance(obj, (staticmethod, classmethod)):
        yield obj.__func__, f"{path}.__func__"
    if isinstance(obj, property):
        yield obj.fget, f"{path}.fget"
    if isinstance(obj, types.GeneratorType) and obj.gi_frame is not None:
        yield dict(obj.gi_frame.f_locals), f"{path}.gi_frame.f_locals"
    if isinstance(obj, weakref.ref):
        yield obj(), f"{path}()"
    if isinstance(obj, torch.Tensor):
        yield obj.grad, f"{path}.grad"
        yield obj._base, f"{path}._base"
    if isinstance(obj, np.ndarray):
        yield obj.base, f"{path}.base"
        return
    wrapped = getattr(obj, "__wrapped__", None) if not isinstance(obj, torch.Tensor) else None
    if wrapped is not None:
        yield wrapped, f"{path}.__wrapped__"
    state = getattr(obj, "__dict__", None)
    if isinstance(state, dict):
        for k, v in state.items():
            yield v, f"{path}.{k}"
    for cls in type(obj).__mro__:
        slots = getattr(cls, "__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if slot not in ("__dict__", "__weakref__") and hasattr(obj, slot):
                yield getattr(obj, slot), f"{path}.{slot}"


def reachable(root, name: str = "root") -> Found:
    """Every tensor and array reachable from ``root`` (and every attribute named task_id*)."""
    found, seen, stack = Found(), set(), [(root, name)]
    while stack:
        obj, path = stack.pop()
        if id(obj) in seen or isinstance(obj, _ATOMS):
            continue
        seen.add(id(obj))
        assert len(seen) <= LIMIT, f"the walk from {name} passed {LIMIT} objects at {path}; raise LIMIT"
        if isinstance(obj, (torch.Tensor, np.ndarray)):
            found.tensors.append((path, obj))
        for child, child_path in _children(obj, path):
            if child is None:
                continue
            attr = child_path.rsplit(".", 1)[-1]
            if attr.startswith("task_id") and not isinstance(child, (types.FunctionType, types.MethodType)):
                found.task_ids.append((child_path, child))
            if isinstance(child, _ATOMS):
                continue
            stack.append((child, child_path))
    return found


# ------------------------------------------------------------------------------ what must stay hidden
def _span(t) -> tuple[int, int]:
    """The bytes a tensor or array gives access to: its whole storage (a view reaches all of it)."""
    if isinstance(t, np.ndarray):
        while isinstance(t.base, np.ndarray):
            t = t.base
        start = t.__array_interface__["data"][0]
        return start, start + t.nbytes
    storage = t.untyped_storage()
    return storage.data_ptr(), storage.data_ptr() + storage.nbytes()


def _region(t: torch.Tensor) -> tuple[int, int]:
    """The bytes of a secret itself (a contiguous tensor, or a slice of one)."""
    assert t.is_contiguous()
    return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()


@dataclasses.dataclass
class Secret:
    what: str
    tensor: torch.Tensor
    compare_values: bool = True   # also flag equal copies (images; label vectors may coincide)


def _data_secrets(data, what: str, compare_values: bool = True) -> list[Secret]:
    """A TensorData's uint8 images, their normalised form and its labels."""
    out = [Secret(f"{what} labels", data.labels, False)]
    if hasattr(data, "images"):
        out += [Secret(f"{what} images", data.images, compare_values),
                Secret(f"{what} images (normalised)", data.prepare(data.images), compare_values)]
    return out


def task_secrets(scenario, step: int) -> list[Secret]:
    """A task-by-task scenario after ``step`` tasks were handed over: every test and validation
    split, and the train data of tasks step+1 and later."""
    out = []
    for j, task in enumerate(scenario.tasks):
        out += _data_secrets(task.test, f"task {j}'s test split")
        if task.val is not None:
            out += _data_secrets(task.val, f"task {j}'s validation split")
        if j > step:
            out += _data_secrets(task.train, f"later task {j}'s train data")
    return out


def stream_secrets(scenario, step: int) -> list[Secret]:
    """The STF stream after ``step`` minibatches: its test split and every instance not yet observed."""
    b = scenario.spec.options["stream_batch"]
    out = _data_secrets(scenario.test, "the test split")
    later = slice((step + 1) * b, None)
    if len(scenario.stream.labels[later]):
        out += [Secret("unobserved stream labels", scenario.stream.labels[later], False),
                Secret("unobserved stream images", scenario.stream.images[later], False)]
    return out


def pool_secrets(pool) -> list[Secret]:
    """A CLDyB pool: every source's full train array (other classes, validation images) and test split."""
    out = []
    for src in pool.sources:
        for split in ("train", "test"):
            ds = getattr(src, split)
            out += [Secret(f"pool {src.name} {split} images", ds.images, False),
                    Secret(f"pool {src.name} {split} labels", ds.labels, False)]
    return out


def leaks(found: Found, secrets: list[Secret]) -> list[str]:
    problems = []
    for path, t in found.tensors:
        a0, a1 = _span(t)
        for s in secrets:
            if s.tensor.numel() == 0:
                continue
            b0, b1 = _region(s.tensor)
            if a0 < b1 and b0 < a1:
                problems.append(f"{path} shares storage with {s.what}")
            elif (s.compare_values and isinstance(t, torch.Tensor) and t.dim() >= 2 and t.shape == s.tensor.shape
                  and t.dtype == s.tensor.dtype and torch.equal(t.detach(), s.tensor)):
                problems.append(f"{path} equals {s.what}")
    return problems


# ------------------------------------------------------------------------------ running the spy
@pytest.fixture(scope="module")
def harness():
    h = clh.Harness()
    h.register(plugin_leak_spy)
    return h


@pytest.fixture
def spy(monkeypatch):
    """Walks what LeakSpy receives; returns the list of (step, what, Found) and the built scenarios."""
    seen, built = [], []
    original = runner.build_scenario

    def capture(*args, **kwargs):
        built.append(original(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(runner, "build_scenario", capture)
    monkeypatch.setattr(LeakSpy, "inspect", staticmethod(lambda step, what, obj: seen.append(
        (step, what, reachable(obj, what)))))
    monkeypatch.setattr(LeakSpy, "task_ids", [])
    return seen, built


def quick_spec(harness, suite: str, index: int = 0, **changes):
    return replace(load_suite(harness.suites[suite], quick=True).scenarios[index], **changes)


def run_spy(harness, spec, seed: int = 0):
    record = run_case(Case("leak", spec, "leakspy", seed, {}), harness, CPU)
    assert record.status == "passed", record.message
    return record


def assert_nothing_hidden_reached(seen, secrets_at, task_ids_hidden: bool):
    kinds = {what for _, what, _ in seen}
    assert {"context", "backbone", "batch"} <= kinds, kinds   # the spy really looked
    problems = [f"step {step}, {what}: {p}" for step, what, found in seen for p in leaks(found, secrets_at(step))]
    assert not problems, "\n".join(problems[:20])
    if task_ids_hidden:
        shown = [(what, path, v) for _, what, found in seen for path, v in found.task_ids if v is not None]
        assert not shown, shown[:10]
        assert LeakSpy.task_ids and set(LeakSpy.task_ids) == {None}
    assert sum(len(found.tensors) for _, _, found in seen) > 0


@pytest.mark.parametrize("setting", ["class-incremental", "task-incremental"])
def test_splits(harness, spy, setting):
    seen, built = spy
    run_spy(harness, quick_spec(harness, "quickstart", setting=setting))
    scenario = built[-1]
    assert_nothing_hidden_reached(seen, lambda step: task_secrets(scenario, step),
                                  task_ids_hidden=setting == "class-incremental")
    if setting == "task-incremental":   # the detector finds task ids where they are given
        assert any(v is not None for _, _, found in seen for _, v in found.task_ids)
        assert set(LeakSpy.task_ids) == set(range(len(scenario.tasks)))


@pytest.mark.parametrize("stream", [0, 1], ids=["stf", "disjoint"])
def test_stf_online_protocol(harness, spy, stream):
    seen, built = spy
    run_spy(harness, quick_spec(harness, "stf-digits", stream))
    scenario = built[-1]
    assert_nothing_hidden_reached(seen, lambda step: stream_secrets(scenario, step), task_ids_hidden=True)


def test_curriculum(harness, spy):
    seen, built = spy
    run_spy(harness, quick_spec(harness, "m2i-mini", max_train_per_class=5, max_test_per_class=3))
    scenario = built[-1]
    assert_nothing_hidden_reached(seen, lambda step: task_secrets(scenario, step), task_ids_hidden=True)


@pytest.mark.parametrize("phase", ["tune", "eval"])
def test_gtep_phases(harness, spy, phase):
    seen, built = spy
    spec = gtep.phase_spec(quick_spec(harness, "gtep-digits"), phase, {"epochs": 1}, 0)
    run_spy(harness, spec)
    scenario = built[-1]
    if phase == "tune":   # D^HT: scored on validation data, which the scenario holds as its tasks' test
        assert scenario.extra["phase"] == "tune"
    assert_nothing_hidden_reached(seen, lambda step: task_secrets(scenario, step), task_ids_hidden=True)


def test_cldyb_search_and_replay(harness, spy, monkeypatch, tmp_path):
    seen, built = spy
    pools = []
    make_pool = cldyb_kind.make_pool
    monkeypatch.setattr(cldyb_kind, "make_pool", lambda *a, **k: pools.append(make_pool(*a, **k)) or pools[-1])
    base = quick_spec(harness, "cldyb-mini")
    spec = replace(base, options={**base.options, "pool": base.options["pool"][:2], "steps": 2, "candidates": 4,
                                  "search_space": 2})
    job = cldyb_kind.Job("ic-leakspy", "ic", ["leakspy"], ["leakspy"])
    sequence = cldyb_kind.run_search(FamilyServices(), "leak", spec, job, {"leakspy": {}}, harness, 0, CPU)
    assert_nothing_hidden_reached(seen, lambda step: pool_secrets(pools[-1]), task_ids_hidden=True)

    seen.clear()
    LeakSpy.task_ids.clear()
    path = cldyb_sequence.save(tmp_path / "seq.json", sequence)
    run_spy(harness, replace(spec, options={**spec.options, "sequence": str(path)}))
    scenario, pool = built[-1], pools[-1]
    assert_nothing_hidden_reached(seen, lambda step: task_secrets(scenario, step) + pool_secrets(pool),
                                  task_ids_hidden=True)


# ------------------------------------------------------------------------------ the walk itself
def test_the_walk_finds_data_behind_closures_partials_bound_methods_and_views(harness):
    """The detector can fail: test data behind each kind of indirection is found."""
    spec = quick_spec(harness, "quickstart")
    scenario = runner.build_scenario(spec, harness.datasets, 0, CPU)
    secrets = task_secrets(scenario, 0)
    backbone = harness.backbones[spec.backbone]
    closure = Context(Setting.CLASS_IL, 10, scenario.input_shape,   # the factory main had before issue 11
                      backbone_factory=lambda: backbone(scenario.input_shape))
    assert any("shares storage with task 0's test split" in p for p in leaks(reachable(closure), secrets))

    test = scenario.tasks[1].test
    hiding = {"default": (lambda x=test.labels: x), "bound": test.batches, "view": test.images[3:5],
              "partial": functools.partial(print, test), "copy": test.prepare(test.images).clone()}
    for name, obj in hiding.items():
        assert leaks(reachable(obj), secrets), name

    clean = runner.make_context(Case("leak", spec, "leakspy", 0), scenario, harness, CPU)
    assert not leaks(reachable(clean), secrets)
