"""Which methods and cases may train as members of a seed ensemble (engine.ensemble), and why not.

A method opts in with its own class attribute ``ensemble = True`` and declares what the batched step needs
(``ensemble_state``, ``ensemble_steps``, ``ensemble_solo_when``; the Method contract); the engine names no
method. For one that has not opted in, ``why_solo`` names the structural obstacle, read from its source
(``_structure``), then the case's protocol (``_protocol``).
"""
from __future__ import annotations

import functools
import types

import torch

from ..method import Setting


def opted_in(method_cls) -> bool:
    """The class itself says ``ensemble = True`` (a subclass that changes training opts in anew)."""
    return vars(method_cls).get("ensemble", False) is True


def _declared(method_cls, name: str):
    """A class attribute of the ensemble contract: inherited by a class that opted in itself (CBRS keeps
    ER's steps), else only the class's own (GMED's loss is not ER's)."""
    return getattr(method_cls, name, None) if opted_in(method_cls) else vars(method_cls).get(name)


def _state_names(method_cls):
    """The attributes its own loss reads per member (class attribute ``ensemble_state``)."""
    names = _declared(method_cls, "ensemble_state")
    return tuple(names) if names is not None else None


def _steps(method_cls) -> dict:
    """Its ``fit`` losses that draw at random (class attribute ``ensemble_steps``)."""
    return dict(_declared(method_cls, "ensemble_steps") or {})


def _solo_reason(method_cls, hparams) -> str | None:
    """Why an opted-in method runs solo under these hyperparameters (``ensemble_solo_when(hp)``), None: batched."""
    rule = _declared(method_cls, "ensemble_solo_when")
    return rule(hparams) if rule is not None else None


def _obstacle(method_cls) -> str | None:
    """Why its training cannot be batched, as the class (or a base) declares it (``ensemble_obstacle``)."""
    return next((vars(b)["ensemble_obstacle"] for b in method_cls.__mro__ if "ensemble_obstacle" in vars(b)), None)


def why_solo(case, method_cls, harness=None, device: torch.device | None = None) -> str | None:
    """Why ``case`` cannot run as a member of a seed ensemble (None: it can). For a method that has not
    opted in, the structural obstacle first (``_structure``: not a SupervisedMethod, its own training
    loop, a fit() the harness does not batch, its own loss without declared state), then the case's
    protocol, and "has not opted in" only where nothing keeps it out."""
    from ..toolkit.training import SupervisedMethod
    if not opted_in(method_cls):
        reason = _structure(method_cls)
        if reason:
            return f"method {case.method!r} {reason}"
        reason = _protocol(case, harness, device)
        if reason:
            return reason
        base = next((b for b in method_cls.__mro__[1:] if opted_in(b)), None)
        return (f"method {case.method!r} has not opted in to batched training"
                + (f" (opting in is per class: its base {base.__qualname__} has)" if base else "")
                + "; nothing in its training keeps it out: it could be opted in (a class attribute "
                  "ensemble = True) once its members equal their solo runs")
    reason = _solo_reason(method_cls, case.hparams)
    if reason:
        return reason
    if not issubclass(method_cls, SupervisedMethod):
        return f"method {case.method!r} is not a SupervisedMethod"
    for name in ("fit", "loss", "cross_entropy"):
        if name == "loss" and _state_names(method_cls) is not None:
            continue   # its own loss, run per member inside vmap with its stacked state
        if getattr(method_cls, name) is not getattr(SupervisedMethod, name):
            return f"method {case.method!r} overrides {name}()"
    return _protocol(case, harness, device)


