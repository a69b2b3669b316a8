"""Seed ensembles (issue 32) under the schedulers: pytest-xdist (an ensemble is one xdist unit of work,
``--dist loadgroup``), Ray (one task per ensemble) and the results store (a member already stored is
not retrained: the ensemble shrinks, below two members it runs solo). GTEP's tuning trials are members."""
from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

import clharness
# pytester's in-process runs drop modules first imported during a run: import them here (as test_ensemble)
import clharness.engine.runner  # noqa: F401
import clharness.reporting.scorecard  # noqa: F401
import clharness_methods  # noqa: F401
import sklearn.datasets  # noqa: F401
import sklearn.model_selection  # noqa: F401
from clharness.results import ResultsStore
from mini_suite import mini_suite

MINI = mini_suite(seeds=3, hidden=32)


def records(path) -> dict:
    return {r.key: r for r in ResultsStore(path).records()}


def _same_matrices(a, b) -> bool:
    return np.array_equal(a.acc_matrix, b.acc_matrix, equal_nan=True)


def _mini(pytester, monkeypatch, methods=("finetune", "joint")):
    """The suite file and the arguments of a session on it (a subprocess imports this checkout)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parent.parent), str(Path(__file__).parent)]))
    pytester.makefile(".toml", mini=MINI)
    return ["mini.toml", "-p", "no:cacheprovider", *[a for m in methods for a in ("--clh-method", m)]]


def test_xdist_sends_an_ensemble_to_one_worker_which_trains_it(pytester, monkeypatch):
    """``-n 2 --clh-ensemble``: the three seeds of a method are one xdist unit of work (loadgroup, set
    by the plugin) on one worker, trained as an ensemble of 3; the records equal a solo session's."""
    args = _mini(pytester, monkeypatch)
    pytester.runpytest(*args, "--clh-results", "solo.sqlite").assert_outcomes(passed=6)
    result = pytester.runpytest_subprocess(*args, "--clh-results", "ens.sqlite", "-n", "2", "--clh-ensemble", "-v")
    result.assert_outcomes(passed=6)
    solo, ens = records(pytester.path / "solo.sqlite"), records(pytester.path / "ens.sqlite")
    assert solo.keys() == ens.keys() and len(ens) == 6
    for key, record in ens.items():
        assert record.extra["executor"] == "ensemble:3", record.case_id
        assert _same_matrices(record, solo[key]) and "executor" not in solo[key].extra
    # which worker ran each item (-v: "[gw0] ... PASSED ... mini.toml::ci[finetune-seed0]@<group>")
    workers = {}
    for line in result.outlines:
        m = re.search(r"\[(gw\d+)\].*mini\.toml::ci\[(\w+)-seed\d\]@clh-ensemble-", line)
        if m:
            workers.setdefault(m.group(2), set()).add(m.group(1))
    assert set(workers) == {"finetune", "joint"} and all(len(w) == 1 for w in workers.values()), workers


@pytest.mark.slow   # > 45 s on 2 cores (CI stays under 15 min); python -m pytest -m slow
def test_xdist_ensemble_leaves_out_stored_members_and_runs_a_lone_one_solo(pytester, monkeypatch):
    """The store under -n 2: finetune's seed 0 is stored, so seeds 1 and 2 train as an ensemble of 2 and
    seed 0 is reused; joint's seeds 0 and 1 are stored, so seed 2 is alone and runs solo."""
    args = _mini(pytester, monkeypatch)
    store = pytester.path / "r.sqlite"
    pytester.runpytest(*args[:3], "--clh-method", "finetune", "--clh-seeds", "1", "--clh-results", str(store)) \
        .assert_outcomes(passed=1)
    pytester.runpytest(*args[:3], "--clh-method", "joint", "--clh-seeds", "2", "--clh-results", str(store)) \
        .assert_outcomes(passed=2)
    before = records(store)
    result = pytester.runpytest_subprocess(*args, "--clh-results", str(store), "-n", "2", "--clh-ensemble")
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines(["*6 runs, 3 reused from*"])
    after = records(store)
    assert len(after) == 6
    for key, record in before.items():   # not retrained
        assert after[key].started_at == record.started_at and "executor" not in after[key].extra
    fresh = {(r.method, r.seed): r.extra.get("executor") for k, r in after.items() if k not in before}
    assert fresh == {("finetune", 1): "ensemble:2", ("finetune", 2): "ensemble:2", ("joint", 2): None}


def test_a_dist_mode_that_splits_ensembles_is_refused(pytester, monkeypatch):
    args = _mini(pytester, monkeypatch)
    result = pytester.runpytest_subprocess(*args, "-n", "2", "--dist", "worksteal", "--clh-ensemble")
    result.stderr.fnmatch_lines(["*--clh-ensemble with --dist worksteal*use --dist loadgroup*"])


# ------------------------------------------------------------------------------------------------- Ray
def _why_solo(method: str):
    from clharness.engine.ensemble_policy import why_solo
    from clharness.engine.runner import Case, resolve_hparams
    from clharness.engine.suites import load_suite
    from clharness.plugins import Harness
    harness = Harness()
    spec = load_suite(harness.suites["quickstart"], quick=True).scenarios[0]
    cls = harness.methods[method]
    return why_solo(Case("q", spec, method, 0, resolve_hparams(cls)), cls)


