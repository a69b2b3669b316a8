"""The ``cldyb`` scenario kind: CLDyB searches (CC and IC use cases, random and held-out baselines)
and the replay of their saved sequences through the normal runner.

A ``[[scenario]]`` with ``kind = "cldyb"`` collects, per seed:

* search items ``name[search-<job>-seedN]``: ``cc`` searches with all ``search_methods`` together,
  ``ic-<method>`` with one method each, ``random`` draws a random-order sequence from the same pool,
  ``heldout`` a random-order sequence from ``heldout_pool``; each writes its sequence JSON
  (docs/cldyb-sequence-format.md) under ``sequence_dir`` and stores a record;
* evaluation items ``name/<cc|ic|random|heldout>[method-seedN]``: wait for their search (across
  pytest-xdist workers), then replay the saved sequence as a static scenario through the runner,
  so their records carry the accuracy matrix and AA, AR (= -AFM), ALA.

With ``sequence = "file.json"`` the scenario is a plain replay: one case per method and seed (any
method, searched with or held out). Robustness (mean final AA over a method's IC sequences), the
CC-vs-random comparison and the rank correlation with the held-out benchmark are printed at the end
of the session (``terminal_summary``).
"""
from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from ...kinds import Unit
from ...outcomes import Failed
from ...scenario_spec import LATER_KEYS, ScenarioSpec, SuiteError
from .summary import SEARCH_METHOD, USE_CASES, _final_aa, summary_rows  # noqa: F401  (shared with report_html)
PSEUDO_METHODS = (SEARCH_METHOD,)   # the search's own records: a protocol step, no method (clharness.kinds)

MULTI_DATASET = True
SELECTS_HPARAMS = True   # collect() applies select_hparams to the replays (clharness.engine.hparam_selection)

OPTIONS = {
    "pool": (list, []),                  # [{dataset = "...", options = {...}, name = "..."}]
    "pool_growth": (list, []),           # [{step = 3, dataset = "...", options = {...}}]: added before that step
    "heldout_pool": (list, []),          # datasets of the held-out random-order benchmark (table 1)
    "classes_per_task": (int, 20),       # K (appendix B.3)
    "steps": (int, 10),                  # N (appendix B.3)
    "candidates": (int, 30),             # tasks drawn by greedy sampling (alg. 1's J)
    "search_space": (int, 5),            # tasks kept by functional clustering (alg. 2's J)
    "clusters": (int, 3),
    "knn_k": (int, 5),
    "probe_per_class": (int, 10),        # train images per class for prototypes and k-NN
    "lookahead": (int, 1),               # l of eq. 6
    "lookahead_width": (int, 0),
    "search": (str, "lookahead"),        # lookahead | mcts | most-similar | random
    "sampling": (str, "greedy"),         # greedy | uniform
    "clustering": (bool, True),
    "simulations": (int, 0),             # MCTS budget (0: 4 x search_space)
    "uct_c": ((int, float), 1.0),
    "discount": ((int, float), 1.0),
    "temperature": ((int, float), 0.0),  # tau of eq. 7: 0 = hard
    "use_cases": (list, ["cc", "random"]),
    "search_methods": (list, []),        # default: the suite's methods
    "sequence": (str, ""),               # replay this saved sequence instead of searching
    "sequence_dir": (str, ".clharness/sequences"),
}


