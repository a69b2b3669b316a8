"""One task of an ensemble's members (engine.ensemble): their paused ``fit(batches)`` calls trained together,
each member computing exactly what its solo run computes (its accuracy matrix bit-identical where measured).

A step's forward, two ways:
- batched: SupervisedMethod's own loss on a model made only of Linear, ReLU and Flatten (the digits and
  Fashion-MNIST MLPs), on a CPU at one thread, with batches of two samples or more: one ``baddbmm`` per
  Linear for all members (``_stacked_forward``). Measured bit-identical to the solo ``addmm`` (forward and
  backward) for 72 layer shapes (inputs 64-3072, widths 32-1000, batches 7-128); not at two threads or
  more, nor for a batch of one sample (up to 6e-8), which then run the member's own forward.
- the member's own forward (everything else: a convolution, BatchNorm or pooling layer, a method's own
  loss with its declared per-member state, ER's and DER++'s replay steps): each member's loss in turn, by
  its method's own ``loss`` on its own parameters (a view of the stack, ``_View``), its own
  hyperparameters, in its own random streams: the solo run's kernels, shapes and sums. ``torch.func.vmap``,
  used here before, batches a convolution or BatchNorm into one kernel that sums in another order (the cnn's
  members ended up to 0.019 from their solo runs) and even a Linear of 784 inputs (5e-7 in the forward).
Either way one ``backward`` of the members' summed losses gives each member its own gradient (they share
no parameter: another member's zero adds nothing), and the optimizer arithmetic is the solo run's: one
elementwise optimizer over the stacked parameters when every member's trainer is the same constant one
(``_uniform``), else each member's own trainer, schedule and clipping (``_member_step``).
"""
from __future__ import annotations

import copy
import math
import time
import types

import torch
import torch.nn.functional as F

from ..method import Diverged, MethodError
from . import flops
from .ensemble_members import _in_member, _Member
from .ensemble_policy import _state_names


class _View:
    """What the method's own ``loss`` reads of ``self`` for one member: ``model`` (the functional call on the
    member's parameters), ``labels`` (its task grouping), ``hp``, the member's declared state
    (``_state_names``) and the class's other methods, bound to the view."""

    def __init__(self, cls, model, labels, hp=None, state=None):
        self._cls = cls
        self.model, self.labels, self.hp = model, labels, hp
        vars(self).update(state or {})
        self.cross_entropy = types.MethodType(cls.cross_entropy, self)
        self.loss = types.MethodType(cls.loss, self)

    def __getattr__(self, name):
        attr = getattr(vars(self)["_cls"], name)
        if isinstance(attr, property):
            return attr.fget(self)
        return types.MethodType(attr, self) if isinstance(attr, types.FunctionType) else attr


class _FModel:
    """One member's model: called, it is the functional call on the member's parameters;
    ``named_parameters()`` gives those parameters (a penalty such as EWC's reads them)."""

    def __init__(self, base, params, buffers):
        self.base, self.params, self.buffers = base, params, buffers

    def __call__(self, x):
        from torch.func import functional_call
        return functional_call(self.base, (self.params, self.buffers), (x,))

    def named_parameters(self):
        return iter(self.params.items())


def _tree(values: list):
    """``values`` (one per member: tensors, or dicts and lists of them) stacked into one tree."""
    first = values[0]
    if isinstance(first, (list, tuple)) and first and all(isinstance(v, int) for value in values for v in value):
        return torch.stack([torch.tensor(list(v), dtype=torch.long) for v in values])   # class ids
    if isinstance(first, dict):
        return {k: _tree([v[k] for v in values]) for k in first}
    if isinstance(first, (list, tuple)):
        return [_tree([v[i] for v in values]) for i in range(len(first))]
    return torch.stack([v.detach() for v in values])


def _rows(tree, at):
    """The rows of members ``at`` of a stacked tree."""
    if isinstance(tree, dict):
        return {k: _rows(v, at) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_rows(v, at) for v in tree)
    return tree.index_select(0, at)


def _row(tree, i: int):
    """Member ``i``'s own part of a stacked tree (a view: a BatchNorm's running statistics update in place)."""
    if isinstance(tree, dict):
        return {k: _row(v, i) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_row(v, i) for v in tree)
    return tree[i]


