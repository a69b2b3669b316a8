"""Machine-independent compute cost of a run (issue 41 item 1): ``RunMeter`` counts what a run computes.

FLOPs are counted with the formulas of ``torch.utils.flop_counter`` (``FORMULAS``), which cover aten ops
with a registered formula only (mm/addmm/bmm/convolution and their backward): elementwise ops, optimizer
updates, a QP (GEM), herding or an EMA update are NOT counted. The count is a count of ops on
shapes, so it is the same under any thread count, executor or device.

A run is counted whole (``RunMeter``, entered by the runner around the method's construction and the
scenario's protocol): everything the method computes -- its own loops in ``learn``/``observe``, replay
batches, a teacher's or an old model's forward, ``consolidate`` -- is training, except what runs inside
``evaluating()`` (the runner's accuracy code: predictions on test data, continual-evaluation points,
STF's retention), which is evaluation. Counting every op is exact whatever a method's loop does (no
key short of the ops themselves determines a step's count: a replay batch grows, a teacher appears after
task 0); each (op, argument shapes) count is computed once and reused, so the cost is that of a dispatch
mode: 1.5-1.8x wall on the quickstart's tiny MLP steps, less as ops grow (``bench/flops_overhead.py``);
built-in optimizers' updates (elementwise, nothing to count) run with the meters stepped aside.
``StepLedger`` (each distinct step shape counted once, then multiplied) serves callers that know their
steps' shapes. Features a frozen backbone's shared cache serves from another run are charged to the run
as if it had computed them (``toolkit.feature_cache.counted_run``), so no count depends on run order.

The mode is thread-local: work another thread does is not seen unless it is counted for the run. A seed
ensemble (engine.ensemble_step) trains its paused members in the coordinator's thread, and each member's record
holds exactly its solo run's count: its own construction, evaluation and work around ``fit`` run in its own
thread; a hand-batched step (one ``baddbmm`` per Linear for every member) is charged, per member, the count of
the solo step of that batch shape (``StepLedger``: measured once per shape on a copy of a member's model, with
no effect on any member's weights, gradients or random streams); a step each member runs by its own forward
is counted in the member's own meters (``counting_as``: the paused thread's meters entered in the coordinator
for the member's loss, its replay draw, its batches), and the one backward over the members' summed losses is
split by graph node (``charged_backward``: a node only one member's loss reaches is that member's). A remote
worker's count (a CLDyB look-ahead candidate valued on Ray) is added to the run that asked (``add_here``).
A protocol step that is not a case (a CLDyB search) is counted whole by the session (``FamilySession.counted``):
the training of every method it runs, clones included, and its evaluation (validation accuracies, probe features).
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections import Counter
from typing import Callable, Hashable, Iterator

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils._python_dispatch import (TorchDispatchMode, _disable_current_modes,
                                         _get_current_dispatch_mode_stack)
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

from ..toolkit import feature_cache
from ..toolkit.feature_cache import counted_run


def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs of the aten ops that ``fn()`` runs, forward and (if it calls backward) backward. Inside a
    run's meter the work is counted there too: measuring is computing."""
    with RunMeter() as meter:
        fn()
    return meter.total_flops


def train_step_flops(model: torch.nn.Module, loss_fn: Callable, x: torch.Tensor,
                     y: torch.Tensor) -> int:
    """FLOPs of one forward + backward of ``loss_fn(model(x), y)``; gradients are left cleared."""

    def step():
        loss_fn(model(x), y).backward()

    try:
        return count_flops(step)
    finally:
        model.zero_grad(set_to_none=True)


def eval_step_flops(model: torch.nn.Module, x: torch.Tensor) -> int:
    """FLOPs of one forward of ``model(x)`` without gradients."""
    with torch.no_grad():
        return count_flops(lambda: model(x))


