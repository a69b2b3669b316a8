"""Deprecated alias of ``clharness.toolkit.vit_adapters`` (moved in 0.2); removed in the next release."""
import sys
import warnings

from .toolkit import vit_adapters as _module

warnings.warn("clharness.vit_adapters moved to clharness.toolkit.vit_adapters; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _module