def _uniform(trainers: list) -> bool:
    """Whether one elementwise optimizer over the stacked parameters steps every member exactly as its
    own trainer would: one class (SGD, Adam, AdamW: elementwise), the same hyperparameters, no schedule
    (it steps at each member's own epoch ends) and no clipping (a norm over each member's own gradients)."""
    first = trainers[0]
    return (type(first.optimizer) in (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)
            and all(type(t.optimizer) is type(first.optimizer) and t.optimizer.defaults == first.optimizer.defaults
                    and t.scheduler is None and not t.clip_grad > 0 for t in trainers))


def _member_step(trainer) -> None:
    """After the batched backward: what ``Trainer.step`` does after its own backward (AMP is never batched,
    ``why_solo``): clip, step, count the step, and step the schedule when the member's own epoch ends."""
    if trainer.clip_grad > 0:
        trainer._clip()
    trainer.optimizer.step()
    trainer.steps += 1
    if trainer.scheduler is not None and trainer.steps % trainer.epoch_steps == 0:
        trainer.scheduler.step()


def _batched_exactly(x: torch.Tensor) -> bool:
    """Whether the hand-batched forward gives these inputs (E, N, ...) each member's solo numbers, bit for
    bit: measured on a CPU at one thread for batches of two or more (module docstring)."""
    return x.device.type == "cpu" and torch.get_num_threads() == 1 and x.shape[1] > 1


_SOLO_STEPS: dict[tuple, int] = {}   # (batch shapes, model shape) -> FLOPs of one solo step (_Task.solo_step_flops)


