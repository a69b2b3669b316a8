"""Deprecated alias of ``clharness.toolkit.backbones`` (moved in 0.2); removed in the next release."""
import sys
import warnings

from .toolkit import backbones as _module

warnings.warn("clharness.backbones moved to clharness.toolkit.backbones; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _module
