"""Peak memory of one run (issue 41 item 2): resident memory on the CPU, allocated memory on a GPU.

Both peaks are process-wide counters, so the runner resets them when a case starts (``reset``) and
reads them when it ends (``read``); without the reset a run would report the largest peak of every
earlier run of its process (pytest-xdist workers and Ray workers run many cases each).

* ``peak_cuda_mb``: ``torch.cuda.max_memory_allocated`` since ``torch.cuda.reset_peak_memory_stats``
  (tensors only: the caching allocator's reserve and the CUDA context are not in it). 0 on a CPU run.
* ``peak_rss_mb``: the process's peak resident set size (VmHWM) since the case started. Linux resets it
  by writing 5 to ``/proc/self/clear_refs``; where that is not possible (other systems, a locked-down
  /proc) it is the process's lifetime peak (``getrusage`` ru_maxrss; ``reset`` returns False). Either
  way it is the whole process: the interpreter, torch and loaded data are in it, not only what the run added.

A shared process shares the counters: under ``--clh-ensemble`` the E members run as threads of one
process on one device, each member's reset also resets the others', and each member's peak is the
ensemble's (every member's memory together) from the last member's start to that member's end.
"""
from __future__ import annotations

import re
import resource
import sys

import torch

RESET_RSS = "/proc/self/clear_refs"
STATUS = "/proc/self/status"


def reset(device: torch.device) -> bool:
    """Start both peaks afresh; returns whether the resident peak could be reset (else it stays the
    process's lifetime peak)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    return _reset_rss()


def read(device: torch.device) -> tuple[float, float]:
    """(peak_rss_mb, peak_cuda_mb) since the last ``reset``; peak_cuda_mb is 0.0 on a CPU device."""
    cuda = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else 0.0
    return _peak_rss_mb(), cuda


def _reset_rss() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        with open(RESET_RSS, "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss_mb() -> float:
    try:
        with open(STATUS) as f:
            found = re.search(r"^VmHWM:\s+(\d+)\s+kB", f.read(), re.MULTILINE)
        if found:
            return int(found.group(1)) / 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss   # KiB on Linux, bytes on macOS
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024
