"""The engine: cases and sessions with no pytest in them.

Suite loading and validation (``suites``), scenarios (``scenario``), the runner (``runner``),
hyperparameter selection (``hparam_selection``), scheduling (``ray_backend``). The pytest plugin and
the CLI are thin front ends over it; nothing here imports pytest or a benchmark family.
"""
