"""CLDyB: dynamic benchmarking by searching challenging task sequences (the ``cldyb`` scenario kind).

pool.py (classes of many datasets), sampling.py (greedy hard-task sampling, eq. 3, alg. 1),
clustering.py (functional task clustering, alg. 2), search.py (tree search, eqs. 5-7),
sequence.py (the saved sequence and its replay), kind.py (suite kind: CC/IC items, summary).
"""
