"""Ensembles (issue 32): cases that differ only in their seed (or float hyperparameters) train as one batched model.

``--clh-ensemble`` (``clharness.run(..., ensemble=True)`` or ``"seeds"``): the plain cases of one scenario,
method and hyperparameters, seeds s_1..s_E, run as E members of one ensemble. ``--clh-ensemble=hparams``
(``ensemble="hparams"``): also cases whose hyperparameters differ only in float values (lr, weight decay,
EWC's lambda, LwF's temperature: ``shared_hparams``), every int, string and bool equal (epochs, batch size,
scheduler kind, optimizer, milestones count), and whose scenarios differ at most in their name (GTEP's
``<scenario>:tune-c<k>``): GTEP's tuning configurations, a selection's candidates. Without the option, a
suite's ``[suite] ensemble = "seeds" | "hparams"`` opts its cases in (the option wins); how runs execute
enters no record key (``mode``). Each member is built exactly
as its solo run builds it, by the runner's own ``run_case`` (seed_everything(seed), its scenario,
its context, the method's own constructor), runs the runner's own protocol (evaluation, metrics,
memory, statuses), and writes the record its solo run would write, under the same key, with
``record.extra["executor"] = "ensemble:E"``. Only the training step is shared: where a member's
``learn`` hands its batches to ``fit``, the member pauses; once every member of the ensemble has
paused at the same task, their models' parameters are stacked (``torch.func.stack_module_state``)
and trained together: one ``vmap`` of the method's own ``loss`` over the members (``functional_call``),
each member fed the batches its solo run would see (its own Experience generator). The optimizer, two
ways (``_train_task``): where every member's trainer is the same constant elementwise optimizer (SGD,
Adam, AdamW, equal hyperparameters, no schedule, no clipping: ``_uniform``), one optimizer over the stacked
parameters, which is E independent optimizers; otherwise each member keeps its model's own parameters and
the trainer its solo ``fit`` builds (``Trainer.for_method``: its optimizer, lr, momentum, weight decay, its
schedule over its own epoch length, its clipping), the step's forward reads ``torch.stack`` of the members'
parameters (one backward hands each member its own gradients) and each member's optimizer steps, its
schedule at its own epoch ends: the optimizer arithmetic is the solo run's, only the forward and backward
sum in another order. A float hyperparameter whose value differs between members reaches the method's own
loss as the member's own (a stacked 0-d tensor inside vmap: a batched method's loss uses its floats as
numbers, never in a Python branch). A member whose batches run out first (class order,
hence task sizes, differ by seed) keeps its weights while the others go on; members whose batch sizes
differ at a step (the last, partial batch of an epoch) are stepped in groups of equal size, so a
BatchNorm layer sees exactly the samples it sees solo. Then every member's weights go back into its
own model, and each member evaluates through the runner's accuracy code, in turn.

The members run in threads that take turns (never two at once): a baton handed by semaphores,
each member's global random streams saved and restored at every hand-over, so the interleaving
changes nothing a member computes.

Which methods: the opted-in ones (the class declares ``ensemble = True``: finetune, joint, ncm, ewc, er, derpp,
lwf with SGD, cbrs, mas, gdumb, mste, or a plugin's method; per class: a subclass of an opted-in method opts in on
its own, and then inherits its base's ``ensemble_*`` declarations) whose ``learn`` trains through the standard supervised loop: ``self.fit(batches)`` per task with the
default parameters and trainer (a fresh optimizer per task), the step elementwise over members, and a loss
that is SupervisedMethod's, the method's own reading declared per-member state (class attribute
``ensemble_state``: EWC's Fishers and anchors, MAS's importance and anchor, LwF's old model and the classes it
distils, stacked and vmapped with the parameters), or a ``fit`` loss of its own that draws at random (class
attribute ``ensemble_steps``: ER's, CBRS's and DER++'s replay). Work a method does around ``fit`` (NCM's class means,
EWC's Fisher, MAS's importance, ER's and CBRS's memory update after the task, GDumb's sampler and fresh model,
MSTE's fresh expert per task) runs in the member, on its trained weights. A case that cannot be batched runs
solo; the session says which and why (``why_solo``). For a method that has not opted in, why_solo names the
structural obstacle, read from the source of the functions its ``learn`` reaches (``_structure``): not a
SupervisedMethod (the prompt and adapter methods: l2p, dualprompt, coda_prompt, hide_prompt, pgp, lae, aper,
ease, ranpac, simplecil, pnn); a training loop of its own outside ``fit`` (si: its path integral reads every
step's gradient; agem and gem: they project each step's gradient between backward and step, which one
batched loss cannot express, their ``ensemble_obstacle``; ace, afec, bic, clser, generative_replay, gmed, mir, slca,
xder); a ``fit`` over its own parameters or with its own trainer (beef, cwr, der, memo, foster; icarl,
podnet, wa); a loss of its own without declared state, or a ``fit`` loss no ``ensemble_steps`` entry splits; then the
case's protocol; "has not opted in" only where nothing keeps it out (it could then be opted in, once its
members equal their solo runs). Not batched yet: lwf with Adam/AdamW (``LwF.ensemble_solo_when``: chaotic at the
rounding level, so no reassociated sum stays within the floor), online streams, continual evaluation, mixed
precision on CUDA. LR schedules and gradient clipping are batched (each member's own trainer).

Replay: a step of ER or DER++ draws its replay batch from the member's memory with the member's
generator (and, with augmentation, views with the member's augmentation generator). The method splits
its ``fit`` loss into ``prepare`` (the step's random draws), ``loss`` (a function of the drawn tensors)
and, for DER++, ``after`` (the step's logits into the memory); the harness calls ``prepare`` and
``after`` per member, in the member's own random streams, in the order its solo run calls them, and
batches ``loss`` over the members (members whose drawn batches differ in size step in groups). So each
member draws exactly the batches its solo run draws, and its memory is its own.

Two ways to run the members' forward: SupervisedMethod's loss on a model made only of Linear, ReLU
and Flatten (the digits MLP) is written out with ``bmm`` for all members at once; anything else is
``vmap(functional_call)`` of the model's own forward. Each member's loss is summed and one
``backward`` gives every member its own gradient (the members share no parameter).

Where it pays: the step's fixed cost (Python, dispatch, kernel launches) is paid once per ensemble
instead of once per member; the arithmetic is the same. On a CPU the quickstart MLP's step is mostly
GEMM arithmetic already, so the gain there is small (bench/ensemble.py measures it); a narrow MLP
(overhead-bound) gains more, and a GPU, where a small model's step is all launch overhead, the most.
ER's and DER++'s draws stay per member (Python, and a swap of random streams, ~0.15 ms a call on a
CPU): on the quickstart's CPU their ensembles ran at about solo speed or slower (DER++: vmap's three
forward passes); the batched part is the forward and backward.

Scheduling: under pytest-xdist an ensemble is one unit of work: its items carry one ``xdist_group``
(``xdist_groups``) and the plugin turns ``-n N`` into ``--dist loadgroup``, so the worker that gets the
group trains the ensemble (``--dist worksteal``, which would split it, is refused). Under Ray
(``--clh-ray``) an ensemble is one task with the resources of one run (``ray_backend.run_remote_ensemble``)
whose records are stored under each member's key; cases that cannot be batched go as one task each. A
member already in the results store is not retrained: the ensemble shrinks to the others, and a member
left alone runs solo. GTEP's tuning runs (a configuration's S trials; their run says ``trains_case``)
are members too (every configuration's trials, schedules included; under "hparams" also configurations that
differ only in floats); its evaluation runs, whose case exists only once H* is selected, run solo. A suite's
``[suite] ensemble`` key alone: under pytest-xdist its ensembles are grouped with ``--dist loadgroup`` (plain
``-n`` keeps ``--dist load`` and its cases run solo, saying so); the Ray backend batches only under the
option, by seed (``ensembles`` without a session).

Declared differences from a solo run: ``train_seconds`` is the member's share of the ensemble's
training time (the whole ensemble's in ``extra["ensemble_train_seconds"]``); the non-finite-loss
guard checks every step on every device (a solo CUDA run checks every 50 steps); floats are summed in
another order (bmm / vmap kernels), so a chaotic run may drift from its solo twin (the equality floor
is a test on the quickstart: accuracy matrices equal within 1e-4).
"""
from __future__ import annotations

