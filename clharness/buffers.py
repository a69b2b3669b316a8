"""Deprecated alias of ``clharness.toolkit.buffers`` (moved in 0.2); removed in the next release."""
import sys
import warnings

from .toolkit import buffers as _module

warnings.warn("clharness.buffers moved to clharness.toolkit.buffers; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _module
