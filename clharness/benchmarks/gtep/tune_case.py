"""GTEP's tuning run as a case (a module of its own: it needs the runner, which needs torch)."""
from __future__ import annotations

from dataclasses import dataclass

from ...engine.runner import Case


@dataclass(frozen=True)
class TuneCase(Case):
    """A tuning run (Alg. 2 line 9): defined by D^HT, the method, its configuration and the trial,
    not by the suite that asked for it, so scenarios of different suites that tune on the same
    D^HT share one stored run (its record keeps the name of the suite that ran it first)."""

    KEY_OMITS = ("suite",)   # engine.keys: the definition without the suite that asked for it
