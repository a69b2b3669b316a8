"""GTEP, the generalizable two-phase evaluation protocol (kind ``gtep``; "Hyperparameters in continual
learning: a reality check"). kind.py: the suite keys and the phase scenarios of D^HT and D^E;
protocol.py: sampling the R configurations, tuning and evaluation items, selecting H*, the
tuning-vs-evaluation section. The general hyperparameter tables (4, 5) live in clharness.hparams:
every method's search space is built from them, GTEP or not.
"""
