"""Deprecated alias of ``clharness.toolkit.vit_prompts`` (moved in 0.2); removed in the next release."""
import sys
import warnings

from .toolkit import vit_prompts as _module

warnings.warn("clharness.vit_prompts moved to clharness.toolkit.vit_prompts; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _module
