"""``clharness store list|rm|vacuum``: see a results store by configuration and prune it.

A record is *stale* when the store holds a newer record of the same case and configuration but
other code (same ``base_key``, another ``code_digest``): a rerun superseded it. Removal runs in short
transactions (``ResultsStore.delete``), so a session writing to the same store is never damaged.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable

from ..results import RunRecord, configuration_fields, configuration_id, configuration_label

_DURATION = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class SelectionError(ValueError):
    """A selection flag with a value that cannot be read."""


def parse_age(text: str) -> float:
    """"30d", "12h", "90m", "2w" -> seconds."""
    text = text.strip()
    try:
        return float(text[:-1]) * _DURATION[text[-1]]
    except (KeyError, ValueError, IndexError):
        raise SelectionError(f"--older-than {text!r}: give a number and a unit of s, m, h, d or w "
                             "(e.g. 30d)") from None


def stale_keys(records: Iterable[RunRecord]) -> set[str]:
    """Keys of records superseded by a newer record of the same base key made by other code."""
    newest: dict[str, RunRecord] = {}
    records = list(records)
    for r in records:
        if r.base_key and (r.base_key not in newest or r.finished_at > newest[r.base_key].finished_at):
            newest[r.base_key] = r
    return {r.key for r in records
            if r.base_key and newest[r.base_key].code_digest != r.code_digest}


@dataclass
class Selection:
    """Which records ``store rm`` takes: every given filter must hold (names: any of the given)."""
    methods: list[str] = field(default_factory=list)
    suites: list[str] = field(default_factory=list)
    scenarios: list[str] = field(default_factory=list)
    stale: bool = False
    quick: bool = False
    older_than: float | None = None      # seconds

    def empty(self) -> bool:
        return not (self.methods or self.suites or self.scenarios or self.stale or self.quick
                    or self.older_than is not None)

    def select(self, records: list[RunRecord], now: float | None = None) -> list[RunRecord]:
        now = time.time() if now is None else now
        stale = stale_keys(records) if self.stale else set()
        return [r for r in records
                if (not self.methods or r.method in self.methods)
                and (not self.suites or r.suite in self.suites)
                and (not self.scenarios or r.scenario in self.scenarios)
                and (not self.stale or r.key in stale)
                and (not self.quick or r.budget == "quick")
                and (self.older_than is None or r.finished_at < now - self.older_than)]


def listing(records: list[RunRecord]) -> str:
    """One line per suite / scenario / method / configuration: seeds, dates, code digest, budget, and
    whether it is stale."""
    stale = stale_keys(records)
    groups: dict[tuple, list[RunRecord]] = {}
    for r in records:
        groups.setdefault((r.suite, r.scenario, r.method, configuration_id(r)), []).append(r)
    lines = ["suite | scenario | method | configuration | seeds | finished | code | budget | state"]
    for (suite, scenario, method, cid), group in sorted(groups.items()):
        first, last = (time.strftime("%Y-%m-%d", time.gmtime(f(r.finished_at for r in group))) for f in (min, max))
        fields = configuration_fields(group[0])
        state = "stale" if all(r.key in stale for r in group) else "current"
        lines.append(" | ".join([suite, scenario, method, f"{cid} ({configuration_label(group[0])})",
                                 str(len({r.seed for r in group})), first if first == last else f"{first}..{last}",
                                 fields["code_digest"][:8] or "?", fields["budget"] or "?", state]))
    return "\n".join(lines)
