"""One reuse path (issue 37 item 2): every executor decides reuse through ``Session.reuse``, so
``--clh-fresh`` and ``--clh-reuse-stale`` mean the same for the serial session, the Ray executor's
up-front submission and CLDyB's sequence searches (look-ahead included) and their replays.

A record "made by other code" is simulated by rewriting a stored record's key and code digest (its
base key kept): what a store holds after the method's code changed."""
import json
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

import clharness as clh
from clharness.results import ResultsStore

HERE = Path(__file__).parent


def make_stale(path: Path) -> dict[str, str]:
    """Every record of ``path`` as if other code had made it; returns {new key: old key}. A CLDyB
    search's sequence file is rewritten to name its (stale) search, as that search would have."""
    store = ResultsStore(path)
    records = store.records()
    store.close()
    db = sqlite3.connect(path)
    db.execute("DELETE FROM runs")
    db.commit()
    db.close()
    store, renamed = ResultsStore(path), {}
    for r in records:
        old = r.key
        r.key, r.code_digest = "0" + old[1:] if old[0] != "0" else "1" + old[1:], "old-code"
        renamed[r.key] = old
        if r.method == "cldyb-search":
            seq = Path(r.message)
            data = json.loads(seq.read_text())
            data["search_key"] = r.key
            seq.write_text(json.dumps(data))
        store.put(r)
    store.close()
    return renamed


def forbid(monkeypatch, module, name):
    calls = []

    def refuse(*args, **kwargs):
        calls.append(args)
        raise AssertionError(f"{module.__name__}.{name} called: the stale record should have been reused")
    monkeypatch.setattr(module, name, refuse)
    return calls


def test_serial_session_reuses_a_stale_record_only_when_asked(tmp_path, monkeypatch):
    from clharness.engine import runner
    results = tmp_path / "r.sqlite"
    opts = dict(methods="finetune", seeds=1, quick=True, device="cpu", results=results)
    (made,) = clh.run("quickstart", **opts)
    renamed = make_stale(results)
    calls = forbid(monkeypatch, runner, "run_case")
    (reused,) = clh.run("quickstart", reuse_stale=True, **opts)
    assert calls == [] and renamed[reused.key] == made.key and reused.acc_matrix == made.acc_matrix
    monkeypatch.undo()
    for stale_too in (False, True):   # without the option, and with --clh-fresh, it runs again
        (fresh,) = clh.run("quickstart", reuse_stale=stale_too, fresh=stale_too, **opts)
        assert fresh.key == made.key and fresh.code_digest != "old-code"


class FakeRunner:
    """What RayExecutor.prepare hands cases to (no Ray runtime needed to see what it would submit)."""
    def __init__(self):
        self.pending, self.submitted = set(), []

    def submit(self, key, case, amend, label):
        self.pending.add(key)
        self.submitted.append(key)

    def submit_ensemble(self, units, label):
        self.submitted += [u.key for u in units]


@pytest.mark.parametrize("reuse_stale", [True, False])
def test_ray_submits_no_case_whose_stale_record_the_session_reuses(tmp_path, reuse_stale):
    pytest.importorskip("ray")
    from clharness.engine.api import api_options
    from clharness.engine.plan import expand, resolve_suite
    from clharness.engine.ray_backend import RayExecutor
    from clharness.engine.session import Session
    results = tmp_path / "r.sqlite"
    opts = dict(methods="finetune", seeds=2, quick=True, device="cpu", results=results)
    clh.run("quickstart", **opts)
    make_stale(results)
    session = Session(api_options(**opts, reuse_stale=reuse_stale))
    try:
        units = [u for u in expand(session, resolve_suite(session, "quickstart")) if u.case is not None]
        session.schedule(units)
        executor = RayExecutor(session, "local")
        executor.runner = fake = FakeRunner()   # started: prepare submits to it
        executor.prepare(units)
    finally:
        session.close()
    assert len(units) == 2
    assert fake.submitted == ([] if reuse_stale else [u.key for u in units])


