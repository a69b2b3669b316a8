"""Domain-incremental benchmarks (kind ``domain``): the same classes, a new input distribution per task."""
