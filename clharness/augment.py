"""Deprecated alias of ``clharness.toolkit.augment`` (moved in 0.2); removed in the next release."""
import sys
import warnings

from .toolkit import augment as _module

warnings.warn("clharness.augment moved to clharness.toolkit.augment; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _module
