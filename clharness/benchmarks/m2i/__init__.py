"""The M2I / I2M curricula (kind ``curriculum``; Faber et al. 2024). kind.py: the six-task curriculum
from MNIST to Tiny ImageNet and back; effect.py: the curriculum effect (M2I minus I2M per method, CI
over seeds), as ``clharness curriculum-effect RESULTS`` or ``python -m clharness.benchmarks.m2i.effect``.
"""