import copy
import functools
import math
import random
import threading
import time
import types
import warnings

import numpy as np
import torch

from ..method import Diverged, MethodError
from .flops import NOT_COUNTED
from .ensemble_policy import _state_names, _steps, why_solo   # the opt-in policy (why_solo: its public entry)


def _trains_own_case(unit) -> bool:
    """A unit whose run trains ``unit.case`` through ``session.run_stored`` with its own amend:
    ``run_case_unit``, or a family's run that says so (``run.trains_case = True``: GTEP's tuning runs)."""
    from .units import run_case_unit
    return (unit.case is not None and bool(unit.key) and unit.after is None
            and (unit.run is run_case_unit or getattr(unit.run, "trains_case", False) is True))


MODES = ("seeds", "hparams")


def mode(session, unit) -> str | None:
    """How ``unit``'s case may be grouped: the session's ``--clh-ensemble[=seeds|hparams|off]`` (``ensemble=``
    of clharness.run; True is "seeds"; "off" runs every case solo), else its suite's ``[suite] ensemble`` key;
    None: solo. An execution
    mode, not part of what a run computes: it enters no record key."""
    option = session.options.ensemble
    if option is True:
        option = "seeds"
    if option and option not in (*MODES, "off"):
        raise ValueError(f"ensemble = {option!r}; choose seeds, hparams or off")
    if option == "off":   # solo, whatever the suite's key says
        return None
    if option:
        return option
    return _suite_mode(str(unit.path)) if getattr(unit, "path", None) else None