class StepLedger:
    """Counts each distinct step shape once and multiplies by its occurrences.

    ``record(shape_key, measure)`` is called on every step; ``measure()`` (which returns the FLOPs
    of one such step) runs only the first time a key is seen.
    """

    def __init__(self) -> None:
        self._per_step: dict[Hashable, int] = {}
        self._occurrences: Counter = Counter()

    def record(self, shape_key: Hashable, measure: Callable[[], int]) -> None:
        if shape_key not in self._per_step:
            self._per_step[shape_key] = int(measure())
        self._occurrences[shape_key] += 1

    @property
    def total_flops(self) -> int:
        return sum(self._per_step[k] * n for k, n in self._occurrences.items())

    @property
    def gflops(self) -> float:
        return self.total_flops / 1e9


_local = threading.local()   # the meters of this thread, innermost last
_aten = torch.ops.aten


def _cpu_attention(query, key, value, *args, out_val=None, **kwargs) -> int:
    return sdpa_flop_count(query.shape, key.shape, value.shape)


def _cpu_attention_backward(grad_out, query, key, value, *args, out_val=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out.shape, query.shape, key.shape, value.shape)


# torch's formulas, plus the CPU kernel of fused attention, which torch's table leaves out (so a ViT
# would count its attention on CUDA and not on CPU): the same formula as the CUDA kernels'
FORMULAS = {**flop_registry,
            _aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention,
            _aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_attention_backward}
_PLANS: dict = {}            # OpOverload -> its formula, _DECOMPOSE or _PLAIN (looked up once per op)
_PLAIN, _DECOMPOSE, _UNHANDLED = object(), object(), object()
_COUNTS: dict = {}           # (op, argument shapes and values) -> its FLOPs


class _CountingMode(TorchDispatchMode):
    """The counting of torch's ``FlopCounterMode`` without its per-module bookkeeping: the same formulas
    (``FORMULAS``) on the same ops (an op without a formula that decomposes is counted through its
    decomposition, as there), so the totals are equal (tests/test_flops.py), at a fraction of the cost
    per op. Only the total is kept."""
    counts_flops = True   # what toolkit.metering.uncounted() may step aside

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch >= 2.8 wraps a mode's __torch_dispatch__ in a dynamo-disabling frame, a quarter of the
        # counting cost on small steps; nothing here is compiled (as in torch < 2.8, which had no wrapper)
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        plan = _PLANS.get(func) or _plan(func)
        if plan is _PLAIN:   # most ops: no formula, nothing to decompose
            if func._pyobj_dispatcher is None:   # OpOverload.__call__ without its Python frame (~1 us an op)
                return func._op(*args, **kwargs) if kwargs else func._op(*args)
            return func(*args, **(kwargs or {}))
        kwargs = kwargs or {}
        if plan is _UNHANDLED:
            return NotImplemented
        if plan is _DECOMPOSE:
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        # a formula reads shapes and flags only (and the output's shape, a function of them): counted once per key
        key = (func, *map(_shape_of, args), *((k, _shape_of(v)) for k, v in kwargs.items()))
        try:
            flops = _COUNTS.get(key)
        except TypeError:   # an argument that cannot be a key: count this call as it is
            flops = key = None
        if flops is None:
            flops = int(plan(*args, **kwargs, out_val=out))
            if key is not None:
                _COUNTS[key] = flops
        self.total += flops
        return out


def _pause_for_optimizer_step(optimizer, args, kwargs) -> None:
    """A built-in optimizer's update is elementwise (no formula counts it), yet it is a third to half of a
    small step's ops (Adam: ~50 of ~110): the meters step aside while it runs instead of forwarding each
    op. Not for an optimizer defined elsewhere (it may multiply matrices) nor for a closure (LBFGS runs
    forward and backward inside ``step``); only when the meters' modes are all that is active."""
    closure = [a for a in (*args[1:], *kwargs.values()) if a is not None]   # args[0] is the optimizer
    if (getattr(_local, "paused", None) is None and _stack() and not closure
            and type(optimizer).__module__.startswith("torch.optim.")
            and all(isinstance(m, _CountingMode) for m in _get_current_dispatch_mode_stack())):
        pause = _disable_current_modes()
        pause.__enter__()
        _local.paused = pause


def _resume_counting(*_) -> None:
    pause = getattr(_local, "paused", None)
    if pause is not None:
        _local.paused = None
        pause.__exit__(None, None, None)


