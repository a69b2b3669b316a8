"""GTEP's record names: a run's scenario name says its phase (``<tuning id>:tune-c<k>``, ``<scenario>:eval@<tuning>``,
the paper's configuration ``...@paper-<preset>``), so the store and the report read phases back from records."""
from __future__ import annotations

import re

from ...results import RunRecord

# ``<tuning id>:tune-c<k>`` and ``<scenario>:eval@<tuning id>`` (records before one tuning phase per
# D^HT: ``<scenario>:tune-c<k>`` and ``<scenario>:eval``, their tuning id being the scenario's name)
PAPER = "paper-"   # ``<scenario>:eval@paper-<preset>``: the paper's configuration (--clh-preset gtep:<preset>)
# on D^E, and ``<tuning id>:tune@paper-<preset>`` the same configuration on D^HT (Fig. 7(a), Tables 7/14)
PHASE = re.compile(r"^(?P<scenario>.+):(?:tune-c(?P<k>\d+)|tune@(?P<ptune>paper-[^:]+)|eval(?:@(?P<tuning>[^:]+))?)$")

# ----------------------------------------------------------------------------- outputs
def split_scenario(name: str) -> tuple[str, str, int | None] | None:
    """``tuning:tune-c3`` -> (tuning, "tune", 3); ``scenario:eval@tuning`` (or ``scenario:eval``)
    -> (scenario, "eval", None); ``tuning:tune@paper-P`` -> ("tuning [paper H* P]", "tune", None)
    (a tuning-phase run: reports fold it into the GTEP section)."""
    m = PHASE.match(name)
    if not m:
        return None
    if m["tuning"] and m["tuning"].startswith(PAPER):   # the paper's H*: a scenario of its own in every table
        return f"{m['scenario']} [paper H* {m['tuning'][len(PAPER):]}]", "eval", None
    if m["ptune"]:   # the paper's H* on D^HT: its tuning-phase score, beside the D^E one in the same row
        return f"{m['scenario']} [paper H* {m['ptune'][len(PAPER):]}]", "tune", None
    return m["scenario"], "tune" if m["k"] is not None else "eval", None if m["k"] is None else int(m["k"])


def tuning_of(name: str) -> str | None:
    """The tuning id an evaluation record took its H* from (None for records named before
    tuning phases were shared: their tuning records carry the scenario's own name)."""
    m = PHASE.match(name)
    return m["tuning"] if m else None


def is_gtep(record: RunRecord) -> bool:
    return split_scenario(record.scenario) is not None