@functools.lru_cache(maxsize=64)
def _suite_mode(path: str) -> str | None:
    from .suites import load_suite
    try:
        return load_suite(path).ensemble or None
    except Exception:   # noqa: BLE001 - a unit whose file no longer loads runs solo (as without the key)
        return None


def shared_hparams(hparams: dict, how: str = "seeds") -> dict:
    """What the members of one ensemble share of their hyperparameters. "seeds": all of them. "hparams":
    all but the float-valued ones (lr, a loss weight, a temperature: they change no shape and no control
    flow; each member reads its own, ``_train_task``), whose names only must match. An int (epochs,
    batch_size, num_milestones), a string (scheduler, optimizer) or a bool must be equal."""
    if how != "hparams":
        return {"hparams": hparams}
    floats = {k for k, v in hparams.items() if isinstance(v, float)}
    return {"hparams": {k: v for k, v in hparams.items() if k not in floats}, "floats": sorted(floats)}


def _ensemble_id(case, how: str = "seeds") -> str:
    """What the members of one ensemble share: the case but for its seed (suite, scenario, method, hparams);
    under "hparams" also but for its float hyperparameters (``shared_hparams``) and its scenario's name (a
    label: GTEP writes the configuration there, ``<scenario>:tune-c<k>``; each member builds its own
    scenario from its own case anyway, so a name could change only the member's data, never a shape)."""
    from ..results import run_key
    from .suites import spec_definition
    scenario = spec_definition(case.scenario)
    if how == "hparams":
        del scenario["name"]
    return run_key({"type": type(case).__qualname__, "suite": case.suite, "scenario": scenario,
                    "method": case.method, **shared_hparams(case.hparams, how), "mode": how})


