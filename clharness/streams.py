"""Deprecated: moved to ``clharness.benchmarks.stf.streams``; this re-export goes in the next release."""
from .benchmarks.stf.streams import *  # noqa: F401,F403  (deprecated path)