@pytest.fixture(scope="module")
def ray_runtime():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield
    ray.shutdown()


@pytest.mark.slow   # > 45 s on 2 cores (CI stays under 15 min); python -m pytest -m slow
def test_ray_runs_one_task_per_ensemble_and_stores_every_member(pytester, monkeypatch, ray_runtime):
    """``--clh-ray local --clh-ensemble``: finetune's seeds not stored (1 and 2; seed 0 is) go as one
    task with the resources of one run, whose records are stored under each member's key; agem cannot
    be batched and goes as one task per case, as without the option. Records equal the serial ones."""
    from clharness.engine import ray_backend
    tasks = []
    for name in ("submit", "submit_ensemble"):
        original = getattr(ray_backend.RayRunner, name)

        def spy(self, *a, _original=original, _name=name, **kw):
            before = self.submitted   # result() calls submit too: count only the tasks that went out
            out = _original(self, *a, **kw)
            if self.submitted > before:
                tasks.append((_name, self.resources(a[0][0].case if _name == "submit_ensemble" else a[1])))
            return out
        monkeypatch.setattr(ray_backend.RayRunner, name, spy)
    assert _why_solo("agem") is not None   # the method that shows the unbatched path (pick another if it opts in)
    args = _mini(pytester, monkeypatch, methods=("finetune", "agem"))
    pytester.runpytest(*args, "--clh-results", "serial.sqlite").assert_outcomes(passed=6)
    pytester.runpytest(*args[:3], "--clh-method", "finetune", "--clh-seeds", "1", "--clh-results", "ray.sqlite") \
        .assert_outcomes(passed=1)
    tasks.clear()
    result = pytester.runpytest(*args, "--clh-results", "ray.sqlite", "--clh-ray", "local", "--clh-ensemble")
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines(["*mini::ci[[]agem[]] runs solo: method 'agem' trains with a loop of its own, outside fit()*"])
    assert sorted(name for name, _ in tasks) == ["submit", "submit", "submit", "submit_ensemble"], tasks
    assert all(res == {"num_cpus": 1.0, "num_gpus": 0.0} for _, res in tasks)
    serial, ray = records(pytester.path / "serial.sqlite"), records(pytester.path / "ray.sqlite")
    assert serial.keys() == ray.keys() and len(ray) == 6
    executors = {(r.method, r.seed): r.extra.get("executor") for r in ray.values()}
    assert executors == {("finetune", 0): None, ("finetune", 1): "ensemble:2", ("finetune", 2): "ensemble:2",
                         ("agem", 0): None, ("agem", 1): None, ("agem", 2): None}
    for key, record in ray.items():
        assert record.status == "passed" and _same_matrices(record, serial[key]), record.case_id
        # and the same FLOPs: an ensemble member on a Ray worker counts what its serial solo run counts (issue 41)
        assert (record.train_gflops, record.eval_gflops) == (serial[key].train_gflops, serial[key].eval_gflops) \
            and record.train_gflops > 0, record.case_id


# ------------------------------------------------------------------------------------------------ GTEP
def test_gtep_tuning_trials_train_as_ensembles(tmp_path):
    """A GTEP configuration's trials are the same case but for the seed: with a constant learning rate
    they train as one ensemble (S = 2), records equal to the solo tuning phase's, so the same H*. Units
    of the second scenario that share the tuning phase are not members (the first unit trains the key)."""
    from clharness.engine import ensemble
    from clharness.engine.plan import expand
    from clharness.engine.session import Options, Session
    import clharness.benchmarks.gtep.protocol as gtep
    text = (Path(clharness.__file__).parent.parent / "suites" / "gtep-digits.toml").read_text()
    suite = tmp_path / "gtep.toml"
    suite.write_text(text.replace("fixed = { momentum = 0.9 }", 'fixed = { momentum = 0.9, scheduler = "constant" }'))
    session = Session(Options(results=tmp_path / "x.sqlite", quick=True, methods=("finetune",), ensemble=True))
    units = expand(session, suite)
    groups = ensemble.ensembles(units)
    tune = [u for u in units if "-tune-c" in u.name]
    assert len(tune) == 8 and sorted(len(g) for g in groups) == [2, 2]   # 2 configurations x 2 trials, twice
    assert all("high-synthetic-10" in u.name and "-tune-c" in u.name for g in groups for u in g)
    runs = {}
    for name, ens in (("solo", False), ("ens", True)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            runs[name] = clharness.run(suite, methods="finetune", quick=True, device="cpu",
                                       results=tmp_path / f"{name}.sqlite", ensemble=ens)
        assert runs[name].ok
    solo, ens = ({r.key: r for r in runs[n]} for n in ("solo", "ens"))
    assert solo.keys() == ens.keys()
    executors = sorted(str(r.extra.get("executor")) for r in ens.values())
    assert executors == ["None"] * 4 + ["ensemble:2"] * 4   # the 4 evaluation runs are made after selection
    for key, record in ens.items():
        assert _same_matrices(record, solo[key]) and record.hparams == solo[key].hparams, record.case_id
    from clharness.benchmarks.gtep.summary import summarize
    chosen = [summarize(list(r.values()))[["method", "config"]].to_dict("records") for r in (solo, ens)]
    assert chosen[0] == chosen[1]