def ensembles(units, session=None) -> list[list]:
    """``units`` (in order) as would-be ensembles: the units that train their own case and whose
    ``mode`` is on (without a session: all, by seed), grouped by ``_ensemble_id``, one unit per record key
    (units that share a key, GTEP tuning runs of two scenarios: the first trains it, ``Session.owner``).
    Groups of one included; stored keys not removed."""
    owners: dict[str, object] = {}
    for u in units:
        if u.key:
            owners.setdefault(u.key, u)
    groups: dict[str, list] = {}
    for u in units:
        if _trains_own_case(u) and owners[u.key] is u:
            how = mode(session, u) if session is not None else "seeds"
            if how:
                groups.setdefault(_ensemble_id(u.case, how), []).append(u)
    return list(groups.values())


def batchable(session, group: list) -> bool:
    """Whether ``group`` (one ensemble's units) can train batched; when not, the session says why (once)."""
    case = group[0].case
    reason = why_solo(case, session.harness.methods[case.method], session.harness, session.device)
    if reason:
        _say(session, (case.suite, case.scenario.name, case.method),
             f"--clh-ensemble: {case.suite}::{case.scenario.name}[{case.method}] runs solo: {reason}")
    return reason is None


def xdist_groups(session, units) -> dict:
    """unit -> the name of its ``xdist_group`` (pytest-xdist ``--dist loadgroup`` sends a group's items
    to one worker, which then trains the ensemble), for the ensembles of two or more batchable members.
    Every worker collects the same units in the same order, so every worker names the same groups."""
    out = {}
    for group in ensembles(units, session):
        case = group[0].case
        if len(group) >= 2 and why_solo(case, session.harness.methods[case.method], session.harness,
                                        session.device) is None:
            name = f"clh-ensemble-{_ensemble_id(case, mode(session, group[0]))}"
            out.update((u, name) for u in group)
    return out


def member_record(session, unit, case, method_cls, key: str):
    """The record of ``case`` trained as a member of a seed ensemble, or None (run it solo).
    Called by ``Session._run_here`` under ``--clh-ensemble``: the first unit of an ensemble trains
    every member not yet stored (a member already stored is reused: the ensemble shrinks; below two
    members, solo); its siblings' records wait here until their own units run (each through its own
    ``run_stored``: amended and stored as its solo record would be)."""
    stash = session.__dict__.setdefault("_ensembled", {})
    if key in stash:
        return stash.pop(key)
    if session.options.xdist_worker and not session.options.xdist_grouped:
        # this worker may hold only some of the ensemble's units: training the others here would train
        # them twice (pytest_plugin sets --dist loadgroup itself; another --dist that splits them lands here)
        _say(session, ("xdist",), "--clh-ensemble under pytest-xdist: cases run solo, the --dist mode does not "
                                  "keep an ensemble's items on one worker; use --dist loadgroup")
        return None
    if unit not in session.units or case is not unit.case:
        return None
    cached = session.__dict__.get("_ensembles")
    if cached is None or cached[0] is not session.units:   # once per schedule
        cached = session.__dict__["_ensembles"] = (session.units, ensembles(session.units, session))
    group = next((g for g in cached[1] if unit in g), [unit])
    # the session's one reuse decision (--clh-fresh, --clh-reuse-stale): a member it would reuse is not trained
    group = [u for u in group if u is unit or (u.key not in stash and session.reuse_case(u.case) is None)]
    if len(group) < 2 or not batchable(session, group):
        return None
    root = session.options.data_root
    from pathlib import Path
    progress = session.progress(unit) if session.progress else None
    records = run_ensemble([u.case for u in group], session.harness, session.device,
                           Path(root) if root else None, session.options.download, on_task=progress)
    for u, record in zip(group, records):
        if u is not unit:
            stash[u.key] = record
    return records[group.index(unit)]


def _say(session, what, message: str) -> None:
    said = session.__dict__.setdefault("_ensemble_said", set())
    if what not in said:
        said.add(what)
        session.warn(message)


# ----------------------------------------------------------------------------------------- the members
_local = threading.local()


