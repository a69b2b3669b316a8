"""Every shipped suite file loads (keys, kinds, gates checked by the loader) and names only
methods that are registered, so a typo in a suite or a renamed method fails here, not in a
user's long run."""
from pathlib import Path

import pytest

from clharness.engine.suites import load_suite
from clharness_methods import REFERENCE_METHODS

SUITES = sorted((Path(__file__).parent.parent / "suites").glob("*.toml"))
REGISTERED = {cls.name for cls in REFERENCE_METHODS}


def test_the_suite_folder_is_found():
    assert len(SUITES) >= 20 and any(p.stem == "baselines-digits" for p in SUITES)


@pytest.mark.parametrize("path", SUITES, ids=[p.stem for p in SUITES])
def test_shipped_suite_loads_and_names_registered_methods(path):
    suite = load_suite(path)
    unknown = set(suite.methods) - REGISTERED
    # CLDyB's paper-scale pool names search/evaluation methods that may arrive later; it says so
    assert not unknown or "not registered" in path.read_text(), f"{path.name}: unknown methods {sorted(unknown)}"
    for gate in suite.gates:
        assert gate.method in suite.methods or not suite.methods, f"{path.name}: gate {gate} on a method it does not run"


# The suites that run offline (bundled digits, synthetic data, tiny random-init models): every one is
# green out of the box, quick in CI and in full under `-m slow`.
OFFLINE = ["quickstart", "baselines-digits", "stf-digits", "stf-digits-difficulty", "m2i-mini", "gtep-digits",
           "cldyb-mini", "cldyb-mini-ablations", "ptm-mini", "select-hparams-digits", "domain-digits"]


def _green(suite, tmp_path, quick):
    """Every unit passes (in full: the gates too). Under --clh-quick a suite's gates, calibrated for its
    full budgets (e.g. "icarl beats finetune by 0.5" after 5 epochs), are not judged here: one epoch is a
    smoke run of every case and protocol step."""
    import clharness as clh
    records = clh.run(suite, quick=quick, results=tmp_path / "r.sqlite", device="cpu")
    failed = [(u.name, u.message.splitlines()[0] if u.message else "") for u in records.units
              if u.outcome == "failed" and not (quick and u.role == "gate")]
    assert not failed, f"{suite}: {len(failed)} unit(s) failed: {failed[:5]}"
    assert records and all(r.status in ("passed", "diverged", "not-applicable") for r in records)
    # FLOPs in every record the suite stored (issue 41): every method's run (GTEP's phases, M2I's, STF's, domain
    # runs) and every protocol step (CLDyB's searches: 0 for one that trains no method, never None), and its peaks
    from clharness.kinds import pseudo_methods
    from clharness.results import ResultsStore
    stored = ResultsStore(tmp_path / "r.sqlite").records()   # the searches' records too (records holds cases)
    assert {r.key for r in records} <= {r.key for r in stored}
    steps = [r for r in stored if r.status == "passed" and r.method in pseudo_methods()]
    runs = [r for r in stored if r.status == "passed" and r.method not in pseudo_methods()]
    uncounted = [r.case_id for r in runs
                 if not (r.train_gflops and r.train_gflops > 0 and r.eval_gflops and r.eval_gflops > 0)]
    uncounted += [r.case_id for r in steps if r.train_gflops is None or r.eval_gflops is None]
    assert not uncounted, f"{suite}: records without training or evaluation FLOPs: {uncounted[:5]}"
    assert all(r.peak_rss_mb > 0 for r in runs + steps), f"{suite}: records without their peak memory"
    if suite.startswith("cldyb"):
        assert any(r.train_gflops > 0 for r in steps), f"{suite}: no search counted its methods' training"


# over 40 s quick on 2 cores each, so under -m slow (CI stays under 15 min); their families stay covered quick
# by the wheel test (one quick suite a family: stf-digits and domain-digits too), test_family_guard and the
# methods' own tests
SLOW_QUICK = {"stf-digits-difficulty", "baselines-digits", "ptm-mini", "domain-digits", "stf-digits"}


@pytest.mark.parametrize("suite", [pytest.param(s, marks=pytest.mark.slow) if s in SLOW_QUICK else s for s in OFFLINE])
def test_every_offline_suite_is_green_quick(suite, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # CLDyB writes its sequences under the invocation folder
    _green(suite, tmp_path, quick=True)


@pytest.mark.slow
@pytest.mark.parametrize("suite", OFFLINE)
def test_every_offline_suite_is_green_in_full(suite, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _green(suite, tmp_path, quick=False)
