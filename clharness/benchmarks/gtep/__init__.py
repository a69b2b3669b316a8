"""GTEP, the generalizable two-phase evaluation protocol (kind ``gtep``; "Hyperparameters in continual
learning: a reality check"). One module a job:
kind.py      the suite keys and the phase scenarios of D^HT and D^E
search.py    what is searched per method, and configuration k's draw (Alg. 2)
protocol.py  the tuning and evaluation units, their cases and runs
selection.py choosing H* (Alg. 1)
phases.py    record names that carry a run's phase
presets.py   the paper's appendix-A configurations (--clh-preset gtep:...)
summary.py   the tuning-vs-evaluation table and scorecard section; report_html.py its page section
spaces.py, paper_configs.py  the paper's Table 4/5 sets and configurations
The general hyperparameter tables (4, 5) live in clharness.hparams: every method's search space is built
from them, GTEP or not.
"""