class _Task:
    """One task's training of the paused members: what they share (the stacked parameters and buffers, the
    optimizer or each member's trainer, their declared state) and how each step's losses are computed."""

    def __init__(self, members: list[_Member]):
        from torch.func import stack_module_state

        from ..toolkit.training import SupervisedMethod, Trainer
        self.members = members
        self.methods = methods = [m.method for m in members]
        self.cls = type(methods[0])
        self.models = [method.model for method in methods]
        for model in self.models:
            model.train()
        self.own = [Trainer.for_method(method) for method in methods]   # each member's, as its solo fit builds it
        self.shared = _uniform(self.own)
        self.params, self.buffers = stack_module_state(self.models)   # the buffers (BatchNorm's) stacked either way
        self.optimizer = (Trainer.for_method(methods[0], params=self.params.values()).optimizer   # every member's own
                          if self.shared else None)
        self.leaves = None if self.shared else [dict(model.named_parameters()) for model in self.models]
        self.base = copy.deepcopy(self.models[0]).to("meta")
        self.base.train()
        self.task_il = methods[0].labels.task_il
        self.groups = {"group": torch.stack([method.labels.group for method in methods]),
                       "current": torch.stack([method.labels.current for method in methods])}
        names = _state_names(self.cls) or ()
        self.state, self.fixed, self.bases = _member_state(methods, names)
        _check_hparams(methods)
        self.parts = [m.step for m in members]   # (prepare, loss name, after) of an ensemble_steps loss, or None
        if len({s and (s[1], s[2] and s[2].__name__) for s in self.parts}) > 1:
            raise MethodError("the members' fit calls differ in their loss")
        self.loss_name, self.after = (self.parts[0][1], self.parts[0][2]) if self.parts[0] else ("loss", None)
        # hand-batched layers where every layer is known and the loss is SupervisedMethod's, else each member's own
        # forward (a method's own loss, even one that declares no state, ``ensemble_state = ()``: it runs as written)
        plain = self.loss_name == "loss" and all(getattr(self.cls, n) is getattr(SupervisedMethod, n)
                                                 for n in ("loss", "cross_entropy"))
        self.batched = _stacked_forward(self.models[0]) if not names and plain else None
        self.alive = [m.error is None for m in members]
        self.ledgers = [flops.StepLedger() for _ in members]   # each member's batched steps, as its solo steps count
        self.roots: dict[int, torch.Tensor] = {}               # this step's own-forward losses, by member

    def solo_step_flops(self, e: int, x: torch.Tensor, y: torch.Tensor) -> int:
        """FLOPs of member ``e``'s solo step on a batch of this shape (SupervisedMethod.loss: the model's forward
        and backward; its cross-entropy and task mask count nothing), measured on a copy of its model, in a
        forked random stream: no effect on any member's weights, gradients or draws. Once per batch shape and model
        shape (``_SOLO_STEPS``): a hand-batched model's count is a function of its parameters' names, shapes and
        which of them train (Linear, ReLU and Flatten only, ``_stacked_forward``), not of their values."""
        model = self.models[e]
        key = (tuple(x.shape), tuple(y.shape),
               tuple((name, tuple(p.shape), p.requires_grad) for name, p in model.named_parameters()))
        if key not in _SOLO_STEPS:
            if len(_SOLO_STEPS) >= 1024:
                _SOLO_STEPS.clear()
            with torch.random.fork_rng(devices=[]):
                _SOLO_STEPS[key] = flops.train_step_flops(copy.deepcopy(model).train(), F.cross_entropy, x, y)
        return _SOLO_STEPS[key]

    def member_loss(self, i: int, e: int, P, B, G, S, args):
        """Member ``e``'s loss (row ``i`` of its group's stacks) by its method's own loss on a view of its
        parameters, buffers, task grouping, declared state and its own hyperparameters, in its random streams."""
        from ..toolkit.training import TaskLabels
        lab, s = _row(G, i), _row(S, i)
        labels = types.SimpleNamespace(task_il=self.task_il, group=lab["group"], current=lab["current"])
        labels.mask = types.MethodType(TaskLabels.mask, labels)
        labels.mask_current = types.MethodType(TaskLabels.mask_current, labels)
        attrs = {**self.fixed, **{k: (_FModel(self.bases[k], *v) if k in self.bases else v) for k, v in s.items()}}
        params = P[i] if isinstance(P, list) else _row(P, i)   # its own parameters, or its rows of the stack
        view = _View(self.cls, _FModel(self.base, params, _row(B, i)), labels, self.methods[e].hp, attrs)
        return _in_member(self.members[e], getattr(view, self.loss_name), *(a[i] for a in args))

    def losses(self, P, B, A, G, S, idx: list[int]):
        """Each member's loss on its own batch (members ``idx``, rows of the stacks): hand-batched where that
        is shown exact (SupervisedMethod.loss written out: the logits of every member at once, each member's own
        ``cross_entropy`` on its rows), else each member's own forward, in turn."""
        if self.batched is not None and _batched_exactly(A[0]):
            from ..toolkit.training import NEG
            X, Y = A
            for i, e in enumerate(idx):   # the count of each member's solo step of this shape (measured once)
                self.ledgers[e].record((tuple(X.shape[1:]), tuple(Y.shape[1:])),
                                       lambda: self.solo_step_flops(e, X[i], Y[i]))
            logits = self.batched(P, X)                                   # (E, N, C)
            if self.task_il:
                G = G["group"]
                logits = logits.masked_fill(G.gather(1, Y)[:, :, None] != G[:, None, :], NEG)
            return torch.stack([F.cross_entropy(logits[i], Y[i]) for i in range(len(idx))])
        results = [self.member_loss(i, e, P, B, G, S, A) for i, e in enumerate(idx)]
        for e, result in zip(idx, results):   # their backward is counted per member (flops.charged_backward)
            self.roots[e] = result[0] if isinstance(result, tuple) else result
        if isinstance(results[0], tuple):   # (loss, out): DER++'s step logits
            return tuple(torch.stack(parts) for parts in zip(*results))
        return torch.stack(results)

    def group_losses(self, idx: list[int], A: list, full: bool):
        """The losses of members ``idx`` (one shape of batch): the whole stack when every member steps with
        the same shape, else their rows (their BatchNorm statistics copied back)."""
        if self.shared:
            P = self.params
        elif self.batched is not None and _batched_exactly(A[0]):   # the members' own parameters, stacked
            P = {k: torch.stack([self.leaves[e][k] for e in idx]) for k in self.leaves[0]}   # (each its own gradient)
        else:   # each member's own forward reads its own parameters
            P = [self.leaves[e] for e in idx]
        if full:
            return self.losses(P, self.buffers, A, self.groups, self.state, idx)
        at = torch.tensor(idx, device=A[0].device)
        if self.shared:
            P = {k: p.index_select(0, at) for k, p in self.params.items()}
        B = {k: b.index_select(0, at) for k, b in self.buffers.items()}
        losses = self.losses(P, B, A, _rows(self.groups, at), _rows(self.state, at), idx)
        with torch.no_grad():
            for k, b in self.buffers.items():
                b.index_copy_(0, at, B[k])
        return losses

    def finite(self, idx: list[int], losses: torch.Tensor, steps: int) -> list[int]:
        """The rows of ``losses`` that are finite; a member with a non-finite loss fails as its solo guard
        fails it, before the step, and takes no further step."""
        ok = []
        for i, (e, value) in enumerate(zip(idx, losses.detach().tolist())):
            if math.isfinite(value):
                ok.append(i)
            else:
                self.members[e].error = Diverged(f"method {self.methods[e].name!r}: non-finite loss ({value}) at or "
                                                 f"before training step {steps + 1}; try a lower learning rate")
                self.alive[e] = False
        return ok

    def step_losses(self, batch: list, steps: int) -> tuple[list[int], torch.Tensor | None]:
        """One step of every member with a batch: the members that move and the sum of their losses. The
        loss's arguments are the batch, or what the member's own ``prepare`` draws for it (its replay batch);
        members whose arguments differ in shape (a ragged last batch) are grouped by shape."""
        active = [e for e, b in enumerate(batch) if b is not None]
        parts = self.parts
        self.roots = {}
        args = {e: _in_member(self.members[e], parts[e][0], *batch[e]) if parts[e] else batch[e] for e in active}
        by_shape: dict[tuple, list[int]] = {}
        for e in active:
            by_shape.setdefault(tuple(tuple(a.shape) for a in args[e]), []).append(e)
        full = len(by_shape) == 1 and len(active) == len(self.members)
        moved, total = [], None
        for idx in by_shape.values():
            A = [torch.stack([args[e][i] for e in idx]) for i in range(len(args[idx[0]]))]
            losses = self.group_losses(idx, A, full)
            if self.after is not None:   # (loss, out): each member's own Python after its step (DER++ stores)
                losses, out = losses
                for i, e in enumerate(idx):
                    _in_member(self.members[e], parts[e][2], *batch[e], out[i].detach())
            ok = self.finite(idx, losses, steps)
            moved += [idx[i] for i in ok]
            if ok:   # members are independent: the gradient of the sum is each member's own gradient
                part = losses.sum() if len(ok) == len(idx) else losses[ok].sum()
                total = part if total is None else total + part
        return moved, total

    def backward(self, moved: list[int], total) -> None:
        """One backward of the moved members' summed losses; each member's own-forward part counted by its own
        meters (a batched step's by its ledger)."""
        counted = [(self.members[e].counting, self.roots[e]) for e in moved
                   if e in self.roots and self.members[e].counting is not None]
        with flops.charged_backward(counted):
            total.backward()

    def apply(self, moved: list[int], total) -> None:
        """The step's optimizer arithmetic: each member's own trainer, or the shared optimizer over the
        stack; a member that did not move (out of batches, diverged) keeps its weights either way."""
        if not self.shared:
            if total is not None:
                for e in moved:
                    self.own[e].optimizer.zero_grad(set_to_none=True)
                self.backward(moved, total)
                for e in moved:
                    _member_step(self.own[e])
            return
        still = sorted(set(range(len(self.members))) - set(moved))
        if still:
            at = torch.tensor(still)
            kept = {k: p.detach().index_select(0, at).clone() for k, p in self.params.items()}
        if total is not None:
            self.optimizer.zero_grad(set_to_none=True)
            self.backward(moved, total)
            self.optimizer.step()
        if still:
            with torch.no_grad():
                for k, p in self.params.items():
                    p.index_copy_(0, at, kept[k])

    def write_back(self) -> None:
        """Every member's weights (shared optimizer) and buffers back into its own model."""
        with torch.no_grad():
            for e, model in enumerate(self.models):
                for name, p in model.named_parameters():
                    if self.shared:
                        p.copy_(self.params[name][e])
                for name, b in model.named_buffers():
                    b.copy_(self.buffers[name][e])


