"""Guard for moving code between modules: the quickstart and one quick case of each benchmark family
(stf, curriculum, gtep, cldyb) give the same record keys and bit-identical accuracy matrices as they
did before the families moved into ``clharness/benchmarks/`` (issue 13).

``EXPECTED`` was recorded on main before the move by running this file as a script
(``python tests/test_family_guard.py``), on CPU with one torch thread (tests/conftest.py sets it for
the test; the script sets it too). It is data about the code as it was, not a result to aim for: a
deliberate change of behaviour that changes it must say so in its commit and re-record it.
"""
import json
import math
import sys

import pytest


# suite -> (method, -k expression choosing its smallest scenario)
CASES = {
    "quickstart": ("er", "ci-5x2"),
    "stf-digits": ("er", "stf and not disjoint"),
    "m2i-mini": ("finetune", "ci-m2i"),
    "gtep-digits": ("finetune", "high-synthetic-10"),
    "cldyb-mini": ("lwf", "mini"),
}


def _matrix(rows) -> list:
    """NaN (not reached) as None, so the matrices compare exactly with ``==``."""
    return [[None if v is None or (isinstance(v, float) and math.isnan(v)) else v for v in row] for row in rows]


def family_records(run_pytest, suite: str, results_path) -> dict[str, list]:
    """Run ``suite``'s guard case (quick, one seed) and return {record key: [case, accuracy matrix,
    metrics]} (the STF protocol keeps its accuracies in the metrics, not in a matrix)."""
    from clharness.results import ResultsStore

    method, select = CASES[suite]
    outcome = run_pytest("--clh-suite", suite, "--clh-quick", "--clh-seeds", "1", "--clh-method", method,
                         "-k", select, "--clh-device", "cpu", "--clh-results", str(results_path),
                         "-p", "no:cacheprovider")
    store = ResultsStore(results_path)
    try:
        records = store.records()
    finally:
        store.close()
    assert records, f"{suite}: no records ({outcome})"
    assert all(r.status == "passed" for r in records), [(r.case_id, r.status, r.message) for r in records]
    return {r.key: [r.case_id, _matrix(r.acc_matrix), dict(zip(r.metrics, *_matrix([r.metrics.values()])))]
            for r in records}


@pytest.mark.parametrize("suite", list(CASES))
def test_family_case_keys_and_matrices_are_unchanged(pytester, tmp_path, suite):
    # a fresh process per suite, with one torch thread as the recording had it
    pytester.makepyfile(one_thread="import torch\ntorch.set_num_threads(1)\n")

    def run_pytest(*args):
        result = pytester.runpytest_subprocess("-p", "one_thread", *args)
        assert result.ret == 0, "\n".join(result.outlines[-40:])
        return result.ret

    got = family_records(run_pytest, suite, tmp_path / "results.sqlite")
    expected = EXPECTED[suite]
    assert sorted(got) == sorted(expected), f"{suite}: record keys changed"
    for key, (case, matrix, metrics) in expected.items():
        got_case, got_matrix, got_metrics = got[key]
        assert [got_case, got_matrix] == [case, matrix], f"{suite}: {case}: accuracy matrix changed"
        # every recorded metric unchanged (a metric added since is no change of the old ones)
        assert {k: got_metrics.get(k, "missing") for k in metrics} == metrics, f"{suite}: {case}: metrics changed"


def _record() -> None:
    """Print ``EXPECTED`` for the code as it is now (run once, before a move)."""
    import subprocess
    import tempfile
    from pathlib import Path

    import torch
    torch.set_num_threads(1)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for suite in CASES:
            def run_pytest(*args):
                proc = subprocess.run([sys.executable, "-c",
                                       "import sys, torch, pytest; torch.set_num_threads(1); "
                                       "sys.exit(pytest.main(sys.argv[1:]))", *args],
                                      cwd=tmp, capture_output=True, text=True)
                assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
                return proc.returncode
            out[suite] = family_records(run_pytest, suite, Path(tmp) / f"{suite}.sqlite")
    print("EXPECTED = " + json.dumps(out, indent=1, sort_keys=True).replace("null", "None"))


