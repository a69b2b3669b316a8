"""A case several suites share (a module of its own: it needs the runner, which needs torch)."""
from __future__ import annotations

from dataclasses import dataclass

from .runner import Case


@dataclass(frozen=True)
class SharedCase(Case):
    """A run defined without the suite that asked for it (GTEP's tuning runs, Alg. 2 line 9: D^HT, the
    method, its configuration and the trial), so scenarios of different suites that ask for it share
    one stored run (its record keeps the name of the suite that ran it first)."""

    KEY_OMITS = ("suite",)   # engine.keys: the definition without the suite that asked for it