def _member_state(methods: list, names) -> tuple[dict, dict, dict]:
    """The declared per-member state (``ensemble_state``): stacked tensors, values every member holds alike
    (None), and the bases of frozen modules (LwF's old model: its parameters stacked, no gradient)."""
    from torch.func import stack_module_state
    state, fixed, bases = {}, {}, {}
    for name in names:
        values = [getattr(method, name) for method in methods]
        if all(v is None for v in values):
            fixed[name] = None
        elif isinstance(values[0], torch.nn.Module):
            mp, mb = stack_module_state(values)
            state[name] = ({k: v.detach() for k, v in mp.items()}, mb)
            bases[name] = copy.deepcopy(values[0]).to("meta").train(values[0].training)
        else:
            state[name] = _tree(values)
    return state, fixed, bases


def _check_hparams(methods: list) -> None:
    """Members' hyperparameters may differ in float values only (an "hparams" ensemble): each member's loss
    reads its own; an int, string or bool would change a shape or a branch."""
    hp = methods[0].hp
    varying = [k for k in hp if any(method.hp.get(k) != hp[k] for method in methods)]
    if any(not isinstance(method.hp.get(k), float) for k in varying for method in methods):
        raise MethodError(f"the members' hyperparameters {varying} differ in more than float values")


def _train_task(members: list[_Member]) -> None:
    """One task of every member: their ``fit(batches)`` calls trained together, step by step, until every
    member's batches have run out (a member whose batches run out first keeps its weights while the others
    go on); then every member's weights go back into its own model."""
    t0 = time.perf_counter()
    task = _Task(members)
    iters = [iter(m.batches) for m in members]
    try:
        _steps(task, members, iters)
    finally:   # each member's batched steps, counted as its solo steps (engine.flops: StepLedger)
        for member, ledger in zip(members, task.ledgers):
            flops.charge(member.counting, ledger.total_flops)
    task.write_back()
    spent = time.perf_counter() - t0
    for m in members:
        m.train_seconds += spent / len(members)
        m.ensemble_seconds += spent