def test_cldyb_searches_and_replays_reuse_stale_records_when_asked(tmp_path, monkeypatch):
    from clharness.benchmarks.cldyb import kind
    from clharness.engine import runner
    monkeypatch.chdir(tmp_path)   # sequence_dir is relative to the invocation folder
    results = tmp_path / "r.sqlite"
    opts = dict(methods="lwf", seeds=1, quick=True, device="cpu", results=results)
    assert clh.run("cldyb-mini", **opts).ok
    first = stored(results)
    assert {r.method for r in first.values()} == {"cldyb-search", "lwf"} and len(first) == 4   # cc, random
    renamed = make_stale(results)
    searched = forbid(monkeypatch, kind, "run_search")   # the look-ahead search: not run again
    trained = forbid(monkeypatch, runner, "run_case")
    again = clh.run("cldyb-mini", reuse_stale=True, **opts)
    assert again.ok, [u.message for u in again.units]
    assert searched == trained == []
    assert sorted(renamed[r.key] for r in again) == sorted(k for k, r in first.items() if r.method == "lwf")
    assert len(stored(results)) == 4   # nothing new stored
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    # without the option the searches run again and the replays follow them
    assert clh.run("cldyb-mini", **opts).ok
    third = stored(results)
    assert set(first) < set(third) and all(third[k].code_digest != "old-code" for k in first)


def stored(path) -> dict:
    store = ResultsStore(path)
    try:
        return {r.key: r for r in store.records()}
    finally:
        store.close()


def test_a_cldyb_replay_whose_search_ran_elsewhere_finds_its_stale_search(tmp_path, monkeypatch):
    """Under pytest-xdist a replay may run in another process than its search: it finds the search's stale
    record itself, by the search's base key, instead of waiting for a record the search will never write."""
    from clharness import outcomes
    from clharness.engine import runner
    from clharness.engine.api import api_options
    from clharness.engine.plan import expand, resolve_suite
    from clharness.engine.session import Session
    monkeypatch.chdir(tmp_path)
    opts = dict(methods="lwf", seeds=1, quick=True, device="cpu", results=tmp_path / "r.sqlite")
    assert clh.run("cldyb-mini", **opts).ok
    renamed = make_stale(tmp_path / "r.sqlite")
    forbid(monkeypatch, runner, "run_case")
    session = Session(api_options(**opts, reuse_stale=True))
    try:
        replays = [u for u in expand(session, resolve_suite(session, "cldyb-mini")) if u.after]
        session.schedule(replays)   # this process holds the replays only
        for unit in replays:
            session.execute(unit)
            (record,) = [json.loads(v) for k, v in unit.properties if k == outcomes.RECORD]
            assert record["key"] in renamed and record["code_digest"] == "old-code"
    finally:
        session.close()
    assert len(replays) == 2


def test_an_ensemble_reuses_a_stale_member_only_when_asked(tmp_path):
    """The ensemble executor asks the session's one reuse decision which members are already stored: under
    --clh-reuse-stale a member whose record other code made is reused and the ensemble shrinks to the others."""
    opts = dict(methods="finetune", quick=True, device="cpu", results=tmp_path / "r.sqlite")
    (first,) = clh.run("quickstart", seeds=1, **opts)
    renamed = make_stale(tmp_path / "r.sqlite")
    again = clh.run("quickstart", seeds=3, ensemble=True, reuse_stale=True, **opts)
    reused = {u.name: u.reused for u in again.units if u.role == "case"}
    assert reused == {"ci-5x2[finetune-seed0]": True, "ci-5x2[finetune-seed1]": False,
                      "ci-5x2[finetune-seed2]": False}
    assert renamed[again[0].key] == first.key and again[0].code_digest == "old-code"
    assert [r.extra.get("executor") for r in again[1:]] == ["ensemble:2", "ensemble:2"]   # seed 0 not retrained