def _protocol(case, harness, device) -> str | None:
    """What of the case (not of the method) keeps its members from one batched training step."""
    spec = case.scenario
    if spec.setting_enum not in (Setting.CLASS_IL, Setting.TASK_IL):
        return f"setting {spec.setting}: only class- and task-incremental task protocols are batched"
    if getattr(spec, "eval_every", 0):
        return "continual evaluation (eval_every) scores members mid-task"
    if getattr(spec, "amp", False) and device is not None and device.type == "cuda":
        return "mixed precision (GradScaler) keeps one scale for the whole ensemble"
    if harness is not None and getattr(harness, "wants_training_loss", False):
        return "a logger wants every training step's loss (clharness_training_loss)"
    return None


@functools.lru_cache(maxsize=None)
def _structure(method_cls) -> str | None:
    """What in ``method_cls``'s training keeps it from the batched step, read from its source (None: nothing
    found). The functions its ``learn`` reaches through ``self.<name>`` and ``super()`` (those of SupervisedMethod
    and above excepted, the harness's own), in order: a training loop of its own (a Trainer, an optimizer, a
    ``.step()``, with what else it does: backward, gradients), a ``fit`` over its own parameters or trainer, or
    with a loss its ensemble_steps do not declare, an override of ``fit``, or its own ``loss`` / ``cross_entropy``
    without declared per-member state (``ensemble_state``)."""
    from ..toolkit.training import SupervisedMethod
    order = _reached(method_cls)
    loop = _own_loop(method_cls, order)
    if not issubclass(method_cls, SupervisedMethod):
        return ("is not a SupervisedMethod: it has no fit(batches) for the batched step to replace"
                + (f"; {loop}" if loop else ""))
    if loop:
        return f"trains with a loop of its own, outside fit(): {loop}"
    reason = _fit_calls(method_cls, order)
    if reason:
        return reason
    if getattr(method_cls, "fit") is not getattr(SupervisedMethod, "fit"):
        return "overrides fit()"
    if _state_names(method_cls) is None:
        return _own_loss(method_cls)
    return None


def _harness_own(method_cls) -> set:
    """The classes whose functions are the harness's own (SupervisedMethod and above), not the method's."""
    from ..toolkit.training import SupervisedMethod
    return set(SupervisedMethod.__mro__) if issubclass(method_cls, SupervisedMethod) else {object}


def _lookup(method_cls, name: str, after=None):
    """(defining class, function) of ``name`` on method_cls (after class ``after`` in its MRO); None where
    the harness defines it or it is no Python function."""
    mro = method_cls.__mro__
    if after is not None:
        mro = mro[mro.index(after) + 1:]
    for klass in mro:
        if name in vars(klass):
            attr = vars(klass)[name]
            attr = attr.fget if isinstance(attr, property) else getattr(attr, "__func__", attr)
            if klass in _harness_own(method_cls) or not isinstance(attr, types.FunctionType):
                return None
            return klass, attr
    return None


def _source_tree(func):
    """The syntax tree of ``func``'s source, annotations dropped (``trainer: Trainer`` builds nothing)."""
    import ast
    import inspect
    import textwrap
    try:
        node = ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, TypeError, SyntaxError):
        return None
    for n in ast.walk(node):
        if isinstance(n, (ast.arg, ast.FunctionDef)):
            n.annotation = n.returns = None
    return node


def _self_names(node) -> list[str]:
    import ast
    return [n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id == "self"]


def _reached(method_cls) -> list:
    """(class, function, tree) of every function of the method's own that its ``learn`` reaches through
    ``self.<name>`` and ``super().<name>``, in the order they are reached."""
    import ast
    seen, order, todo = set(), [], [_lookup(method_cls, "learn")]
    while todo:
        found = todo.pop(0)
        if found is None or found in seen:
            continue
        seen.add(found)
        klass, func = found
        node = _source_tree(func)
        if node is None:
            continue
        order.append((klass, func, node))
        for n in ast.walk(node):
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self":
                todo.append(_lookup(method_cls, n.attr))
            elif (isinstance(n, ast.Attribute) and isinstance(n.value, ast.Call)
                  and isinstance(n.value.func, ast.Name) and n.value.func.id == "super"):
                todo.append(_lookup(method_cls, n.attr, klass))
    return order


