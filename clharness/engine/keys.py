"""Record keys: every key a record is stored under is built here, from one declared list of fields.

The rule (README, "What a record's key holds"): whatever can change a record's numbers is in its key,
or is shown bit-identical by a test. ``FIELDS`` names every field a definition may hold; ``record_key``
is the one function that hashes one, and refuses a field not declared. The base key is the same
definition without the code it ran (``CODE_FIELDS``): ``--clh-reuse-stale`` looks records up by it.

Fields that joined the key after records were first stored stay out of it while they hold the value
they had before (a method's ``later_hparams``, the suite's ``LATER_KEYS``, one CPU thread, no weights
file), so the keys of existing runs never move.
"""
from __future__ import annotations

from typing import Any

from ..results import run_key

# field -> what it holds (a case's definition, and a CLDyB search's: kind, job, search_version, methods)
FIELDS = {
    "suite": "the suite's name; left out by runs that several suites share (GTEP tuning, selection runs)",
    "scenario": "the scenario table as run (engine.suites.spec_definition: later keys at their defaults left out)",
    "method": "the method's registered name",
    "method_version": "the method class's declared version",
    "method_class": "the method class's qualified name",
    "hparams": "the resolved hyperparameters (a later_hparams entry at its default left out)",
    "seed": "the run's seed",
    "versions": "clharness, torch, torchvision, numpy and python versions (engine.runner.versions)",
    "code": "the digest of the code that runs it (engine.code_identity): not in the base key",
    "cpu_threads": "torch's CPU threads per run, when not 1 (a CPU float sum is split by thread)",
    "weights": "the content hash of the weights file the backbone loads (a named checkpoint, else timm's cached "
               "pretrained file), when there is one",
    "device_type": "the device type, when not CPU (CUDA kernels sum in other orders)",
    "selection": "a hyperparameter-selection run's cut (engine.hparam_selection.SelectionCase)",
    "kind": "a protocol step's kind (CLDyB's 'cldyb-search')",
    "job": "a CLDyB search's job (cc, ic-<method>, random, heldout)",
    "search_version": "the CLDyB search algorithm's version",
    "methods": "a CLDyB search's searchers: (name, version, hyperparameters)",
}
CODE_FIELDS = ("code",)
# scenario options that carry another record's full key (a CLDyB replay names its search): in the base
# key they give way to that record's base key, held beside them under "<name>_base"
KEYED_OPTIONS = ("search_key",)


class UndeclaredKeyField(ValueError):
    """A definition with a field the key rule does not declare."""


def record_key(definition: dict[str, Any]) -> str:
    """The key of a record: the content hash of its definition (every field declared in ``FIELDS``)."""
    unknown = sorted(set(definition) - set(FIELDS))
    if unknown:
        raise UndeclaredKeyField(f"record key: field(s) {', '.join(unknown)} are not declared in engine.keys.FIELDS; "
                        "declare each with what it holds (and whether it leaves the base key) before keying on it")
    return run_key(_without_base_only(definition))


def base_key_of(definition: dict[str, Any]) -> str:
    """The key of the same definition whatever the code (``RunRecord.base_key``)."""
    out = {k: v for k, v in definition.items() if k not in CODE_FIELDS}
    scenario = out.get("scenario")
    if isinstance(scenario, dict) and any(k in scenario.get("options", {}) for k in KEYED_OPTIONS):
        options = dict(scenario["options"])
        for name in KEYED_OPTIONS:
            if name in options:
                options[name] = options.pop(f"{name}_base", options[name])
        out["scenario"] = {**scenario, "options": options}
    return record_key(out)


def _without_base_only(definition: dict[str, Any]) -> dict[str, Any]:
    """The full key holds a keyed option itself, not the base key carried beside it."""
    scenario = definition.get("scenario")
    if not isinstance(scenario, dict) or not any(f"{k}_base" in scenario.get("options", {}) for k in KEYED_OPTIONS):
        return definition
    options = {k: v for k, v in scenario["options"].items() if k not in {f"{n}_base" for n in KEYED_OPTIONS}}
    return {**definition, "scenario": {**scenario, "options": options}}


def case_definition(case, method_cls, *, versions: dict[str, str], code: str, cpu_threads: int = 1,
                    weights: str | None = None, device_type: str = "cpu") -> dict[str, Any]:
    """Everything that defines a case's outcome (``engine.runner.Case``; its subclasses leave fields
    out by ``KEY_OMITS`` and add their own by ``key_extra()``)."""
    from .suites import spec_definition
    later = getattr(method_cls, "later_hparams", {})
    hparams = {k: v for k, v in case.hparams.items() if not (k in later and v == later[k])}
    out = {"suite": case.suite, "scenario": spec_definition(case.scenario), "method": case.method,
           "method_version": method_cls.version, "method_class": method_cls.__qualname__,
           "hparams": hparams, "seed": case.seed, "versions": versions, "code": code,
           **({"cpu_threads": cpu_threads} if cpu_threads != 1 else {}),
           **({"weights": weights} if weights else {}),
           **({"device_type": device_type} if device_type != "cpu" else {})}
    for name in case.KEY_OMITS:
        out.pop(name, None)
    out.update(case.key_extra())
    return out


def search_definition(suite: str, scenario: dict, job: str, seed: int, versions: dict[str, str],
                      search_version: int, methods: list, code) -> dict[str, Any]:
    """A CLDyB sequence search's definition (benchmarks/cldyb: its searches are records too)."""
    return {"kind": "cldyb-search", "suite": suite, "scenario": scenario, "job": job, "seed": seed,
            "versions": versions, "search_version": search_version, "methods": methods, "code": code}