# Recorded on main at d571360, before the move, by `python tests/test_family_guard.py`:
# suite -> {record key: [case id, accuracy matrix (None: not reached), metrics]}.
EXPECTED = {
    'cldyb-mini': {
        '33bce748e04a420dfbe3': ['cldyb-mini::mini/cc[cldyb-search-seed0]',
            [],
            {'clustering_seconds': 1.3299801369998931, 'learn_seconds': 0.29152840999995533, 'lookahead_seconds': 1.283877672000017, 'prototypes_seconds': 0.08978659049989801, 'sampling_seconds': 0.09961487999999008}],
        '95f3ccc8760a71ef1c1f': ['cldyb-mini::mini/cc[lwf-seed0]',
            [[0.37, 0.0, 0.01], [0.36, 0.0, 0.01], [0.36, 0.0, 0.0]],
            {'acc': 0.18166666666666664, 'afm': 0.0050000000000000044, 'ala': 0.12333333333333334, 'ar': -0.0050000000000000044, 'avg_inc_acc': 0.22333333333333336, 'bwt': -0.006666666666666672, 'final_acc': 0.12, 'forgetting': 0.0050000000000000044, 'fwt': 0.006666666666666667, 'hmean': 0.15611650485436893}],
        'aeeee66a17df10c28910': ['cldyb-mini::mini/random[cldyb-search-seed0]',
            [],
            {'clustering_seconds': 0.0, 'learn_seconds': 1.02349999906437e-05, 'lookahead_seconds': 0.0, 'prototypes_seconds': 0.0, 'sampling_seconds': 0.0}],
        'd369a5d6b78a64a50d84': ['cldyb-mini::mini/random[lwf-seed0]',
            [[0.37, 0.01, 0.02], [0.25, 0.22, 0.02], [0.21, 0.18, 0.2]],
            {'acc': 0.2383333333333333, 'afm': 0.1, 'ala': 0.26333333333333336, 'ar': -0.1, 'avg_inc_acc': 0.2672222222222222, 'bwt': -0.10666666666666669, 'final_acc': 0.19666666666666666, 'forgetting': 0.1, 'fwt': 0.016666666666666666, 'hmean': 0.22657884231536923}],
    },
    'gtep-digits': {
        '3fbd6399d5a6a009eac0': ['gtep-digits::high-synthetic-10:tune-c0[finetune-seed0]',
            [[0.5, 0.05555555555555555, 0.027777777777777776, 0.027777777777777776, 0.027777777777777776], [0.3888888888888889, 0.5555555555555556, 0.027777777777777776, 0.027777777777777776, 0.0], [0.3055555555555556, 0.5, 0.19444444444444445, 0.0, 0.0], [0.2777777777777778, 0.5, 0.2222222222222222, 0.2222222222222222, 0.0], [0.2777777777777778, 0.4444444444444444, 0.1388888888888889, 0.16666666666666666, 0.3055555555555556]],
            {'acc': 0.33333333333333337, 'afm': 0.11111111111111113, 'ala': 0.35555555555555557, 'ar': -0.11111111111111113, 'avg_inc_acc': 0.37555555555555553, 'bwt': -0.10555555555555556, 'final_acc': 0.26666666666666666, 'forgetting': 0.11805555555555555, 'fwt': 0.019444444444444445, 'hmean': 0.31188004613610143}],
        '565338e8bab6c5e5f12d': ['gtep-digits::high-synthetic-10:eval[finetune-seed0]',
            [[0.45, 0.0, 0.0125, 0.025, 0.0875], [0.35, 0.425, 0.0, 0.0, 0.0], [0.325, 0.375, 0.1625, 0.0, 0.0], [0.275, 0.3, 0.1375, 0.1625, 0.0], [0.2375, 0.175, 0.0625, 0.1125, 0.85]],
            {'acc': 0.2933333333333333, 'afm': 0.153125, 'ala': 0.41000000000000003, 'ar': -0.153125, 'avg_inc_acc': 0.32625000000000004, 'bwt': -0.12125000000000001, 'final_acc': 0.2875, 'forgetting': 0.153125, 'fwt': 0.012499999999999999, 'hmean': 0.3056517311608961}],
        '64a576cd52b44a839578': ['gtep-digits::high-synthetic-10:tune-c0[finetune-seed1]',
            [[0.3888888888888889, 0.3333333333333333, 0.0, 0.027777777777777776, 0.0], [0.2222222222222222, 0.8333333333333334, 0.0, 0.0, 0.0], [0.25, 0.8055555555555556, 0.05555555555555555, 0.0, 0.0], [0.19444444444444445, 0.75, 0.05555555555555555, 0.1111111111111111, 0.0], [0.19444444444444445, 0.75, 0.027777777777777776, 0.1111111111111111, 0.027777777777777776]],
            {'acc': 0.3185185185185185, 'afm': 0.0763888888888889, 'ala': 0.2833333333333333, 'ar': -0.0763888888888889, 'avg_inc_acc': 0.35740740740740745, 'bwt': -0.09166666666666667, 'final_acc': 0.2222222222222222, 'forgetting': 0.0763888888888889, 'fwt': 0.03611111111111111, 'hmean': 0.2740504082357117}],
        '8968f4628b037aa15b51': ['gtep-digits::high-synthetic-10:eval[finetune-seed1]',
            [[0.6, 0.075, 0.0, 0.0125, 0.0], [0.1, 0.4875, 0.0, 0.0, 0.0], [0.0375, 0.4, 0.3625, 0.0, 0.0], [0.0375, 0.35, 0.35, 0.175, 0.0], [0.0375, 0.3625, 0.35, 0.15, 0.05]],
            {'acc': 0.25666666666666665, 'afm': 0.18125, 'ala': 0.335, 'ar': -0.18125, 'avg_inc_acc': 0.3157083333333333, 'bwt': -0.25875, 'final_acc': 0.19, 'forgetting': 0.18125, 'fwt': 0.008749999999999999, 'hmean': 0.23722995797973137}],
        'a24c0712626fc8089fb3': ['gtep-digits::high-synthetic-10:tune-c1[finetune-seed1]',
            [[0.05555555555555555, 0.5277777777777778, 0.0, 0.027777777777777776, 0.0], [0.05555555555555555, 0.5555555555555556, 0.0, 0.027777777777777776, 0.0], [0.05555555555555555, 0.5555555555555556, 0.0, 0.027777777777777776, 0.0], [0.05555555555555555, 0.5555555555555556, 0.0, 0.027777777777777776, 0.0], [0.05555555555555555, 0.5277777777777778, 0.0, 0.027777777777777776, 0.0]],
            {'acc': 0.1685185185185185, 'afm': 0.0069444444444444475, 'ala': 0.1277777777777778, 'ar': -0.0069444444444444475, 'avg_inc_acc': 0.16935185185185186, 'bwt': -0.002777777777777779, 'final_acc': 0.12222222222222222, 'forgetting': 0.0069444444444444475, 'fwt': 0.061111111111111116, 'hmean': 0.14197805299742422}],
        'aab163025f1ee541f100': ['gtep-digits::high-synthetic-10:tune-c1[finetune-seed0]',
            [[0.2777777777777778, 0.2222222222222222, 0.05555555555555555, 0.1111111111111111, 0.1111111111111111], [0.2777777777777778, 0.2222222222222222, 0.05555555555555555, 0.1111111111111111, 0.1111111111111111], [0.2777777777777778, 0.2222222222222222, 0.05555555555555555, 0.1111111111111111, 0.1111111111111111], [0.2777777777777778, 0.2222222222222222, 0.05555555555555555, 0.1111111111111111, 0.1111111111111111], [0.2777777777777778, 0.2222222222222222, 0.05555555555555555, 0.1111111111111111, 0.1111111111111111]],
            {'acc': 0.18518518518518517, 'afm': 0.0, 'ala': 0.15555555555555559, 'ar': -0.0, 'avg_inc_acc': 0.20703703703703705, 'bwt': 0.0, 'final_acc': 0.15555555555555556, 'forgetting': 0.0, 'fwt': 0.11111111111111112, 'hmean': 0.17764158438315744}],
    },
    'm2i-mini': {
        '763c779de6bc1463e294': ['m2i-mini::ci-m2i[finetune-seed0]',
            [[0.26, 0.0, 0.0, 0.0, 0.0, 0.0], [0.24, 0.1, 0.0, 0.0, 0.0, 0.0], [0.24, 0.1, 0.18, 0.0, 0.0, 0.0], [0.26, 0.1, 0.14, 0.08, 0.0, 0.0], [0.3, 0.1, 0.14, 0.1, 0.1, 0.0], [0.28, 0.1, 0.14, 0.1, 0.12, 0.14]],
            {'acc': 0.15809523809523812, 'afm': -0.004000000000000006, 'ala': 0.14333333333333334, 'ar': 0.004000000000000006, 'avg_inc_acc': 0.17383333333333337, 'bwt': -0.0026666666666666653, 'final_acc': 0.14666666666666667, 'forgetting': 0.00799999999999999, 'fwt': 0.0, 'hmean': 0.15909863061189117}],
    },
    'quickstart': {
        'ed010fe0a377656996f2': ['quickstart::ci-5x2[er-seed0]',
            [[1.0, 0.0, 0.0, 0.0, 0.0], [0.9814814814814815, 0.9065420560747663, 0.0, 0.0, 0.0], [0.9814814814814815, 0.8598130841121495, 0.9090909090909091, 0.0, 0.0], [0.9351851851851852, 0.897196261682243, 0.13636363636363635, 0.9537037037037037, 0.0], [0.9351851851851852, 0.4672897196261682, 0.18181818181818182, 0.4537037037037037, 0.7289719626168224]],
            {'acc': 0.7551884368083746, 'afm': 0.43283496963403506, 'ala': 0.8996617262972404, 'ar': -0.43283496963403506, 'avg_inc_acc': 0.8280887308540781, 'bwt': -0.26619937694704043, 'final_acc': 0.5518518518518518, 'forgetting': 0.43283496963403506, 'fwt': 0.0, 'hmean': 0.6623217047843822}],
    },
    'stf-digits': {
        '26e9ac6d464b0056e860': ['stf-digits::stf[er-seed0]',
            [],
            {'final_acc': 0.9, 'info_retention': 0.8943174603174603}],
    },
}


if __name__ == "__main__":
    _record()
