"""Ensembles (issue 32): cases that differ only in their seed (or float hyperparameters) train together,
each member computing exactly what its solo run computes. This module schedules them; the members' threads
are ``engine.ensemble_members``, one task's training ``engine.ensemble_step``, the two driven together
``engine.ensemble_run``, the opt-in policy ``engine.ensemble_policy``.

``--clh-ensemble`` (``clharness.run(..., ensemble=True)`` or ``"seeds"``): the plain cases of one scenario,
method and hyperparameters, seeds s_1..s_E, run as E members of one ensemble. ``--clh-ensemble=hparams``
(``ensemble="hparams"``): also cases whose hyperparameters differ only in float values (lr, weight decay,
EWC's lambda, LwF's temperature: ``shared_hparams``), every int, string and bool equal (epochs, batch size,
scheduler kind, optimizer, milestones count), and whose scenarios differ at most in their name (GTEP's
``<scenario>:tune-c<k>``): GTEP's tuning configurations, a selection's candidates. Without the option, a
suite's ``[suite] ensemble = "seeds" | "hparams"`` opts its cases in (the option wins).

The executor enters no record key (README, "What a record's key holds"), because it changes no number:
each member is built exactly as its solo run builds it, by the runner's own ``run_case`` (seed_everything(seed),
its scenario, its context, the method's own constructor), runs the runner's own protocol (evaluation, metrics,
memory, statuses), and writes the record its solo run would write, under the same key, with
``record.extra["executor"] = "ensemble:E"``. Only the training step is shared: where a member's ``learn``
hands its batches to ``fit``, the member pauses; once every member has paused at the same task, their fits
are trained together (``ensemble_step._train_task``), each member fed the batches its solo run would see.
A step is hand-batched only where that is shown bit-identical to the solo step (SupervisedMethod's loss on
the MLP, on a CPU at one thread: one ``baddbmm`` per Linear); everywhere else (a convolution, BatchNorm, a
method's own loss, replay) each member's loss runs by its own forward, in turn. ``torch.func.vmap``, used
before, summed a batched convolution in another order: the cnn's members ended up to 0.019 from their solo
runs under the solo runs' keys (issue 38 item 3); the tests now hold members to their solo runs bit for bit,
on the MLP and on the cnn. The optimizer arithmetic is the solo run's: one elementwise optimizer over the
stacked parameters when every member's trainer is the same constant one, else each member's own trainer,
schedule (at its own epoch ends) and clipping. A member whose batches run out first keeps its weights while
the others go on; members whose batch shapes differ at a step are stepped in groups of equal shape.

Which methods: the opted-in ones (the class declares ``ensemble = True``: finetune, joint, ncm, ewc, er, derpp,
lwf with SGD, cbrs, mas, gdumb, mste, or a plugin's method; per class: a subclass of an opted-in method opts in
on its own, and then inherits its base's ``ensemble_*`` declarations) whose ``learn`` trains through the standard
supervised loop: ``self.fit(batches)`` per task with the default parameters and trainer (a fresh optimizer per
task), and a loss that is SupervisedMethod's, the method's own reading declared per-member state (class attribute
``ensemble_state``: EWC's Fishers and anchors, MAS's importance and anchor, LwF's old model and the classes it
distils), or a ``fit`` loss of its own that draws at random (class attribute ``ensemble_steps``: ER's, CBRS's and
DER++'s replay, split into ``prepare``, the step's random draws, ``loss`` and ``after``, each called in the
member's own random streams in its solo order). Work a method does around ``fit`` (NCM's class means, EWC's
Fisher, MAS's importance, memory updates, GDumb's fresh model, MSTE's fresh expert) runs in the member. A case
that cannot join an ensemble runs solo; the session says which and why (``why_solo``: the structural obstacle
read from the method's source, then the case's protocol, "has not opted in" only where nothing keeps it out).
Not batched yet: lwf with Adam/AdamW (``LwF.ensemble_solo_when``), online streams, continual evaluation, mixed
precision on CUDA.

Where it pays: the hand-batched step pays the step's fixed cost (Python, dispatch, kernel launches) once per
ensemble instead of once per member; a step run by each member's own forward costs what the solo steps cost
(bench/ensemble.py measures both). On a CPU the quickstart MLP's step is mostly GEMM arithmetic already, so the
gain there is small.

Scheduling: under pytest-xdist an ensemble is one unit of work: its items carry one ``xdist_group``
(``xdist_groups``) and the plugin turns ``-n N`` into ``--dist loadgroup``, so the worker that gets the
group trains the ensemble (``--dist worksteal``, which would split it, is refused). Under Ray
(``--clh-ray``) an ensemble is one task with the resources of one run (``ray_backend.run_remote_ensemble``)
whose records are stored under each member's key; cases that cannot be batched go as one task each. A
member the session would reuse (``Session.reuse_case``: ``--clh-fresh`` and ``--clh-reuse-stale`` included)
is not retrained: the ensemble shrinks to the others, and a member left alone runs solo. GTEP's tuning runs
(a configuration's S trials; their run says ``trains_case``) are members too; its evaluation runs, whose case
exists only once H* is selected, run solo. A suite's ``[suite] ensemble`` key alone: under pytest-xdist its
ensembles are grouped with ``--dist loadgroup`` (plain ``-n`` keeps ``--dist load`` and its cases run solo,
saying so); the Ray backend batches only under the option, by seed (``ensembles`` without a session).

Declared differences from a solo run (none in the numbers): ``train_seconds`` is the member's share of the
ensemble's training time (the whole ensemble's in ``extra["ensemble_train_seconds"]``); the FLOPs are the solo
run's, counted as engine/flops.py says; the non-finite-loss guard checks every step on every device (a solo
CUDA run checks every 50).
"""
from __future__ import annotations

import functools

from .ensemble_run import run_ensemble   # the members' cases in threads taking turns, trained together
from .ensemble_policy import why_solo   # the opt-in policy (why_solo: its public entry)


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