def _own_loop(method_cls, order) -> str | None:
    """A training loop of its own among the reached functions: an optimizer (or Trainer) built and stepped,
    where, and what else the stepping function does (backward, gradients); None where there is none."""
    import ast
    builds, steps = {}, {}
    for klass, func, node in order:
        where = f"{klass.__qualname__}.{func.__name__}"
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        attrs = {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
        calls = [n.func for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
        built = [w for w, hit in (("Trainer", "Trainer" in names),
                                  ("optimizer", "make_optimizer" in names or "optim" in attrs)) if hit]
        if built:
            builds[where] = f"builds its own {' and '.join(built)}"
        if any(c.attr == "step" and not (isinstance(c.value, ast.Name) and c.value.id == "self") for c in calls):
            steps[where] = [w for w, hit in (
                ("calls backward()", any(c.attr == "backward" for c in calls)),
                ("reads or rewrites the step's gradients",
                 "grad" in attrs or any("grad" in n for n in names if n not in ("enable_grad", "no_grad")))) if hit]
    if not (builds and steps):
        return None
    both = next((w for w in steps if w in builds), None)
    if both:
        loop = f"{both} {builds[both]}, steps it" + "".join(f", {w}" for w in steps[both])
    else:
        built, stepped = next(iter(builds)), next(iter(steps))
        loop = f"{built} {builds[built]}, {stepped} steps it" + "".join(f", {w}" for w in steps[stepped])
    note = _obstacle(method_cls)
    return loop + " (" + (note or "the batched step replaces fit(batches) only") + ")"


def _fit_calls(method_cls, order) -> str | None:
    """A ``self.fit`` call the batched step cannot take: over a subset of the parameters, with a trainer of
    its own, or with a loss no ``ensemble_steps`` entry splits into its random draws and a batchable loss."""
    import ast
    steps = _steps(method_cls)
    for klass, func, node in order:
        for call in ast.walk(node):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "fit"
                    and isinstance(call.func.value, ast.Name) and call.func.value.id == "self"):
                continue
            where = f"{klass.__qualname__}.{func.__name__}"
            kw = {k.arg: k.value for k in call.keywords}
            if len(call.args) > 2 or "params" in kw:
                return f"trains a subset of its parameters: {where} calls fit(..., params=...)"
            if len(call.args) > 3 or "trainer" in kw:
                return f"hands fit() a trainer of its own: {where} calls fit(..., trainer=...)"
            loss = call.args[1] if len(call.args) > 1 else kw.get("loss_fn")
            if loss is None:
                continue
            exprs = [loss]
            if isinstance(loss, ast.Name):   # a local: what it is assigned
                exprs = [a.value for a in ast.walk(node) if isinstance(a, ast.Assign)
                         and any(isinstance(t, ast.Name) and t.id == loss.id for t in a.targets)]
            used = {name for e in exprs for name in _self_names(e)}
            if not used or any(name not in steps for name in used):
                named = ", ".join(sorted(used)) or ast.unparse(loss)
                return (f"hands fit() a loss of its own ({named}, in {where}) that no ensemble_steps entry splits into "
                        "its random draws and a batchable loss")
    return None


def _own_loss(method_cls) -> str | None:
    """Its own ``loss`` or ``cross_entropy`` without declared per-member state, and what that reads."""
    for name in ("loss", "cross_entropy"):
        found = _lookup(method_cls, name)
        if found is None:
            continue
        klass, func = found
        node = _source_tree(func)
        reads = sorted({a for a in (_self_names(node) if node else ()) if a not in ("model", "labels", "hp", "context")
                        and not callable(getattr(method_cls, a, None))})
        return (f"overrides {name}() ({klass.__qualname__}.{name}) without declaring the per-member state "
                f"it reads (ensemble_state)" + (f": it reads {', '.join(reads)}" if reads else ""))
    return None
