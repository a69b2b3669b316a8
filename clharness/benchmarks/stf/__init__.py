"""Simulated task-free (STF) online streams (kind ``stf``; "Simulating task-free continual learning
streams from existing datasets"). streams.py: the STF and disjoint label streams (per-class
timestamps whose spread is set by mu_sigma); kind.py: the online protocol (stream batches, evaluation
points, information retention); plots.py: figures 2 and 4 and the ``clharness stream-plot`` command.
"""