def _rng_state():
    return random.getstate(), np.random.get_state(), torch.get_rng_state()


def _set_rng(state) -> None:
    random.setstate(state[0])
    np.random.set_state(state[1])
    torch.set_rng_state(state[2])


class _Member:
    def __init__(self, case, coordinator: threading.Semaphore):
        self.case = case
        self.turn = threading.Semaphore(0)
        self.coordinator = coordinator
        self.method = None
        self.batches = None
        self.error: BaseException | None = None      # raised in the member at its resume (Diverged)
        self.crash: BaseException | None = None      # escaped run_case (KeyboardInterrupt)
        self.record = None
        self.done = False
        self.step = None     # this task's (prepare, loss name, after), _step; None: the method's loss
        self.rng = None      # its global random streams while paused
        self.train_seconds = 0.0     # its share of the ensemble's training time
        self.ensemble_seconds = 0.0  # the ensemble's training time while it was a member

    def pause(self) -> None:
        """Hand the baton to the coordinator; resume when it hands it back (its random streams as it
        left them, or as its ``prepare`` and ``after`` calls left them, ``_in_member``)."""
        self.rng = _rng_state()
        self.coordinator.release()
        self.turn.acquire()
        _set_rng(self.rng)


def _in_member(member: _Member, f, *args):
    """``f(*args)``, the member's own Python (a replay draw, a store), in the member's random streams."""
    if member.rng is None:   # not paused (a test drives _train_task directly)
        return f(*args)
    _set_rng(member.rng)
    try:
        return f(*args)
    finally:
        member.rng = _rng_state()


def _step(method, loss_fn):
    """``fit``'s ``loss_fn`` (a bound method of ``method`` named in its ensemble_steps, or a partial of one with
    keywords) as (prepare, loss name, after); None when it is not one."""
    kw = {}
    if isinstance(loss_fn, functools.partial) and not loss_fn.args:
        loss_fn, kw = loss_fn.func, loss_fn.keywords
    parts = _steps(type(method)).get(getattr(loss_fn, "__name__", None))
    if parts is None or getattr(loss_fn, "__self__", None) is not method:
        return None
    prepare, loss, after = parts
    return functools.partial(getattr(method, prepare), **kw), loss, after and getattr(method, after)


def _fit_hook(original):
    def fit(self, batches, loss_fn=None, params=None, trainer=None):
        member = getattr(_local, "member", None)
        if member is None:
            return original(self, batches, loss_fn, params, trainer)
        step = None if loss_fn is None else _step(self, loss_fn)
        if ((loss_fn is not None and step is None) or params is not None or trainer is not None
                or member.batches is not None):
            raise MethodError(f"method {self.name!r}: --clh-ensemble batches only one fit(batches) per task with "
                              "the default loss (or one its ensemble_steps declare), parameters and trainer; run it "
                              "without --clh-ensemble")
        member.method, member.batches, member.step = self, batches, step
        member.pause()
        error, member.error = member.error, None
        if error is not None:
            raise error
        return None
    fit.ensemble_hook = True
    return fit