def check(spec: ScenarioSpec) -> None:
    from .search import SAMPLINGS, SEARCHES
    o = spec.options
    if spec.setting != "class-incremental":
        raise ValueError(f"setting = {spec.setting!r}; CLDyB sequences are class-incremental")
    if o["sequence"]:
        return
    if not o["pool"]:
        raise ValueError("pool is empty; list the datasets of the CLDyB pool, e.g. "
                         "pool = [{ dataset = \"digits\" }, { dataset = \"synthetic\", options = { num_classes = 200 } }]")
    for key in ("pool", "pool_growth", "heldout_pool"):
        for entry in o[key]:
            _check_entry(key, entry, growth=key == "pool_growth")
    if not 0 < spec.validation < 1:
        raise ValueError(f"validation = {spec.validation}; the CLDyB search scores tasks on held-out validation "
                         "data: set validation to a fraction in (0, 1), e.g. 0.2")
    if o["classes_per_task"] < 2:
        raise ValueError(f"classes_per_task = {o['classes_per_task']}; a task needs at least 2 classes")
    for key in ("steps", "candidates", "search_space", "clusters", "knn_k", "probe_per_class"):
        if o[key] < 1:
            raise ValueError(f"{key} = {o[key]} must be at least 1")
    if o["search_space"] > o["candidates"]:
        raise ValueError(f"search_space = {o['search_space']} exceeds candidates = {o['candidates']}: clustering "
                         "keeps a subset of the sampled candidates")
    if o["lookahead"] < 0 or o["lookahead_width"] < 0 or o["simulations"] < 0:
        raise ValueError("lookahead, lookahead_width and simulations must not be negative")
    if o["temperature"] < 0 or not 0 < o["discount"] <= 1:
        raise ValueError(f"temperature = {o['temperature']} must be >= 0 and discount = {o['discount']} in (0, 1]")
    if o["search"] not in SEARCHES:
        raise ValueError(f"search = {o['search']!r}; allowed: {', '.join(SEARCHES)}")
    if o["sampling"] not in SAMPLINGS:
        raise ValueError(f"sampling = {o['sampling']!r}; allowed: {', '.join(SAMPLINGS)}")
    bad = [u for u in o["use_cases"] if u not in USE_CASES]
    if bad or not o["use_cases"]:
        raise ValueError(f"use_cases = {o['use_cases']!r}; allowed entries: {', '.join(USE_CASES)}")
    if "heldout" in o["use_cases"] and not o["heldout_pool"]:
        raise ValueError("use_cases has \"heldout\" but heldout_pool is empty; list the held-out datasets")


