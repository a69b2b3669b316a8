"""Declared hyperparameter spaces.

A method declares ``hparams = {"lr": Float(1e-4, 1.0, default=0.1, log=True), ...}``.
The runner builds methods from the defaults (overridden by suite files); GTEP later
samples configurations from the same declaration, so every parameter can both
validate a value and draw one.
"""
from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence


class HParamError(ValueError):
    """A hyperparameter space or value that cannot be used."""


@dataclass(frozen=True)
class Param:
    default: Any
    # Conditional parameter: only active when every named parent has one of the values.
    when: Mapping[str, Sequence[Any]] = field(default_factory=dict)

    def check(self, name: str, value: Any) -> Any:
        return value

    def sample(self, rng: random.Random) -> Any:
        return self.default


@dataclass(frozen=True)
class Choice(Param):
    values: Sequence[Any] = ()

    def __init__(self, values: Sequence[Any], default: Any = None, when=None):
        values = tuple(values)
        if not values:
            raise HParamError("Choice needs at least one value")
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "default", values[0] if default is None else default)
        object.__setattr__(self, "when", dict(when or {}))
        if self.default not in values:
            raise HParamError(f"Choice default {self.default!r} is not one of {list(values)}")

    def check(self, name, value):
        if value not in self.values:
            raise HParamError(f"hyperparameter {name!r}={value!r} is not one of {list(self.values)}")
        return value

    def sample(self, rng):
        return rng.choice(self.values)


@dataclass(frozen=True)
class Float(Param):
    low: float = 0.0
    high: float = 1.0
    log: bool = False

    def __init__(self, low: float, high: float, default: float | None = None, log: bool = False, when=None):
        if not low <= high or (log and low <= 0):
            raise HParamError(f"Float range [{low}, {high}] is empty{' or not positive for log scale' if log else ''}")
        object.__setattr__(self, "low", float(low))
        object.__setattr__(self, "high", float(high))
        object.__setattr__(self, "log", log)
        object.__setattr__(self, "default", float(low if default is None else default))
        object.__setattr__(self, "when", dict(when or {}))
        self.check("default", self.default)

    def check(self, name, value):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise HParamError(f"hyperparameter {name!r}={value!r} must be a number in [{self.low}, {self.high}]")
        if not self.low <= value <= self.high:
            raise HParamError(f"hyperparameter {name!r}={value!r} is outside [{self.low}, {self.high}]")
        return float(value)

    def sample(self, rng):
        if self.log:
            return math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        return rng.uniform(self.low, self.high)


@dataclass(frozen=True)
class Int(Param):
    low: int = 0
    high: int = 1

    def __init__(self, low: int, high: int, default: int | None = None, when=None):
        if not low <= high:
            raise HParamError(f"Int range [{low}, {high}] is empty")
        object.__setattr__(self, "low", int(low))
        object.__setattr__(self, "high", int(high))
        object.__setattr__(self, "default", int(low if default is None else default))
        object.__setattr__(self, "when", dict(when or {}))
        self.check("default", self.default)

    def check(self, name, value):
        if isinstance(value, bool) or not isinstance(value, int) or not self.low <= value <= self.high:
            raise HParamError(f"hyperparameter {name!r}={value!r} must be an integer in [{self.low}, {self.high}]")
        return value

    def sample(self, rng):
        return rng.randint(self.low, self.high)


def validate_space(owner: str, space: Mapping[str, Param]) -> None:
    """Reject spaces that cannot be used: wrong types, conditions on unknown parents."""
    for name, param in space.items():
        if not isinstance(param, Param):
            raise HParamError(f"{owner}: hyperparameter {name!r} is declared as {param!r}; "
                              "use clharness.Choice, Float or Int")
        for parent, allowed in param.when.items():
            if parent not in space:
                raise HParamError(f"{owner}: hyperparameter {name!r} is conditional on {parent!r}, "
                                  f"which the space does not declare (declared: {sorted(space)})")
            for v in allowed:
                space[parent].check(parent, v)


def active(space: Mapping[str, Param], values: Mapping[str, Any]) -> dict[str, Any]:
    """Drop conditional parameters whose parent condition does not hold."""
    return {k: v for k, v in values.items()
            if k not in space or all(values.get(p) in allowed for p, allowed in space[k].when.items())}


