"""Deprecated alias of ``clharness.toolkit.feature_cache`` (moved in 0.2); removed in the next release."""
import sys
import warnings

from .toolkit import feature_cache as _module

warnings.warn("clharness.feature_cache moved to clharness.toolkit.feature_cache; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _module
