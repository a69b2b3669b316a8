"""Suite files: declarative TOML describing scenarios, methods, seeds and budgets.

    [suite]
    name = "quickstart"
    seeds = 3
    methods = ["finetune", "er"]        # optional; default: every method that supports the setting
    planned_methods = ["clser"]         # optional: run when registered, else shown as skipped "not registered"
    ensemble = "seeds"                  # optional: batch cases as --clh-ensemble does ("seeds" | "hparams")

    [defaults]                          # any scenario key, applied to every scenario
    backbone = "mlp"
    epochs = 5

    [[scenario]]
    name = "ci-5x2"
    dataset = "digits"
    setting = "class-incremental"
    tasks = 5
    quick = { epochs = 1 }              # applied under --clh-quick

    [hparams.er]                        # per-method hyperparameter overrides
    lr = 0.05

Every key is checked: a typo is an error naming the file, the key and the allowed keys.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from .. import kinds
from ..scenario_spec import LATER_KEYS, ScenarioSpec, SuiteError, spec_definition  # noqa: F401  (the contract's)

_TYPES = {"name": str, "dataset": str, "kind": str, "setting": str, "dataset_options": dict, "tasks": int,
          "first_task": int, "increment": int, "num_classes": int, "validation": (int, float),
          "class_order": str, "epochs": int, "batch_size": int, "eval_batch_size": int, "memory_size": int,
          "backbone": str, "backbone_options": dict, "image_size": list, "channels": int,
          "max_train_per_class": int, "max_test_per_class": int, "amp": bool, "augment": str,
          "first_task_train": dict, "select_hparams": dict, "normalize": str, "eval_every": int,
          "eval_samples": int, "memory_encoder": str, "hparams": dict}
SCENARIO_KEYS = tuple(f.name for f in fields(ScenarioSpec) if f.name != "options")
# first_task_train = { epochs = 200, lr = 0.1, milestones = [60, 120, 170], lr_decay = 0.1, weight_decay = 5e-4 }
FIRST_TASK_KEYS = {"epochs": int, "lr": (int, float), "milestones": list, "lr_decay": (int, float),
                   "weight_decay": (int, float)}


# Scenario kinds (benchmark families) come from the clharness_add_kinds hook: clharness.kinds holds
# their registry and documents a kind's interface (OPTIONS, build, check, collect, sections).
SETTINGS = ("class-incremental", "task-incremental", "online", "domain-incremental")   # clharness.Setting values
CHOICES = {"setting": SETTINGS, "class_order": ("seed", "fixed"),
           "normalize": ("dataset", "none", "imagenet", "timm"),   # toolkit.backbones.NORMALIZATIONS
           "memory_encoder": ("trained", "never")}   # method.MEMORY_ENCODER_READINGS; kind: checked against clharness.kinds
SUITE_KEYS = ("name", "description", "seeds", "methods", "planned_methods", "ensemble")
RESOURCE_KEYS = ("cpus_per_run", "gpus_per_run")   # Ray task resources per run (--clh-ray), any scenario table
TOP_KEYS = ("suite", "defaults", "quick", "scenario", "hparams", "gates")


@dataclass(frozen=True)
class Suite:
    name: str
    path: Path
    scenarios: tuple[ScenarioSpec, ...]
    description: str = ""
    seeds: int = 1
    methods: tuple[str, ...] = ()                       # empty: every applicable method
    # methods a suite names that may not be registered yet (a paper's methods still to be written):
    # registered ones run as if in `methods`, the others are skipped as "not registered"
    planned_methods: tuple[str, ...] = ()
    hparams: dict[str, dict[str, Any]] = field(default_factory=dict)
    gates: tuple = ()                                    # clharness.reporting.gates.Gate, judged after the cases
    resources: dict[str, dict[str, float]] = field(default_factory=dict)   # scenario -> cpus/gpus_per_run
    # "seeds" | "hparams": train cases as ensembles (engine.ensemble) unless --clh-ensemble says otherwise;
    # how runs execute, not what they compute: no part of any record key
    ensemble: str = ""


def is_suite_file(path: Path) -> bool:
    """A TOML file with a top-level [suite] table (pyproject.toml and friends are not)."""
    try:
        with open(path, "rb") as fh:
            return isinstance(tomllib.load(fh).get("suite"), dict)
    except (OSError, tomllib.TOMLDecodeError):
        return path.suffix == ".toml" and path.parent.name == "suites"


def load_suite(path: str | Path, quick: bool = False) -> Suite:
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise SuiteError(f"suite file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise SuiteError(f"{path}: not valid TOML: {exc}") from None

    _check_keys(path, "the top level", data, TOP_KEYS)
    head = data.get("suite")
    if not isinstance(head, dict):
        raise SuiteError(f"{path}: missing the [suite] table (with at least name = \"...\")")
    _check_keys(path, "[suite]", head, SUITE_KEYS)
    name = head.get("name") or path.stem
    seeds = head.get("seeds", 1)
    if not isinstance(seeds, int) or isinstance(seeds, bool) or seeds < 1:
        raise SuiteError(f"{path}: [suite] seeds = {seeds!r}; expected a positive integer")
    methods = head.get("methods", [])
    if not isinstance(methods, list) or not all(isinstance(m, str) for m in methods):
        raise SuiteError(f"{path}: [suite] methods must be a list of method names, got {methods!r}")
    if "methods" in head and not methods:   # an empty list would silently mean "every method"
        raise SuiteError(f"{path}: [suite] methods = [] names no method; remove the methods key to run every "
                         "applicable method, or name the methods to run, e.g. methods = [\"er\", \"ewc\"]")
    planned = head.get("planned_methods", [])
    if not isinstance(planned, list) or not all(isinstance(m, str) for m in planned):
        raise SuiteError(f"{path}: [suite] planned_methods must be a list of method names, got {planned!r}")
    if set(planned) & set(methods):
        raise SuiteError(f"{path}: [suite] {sorted(set(planned) & set(methods))} are in both methods and "
                         "planned_methods; name each method once (planned_methods: those that may not be registered)")

    # [defaults] < [[scenario]] < [quick] < the scenario's own quick = {...}. Both the plain and the
    # quick variant of every scenario are checked, so a typo in a quick table never hides.
    defaults, quick_defaults = dict(data.get("defaults", {})), dict(data.get("quick", {}))
    base_resources = _take_resources(path, "[defaults]", defaults)
    quick_resources = _take_resources(path, "[quick]", quick_defaults)
    resources = {}
    raw = data.get("scenario", [])
    if not isinstance(raw, list) or not raw:
        raise SuiteError(f"{path}: no [[scenario]] tables; a suite needs at least one")
    scenarios, seen = [], set()
    for i, table in enumerate(raw):
        where = f"[[scenario]] #{i + 1}" + (f" ({table['name']})" if isinstance(table.get("name"), str) else "")
        table = dict(table)
        quick_table = table.pop("quick", {})
        if not isinstance(quick_table, dict):
            raise SuiteError(f"{path}: {where}: quick = {quick_table!r} must be a table of overrides")
        own = {**base_resources, **_take_resources(path, where, table)}
        own_quick = {**own, **quick_resources, **_take_resources(path, f"{where}.quick", quick_table)}
        plain = _check_kind(path, where, [("[defaults]", defaults), (where, table)])
        fast = _check_kind(path, f"{where} with its quick settings",
                           [("[defaults]", defaults), ("[quick]", quick_defaults), (where, table),
                            (f"{where}.quick", quick_table)])
        if plain.name in seen:
            raise SuiteError(f"{path}: scenario name {plain.name!r} is used twice")
        seen.add(plain.name)
        scenarios.append(fast if quick else plain)
        resources[plain.name] = own_quick if quick else own

    ensemble = head.get("ensemble", "")
    if ensemble not in ("", "seeds", "hparams"):
        raise SuiteError(f"{path}: [suite] ensemble = {ensemble!r}; allowed values: seeds, hparams")
    hparams = data.get("hparams", {})
    if not isinstance(hparams, dict) or not all(isinstance(v, dict) for v in hparams.values()):
        raise SuiteError(f"{path}: [hparams.<method>] tables expected, got {hparams!r}")
    return Suite(name=name, path=path, scenarios=tuple(scenarios), description=head.get("description", ""),
                 seeds=seeds, methods=tuple(methods), planned_methods=tuple(planned), hparams=hparams, gates=_gates(path, data, seen),
                 resources={k: v for k, v in resources.items() if v}, ensemble=ensemble)


def _take_resources(path, where, table: dict) -> dict:
    """Pop a table's per-run resources (``cpus_per_run``, ``gpus_per_run``): where a run goes is no part
    of what it computes, so they stay out of the ScenarioSpec and the record key (clharness.engine.ray_backend)."""
    out = {}
    for key in RESOURCE_KEYS:
        if key in table:
            value = table.pop(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise SuiteError(f"{path}: {where}: {key} = {value!r} must be a number >= 0 "
                                 "(e.g. gpus_per_run = 0.25 packs four runs on one GPU)")
            out[key] = value
    return out


def _gates(path, data, scenario_names) -> tuple:
    from ..reporting.gates import GateError, parse_gate
    lines = data.get("gates", [])
    if not isinstance(lines, list) or not all(isinstance(g, str) for g in lines):
        raise SuiteError(f"{path}: gates must be a list of strings such as \"er: final_acc >= 0.30\"")
    gates = []
    for line in lines:
        try:
            gate = parse_gate(line)
        except GateError as exc:
            raise SuiteError(f"{path}: {exc}") from None
        if gate.scenario and gate.scenario not in scenario_names:
            raise SuiteError(f"{path}: gate {line!r} names scenario {gate.scenario!r}; the suite has "
                             f"{', '.join(sorted(scenario_names))}")
        gates.append(gate)
    return tuple(gates)


def _check_keys(path, where, table, allowed):
    unknown = [k for k in table if k not in allowed]
    if unknown:
        named = ", ".join(f"{k!r}{did_you_mean(k, allowed)}" for k in unknown)
        raise SuiteError(f"{_key_line(path, unknown[0])}: {where}: unknown key(s) {named}; "
                         f"allowed: {', '.join(allowed)}")


def _key_line(path, key) -> str:
    """``path:line`` of the first line setting ``key`` (a plain or inline-table assignment), else ``path``."""
    import re
    pattern = re.compile(rf"""(^|[\s{{,]){re.escape(str(key))}\s*=""")
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, ValueError):
        return str(path)
    for i, line in enumerate(lines, 1):
        if pattern.search(line.split("#", 1)[0]):
            return f"{path}:{i}"
    return str(path)


def kind_module(kind: str):
    """The module that builds scenarios of ``kind`` (imported on first use: it needs torch)."""
    return kinds.kind_module(kind)


def _check_kind(path, where, layers: list[tuple[str, dict]]) -> ScenarioSpec:
    """Merge the tables (later wins), split common keys from the kind's own, check both (an
    unknown key is reported in the table it was written in), build the spec."""
    table = {k: v for _, layer in layers for k, v in layer.items()}
    common = {k: v for k, v in table.items() if k in SCENARIO_KEYS}
    extra = {k: v for k, v in table.items() if k not in SCENARIO_KEYS}
    kind = common.get("kind", "split")
    if kind not in kinds.registry():
        raise SuiteError(f"{path}: {where}: kind = {kind!r}; allowed values: {', '.join(kinds.names())} "
                         "(more come from plugins implementing clharness_add_kinds)")
    fam = kinds.family(kind) if kind != "split" else None
    allowed = fam.OPTIONS if fam is not None else {}
    for label, layer in layers:
        _check_keys(path, label, {k: v for k, v in layer.items() if k in extra}, [*SCENARIO_KEYS, *allowed])
    _check_scenario_table(path, where, common)
    options = {k: default for k, (_, default) in allowed.items()}
    for key, value in extra.items():
        _check_type(path, where, key, value, allowed[key][0])
        options[key] = value
    spec = ScenarioSpec(**common, options=options)
    if not all(isinstance(table, dict) for table in spec.hparams.values()):
        raise SuiteError(f"{path}: {where}: hparams = {spec.hparams!r} must map method names to tables, "
                         "e.g. hparams = { ewc = { ewc_lambda = 1e9 } }")
    if fam is None:
        return _check_split(path, where, spec)
    try:
        fam.check(spec)
    except ValueError as exc:
        raise SuiteError(f"{path}: {where}: {exc}") from None
    return spec



def did_you_mean(name, choices) -> str:
    """`` (did you mean 'x'?)`` for the registered name closest to ``name`` (difflib), else ''."""
    import difflib
    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""

def _check_type(path, where, key, value, expected):
    if isinstance(value, bool) and expected is not bool or not isinstance(value, expected):
        names = expected.__name__ if isinstance(expected, type) else " or ".join(t.__name__ for t in expected)
        raise SuiteError(f"{path}: {where}: {key} = {value!r} must be of type {names}")


def _check_scenario_table(path, where, table):
    for required in ("name", "dataset") if table.get("kind", "split") == "split" else ("name",):
        if required not in table:
            raise SuiteError(f"{path}: {where}: missing required key {required!r}")
    for key, value in table.items():
        _check_type(path, where, key, value, _TYPES[key])
        if key in CHOICES and value not in CHOICES[key]:
            raise SuiteError(f"{path}: {where}: {key} = {value!r}; allowed values: {', '.join(CHOICES[key])}")
        if isinstance(value, int) and not isinstance(value, bool) and key not in ("validation",) and value < 0:
            raise SuiteError(f"{path}: {where}: {key} = {value} must not be negative")
    if "augment" in table:
        from ..toolkit.augment import recipes   # lazy: torch; holds the recipes every loaded plugin added
        if table["augment"] not in recipes():
            raise SuiteError(f"{path}: {where}: augment = {table['augment']!r} is not a registered augmentation "
                             f"recipe{did_you_mean(table['augment'], recipes())}; registered: {', '.join(recipes())}")
    if table.get("first_task_train") is not None:
        _check_first_task(path, where, table["first_task_train"])
    if table.get("select_hparams") is not None:
        from .select_hparams_key import check_option
        try:
            check_option(table["select_hparams"], table.get("kind", "split"), table.get("setting", "class-incremental"),
                         table.get("validation", 0.0), table.get("tasks"))
        except ValueError as exc:
            raise SuiteError(f"{path}: {where}: {exc}") from None


def _check_first_task(path, where, value: dict) -> None:
    example = "{ epochs = 200, lr = 0.1, milestones = [60, 120, 170], lr_decay = 0.1, weight_decay = 5e-4 }"
    if set(value) != set(FIRST_TASK_KEYS):
        raise SuiteError(f"{path}: {where}: first_task_train needs exactly the keys {', '.join(FIRST_TASK_KEYS)} "
                         f"(got {', '.join(value) or 'none'}), e.g. first_task_train = {example}")
    for key, expected in FIRST_TASK_KEYS.items():
        _check_type(path, where, f"first_task_train.{key}", value[key], expected)
    marks = value["milestones"]
    if (value["epochs"] < 1 or value["lr"] <= 0 or value["weight_decay"] < 0 or not 0 < value["lr_decay"] <= 1
            or not all(isinstance(m, int) and not isinstance(m, bool) for m in marks)
            or marks != sorted(marks) or any(not 0 < m < value["epochs"] for m in marks)):
        raise SuiteError(f"{path}: {where}: first_task_train = {value!r}: epochs >= 1, lr > 0, weight_decay >= 0, "
                         "lr_decay in (0, 1], milestones increasing integer epochs inside (0, epochs); e.g. "
                         f"first_task_train = {example}")


def _check_split(path, where, spec: ScenarioSpec) -> ScenarioSpec:
    if spec.tasks is not None and (spec.first_task is not None or spec.increment is not None):
        raise SuiteError(f"{path}: {where}: give either tasks = N or first_task/increment, not both")
    if spec.tasks is None and spec.increment is None:
        raise SuiteError(f"{path}: {where}: say how to split the classes: tasks = N, or increment = K "
                         "(optionally with first_task = F)")
    if spec.tasks == 0 or spec.increment == 0 or spec.first_task == 0:
        raise SuiteError(f"{path}: {where}: tasks, first_task and increment must be positive")
    if not 0 <= spec.validation < 1:
        raise SuiteError(f"{path}: {where}: validation = {spec.validation} must be in [0, 1)")
    if spec.batch_size < 1 or spec.epochs < 0:
        raise SuiteError(f"{path}: {where}: batch_size must be >= 1 and epochs >= 0")
    if spec.image_size is not None and (len(spec.image_size) != 2 or not all(isinstance(v, int) for v in spec.image_size)):
        raise SuiteError(f"{path}: {where}: image_size = {spec.image_size!r} must be [height, width]")
    return spec


def with_overrides(spec: ScenarioSpec, **overrides) -> ScenarioSpec:
    return replace(spec, **overrides)