register_optimizer_step_pre_hook(_pause_for_optimizer_step)
register_optimizer_step_post_hook(_resume_counting)


def _shape_of(value):
    if isinstance(value, torch.Tensor):
        return value.shape
    if isinstance(value, (list, tuple)):
        return tuple(map(_shape_of, value))
    return value


def _plan(func):
    """What the mode does with ``func``: count it by its formula, count its decomposition (an op without a
    formula that has a CompositeImplicitAutograd kernel, as FlopCounterMode does), or just run it."""
    if not isinstance(func, torch._ops.OpOverload):   # a higher-order operator: as FlopCounterMode, not handled
        return _UNHANDLED
    formula = FORMULAS.get(func._overloadpacket)
    if formula is None:
        key = torch._C.DispatchKey.CompositeImplicitAutograd
        decomposes = (key in getattr(func, "py_kernels", {})
                      or torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), key))
        formula = _DECOMPOSE if decomposes else _PLAIN
    _PLANS[func] = formula
    return formula


class RunMeter:
    """FLOPs of one run: all that runs in this thread while the meter is entered counts as training,
    except what runs inside ``evaluating()``, which counts as evaluation."""

    def __init__(self) -> None:
        self._mode = _CountingMode()
        self._cache_run = None
        self.incomplete = ""      # why the count misses work (toolkit.feature_cache), else ""
        self._eval = 0
        self._depth = 0           # nesting of evaluating() (an accuracy inside an evaluation)
        self._mark = 0

    def __enter__(self) -> "RunMeter":
        if not _stack():   # the run's own meter (not a measurement inside it): cached features are charged to it
            self._cache_run = counted_run(self)
            self._cache_run.__enter__()
        self._mode.__enter__()
        _stack().append(self)
        return self

    def __exit__(self, *exc) -> None:
        _resume_counting()           # an optimizer step that raised left the meters paused
        _stack().remove(self)
        self._mode.__exit__(*exc)
        if self._cache_run is not None:
            self._cache_run.__exit__(*exc)

    def add(self, flops: int) -> None:
        """Work done for this run outside its view (features another run computed), as it would have counted."""
        self._mode.total += int(flops)

    @property
    def total_flops(self) -> int:
        return self._mode.total

    @property
    def eval_flops(self) -> int:
        return self._eval + (self.total_flops - self._mark if self._depth else 0)

    @property
    def train_flops(self) -> int:
        return self.total_flops - self.eval_flops

    def stamp(self, record) -> None:
        """``record``'s train_gflops and eval_gflops from this count; None both, with ``extra["flops"]`` saying why,
        where the count misses work (never a partial count passed off as the cost)."""
        record.train_gflops, record.eval_gflops = self.train_flops / 1e9, self.eval_flops / 1e9
        if self.incomplete:
            record.train_gflops = record.eval_gflops = None
            record.extra["flops"] = self.incomplete

    @contextlib.contextmanager
    def evaluating(self) -> Iterator[None]:
        if self._depth == 0:
            self._mark = self.total_flops
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._eval += self.total_flops - self._mark


def _stack() -> list[RunMeter]:
    if not hasattr(_local, "meters"):
        _local.meters = []
    return _local.meters


@contextlib.contextmanager
def evaluating() -> Iterator[None]:
    """Marks evaluation work for the run meter of this thread (none entered: nothing to do)."""
    meters = _stack()
    if not meters:
        yield
        return
    with meters[-1].evaluating():
        yield


# ------------------------------------------------------------------ work done for another thread's run
@dataclasses.dataclass(frozen=True)
class Counting:
    """What counts a thread's work at one moment: its meters (outermost first) and the feature cache's counted
    run (``feature_cache.current_run``). Taken by ``counting_here`` in the thread whose run it is."""
    meters: tuple
    cache_run: object = None


def counting_here() -> Counting | None:
    """What counts this thread's work now, for another thread to count work it does for this run while this
    thread waits (``counting_as``); None when no meter is entered."""
    meters = tuple(_stack())
    return Counting(meters, feature_cache.current_run()) if meters else None


