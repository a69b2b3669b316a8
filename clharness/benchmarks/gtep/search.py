"""GTEP's search spaces (Alg. 2): what is searched for each method (the general sets, the paper's Table 4/5 sets of
spaces.py, the suite's ``search`` overrides, the method's own ``tuning_space``) and configuration k's draw."""
from __future__ import annotations

import copy
import random
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from ...hparams import GENERAL, GENERAL_TABLES, HParamError, Param, check_space, choice_from_values, general_space, settle_conditions

BUDGET = ("epochs", "batch_size")   # general parameters that are scenario budgets, not method arguments
HELD_AT_DEFAULT = ("momentum",)     # optimizer details the paper does not search (SGD momentum 0.9 fixed)


# ----------------------------------------------------------------------------- search spaces
@dataclass(frozen=True)
class MethodSpace:
    """What GTEP searches for one method, and what it could not."""
    space: dict[str, Param]
    fixed: dict[str, Any]            # held-fixed values this method takes
    own: tuple[str, ...]             # its method-specific parameters (empty: general only)
    not_tunable: tuple[str, ...]     # general parameters the method does not accept
    paper: bool = False              # its space is the paper's (Table 4/5, spaces.py)


def method_space(method_cls, options: Mapping[str, Any]) -> MethodSpace:
    """The method's GTEP space: the general sets (``general`` table, the paper's column for the
    method (Table 5's prompt-based sets), ``search."*"`` and ``search.<method>`` overrides)
    restricted to what the method accepts, plus its own: the suite's ``search.<method>`` sets when
    they name method-specific parameters, else the paper's Table 4/5 sets for the methods it covers
    (spaces.py; suite option ``spaces = "method"`` skips them), else its
    ``tuning_space`` when it declares one, else
    its declared ``hparams`` beyond the general ones. ``fixed`` values leave the space. Errors
    (unknown names, empty sets, a conditional parameter without its parent) raise HParamError."""
    from .spaces import SPACES, paper_space
    name = method_cls.name
    owner = f"gtep search space of method {name!r}"
    search = options.get("search", {})
    table = options.get("general", "table4")
    reading = options.get("spaces", "paper")
    if reading not in SPACES:
        raise HParamError(f"{owner}: spaces = {reading!r}; allowed: {', '.join(SPACES)}")
    paper = paper_space(table, name) if reading == "paper" else None
    column = paper[1] if paper else {}
    overrides = {**column, **search.get("*", {}), **search.get(name, {})}
    general = general_space(GENERAL_TABLES[table], **{k: v for k, v in overrides.items() if k in GENERAL})
    accepted = set(BUDGET) | set(method_cls.hparams)
    not_tunable = tuple(k for k in general if k not in accepted)
    space = {k: p for k, p in general.items() if k in accepted}
    declared = getattr(method_cls, "tuning_space", None)
    if paper is not None:   # the paper's Table 4/5 sets (spaces.py), whatever the method declares
        declared = {k: choice_from_values(owner, k, v) for k, v in paper[0].items()}
    if any(k not in GENERAL for k in search.get(name, {})):
        declared = {}   # the suite's sets for its own parameters are the method's whole own space
    elif declared is None:
        declared = {k: p for k, p in method_cls.hparams.items() if k not in GENERAL and k not in HELD_AT_DEFAULT}
    own = dict(declared)
    for key, values in search.get(name, {}).items():
        if key in GENERAL:
            continue
        if key not in method_cls.hparams:
            raise HParamError(f"{owner}: search.{name}.{key}: {name!r} has no hyperparameter {key!r}; "
                              f"declared: {sorted(method_cls.hparams)}")
        own[key] = choice_from_values(owner, key, values, when=getattr(method_cls.hparams[key], "when", None))
    for key in own:
        if key not in method_cls.hparams:
            raise HParamError(f"{owner}: tuning_space names {key!r}, which {name!r} does not declare in hparams "
                              f"(declared: {sorted(method_cls.hparams)})")
    space.update(own)
    # a parameter conditional on one this space does not search: settled by the run's value
    space = settle_conditions(space, {**{k: p.default for k, p in method_cls.hparams.items()}, **options.get("fixed", {})})
    fixed = {}
    for key, value in options.get("fixed", {}).items():
        if key in accepted:
            fixed[key] = method_cls.hparams[key].check(key, value) if key in method_cls.hparams else value
            space.pop(key, None)
    # a conditional parameter whose parent is held fixed stays only if the fixed value enables it
    for key in [k for k, p in space.items() if any(parent in fixed for parent in p.when)]:
        if not all(fixed.get(parent, None) in allowed for parent, allowed in space[key].when.items() if parent in fixed):
            space.pop(key)
        else:
            space[key] = copy.copy(space[key])   # the method's own Param objects are shared: never mutate them
            object.__setattr__(space[key], "when", {p: v for p, v in space[key].when.items() if p not in fixed})
    check_space(owner, space)
    for key, param in space.items():   # every value the space can draw must be one the method accepts
        for value in getattr(param, "values", ()):
            if key in method_cls.hparams:
                method_cls.hparams[key].check(key, value)
    return MethodSpace(space, fixed, tuple(own), not_tunable, paper is not None)


def draw(space: Mapping[str, Param], tuning: str, method: str, k: int) -> dict[str, Any]:
    """Configuration k of a method (Alg. 2 lines 3-5): seeded by the tuning phase's identity
    (``tuning_id``: D^HT and everything that defines its runs, never the scenario or suite name),
    the method and k; never global state. Scenarios that tune on the same D^HT draw the same set."""
    from ...hparams import sample
    return sample(space, random.Random(f"gtep/{tuning}/{method}/{k}"))


def method_spaces(harness, methods: Iterable[str], options=None) -> dict[str, MethodSpace]:
    """method -> its GTEP space (default options), for the scorecard's notes."""
    out = {}
    for m in methods:
        try:
            out[m] = method_space(harness.methods[m], options or {})
        except (LookupError, HParamError):
            continue
    return out


