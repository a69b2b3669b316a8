"""Deprecated alias of ``clharness.toolkit.training`` (moved in 0.2); removed in the next release."""
import sys
import warnings

from .toolkit import training as _module

warnings.warn("clharness.training moved to clharness.toolkit.training; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _module