def resolve(owner: str, space: Mapping[str, Param], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Defaults of ``space`` updated with ``overrides``; unknown names and bad values raise."""
    unknown = set(overrides) - set(space)
    if unknown:
        import difflib   # the closest declared name per typo, as engine.suites.did_you_mean says it
        hints = [f"{name!r} (did you mean {close[0]!r}?)" for name in sorted(unknown)
                 if (close := difflib.get_close_matches(name, list(space), n=1, cutoff=0.6))]
        raise HParamError(f"{owner}: unknown hyperparameter(s) {sorted(unknown)}"
                          f"{'; ' + ', '.join(hints) if hints else ''}; declared: {sorted(space) or 'none'}")
    values = {name: p.default for name, p in space.items()}
    for name, value in overrides.items():
        values[name] = space[name].check(name, value)
    return active(space, values)


def sample(space: Mapping[str, Param], rng: random.Random) -> dict[str, Any]:
    """One random configuration from ``space``: parents are drawn before the parameters that
    depend on them, and a conditional parameter is drawn only when its condition holds (so the
    draws, and the rng's state, do not depend on inactive parameters)."""
    values: dict[str, Any] = {}
    for name in _parents_first(space):
        param = space[name]
        if all(p in values and values[p] in allowed for p, allowed in param.when.items()):
            values[name] = param.sample(rng)
    return {name: values[name] for name in space if name in values}


def _parents_first(space: Mapping[str, Param]) -> list[str]:
    """Names in declaration order, moved after their parents; a cycle is an error."""
    order: list[str] = []
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in order:
            return
        if name in visiting:
            raise HParamError(f"hyperparameter {name!r} is conditional on itself (through {sorted(visiting)})")
        visiting.add(name)
        for parent in space[name].when:
            if parent in space:
                visit(parent)
        visiting.discard(name)
        order.append(name)

    for name in space:
        visit(name)
    return order


def settle_conditions(space: Mapping[str, Param], fixed: Mapping[str, Any]) -> dict[str, Param]:
    """``space`` with each condition on a parameter it does not search settled by that parameter's
    ``fixed`` value (the run's: the suite's, else the default): kept unconditional where it holds,
    dropped where it does not (RanPAC's prompt tokens when its first phase is the adapter)."""
    out = {}
    for key, param in space.items():
        # parents that are hyperparameters of the run but not searched (an undeclared one stays: check_space names it)
        outside = {p: allowed for p, allowed in param.when.items() if p not in space and p in fixed}
        if outside:
            if not all(fixed.get(p) in allowed for p, allowed in outside.items()):
                continue
            param = dataclasses.replace(param, when={p: a for p, a in param.when.items() if p not in outside})
        out[key] = param
    return out


def check_space(owner: str, space: Mapping[str, Param]) -> None:
    """Collection-time check of a space that will be sampled (GTEP): every parameter typed, every
    choice list non-empty, every conditional parameter's parent declared with the values it names,
    no conditional cycles. Raises HParamError naming the owner, the parameter and the fix."""
    validate_space(owner, space)
    for name, param in space.items():
        if isinstance(param, Choice) and not param.values:
            raise HParamError(f"{owner}: hyperparameter {name!r} has an empty choice list; "
                              "give at least one value (or hold it fixed)")
        for parent, allowed in param.when.items():
            if not allowed:
                raise HParamError(f"{owner}: hyperparameter {name!r} is conditional on {parent!r} taking one "
                                  "of an empty list of values, so it can never be active")
    _parents_first(space)


def choice_from_values(owner: str, name: str, values: Any, when=None) -> "Choice":
    """A search set written as a list (suite files): an empty or non-list value is a clear error."""
    if not isinstance(values, (list, tuple)) or not values:
        raise HParamError(f"{owner}: search set {name} = {values!r} must be a non-empty list of values, "
                          f"e.g. {name} = [0.05, 0.1]")
    return Choice(values, when=when)


# --- GTEP's general hyperparameters ("Hyperparameters in continual learning: a reality check",
# appendix A.1 Table 4 and A.2 Table 5). ``num_milestones`` and ``lr_decay`` exist only with StepLR.
STEPLR = {"scheduler": ["steplr"]}
TABLE4 = {   # class-IL without a pretrained model (ResNet); SGD with momentum 0.9 for every method
    "epochs": [30, 70, 120, 160, 200],
    "lr": [0.05, 0.1, 0.15, 0.2, 0.3],
    "num_milestones": [2, 3, 4],
    "lr_decay": [0.1, 0.3, 0.5],
    "batch_size": [32, 64, 128, 256, 512],
    "weight_decay": [0.0001, 0.0005, 0.001, 0.005],
    "scheduler": ["steplr", "cosine"],
    "optimizer": ["sgd"],
}
TABLE5 = {   # class-IL with a pretrained model (ViT-B/16), the Adam-Adapter/Ranpac/EASE column sets
    "epochs": [5, 10, 15, 20, 25, 30],
    "lr": [0.01, 0.02, 0.03, 0.04, 0.05],
    "num_milestones": [2, 3, 4],
    "lr_decay": [0.1, 0.3, 0.5],
    "batch_size": [8, 16, 24, 48, 64, 128],
    "weight_decay": [0.0001, 0.0005, 0.001, 0.005],
    "scheduler": ["steplr", "cosine", "constant"],
    "optimizer": ["sgd", "adam", "adamw"],
}
GENERAL_TABLES = {"table4": TABLE4, "table5": TABLE5}
GENERAL = tuple(TABLE4)   # the general hyperparameters, in table order


def general_space(table: Mapping[str, Sequence[Any]] = TABLE4, **sets: Sequence[Any]) -> dict[str, Param]:
    """The general search space: ``table``'s sets with ``sets`` overriding some of them;
    ``num_milestones`` and ``lr_decay`` conditional on ``scheduler = "steplr"``."""
    merged = {**table, **sets}
    return {name: choice_from_values("general space", name, merged[name],
                                     when=STEPLR if name in ("num_milestones", "lr_decay") else None)
            for name in GENERAL}


def milestones(epochs: int, num_milestones: int) -> list[int]:
    """StepLR milestones by the paper's rule (appendix A.1): n milestones at epoch * 2k/(2n+1),
    k = 1..n (2 -> [2/5, 4/5], 3 -> [2/7, 4/7, 6/7], 4 -> [2/9, 4/9, 6/9, 8/9]), floored to
    whole epochs as PyCIL's integer milestones are."""
    if num_milestones < 1 or epochs < 0:
        raise HParamError(f"milestones need num_milestones >= 1 and epochs >= 0, got {num_milestones}, {epochs}")
    return [int(epochs * 2 * k / (2 * num_milestones + 1)) for k in range(1, num_milestones + 1)]
