"""Deprecated: moved to ``clharness.benchmarks.m2i.effect`` (``clharness curriculum-effect``); this
re-export, and ``python -m clharness.curriculum_effect``, go in the next release."""
import sys

from .benchmarks.m2i.effect import *  # noqa: F401,F403  (deprecated path)
from .benchmarks.m2i.effect import main

if __name__ == "__main__":
    sys.exit(main())