def _check_entry(key, entry, growth=False):
    allowed = {"dataset", "options", "name"} | ({"step"} if growth else set())
    if not isinstance(entry, dict) or not isinstance(entry.get("dataset"), str):
        raise ValueError(f"{key} entry {entry!r} must be a table with dataset = \"<registered dataset>\"")
    unknown = set(entry) - allowed
    if unknown:
        raise ValueError(f"{key} entry {entry!r}: unknown key(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
    if not isinstance(entry.get("options", {}), dict):
        raise ValueError(f"{key} entry {entry!r}: options must be a table")
    if growth and (not isinstance(entry.get("step"), int) or entry["step"] < 1):
        raise ValueError(f"{key} entry {entry!r} needs step = N (N >= 1): the step before which it joins the pool")


# ---------------------------------------------------------------------------------- pools
def pool_settings(spec: ScenarioSpec, seed: int) -> dict:
    return {"validation": spec.validation, "max_train_per_class": spec.max_train_per_class,
            "max_test_per_class": spec.max_test_per_class, "image_size": spec.image_size,
            "channels": spec.channels, "probe_per_class": spec.options["probe_per_class"], "seed": seed}


def _entry_name(entry: dict) -> str:
    return entry.get("name") or entry["dataset"]


def add_entry(pool, entry: dict, datasets, data_root, download) -> list[str]:
    try:
        source_cls = datasets[entry["dataset"]]
    except LookupError as exc:
        raise ValueError(f"pool dataset {entry['dataset']!r}: {exc}") from None
    source = source_cls(**entry.get("options", {}))
    source.name = entry["dataset"]
    return pool.add(_entry_name(entry), source, data_root, download)


def make_pool(entries, settings: dict, datasets, device, data_root=None, download=False, augment="none",
              spec: ScenarioSpec | None = None):
    """The pool of ``entries``; ``spec`` (the scenario) decides the inputs' normalisation (its
    ``normalize``, through clharness.toolkit.backbones.input_normalization; default: the first
    dataset's statistics)."""
    import functools

    from ...toolkit import augment as augmentation
    from ...toolkit.backbones import input_normalization
    from .pool import DataPool
    pool = DataPool(device, **settings)
    pool.recipe = augmentation.get(augment)
    if spec is not None:
        pool.normalization = functools.partial(input_normalization, spec.normalize, spec.backbone,
                                               spec.backbone_options)
    for entry in entries:
        add_entry(pool, entry, datasets, data_root, download)
    return pool


def build(spec: ScenarioSpec, datasets, seed, device, data_root=None, download=False):
    """A replay scenario (``sequence`` set); searches run in their own items (see ``collect``)."""
    from . import sequence as seqmod
    path = spec.options.get("sequence")
    if not path:
        raise ValueError(f"scenario {spec.name!r}: a cldyb scenario without `sequence` runs through its search "
                         "items (collected from a suite file); set sequence = \"file.json\" to replay one")
    seq = seqmod.load(path)
    entries = spec.options["pool"] or [*seq["pool"], *seq.get("pool_growth", [])]
    pool = make_pool(entries, seq["pool_settings"], datasets, device, data_root, download, spec.augment, spec)
    return seqmod.replay(seq, pool, spec, seed, where=f"sequence {path}")


# ---------------------------------------------------------------------------------- searching
def search_config(spec: ScenarioSpec, search: str | None = None):
    from .search import SearchConfig
    o = spec.options
    fields = {f.name for f in dataclasses.fields(SearchConfig)}
    cfg = SearchConfig(**{k: v for k, v in o.items() if k in fields}, batch_size=spec.batch_size,
                       eval_batch_size=spec.eval_batch_size)
    return dataclasses.replace(cfg, search=search) if search else cfg


@dataclasses.dataclass
class Job:
    label: str            # cc | ic-<method> | random | heldout
    use_case: str         # cc | ic | random | heldout
    searchers: list       # methods searched with
    evaluated: list       # methods evaluated on the sequence


def run_search(session, suite_name: str, spec: ScenarioSpec, job: Job, hparams: dict, harness, seed: int, device,
               data_root=None, download=False, remote=None, evaluating=None) -> dict:
    """One search: build the pool and the live methods, run the steps, return the sequence dict.
    ``session`` (a ``kinds.FamilySession``) seeds, makes the methods' cases and contexts and names the
    versions. ``remote``: an executor with ``map_method`` (Ray): the look-ahead values every candidate as
    its own task (``remote_fan_out``); the same arithmetic per candidate, so the same sequence.
    ``evaluating``: what marks the search's evaluation for its FLOP count (``session.counted``)."""
    from ...method import Setting
    from .search import Search
    from .sequence import describe_device
    session.seed_everything(seed)
    o = spec.options
    settings = pool_settings(spec, seed)
    random_order = job.use_case in ("random", "heldout")
    entries = o["heldout_pool"] if job.use_case == "heldout" else o["pool"]
    growth = [] if job.use_case == "heldout" else o["pool_growth"]
    pool = make_pool(entries, settings, harness.datasets, device, data_root, download, spec.augment, spec)
    cfg = search_config(spec, "random" if random_order else None)
    shape = SimpleNamespace(setting=Setting.CLASS_IL, num_classes=cfg.classes_per_task * cfg.steps,
                            input_shape=pool.input_shape, tasks=[])
    methods = []
    for name in job.searchers:
        cls = harness.methods[name]
        case = session.case(suite_name, spec, name, seed, hparams[name])
        methods.append(cls(session.method_context(case, shape, harness, device), **hparams[name]))

    def grow(step):
        return [c for e in growth if e["step"] == step for c in add_entry(pool, e, harness.datasets, data_root, download)]

    search = Search(pool, methods, cfg, seed, device, grow)
    if evaluating is not None:
        search.evaluating = evaluating
    if remote is not None:
        search.fan_out = remote_fan_out(remote)
    steps, t0 = [], time.perf_counter()
    for log in search.run():
        steps.append(dataclasses.asdict(log))
    return {"use_case": job.use_case, "job": job.label, "seed": seed, "suite": suite_name, "scenario": spec.name,
            "methods": list(job.searchers), "hparams": {m: hparams[m] for m in job.searchers},
            "backbone": spec.backbone, "backbone_options": spec.backbone_options, "epochs": spec.epochs,
            "classes_per_task": cfg.classes_per_task, "pool": list(entries), "pool_growth": list(growth),
            "pool_settings": settings, "search": dataclasses.asdict(cfg), "device": describe_device(device),
            "versions": session.versions(), "search_seconds": time.perf_counter() - t0, "steps": steps}


def step_timings(sequence: dict) -> dict[str, float]:
    """Mean seconds per searched step (steps after the first) of each phase."""
    phases = ("prototypes", "sampling", "clustering", "lookahead", "learn")
    searched = sequence["steps"][1:] or sequence["steps"]
    return {p: float(np.mean([s["timings"].get(p, 0.0) for s in searched])) for p in phases}


def remote_fan_out(remote):
    """``Search.fan_out`` on a remote executor: the state F^{t-1} (methods, pool, diagonals) is shipped
    once per step, without the closures over the harness; every candidate is valued by its own task
    and the values come back in candidate order, so eq. 7 picks exactly what the serial search picks."""
    def fan_out(search, tasks):
        import copy
        light = copy.copy(search)
        light.grow, light._val_cache, light.fan_out = None, {}, None
        out = remote.map_method(light, "value_candidate", [(tasks, names) for names in tasks])
        return [v for v, _ in out], [r for _, r in out]
    return fan_out


# ---------------------------------------------------------------------------------- units
def collect(session, suite, spec: ScenarioSpec, methods: list[str], seeds: int) -> list:
    from .search import SEARCH_VERSION, Search
    harness = session.harness
    o = spec.options
    searchers = list(o["search_methods"]) or list(methods)
    hparams = {}
    for m in dict.fromkeys([*methods, *searchers]):
        try:
            hparams[m] = session.resolve_hparams(harness.methods[m], suite.hparams.get(m, {}))
        except ValueError as exc:
            raise SuiteError(f"{suite.path}: [hparams.{m}]: {exc}") from None

    def case_units(name, case, search_key=None, search_name=None) -> list:
        """The case's unit (a replay waits for its search); with ``select_hparams``, its selection
        runs on the sequence's first tasks before it, and it runs with their choice."""
        def plain():
            if search_key is None:
                return session.case_unit(suite, name, case)
            return session.case_unit(suite, name, case, run=_run_replay, after=search_key,
                                     data={"search_name": search_name})
        if spec.select_hparams is None:
            return [plain()]
        return session.selection_units(suite, case, name, after=search_key, make_plain=plain)

    if o["sequence"]:   # a saved sequence: a static scenario for any method
        path = Path(o["sequence"])
        if not path.is_absolute():   # a relative path names a file beside the suite file, wherever it runs
            spec = dataclasses.replace(spec, options={**o, "sequence": str(Path(suite.path).resolve().parent / path)})
        out = []
        for m in methods:
            for seed in range(seeds):
                out += case_units(f"{spec.name}[{m}-seed{seed}]", session.case(suite.name, spec, m, seed, hparams[m]))
        return out

    root = Path(o["sequence_dir"])
    root = root if root.is_absolute() else Path.cwd() / root   # like the results store: relative to the invocation
    searches, evals = [], []
    for seed in range(seeds):
        jobs = []
        for use_case in o["use_cases"]:
            if use_case == "cc":
                jobs.append(Job("cc", "cc", searchers, list(methods)))
            elif use_case == "ic":
                jobs += [Job(f"ic-{m}", "ic", [m], [m]) for m in searchers if m in methods]
            else:
                jobs.append(Job(use_case, use_case, [], list(methods)))
        for job in jobs:
            key, base = session.search_keys(   # base: the same search under any code
                suite.name, _search_spec(spec), job.label, seed, SEARCH_VERSION,
                [(m, harness.methods[m].version, hparams[m]) for m in job.searchers],
                [session.code_digest(harness.methods[m], __file__) for m in job.searchers]
                or session.code_digest(Search, __file__))
            path = root / f"{suite.name}-{spec.name}-{job.label}-seed{seed}.json"
            name = f"{spec.name}[search-{job.label}-seed{seed}]"
            searches.append(Unit(name, _run_search, suite=suite.name, path=suite.path, key=key, role="search",
                                 label=f"{suite.name}::{name} (CLDyB search with {job.searchers or 'no methods'})",
                                 data={"spec": spec, "job": job, "seed": seed, "sequence_path": path,
                                       "hparams": hparams, "base_key": base}))
            replay_spec = dataclasses.replace(spec, name=f"{spec.name}/{job.use_case}",
                                              options={**o, "pool": [], "sequence": str(path), "search_key": key,
                                                       "search_key_base": base})   # engine.keys.KEYED_OPTIONS
            for m in job.evaluated:
                evals += case_units(f"{spec.name}/{job.use_case}[{m}-seed{seed}]",
                                    session.case(suite.name, replay_spec, m, seed, hparams[m]), key, name)
    return searches + evals   # the searches first, then every replay


def _search_spec(spec: ScenarioSpec) -> dict:
    """The spec as it defines a search: select_hparams applies to the replays, not to the search."""
    # keys that joined the spec after the search key was defined: left out at their defaults, so the keys
    # of existing searches do not change (augment and first_task_train were there from the start)
    return {k: v for k, v in dataclasses.asdict(spec).items()
            if k != "select_hparams" and not (k in SEARCH_LATER_KEYS and v == SEARCH_LATER_KEYS[k])}


# every spec key that joined after the search key was defined (all of scenario_spec.LATER_KEYS but the three
# that were there from the start), so a key added to the spec later never moves the keys of stored searches
SEARCH_LATER_KEYS = {k: v for k, v in LATER_KEYS.items() if k not in ("augment", "first_task_train", "select_hparams")}


def _run_search(session, unit) -> None:
    from ...results import RunRecord
    from . import sequence as seqmod
    d = unit.data
    spec, job, seed, path = d["spec"], d["job"], d["seed"], d["sequence_path"]
    record = session.reuse(unit.key, d["base_key"])   # the session's one reuse rule (--clh-fresh, --clh-reuse-stale)
    if record is not None and record.status == "passed" and path.exists():
        try:
            if seqmod.load(path).get("search_key") == record.key:   # the file is still that search's sequence
                if record.key != unit.key:
                    session.say_stale(unit, record, f"that of search {unit.key}")
                return
        except seqmod.SequenceError:
            pass
    session.stale_reused.pop(unit.key, None)   # searched again: its own record answers
    record = RunRecord(suite=unit.suite, scenario=f"{spec.name}/{job.label}", method=SEARCH_METHOD,
                       seed=seed, setting=spec.setting, device=str(session.device), versions=dict(session.versions()),
                       key=unit.key, base_key=d["base_key"], started_at=time.time(), session=session.session_id)
    root = session.options.data_root
    try:
        # the search's cost, as a case's: every FLOP its methods' learning (look-ahead clones included) and its
        # evaluation compute, and its peak memory (issue 41)
        with session.counted(record) as evaluating:
            seq = run_search(session, unit.suite, spec, job, d["hparams"], session.harness, seed, session.device,
                             Path(root) if root else None, session.options.download, remote=session.remote,
                             evaluating=evaluating)
        seq["search_key"] = unit.key
        seqmod.save(path, seq)
        record.status, record.message = "passed", str(path)
        record.class_order = [c for s in seq["steps"] for c in s["classes"]]
        record.metrics = {f"{k}_seconds": v for k, v in step_timings(seq).items()}
        record.train_seconds = seq["search_seconds"]
    except Exception as exc:
        record.status, record.message = "error", f"{type(exc).__name__}: {exc}"
    record.finished_at = time.time()
    session.store.put(record)
    if record.status != "passed":
        raise Failed(f"CLDyB search {unit.name} failed: {record.message}")


def _run_replay(session, unit) -> None:
    if session.options.reuse_stale:   # its search may be answered by a stale record in another process (xdist)
        session.reuse(unit.after, unit.case.scenario.options.get("search_key_base"))
    records, missing = session.wait_for([unit.after])
    if missing or records[0].status != "passed":
        why = records[0].message if records else "no record (not run in this session and not in the results store)"
        raise Failed(f"{unit.name}: its search {unit.data['search_name']} did not produce a sequence: {why}")
    session.run_stored(unit, unit.case, unit.amend)


# ---------------------------------------------------------------------------------- summary
def terminal_summary(clh, terminalreporter) -> None:
    from tabulate import tabulate

    from ...metrics import rank_correlation
    rows = summary_rows(clh.records)
    if not rows:
        return
    def cell(v):
        value = v[0] if isinstance(v, tuple) else v
        if value is None or math.isnan(value):
            return "-"
        return f"{v[0]:.3f} ± {v[1]:.3f}" if isinstance(v, tuple) else f"{v:.2f}"
    cols = [("cc_aa", "CC AA"), ("cc_ar", "CC AR"), ("cc_ala", "CC ALA"), ("robustness", "robustness (IC AA)"),
            ("memory_mb", "memory MB"), ("random_aa", "random AA"), ("heldout_aa", "held-out AA")]
    terminalreporter.section("CLDyB (mean ± 95% CI over seeds; AR = -AFM; robustness = mean final AA on IC sequences)")
    table = [[r["scenario"], r["method"], *[cell(r.get(c)) for c, _ in cols]] for r in rows]
    terminalreporter.write_line(tabulate(table, headers=["scenario", "method", *[h for _, h in cols]], tablefmt="github"))
    for scenario in dict.fromkeys(r["scenario"] for r in rows):
        sub = [r for r in rows if r["scenario"] == scenario]
        both = [r for r in sub if "cc_aa" in r and "random_aa" in r]
        if both:
            gap = np.mean([r["cc_aa"][0] - r["random_aa"][0] for r in both])
            terminalreporter.write_line(f"{scenario}: CC minus random final AA, mean over {len(both)} methods: {gap:+.3f}")
        for name in ("cc", "random"):
            pair = [r for r in sub if f"{name}_aa" in r and "heldout_aa" in r]
            if len(pair) >= 2:
                rc = rank_correlation([r[f"{name}_aa"][0] for r in pair], [r["heldout_aa"][0] for r in pair])
                terminalreporter.write_line(
                    f"{scenario}: rank correlation {name} vs held-out over {len(pair)} methods: Spearman "
                    f"{rc['spearman']:.3f} (p={rc['spearman_p']:.3g}), Kendall {rc['kendall']:.3f} (p={rc['kendall_p']:.3g})")
    searches = [r for r in clh.store.records(keys=None) if r.method == SEARCH_METHOD and r.session == clh.session_id] \
        if not hasattr(clh.config, "workerinput") else []
    for r in searches:
        t = ", ".join(f"{k.removesuffix('_seconds')} {v:.3f}s" for k, v in r.metrics.items())
        terminalreporter.write_line(f"search {r.suite}::{r.scenario} seed {r.seed}: per step {t}")


def report_sections(records, fmt, harness) -> list[tuple[str, str]]:
    """``clharness report``: the CLDyB table, CC-vs-random and held-out lines, and the CC sequence."""
    from . import report_html
    return report_html.text_sections(records, fmt)


def html_sections(records, harness, drawing) -> list[tuple[str, str]]:
    """The HTML report: table and CC/random/held-out bars, the fig. 4 radar, the chosen sequence."""
    from . import report_html
    return report_html.html_sections(records, drawing)