@contextlib.contextmanager
def counting_as(counting: Counting | None) -> Iterator[None]:
    """Count what runs in this thread as ``counting``'s thread counts it: its meters' modes entered here (over
    this thread's own), its ``evaluating()`` marks, its feature-cache charges. The owning thread must be waiting
    (a paused ensemble member: engine.ensemble_members), as the meters are not shared between running threads.
    None: nothing counted."""
    if counting is None:
        yield
        return
    saved = _stack()
    _local.meters = [*saved, *counting.meters]
    entered = []
    try:
        with feature_cache.counted_as(counting.cache_run):
            for meter in counting.meters:
                meter._mode.__enter__()
                entered.append(meter)
            yield
    finally:
        _resume_counting()           # an optimizer step that raised left the meters paused
        for meter in reversed(entered):
            meter._mode.__exit__(None, None, None)
        _local.meters = saved


def charge(counting: Counting | None, flops: int) -> None:
    """``flops`` computed for ``counting``'s run by another computation (a seed ensemble's batched step, counted
    as its solo step: ``StepLedger``), added to each of its meters as its own thread would have counted them."""
    for meter in (counting.meters if counting is not None else ()):
        meter.add(flops)


class _Charging(TorchDispatchMode):
    """Counts each op into the tally of the run whose graph node is running (``charged_backward``)."""

    def __init__(self, runs: int) -> None:
        super().__init__()
        self.tallies = [_CountingMode() for _ in range(runs)]
        self.shared = _CountingMode()   # nodes two runs' losses reach: must count nothing
        self.now = threading.local()    # the running node's owner (the engine's thread for the device)

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        owner = getattr(self.now, "owner", None)
        if owner is None:   # a node no listed loss reaches (counted otherwise) or between nodes
            return func(*args, **(kwargs or {}))
        return owner.__torch_dispatch__(func, types, args, kwargs)


@contextlib.contextmanager
def charged_backward(losses: list) -> Iterator[None]:
    """While one backward runs over the graphs of several runs' losses (``[(counting, loss)]``, disjoint but for
    their leaves: a seed ensemble's members each computing its own loss, engine.ensemble_step), the counted ops
    of every graph node that only one run's loss reaches are charged to that run (``charge``), as its own
    backward would count them. Nodes no listed loss reaches are not counted here (a batched step's, counted by
    its solo step); a counted op in a node two of them reach cannot be split and raises."""
    if not losses:   # nothing to charge (a hand-batched step): no mode on the backward's ops
        yield
        return
    mode = _Charging(len(losses))
    owners: dict = {}
    for i, (_, loss) in enumerate(losses):
        seen, todo = set(), [loss.grad_fn]
        while todo:
            node = todo.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            owners.setdefault(node, set()).add(i)
            todo.extend(n for n, _ in node.next_functions)
    handles = []

    def hooks(tally):
        def enter(*_):
            mode.now.owner = tally

        def leave(*_):
            mode.now.owner = None
        return enter, leave

    for node, runs in owners.items():
        if type(node).__name__ == "AccumulateGrad":   # a leaf's gradient sum: no counted op (a hook would copy it)
            continue
        enter, leave = hooks(mode.tallies[next(iter(runs))] if len(runs) == 1 else mode.shared)
        handles += [node.register_prehook(enter), node.register_hook(leave)]
    try:
        with mode:
            yield
    finally:
        for handle in handles:
            handle.remove()
        mode.now.owner = None
    if mode.shared.total:
        raise RuntimeError(f"FLOP count: {mode.shared.total} FLOPs in backward nodes shared by several runs' "
                           "losses cannot be charged to one run; their graphs must be disjoint but for leaves")
    for (counting, _), tally in zip(losses, mode.tallies):
        charge(counting, tally.total)


def add_here(train: int, evaluation: int, incomplete: str = "") -> None:
    """FLOPs another process counted for this thread's run (a CLDyB look-ahead candidate valued on a Ray
    worker: engine.ray_backend.map_method), added to its meters as if it had run here: ``evaluation`` as
    evaluation; ``incomplete`` (that count missed work) makes this count incomplete too."""
    for meter in _stack():
        meter.add(train)
        with meter.evaluating():
            meter.add(evaluation)
        meter.incomplete = meter.incomplete or incomplete