def run_ensemble(cases: list, harness, device: torch.device, data_root=None, download: bool = False,
                 on_task=None) -> list:
    """Run ``cases`` (the same case but for the seed) as one ensemble; their records, in order."""
    from .runner import run_case
    method_classes = {harness.methods[c.method] for c in cases}
    saved = {cls: cls.__dict__.get("fit") for cls in method_classes}
    coordinator = threading.Semaphore(0)
    members = [_Member(c, coordinator) for c in cases]

    def body(member: _Member, report) -> None:
        _local.member = member
        member.turn.acquire()
        try:
            member.record = run_case(member.case, harness, device, data_root, download, report)
        except BaseException as exc:   # noqa: BLE001 - handed to the coordinator, re-raised there
            member.crash = exc
        finally:
            member.done = True
            coordinator.release()

    for cls in method_classes:
        cls.fit = _fit_hook(getattr(cls, "fit"))
    try:
        threads = []
        for i, member in enumerate(members):   # one at a time: each builds its case up to its first fit
            thread = threading.Thread(target=body, args=(member, on_task if i == 0 else None),
                                      name=f"clh-ensemble-{member.case.seed}", daemon=True)
            thread.start()
            threads.append(thread)
            member.turn.release()
            coordinator.acquire()
        while True:
            waiting = [m for m in members if not m.done]
            if not waiting:
                break
            try:
                _train_task(waiting)
            except Exception as exc:   # the ensemble's own failure: every waiting member fails with it
                for m in waiting:
                    m.error = MethodError(f"ensemble training failed: {type(exc).__name__}: {exc}")
            for m in waiting:
                m.batches = None
                m.turn.release()
                coordinator.acquire()
        for thread in threads:
            thread.join()
    finally:
        for cls, fit in saved.items():
            if fit is None:
                del cls.fit
            else:
                cls.fit = fit
    for m in members:
        if m.crash is not None:
            raise m.crash
    E = len(members)
    for m in members:
        m.record.extra["executor"] = f"ensemble:{E}"
        m.record.extra["ensemble_train_seconds"] = m.ensemble_seconds
        m.record.train_seconds = m.train_seconds
        # its fit ran in this thread, outside its own FLOP meter (engine.flops): no training count, never a wrong one
        m.record.train_gflops, m.record.extra["flops"] = None, NOT_COUNTED
    return [m.record for m in members]


# ------------------------------------------------------------------------------------------ one task
_HP = "__hp__"   # the stacked state's entry for the hyperparameters that differ between members

