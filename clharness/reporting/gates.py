"""CI gates: pass/fail verdicts on seed means of stored run records.

Written in a suite file as one line each (``gates = [...]``), optionally scoped to a scenario::

    "er: final_acc >= 0.30"                         absolute bound (also <=); "*" = every method
    "er: final_acc beats finetune by 0.05"          relative: better by a margin
    "er: final_acc beats finetune by 0.05 welch 0.05"   ... and a one-sided Welch t-test at level 0.05
    "lwf: final_acc within 0.02 of er"              relative: no further apart than a tolerance
    "er: train_gflops <= 2x finetune"               ratio: at most 2 times finetune's seed mean (also >=)
    "*: train_gflops <= 0.5"                        FLOPs are costs like seconds (engine/flops.py)
    "ci-5x2/er: forgetting <= 0.2"                  only in scenario ci-5x2

``--clh-compare baseline.json --clh-max-drop final_acc=0.02`` adds regression gates against a
saved scorecard (like pytest-benchmark's --benchmark-compare-fail). "Better" follows the metric:
lower is better for forgetting, AFM, seconds and megabytes.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Sequence

from ..metrics import HIGHER_IS_BETTER, METRIC_INFO
from ..results import CONFIGURATION_FIELDS, RunRecord, configuration_fields, configuration_id

# Record fields a gate may judge besides the metrics, all lower-is-better costs.
COST_FIELDS = ("train_seconds", "eval_seconds", "memory_mb", "memory_model_mb", "memory_buffer_mb",
               "memory_other_mb", "peak_cuda_mb", "peak_rss_mb", "parameters", "train_gflops", "eval_gflops")
GATE_FORMS = ("'METHOD: METRIC >= VALUE'", "'METHOD: METRIC <= VALUE'",
              "'METHOD: METRIC beats OTHER by MARGIN [welch ALPHA]'", "'METHOD: METRIC within TOL of OTHER'",
              "'METHOD: METRIC <= FACTORx OTHER'", "'METHOD: METRIC >= FACTORx OTHER'")

_NUM = r"([-+]?\d*\.?\d+(?:[eE][-+]?\d+)?)"
_HEAD = r"^\s*(?:(?P<scenario>[^/:\s]+)/)?(?P<method>[^/:\s]+)\s*:\s*(?P<metric>\w+)\s+"
_PATTERNS = {
    "bound": re.compile(_HEAD + r"(?P<op>>=|<=)\s*" + _NUM.replace("(", "(?P<value>", 1) + r"\s*$"),
    "beats": re.compile(_HEAD + r"beats\s+(?P<other>[^\s]+)\s+by\s+" + _NUM.replace("(", "(?P<value>", 1)
                        + r"(?:\s+welch\s+" + _NUM.replace("(", "(?P<alpha>", 1) + r")?\s*$"),
    "ratio": re.compile(_HEAD + r"(?P<op>>=|<=)\s*" + _NUM.replace("(", "(?P<value>", 1)
                        + r"\s*x\s+(?P<other>[^\s]+)\s*$"),
    "within": re.compile(_HEAD + r"within\s+" + _NUM.replace("(", "(?P<value>", 1) + r"\s+of\s+(?P<other>[^\s]+)\s*$"),
}


class GateError(ValueError):
    """A gate line that cannot be read."""


@dataclass(frozen=True)
class Gate:
    text: str
    method: str                  # "*" = every method of the suite
    metric: str
    kind: str                    # ">=", "<=", "beats", "within", "max-drop", "<=x", ">=x" (ratio to other)
    value: float                 # bound, margin, tolerance, allowed drop or factor
    other: str | None = None     # the method compared with (beats / within)
    scenario: str | None = None  # None = every scenario of the suite
    alpha: float | None = None   # one-sided Welch t-test level (beats)
    baseline: float | None = None   # the saved seed mean (max-drop)

    @property
    def methods(self) -> tuple[str, ...]:
        return tuple(m for m in (self.method, self.other) if m)


def parse_gate(text: str) -> Gate:
    for kind, pattern in _PATTERNS.items():
        m = pattern.match(text)
        if m:
            g = m.groupdict()
            metric = g["metric"]
            if metric not in METRIC_INFO and metric not in COST_FIELDS:
                raise GateError(f"gate {text!r}: unknown metric {metric!r}; known: "
                                f"{', '.join([*METRIC_INFO, *COST_FIELDS])}")
            alpha = float(g["alpha"]) if g.get("alpha") else None
            if alpha is not None and not 0 < alpha < 1:
                raise GateError(f"gate {text!r}: welch level {alpha} must be in (0, 1)")
            return Gate(text=text.strip(), method=g["method"], metric=metric,
                        kind=g["op"] if kind == "bound" else g["op"] + "x" if kind == "ratio" else kind,
                        value=float(g["value"]),
                        other=g.get("other"), scenario=g["scenario"], alpha=alpha)
    raise GateError(f"gate {text!r} is not understood; write one of: {', '.join(GATE_FORMS)}")


def higher_is_better(metric: str) -> bool:
    return HIGHER_IS_BETTER.get(metric, metric not in COST_FIELDS)


def values(records: Sequence[RunRecord], method: str, scenario: str, metric: str) -> list[float]:
    """The metric over the passed seeds of one method in one scenario."""
    out = []
    for r in records:
        if r.method == method and r.scenario == scenario and r.status == "passed":
            v = r.metrics.get(metric) if metric not in COST_FIELDS else getattr(r, metric)
            if v is not None and not math.isnan(v):
                out.append(float(v))
    return out


def configurations(records: Sequence[RunRecord], method: str, scenario: str) -> list[tuple[str, list[RunRecord]]]:
    """The method's records in the scenario, one group per configuration (``results.configuration_id``:
    the key less the seed), each labelled by what tells it from the others ("quick", "lr=0.1", "code
    1a2b3c"; "" when it is the only one). A gate never pools configurations: a session that runs
    ``--clh-hparam er.lr=0.01,0.1`` is judged per value, a store's quick and full runs apart."""
    groups: dict[str, list[RunRecord]] = {}
    for r in records:
        if r.method == method and r.scenario == scenario:
            groups.setdefault(configuration_id(r), []).append(r)
    fields = {cid: configuration_fields(rs[0]) for cid, rs in groups.items()}
    out = []
    for cid, group in groups.items():
        mine, parts = fields[cid], []
        for name in CONFIGURATION_FIELDS:
            if len({json.dumps(f[name], sort_keys=True, default=str) for f in fields.values()}) < 2:
                continue
            if name == "hparams":
                keys = sorted({k for f in fields.values() for k in f[name]})
                parts += [f"{k}={mine[name].get(k)}" for k in keys
                          if len({json.dumps(f[name].get(k), default=str) for f in fields.values()}) > 1]
            elif name == "budget":
                parts.append(mine[name])
            elif name == "code_digest":
                parts.append(f"code {(mine[name] or '?')[:6]}")
            else:
                parts.append(f"{name.replace('_', ' ')} {mine[name]}")
        out.append((", ".join(parts), group))
    return out


# What two methods' configurations must share to be compared (their code and hyperparameters are
# their own): the same budget, data and hardware.
_SETTING = ("budget", "dataset", "device_type", "cpu_threads", "versions")


def _setting(records: Sequence[RunRecord]) -> str:
    fields = configuration_fields(records[0])
    return json.dumps({k: fields[k] for k in _SETTING}, sort_keys=True, default=str)


def judge(gate: Gate, records: Sequence[RunRecord]) -> tuple[bool, list[str]]:
    """Verdict and one line per (scenario, method, configuration) judged, naming method, metric,
    value, threshold; a relative gate pairs each configuration with the other method's of the same
    budget, data and hardware (``_SETTING``)."""
    scenarios = [gate.scenario] if gate.scenario else sorted({r.scenario for r in records})
    methods = sorted({r.method for r in records}) if gate.method == "*" else [gate.method]
    ok, lines = True, []
    for scenario in scenarios:
        for method in methods:
            if method == gate.other:
                continue
            for label, group in configurations(records, method, scenario) or [("", [])]:
                if gate.other is None:
                    judged = [_judge_one(gate, group, scenario, method, label)]
                else:
                    candidates = configurations(records, gate.other, scenario)
                    others = [(o_label, o) for o_label, o in candidates if not group or _setting(o) == _setting(group)]
                    judged = [_judge_one(gate, group + o, scenario, method, label, o_label)
                              for o_label, o in others or [("", [])]]
                    if candidates and not others:
                        judged = [(False, f"{method}{f' [{label}]' if label else ''} on {scenario}: {gate.other} "
                                          "has no run of the same budget, data and hardware to compare with")]
                for good, line in judged:
                    ok &= good
                    lines.append(("PASS " if good else "FAIL ") + line)
    if not lines:
        return False, [f"FAIL {gate.text}: no records to judge"]
    return ok, lines


def _judge_one(gate, records, scenario, method, label="", other_label="") -> tuple[bool, str]:
    where = f"{method}{f' [{label}]' if label else ''} on {scenario}"
    a = values(records, method, scenario, gate.metric)
    if not a:
        return False, f"{where}: no passed run has {gate.metric} (failed, diverged or not run)"
    mean = sum(a) / len(a)
    sign = 1 if higher_is_better(gate.metric) else -1
    seeds = f"mean of {len(a)} seed{'s' * (len(a) != 1)}"
    if gate.kind in (">=", "<="):
        good = mean >= gate.value if gate.kind == ">=" else mean <= gate.value
        return good, f"{where}: {gate.metric} = {mean:.4f} ({seeds}) {'' if good else 'not '}{gate.kind} {gate.value}"
    if gate.kind == "max-drop":
        drop = sign * (gate.baseline - mean)
        good = drop <= gate.value + 1e-12
        return good, (f"{where}: {gate.metric} = {mean:.4f} ({seeds}) vs baseline {gate.baseline:.4f}: "
                      f"{'worse' if drop > 0 else 'better'} by {abs(drop):.4f}, allowed drop {gate.value}")
    them = f"{gate.other}{f' [{other_label}]' if other_label else ''}"
    if gate.kind in ("<=x", ">=x"):   # a ratio of seed means: "at most 2x finetune's training FLOPs"
        ref = values(records, gate.other, scenario, gate.metric)
        if not ref:
            return False, f"{where}: {gate.other} has no passed run with {gate.metric} to compare with"
        other = sum(ref) / len(ref)
        bound = gate.value * other
        good = mean <= bound + 1e-12 * abs(bound) if gate.kind == "<=x" else mean >= bound - 1e-12 * abs(bound)
        ratio = f"{mean / other:.4g}x" if other else "undefined (its mean is 0)"
        return good, (f"{where}: {gate.metric} = {mean:.6g} ({seeds}) vs {them} {other:.6g}: ratio {ratio}, "
                      f"{'' if good else 'not '}{gate.kind[:2]} {gate.value:g}x")
    b = values(records, gate.other, scenario, gate.metric)
    if not b:
        return False, f"{where}: {gate.other} has no passed run with {gate.metric} to compare with"
    other = sum(b) / len(b)
    if gate.kind == "within":
        gap = abs(mean - other)
        good = gap <= gate.value + 1e-12
        return good, (f"{where}: {gate.metric} = {mean:.4f} vs {them} {other:.4f}: apart by {gap:.4f}, "
                      f"{'within' if good else 'beyond'} {gate.value}")
    lead = sign * (mean - other)
    good = lead >= gate.value - 1e-12
    line = (f"{where}: {gate.metric} = {mean:.4f} vs {them} {other:.4f}: "
            f"{'better' if lead >= 0 else 'worse'} by {abs(lead):.4f}, margin {gate.value}")
    if gate.alpha is not None:
        p = welch_p(a, b, gate.value, sign)
        good = good and p < gate.alpha
        n = f"n = {len(a)} vs {len(b)} seeds"
        line += (f"; one-sided Welch t-test p = {p:.4g} ({'<' if p < gate.alpha else '>='} {gate.alpha}; {n})"
                 if not math.isnan(p) else f"; no Welch t-test ({n}; it needs n >= 2 on both sides): not passed")
    return good, line


def welch_p(a: Sequence[float], b: Sequence[float], margin: float, sign: int = 1) -> float:
    """p-value of H0: sign*(mu_a - mu_b) <= margin against H1: > margin (Welch, unequal variances)."""
    from scipy import stats
    if len(a) < 2 or len(b) < 2:
        return math.nan
    shifted = [sign * x - margin for x in a]
    res = stats.ttest_ind(shifted, [sign * x for x in b], equal_var=False, alternative="greater")
    return float(res.pvalue)
