"""Split benchmarks (kind ``split``): class- and task-incremental splits of one dataset (kind.py)."""
