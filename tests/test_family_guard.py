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
    # keyed by the key without the code digest (RunRecord.base_key): this guard pins what defines a case
    # and what it computes; the code digest itself changes with every edit of the harness (by design)
    return {r.base_key: [r.case_id, _matrix(r.acc_matrix), dict(zip(r.metrics, *_matrix([r.metrics.values()])))]
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
    # A CLDyB replay's key holds the absolute path of its searched sequence (sequence_dir is relative to
    # the invocation folder, a fresh temporary one here), so replays are matched by case id; every other
    # record, the searches included, by its key.
    path_keyed = {k for k, (case, _, _) in expected.items() if suite.startswith("cldyb") and "cldyb-search" not in case}
    assert sorted(k for k in got if got[k][0] not in {expected[p][0] for p in path_keyed}) == \
        sorted(set(expected) - path_keyed), f"{suite}: record keys changed"
    by_case = {v[0]: v for v in got.values()}
    for key, (case, matrix, metrics) in expected.items():
        got_case, got_matrix, got_metrics = got[key] if key not in path_keyed else by_case[case]
        assert [got_case, got_matrix] == [case, matrix], f"{suite}: {case}: accuracy matrix changed"
        # every recorded metric unchanged (a metric added since is no change of the old ones); wall-clock
        # timings (CLDyB's search stage *_seconds) are measurements, not results
        same = {k: v for k, v in metrics.items() if not k.endswith("_seconds")}
        assert {k: got_metrics.get(k, "missing") for k in same} == same, f"{suite}: {case}: metrics changed"


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


# Recorded on main at d571360, before the move, by `python tests/test_family_guard.py`; gtep-digits
# re-recorded for issue 15 item 1 (one tuning phase per D^HT: tuning runs keyed and named by the
# D^HT's tuning id, configurations drawn from it, evaluation runs named <scenario>:eval@<tuning id>);
# cldyb-mini re-recorded for issue 15 items 5 and 9 (candidate-only normalisation, ablation (d), SEARCH_VERSION 2):
# suite -> {record key: [case id, accuracy matrix (None: not reached), metrics]}.
EXPECTED = {
    'cldyb-mini': {
        '0c8808058c552752a5c5': ['cldyb-mini::mini/random[cldyb-search-seed0]',
            [],
            {'clustering_seconds': 0.0, 'learn_seconds': 5.335001333151013e-06, 'lookahead_seconds': 0.0, 'prototypes_seconds': 0.0, 'sampling_seconds': 0.0}],
        '35d5d1918e90dd3e8f16': ['cldyb-mini::mini/cc[cldyb-search-seed0]',
            [],
            {'clustering_seconds': 0.06307656599983602, 'learn_seconds': 0.011388750000151049, 'lookahead_seconds': 0.048212169500402524, 'prototypes_seconds': 0.004555302999506239, 'sampling_seconds': 0.0037635200005752267}],
        '83e62f03c054af76a325': ['cldyb-mini::mini/random[lwf-seed0]',
            [[0.37, 0.01, 0.02], [0.25, 0.22, 0.02], [0.21, 0.18, 0.2]],
            {'aa': 0.19666666666666668, 'acc': 0.2383333333333333, 'afm': 0.1, 'ala': 0.26333333333333336, 'ar': -0.1, 'avg_inc_acc': 0.2672222222222222, 'bwt': -0.10666666666666669, 'final_acc': 0.19666666666666666, 'forgetting': 0.1, 'fwt': 0.016666666666666666, 'hmean': 0.22657884231536923}],
        'e528e79894e98ebd354d': ['cldyb-mini::mini/cc[lwf-seed0]',
            [[0.37, 0.0, 0.01], [0.36, 0.0, 0.01], [0.36, 0.0, 0.0]],
            {'aa': 0.12, 'acc': 0.18166666666666664, 'afm': 0.0050000000000000044, 'ala': 0.12333333333333334, 'ar': -0.0050000000000000044, 'avg_inc_acc': 0.22333333333333336, 'bwt': -0.006666666666666672, 'final_acc': 0.12, 'forgetting': 0.0050000000000000044, 'fwt': 0.006666666666666667, 'hmean': 0.15611650485436893}],
    },
    'gtep-digits': {
        '0a0da664b4537c92b102': ['gtep-digits::synthetic[0-10]-5-equal-7c690a458c:tune-c1[finetune-seed0]',
            [[1.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.8888888888888888, 0.0, 0.0, 0.0], [0.0, 0.5, 0.9722222222222222, 0.0, 0.0], [0.0, 0.5, 0.5833333333333334, 0.9444444444444444, 0.0], [0.027777777777777776, 0.1111111111111111, 0.05555555555555555, 0.8611111111111112, 0.9722222222222222]],
            {'aa': 0.40555555555555556, 'acc': 0.49444444444444446, 'afm': 0.6875, 'ala': 0.9555555555555555, 'ar': -0.6875, 'avg_inc_acc': 0.5695370370370371, 'bwt': -0.6916666666666667, 'final_acc': 0.40555555555555556, 'forgetting': 0.6875, 'fwt': 0.0, 'hmean': 0.4737578999567415}],
        '2772305e42cb1a0bceb3': ['gtep-digits::synthetic[0-10]-5-equal-7c690a458c:tune-c1[finetune-seed1]',
            [[0.5277777777777778, 0.0, 0.0, 0.0, 0.0], [0.0, 0.9722222222222222, 0.0, 0.0, 0.0], [0.0, 0.5, 0.8888888888888888, 0.0, 0.0], [0.0, 0.5, 0.1388888888888889, 0.9722222222222222, 0.0], [0.0, 0.5, 0.25, 0.7777777777777778, 1.0]],
            {'aa': 0.5055555555555555, 'acc': 0.4685185185185185, 'afm': 0.4583333333333333, 'ala': 0.8722222222222221, 'ar': -0.4583333333333333, 'avg_inc_acc': 0.47703703703703704, 'bwt': -0.5111111111111111, 'final_acc': 0.5055555555555555, 'forgetting': 0.4583333333333333, 'fwt': 0.0, 'hmean': 0.4908824391673996}],
        '61780c9143e41c3cef99': ['gtep-digits::synthetic[0-10]-5-equal-7c690a458c:tune-c0[finetune-seed1]',
            [[0.5277777777777778, 0.0, 0.0, 0.0, 0.0], [0.0, 0.9722222222222222, 0.0, 0.0, 0.0], [0.0, 0.5, 0.8888888888888888, 0.0, 0.0], [0.0, 0.5, 0.1388888888888889, 0.9722222222222222, 0.0], [0.0, 0.5, 0.25, 0.7777777777777778, 1.0]],
            {'aa': 0.5055555555555555, 'acc': 0.4685185185185185, 'afm': 0.4583333333333333, 'ala': 0.8722222222222221, 'ar': -0.4583333333333333, 'avg_inc_acc': 0.47703703703703704, 'bwt': -0.5111111111111111, 'final_acc': 0.5055555555555555, 'forgetting': 0.4583333333333333, 'fwt': 0.0, 'hmean': 0.4908824391673996}],
        '8eb098f9bd71eda45772': ['gtep-digits::high-synthetic-10:eval@synthetic[0-10]-5-equal-7c690a458c[finetune-seed0]',
            [[0.5, 0.0, 0.0, 0.0, 0.0], [0.0, 0.975, 0.0, 0.0, 0.0], [0.0, 0.1125, 0.875, 0.0, 0.0], [0.0, 0.0125, 0.3125, 0.975, 0.0], [0.0, 0.0, 0.0, 0.5125, 1.0]],
            {'aa': 0.3025, 'acc': 0.3516666666666667, 'afm': 0.703125, 'ala': 0.865, 'ar': -0.703125, 'avg_inc_acc': 0.3888333333333333, 'bwt': -0.67, 'final_acc': 0.3025, 'forgetting': 0.703125, 'fwt': 0.0, 'hmean': 0.34027603664416584}],
        'c024819baf125230a112': ['gtep-digits::synthetic[0-10]-5-equal-7c690a458c:tune-c0[finetune-seed0]',
            [[1.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.8888888888888888, 0.0, 0.0, 0.0], [0.0, 0.5, 0.9722222222222222, 0.0, 0.0], [0.0, 0.5, 0.5833333333333334, 0.9444444444444444, 0.0], [0.027777777777777776, 0.1111111111111111, 0.05555555555555555, 0.8611111111111112, 0.9722222222222222]],
            {'aa': 0.40555555555555556, 'acc': 0.49444444444444446, 'afm': 0.6875, 'ala': 0.9555555555555555, 'ar': -0.6875, 'avg_inc_acc': 0.5695370370370371, 'bwt': -0.6916666666666667, 'final_acc': 0.40555555555555556, 'forgetting': 0.6875, 'fwt': 0.0, 'hmean': 0.4737578999567415}],
        'fb0201abdecbfdf56ee6': ['gtep-digits::high-synthetic-10:eval@synthetic[0-10]-5-equal-7c690a458c[finetune-seed1]',
            [[1.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.625, 0.0, 0.0, 0.0], [0.0, 0.0875, 0.75, 0.0, 0.0], [0.0, 0.0375, 0.0875, 0.9625, 0.0], [0.0, 0.0, 0.1625, 0.7125, 0.7625]],
            {'aa': 0.3275, 'acc': 0.3458333333333333, 'afm': 0.615625, 'ala': 0.82, 'ar': -0.615625, 'avg_inc_acc': 0.4382083333333334, 'bwt': -0.725, 'final_acc': 0.3275, 'forgetting': 0.615625, 'fwt': 0.0, 'hmean': 0.37485090058224957}],
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
    'stf-digits': {   # re-recorded for issue 30 item 13: Av. IR exact over every step (retention = "exact" in the key)
        '3b1b5517c6339983a646': ['stf-digits::stf[er-seed0]',
            [],
            {'final_acc': 0.9, 'info_retention': 0.8853806914396273}],
    },
}

if __name__ == "__main__":
    _record()
