"""Regions of harness code the run's FLOP meter may skip (issue 40: the meter's cost at real size).

The engine's FLOP meter (``clharness.engine.flops``) is a Python dispatch mode: every aten op of a run pays
its dispatch (~10-20 us on a small CPU), counted or not. ``uncounted(region)`` steps the meters aside around
harness and toolkit code that runs only ops without a FLOP formula (index gathers, the data layer's
normalisation, a buffer's bookkeeping), as the meter already does around a built-in optimizer's update.
Counting such code would add nothing, so every total is the same; ``PAUSES`` proves it: under ``"check"``
the regions run metered and one whose ops counted anything raises (tests/test_flops_pauses.py runs real
cases so), under ``"off"`` they run metered silently (the reference the tests compare the totals with).

The toolkit depends on the contract only, so the meter's modes are recognised by their ``counts_flops``
attribute; a region pauses only when every active dispatch mode is such a meter (any other mode, a
debugging or tracing one, sees every op as before).
"""
from __future__ import annotations

import torch

# "on": regions skip the meters; "off": they run metered; "check": metered, raising if a region counted FLOPs
PAUSES = "on"

_len_stack = torch._C._len_torch_dispatch_stack
_stack_at = torch._C._get_dispatch_stack_at
_pop = torch._C._pop_torch_dispatch_stack
_push = torch._C._push_on_torch_dispatch_stack


class uncounted:
    """``with uncounted("what runs here"):`` -- the FLOP meters of this thread step aside while the block
    runs. Only for code that runs no op with a FLOP formula (no matmul, convolution or attention, and none
    that decomposes into one); never around a ``yield`` (the consumer's code would run unmetered)."""

    __slots__ = ("region", "_popped", "_check")

    def __init__(self, region: str) -> None:
        self.region = region
        self._popped = self._check = None

    def __enter__(self) -> "uncounted":
        n = _len_stack()
        if not n or PAUSES == "off":
            return self
        modes = [_stack_at(i) for i in range(n)]
        if not all(getattr(mode, "counts_flops", False) for mode in modes):
            return self
        if PAUSES == "check":
            self._check = (modes, [mode.total for mode in modes])
            return self
        self._popped = [_pop(None) for _ in range(n)]   # innermost first
        return self

    def __exit__(self, *exc) -> None:
        popped, self._popped = self._popped, None
        if popped is not None:
            for mode in reversed(popped):
                _push(mode)
            return
        check, self._check = self._check, None
        if check is not None and exc[0] is None:
            modes, before = check
            counted = [mode.total - b for mode, b in zip(modes, before)]
            if any(counted):
                raise RuntimeError(f"FLOP meter: the uncounted region {self.region!r} ran ops with a FLOP formula "
                                   f"({max(counted)} FLOPs); it must not be paused (remove its uncounted())")