def _steps(task: _Task, members: list[_Member], iters: list) -> None:
    """The task's steps, until every member's batches have run out (drawn in the member's own count: an
    augmentation's work is its run's)."""
    steps = 0
    while True:
        batch = [_next(members[e], iters[e]) if task.alive[e] else None for e in range(len(members))]
        batch = [None if b is None else tuple(b) for b in batch]   # (x, y) pairs or Batch objects
        for e, b in enumerate(batch):
            if b is None:
                task.alive[e] = False
        if all(b is None for b in batch):
            break
        task.apply(*task.step_losses(batch, steps))
        steps += 1


def _next(member: _Member, batches):
    with flops.counting_as(member.counting):
        return next(batches, None)


def _stacked_forward(model: torch.nn.Module):
    """``f(params, x)``: the model's forward for stacked parameters and inputs (E, N, ...), written with
    batched matrix products (one ``baddbmm`` per Linear for all members: the bias inside the product, as
    the solo ``addmm`` adds it), or None when the model has a layer this does not know (then each member
    runs its own forward). Known: Classifier, MLP, Sequential, Flatten, Linear, ReLU: the digits MLP."""
    from ..method import Classifier
    from ..toolkit.backbones import MLP
    known = (Classifier, MLP, torch.nn.Sequential, torch.nn.Flatten, torch.nn.Linear, torch.nn.ReLU)
    if any(type(m) not in known for m in model.modules()) or any(True for _ in model.buffers()):
        return None
    if any(m.start_dim != 1 or m.end_dim != -1 for m in model.modules() if isinstance(m, torch.nn.Flatten)):
        return None

    def run(module, prefix, P, x):
        if isinstance(module, Classifier):
            return run(module.head, prefix + "head.", P, run(module.backbone, prefix + "backbone.", P, x))
        if isinstance(module, MLP):
            return run(module.net, prefix + "net.", P, x)
        if isinstance(module, torch.nn.Sequential):
            for name, child in module.named_children():
                x = run(child, f"{prefix}{name}.", P, x)
            return x
        if isinstance(module, torch.nn.Flatten):
            return x.flatten(2)
        if isinstance(module, torch.nn.ReLU):
            return torch.relu(x)
        weight, bias = P[prefix + "weight"], P.get(prefix + "bias")
        if bias is None:
            return torch.bmm(x, weight.transpose(1, 2))
        return torch.baddbmm(bias.unsqueeze(1).expand(x.shape[0], x.shape[1], weight.shape[1]), x, weight.transpose(1, 2))

    return lambda P, x: run(model, "", P, x)