class _View:
    """What the method's own ``loss`` reads of ``self`` for one member, inside ``vmap``: ``model``
    (the functional call on the member's parameters), ``labels`` (its task grouping), ``hp``, the
    member's declared state (``_state_names``) and the class's other methods, bound to the view."""

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
    """One member's model inside vmap: called, it is the functional call on the member's parameters;
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


def _train_task(members: list[_Member]) -> None:
    """One task of every member: their ``fit(batches)`` calls trained as one batched model.

    Two ways to step. Shared: every member's trainer is the same constant elementwise optimizer
    (``_uniform``): the parameters are stacked once (``stack_module_state``) and one optimizer steps the
    stack. Own: otherwise (a schedule, clipping, members' own lr or momentum under "hparams"): each
    member keeps its model's own parameters and the trainer its solo fit builds (``Trainer.for_method``);
    each step's forward reads ``torch.stack`` of the members' parameters, whose backward hands each member
    its own gradients, and each member's optimizer (and schedule) steps as in its solo run."""
    from torch.func import stack_module_state, vmap

    import torch.nn.functional as F

    from ..toolkit.training import NEG, SupervisedMethod, TaskLabels, Trainer
    t0 = time.perf_counter()
    methods = [m.method for m in members]
    cls = type(methods[0])
    models = [method.model for method in methods]
    for model in models:
        model.train()
    own = [Trainer.for_method(method) for method in methods]   # each member's, as its solo fit builds it
    shared = _uniform(own)
    params, buffers = stack_module_state(models)   # the buffers (BatchNorm's statistics) are stacked either way
    if shared:
        optimizer = Trainer.for_method(methods[0], params=params.values()).optimizer   # every member's own
    else:
        leaves = [dict(model.named_parameters()) for model in models]
    base = copy.deepcopy(models[0]).to("meta")
    base.train()
    task_il = methods[0].labels.task_il
    groups = {"group": torch.stack([method.labels.group for method in methods]),
              "current": torch.stack([method.labels.current for method in methods])}

    names = _state_names(cls) or ()
    state, fixed, bases = {}, {}, {}   # stacked tensors (vmapped), values shared by all, frozen modules' bases
    for name in names:
        values = [getattr(method, name) for method in methods]
        if all(v is None for v in values):
            fixed[name] = None
        elif isinstance(values[0], torch.nn.Module):   # a frozen copy (LwF's old model): stacked, no gradient
            mp, mb = stack_module_state(values)
            state[name] = ({k: v.detach() for k, v in mp.items()}, mb)
            bases[name] = copy.deepcopy(values[0]).to("meta").train(values[0].training)
        else:
            state[name] = _tree(values)
    # each member's own hyperparameters inside its loss: those whose values differ between members (the float
    # ones of an "hparams" ensemble: a loss weight, a temperature) go in as stacked 0-d tensors, vmapped
    hp = dict(methods[0].hp)
    varying = [k for k in hp if any(method.hp.get(k) != hp[k] for method in methods)]
    if any(not isinstance(method.hp.get(k), float) for k in varying for method in methods):
        raise MethodError(f"the members' hyperparameters {varying} differ in more than float values")
    if varying:
        first = next(iter(params.values()))
        state[_HP] = {k: torch.tensor([method.hp[k] for method in methods], dtype=first.dtype, device=first.device)
                      for k in varying}
    parts = [m.step for m in members]   # (prepare, loss name, after) of a ensemble_steps loss, or None
    if len({s and (s[1], s[2] and s[2].__name__) for s in parts}) > 1:
        raise MethodError("the members' fit calls differ in their loss")
    loss_name, after = (parts[0][1], parts[0][2]) if parts[0] else ("loss", None)

    def member_loss(p, b, lab, s, *args):
        labels = types.SimpleNamespace(task_il=task_il, group=lab["group"], current=lab["current"])
        labels.mask = types.MethodType(TaskLabels.mask, labels)
        labels.mask_current = types.MethodType(TaskLabels.mask_current, labels)
        s = dict(s)
        mine = {**hp, **s.pop(_HP, {})}
        attrs = {**fixed, **{k: (_FModel(bases[k], *v) if k in bases else v) for k, v in s.items()}}
        return getattr(_View(cls, _FModel(base, p, b), labels, mine, attrs), loss_name)(*args)

    # hand-batched layers (bmm) where every layer is known and the loss is SupervisedMethod's, else vmap (a
    # method's own loss, even one that declares no state, ``ensemble_state = ()``: it runs as written)
    plain = loss_name == "loss" and all(getattr(cls, n) is getattr(SupervisedMethod, n) for n in ("loss", "cross_entropy"))
    batched = _stacked_forward(models[0]) if not names and plain else None

    def group_losses(P, B, A, G, S):
        """Each member's loss on its own batch. The vmap path calls the method's own ``loss`` (via
        ``_View``); the hand-batched path writes SupervisedMethod.loss out for all members at once (the
        mean cross-entropy over the logits masked as TaskLabels.mask masks them: only methods that keep
        that loss are batched, ``why_solo``), float reassociation apart the same numbers."""
        if batched is not None:
            X, Y = A
            logits = batched(P, X)                                   # (E, N, C)
            if task_il:
                G = G["group"]
                logits = logits.masked_fill(G.gather(1, Y)[:, :, None] != G[:, None, :], NEG)
            n, c = Y.shape[1], logits.shape[-1]
            return F.cross_entropy(logits.reshape(-1, c), Y.reshape(-1), reduction="none").view(-1, n).mean(1)
        with warnings.catch_warnings():   # an op vmap runs member by member (kl_div) is still exact: say nothing
            warnings.filterwarnings("ignore", message="There is a performance drop because we have not yet implemented")
            return vmap(member_loss, randomness="error")(P, B, G, S, *A)

    E = len(members)
    iters = [iter(m.batches) for m in members]
    alive = [m.error is None for m in members]
    steps = 0
    while True:
        batch = [next(iters[e], None) if alive[e] else None for e in range(E)]
        batch = [None if b is None else tuple(b) for b in batch]   # (x, y) pairs or Batch objects
        for e in range(E):
            if batch[e] is None:
                alive[e] = False
        active = [e for e in range(E) if batch[e] is not None]
        if not active:
            break
        # the loss's arguments: the batch, or what the member's own prepare draws for it (its replay batch)
        args = {e: _in_member(members[e], parts[e][0], *batch[e]) if parts[e] else batch[e] for e in active}
        by_shape: dict[tuple, list[int]] = {}
        for e in active:
            by_shape.setdefault(tuple(tuple(a.shape) for a in args[e]), []).append(e)
        full = len(by_shape) == 1 and len(active) == E
        moved, total = [], None
        for idx in by_shape.values():
            A = [torch.stack([args[e][i] for e in idx]) for i in range(len(args[idx[0]]))]
            if not shared:   # the members' own parameters, stacked (differentiable: each gets its own gradient)
                P = {k: torch.stack([leaves[e][k] for e in idx]) for k in leaves[0]}
            if full:
                losses = group_losses(params if shared else P, buffers, A, groups, state)
            else:
                at = torch.tensor(idx, device=A[0].device)
                if shared:
                    P = {k: p.index_select(0, at) for k, p in params.items()}
                B = {k: b.index_select(0, at) for k, b in buffers.items()}
                losses = group_losses(P, B, A, _rows(groups, at), _rows(state, at))
                with torch.no_grad():
                    for k, b in buffers.items():
                        b.index_copy_(0, at, B[k])
            if after is not None:   # (loss, out): each member's own Python after its step (DER++ stores)
                losses, out = losses
                for i, e in enumerate(idx):
                    _in_member(members[e], parts[e][2], *batch[e], out[i].detach())
            ok = []
            for i, (e, value) in enumerate(zip(idx, losses.detach().tolist())):
                if not math.isfinite(value):   # the solo guard: raised before the step
                    members[e].error = Diverged(f"method {methods[e].name!r}: non-finite loss ({value}) at or "
                                                f"before training step {steps + 1}; try a lower learning rate")
                    alive[e] = False
                else:
                    ok.append(i)
                    moved.append(e)
            if ok:   # members are independent: the gradient of the sum is each member's own gradient
                part = losses.sum() if len(ok) == len(idx) else losses[ok].sum()
                total = part if total is None else total + part
        if not shared:   # each member's own trainer steps; one that did not move (out of batches, diverged) does not
            if total is not None:
                for e in moved:
                    own[e].optimizer.zero_grad(set_to_none=True)
                total.backward()
                for e in moved:
                    _member_step(own[e])
            steps += 1
            continue
        still = sorted(set(range(E)) - set(moved))
        if still:
            at = torch.tensor(still)
            kept = {k: p.detach().index_select(0, at).clone() for k, p in params.items()}
        if total is not None:
            optimizer.zero_grad(set_to_none=True)
            total.backward()
            optimizer.step()
        if still:
            with torch.no_grad():
                for k, p in params.items():
                    p.index_copy_(0, at, kept[k])
        steps += 1
    with torch.no_grad():   # every member's weights back into its own model
        for e, model in enumerate(models):
            for name, p in model.named_parameters():
                if shared:
                    p.copy_(params[name][e])
            for name, b in model.named_buffers():
                b.copy_(buffers[name][e])
    spent = time.perf_counter() - t0
    for m in members:
        m.train_seconds += spent / E
        m.ensemble_seconds += spent


def _stacked_forward(model: torch.nn.Module):
    """``f(params, x)``: the model's forward for stacked parameters and inputs (E, N, ...), written with
    batched matrix products (one ``baddbmm`` per Linear for all members), or None when the model has a
    layer this does not know (then ``vmap`` runs the model's own forward). Known: Classifier, MLP,
    Sequential, Flatten, Linear, ReLU: the digits MLP, where vmap's per-op cost outweighs the work."""
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
        out = torch.bmm(x, weight.transpose(1, 2))
        return out if bias is None else out + bias.unsqueeze(1)

    return lambda P, x: run(model, "", P, x)
