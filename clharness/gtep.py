"""Deprecated: moved to ``clharness.benchmarks.gtep.protocol``; this re-export goes in the next release."""
from .benchmarks.gtep.protocol import *  # noqa: F401,F403  (deprecated path)
