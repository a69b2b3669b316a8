"""``clharness store list|rm|vacuum`` and the configuration a record belongs to (issue 36 items 2, 3)."""
from __future__ import annotations

import sqlite3
import subprocess
import sys
import time

from clharness.cli import main
from clharness.reporting.store_admin import Selection, parse_age, stale_keys
from clharness.results import (RunRecord, ResultsStore, configuration_differences, configuration_fields,
                               configuration_id, configuration_label)


def rec(method="er", seed=0, *, suite="s", scenario="sc", budget="full", code="c1", hparams=None,
        finished=1000.0, base=None):
    key = f"{suite}-{scenario}-{method}-{seed}-{budget}-{code}-{sorted((hparams or {}).items())}"
    return RunRecord(suite=suite, scenario=scenario, method=method, seed=seed, status="passed",
                     budget=budget, code_digest=code, hparams=dict(hparams or {}), key=key,
                     base_key=base or f"{suite}-{scenario}-{method}-{seed}-{budget}", finished_at=finished)


def test_configuration_id_ignores_the_seed_and_separates_budget_code_and_hparams():
    a, b = rec(seed=0), rec(seed=1)
    assert configuration_id(a) == configuration_id(b)
    assert configuration_id(rec(budget="quick")) != configuration_id(a)
    assert configuration_id(rec(code="c2")) != configuration_id(a)
    assert configuration_id(rec(hparams={"lr": 0.1})) != configuration_id(a)


def test_configuration_differences_name_the_field():
    quick, full = configuration_fields(rec(budget="quick")), configuration_fields(rec())
    assert configuration_differences(quick, full) == ["budget: quick vs full"]
    assert configuration_differences(configuration_fields(rec(code="aaaa")), full) == ["code digest: aaaa vs c1"]
    assert configuration_differences(configuration_fields(rec(hparams={"lr": 0.1})),
                                     configuration_fields(rec(hparams={"lr": 0.01}))) == ["hparams lr: 0.1 vs 0.01"]


def test_configuration_label_says_quick_stale_code_and_hparams():
    main_row = configuration_fields(rec(hparams={"lr": 0.01}))
    assert configuration_label(rec(budget="quick", hparams={"lr": 0.01}), main_row) == "quick"
    assert configuration_label(rec(code="1a2b3c4d", hparams={"lr": 0.01}), main_row, current_code="c1") \
        == "code 1a2b3c (stale)"
    assert configuration_label(rec(hparams={"lr": 0.1}), main_row) == "lr=0.1"
    assert configuration_label(rec(hparams={"lr": 0.01}), main_row) == "full"


def test_stale_records_are_those_superseded_by_newer_code_of_the_same_base_key():
    old = rec(code="c1", finished=10.0, base="b0")
    new = rec(code="c2", finished=20.0, base="b0")
    other = rec(method="ewc", code="c1", finished=5.0, base="b1")   # alone: current
    assert stale_keys([old, new, other]) == {old.key}


def test_selection_filters_all_hold():
    records = [rec("er", 0), rec("ewc", 0), rec("er", 1, budget="quick"), rec("er", 2, finished=0.0)]
    assert [r.key for r in Selection(methods=["er"]).select(records)] == [records[0].key, records[2].key,
                                                                           records[3].key]
    assert [r.key for r in Selection(methods=["er"], quick=True).select(records)] == [records[2].key]
    assert [r.key for r in Selection(older_than=parse_age("1h")).select(records, now=3600.5)] == [records[3].key]
    assert parse_age("2d") == 2 * 86400


def _fill(path, records):
    with ResultsStore(path) as store:
        for r in records:
            store.put(r)


def test_store_rm_without_yes_removes_nothing_and_list_shows_configurations(tmp_path, capsys):
    path = tmp_path / "r.sqlite"
    _fill(path, [rec("er", 0), rec("er", 1), rec("er", 0, budget="quick"), rec("ewc", 0)])
    assert main(["store", "rm", str(path), "--method", "er"]) == 0
    assert "3 record(s) selected; nothing removed" in capsys.readouterr().out
    with ResultsStore(path) as store:
        assert len(store) == 4
    assert main(["store", "list", str(path)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines()[1:]]
    er_rows = sorted(line.split(" | ")[4] + " " + line.split(" | ")[7] for line in rows if " | er | " in line)
    assert er_rows == ["1 quick", "2 full"]   # seeds per configuration, budget apart
    assert main(["store", "rm", str(path)]) == 2   # no filter: refused


WRITER = """
import sys
from pathlib import Path
from clharness.results import ResultsStore, RunRecord
i = 0
with ResultsStore(sys.argv[1]) as store:
    while not Path(sys.argv[2]).exists():   # one record per transaction until told to stop
        store.put(RunRecord(suite="w", scenario="sc", method="writer", seed=i, status="passed",
                            key=f"writer-{i}", base_key=f"writer-{i}", finished_at=float(i)))
        i += 1
print(i)
"""


def _writer_rows(path) -> int:
    probe = sqlite3.connect(path, timeout=60)
    try:
        return probe.execute("SELECT COUNT(*) FROM runs WHERE method = 'writer'").fetchone()[0]
    finally:
        probe.close()


def test_store_rm_method_with_a_concurrent_writer_removes_exactly_that_method(tmp_path, capsys):
    path, stop = tmp_path / "r.sqlite", tmp_path / "stop"
    victims = [rec("x", i, hparams={"i": i}) for i in range(300)]
    keep = [rec("er", i) for i in range(50)]
    _fill(path, victims + keep)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(stop)], stdout=subprocess.PIPE, text=True)
    try:
        while _writer_rows(path) == 0:
            time.sleep(0.01)   # the writer is under way ...
        before = _writer_rows(path)
        assert main(["store", "rm", str(path), "--method", "x", "--yes"]) == 0
        assert _writer_rows(path) > before   # ... and wrote while the removal ran
    finally:
        stop.touch()
        written = int(writer.communicate(timeout=120)[0])
    assert writer.returncode == 0
    n = written
    assert "removed 300 record(s)" in capsys.readouterr().out
    with ResultsStore(path) as store:
        assert store.integrity() == "ok"
        methods = [r.method for r in store.records()]
    assert methods.count("x") == 0
    assert methods.count("er") == 50
    assert methods.count("writer") == n
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db.close()
    assert main(["store", "vacuum", str(path)]) == 0
    with ResultsStore(path) as store:
        assert len(store) == 50 + n


# --- configurations are rows: every report format, the scorecard, compare ---------------------------

def _three_configurations():
    """One case: 3 full seeds of the current code (final acc 0.5, 0.6, 0.7), 2 quick seeds (0.2, 0.4),
    1 full seed of stale code (0.9, the newest record)."""
    out = []
    for seed, acc in enumerate((0.5, 0.6, 0.7)):
        out.append(rec("er", seed, code="cur0001", finished=100.0 + seed))
        out[-1].metrics = {"final_acc": acc}
    for seed, acc in enumerate((0.2, 0.4)):
        out.append(rec("er", seed, budget="quick", code="cur0001", finished=200.0 + seed))
        out[-1].metrics = {"final_acc": acc}
    out.append(rec("er", 0, code="old9999", finished=300.0))
    out[-1].metrics = {"final_acc": 0.9}
    return out


CURRENT = {("s", "sc", "er"): "cur0001"}


def test_summary_rows_are_configurations_with_their_seeds_and_labels():
    from clharness.reporting.scorecard import summarize
    summary = summarize(_three_configurations(), ["final_acc"], current=CURRENT)
    got = [(r.configuration, r.seeds, round(r.final_acc, 6), bool(r.main)) for r in summary.itertuples()]
    assert got == [("full", 3, 0.6, True), ("quick", 2, 0.3, False), ("code old999 (stale)", 1, 0.9, False)]
    # without the current code the newest full configuration leads (the stale one here: why fronts pass it)
    assert summarize(_three_configurations(), ["final_acc"]).iloc[0].code_digest == "old9999"


def test_every_report_format_shows_each_configuration_apart(tmp_path):
    import json as _json
    from clharness.reporting.report import build_html, render_text
    from clharness.reporting.scorecard import write
    records = _three_configurations()
    md = render_text(records, ["final_acc"], "md", current=CURRENT, every=True)   # clharness report --all
    latex = render_text(records, ["final_acc"], "latex", current=CURRENT, every=True)
    csv = render_text(records, ["final_acc"], "csv", current=CURRENT, every=True)
    html = build_html(records, ["final_acc"], current=CURRENT, every=True)
    for text, seeds_of in ((md, lambda label: f"| {label}"), (latex, lambda label: f"& {label}")):
        for label, n, acc in (("full", 3, "0.600"), ("quick", 2, "0.300"), ("code old999", 1, "0.900")):
            line = next(line for line in text.splitlines() if seeds_of(label) in line)
            assert f" {n} " in line and acc in line, (label, line)
    import io
    import pandas as pd
    frame = pd.read_csv(io.StringIO(csv))
    assert sorted(zip(frame.budget, frame.code_digest, frame.seeds)) == [
        ("full", "cur0001", 3), ("full", "old9999", 1), ("quick", "cur0001", 2)]
    for label in ("<td>quick", "<td>code old999", "<td>full"):
        assert label in html
    card = _json.loads(write(tmp_path / "card.json", records, ["final_acc"]).read_text())["summary"]
    assert sorted((r["budget"], r["code_digest"], r["seeds"]) for r in card) == [
        ("full", "cur0001", 3), ("full", "old9999", 1), ("quick", "cur0001", 2)]


def test_compare_of_a_quick_and_a_full_scorecard_is_a_budget_mismatch(tmp_path, capsys):
    from clharness.reporting.scorecard import write
    full = [r for r in _three_configurations() if r.budget == "full" and r.code_digest == "cur0001"]
    quick = [r for r in _three_configurations() if r.budget == "quick"]
    a, b = write(tmp_path / "a.json", full, ["final_acc"]), write(tmp_path / "b.json", quick, ["final_acc"])
    assert main(["compare", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH sc/er: configuration differs, budget: full vs quick (A vs B)" in out
    assert main(["compare", str(a), str(a)]) == 0


def test_report_cli_leads_with_the_current_code_and_filters_by_method(tmp_path, capsys):
    """The front end computes the current code (engine.code_identity): a newer stale record is not the main row."""
    from clharness.engine.runner import _kind_file, code_digest
    from clharness.plugins import Harness
    current = code_digest(Harness().methods["er"], _kind_file("split"))
    records = []
    for seed, acc in enumerate((0.5, 0.6, 0.7)):
        records.append(rec("er", seed, suite="quickstart", scenario="ci-5x2", code=current, finished=100.0 + seed))
        records[-1].metrics = {"final_acc": acc}
    records.append(rec("er", 0, suite="quickstart", scenario="ci-5x2", code="0ld5tale", finished=500.0))
    records[-1].metrics = {"final_acc": 0.9}
    records.append(rec("ewc", 0, suite="quickstart", scenario="ci-5x2", code=current))
    records[-1].metrics = {"final_acc": 0.1}
    path = tmp_path / "r.sqlite"
    _fill(path, records)
    assert main(["report", str(path), "--columns", "final_acc", "--method", "er", "--all"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| quickstart")]
    assert len(rows) == 2 and "| ewc" not in "".join(rows)
    assert "| full " in rows[0] and " 3 " in rows[0] and "0.600" in rows[0]
    assert "code 0ld5ta (stale)" in rows[1] and " 1 " in rows[1] and "0.900" in rows[1]


def test_a_session_keeps_its_budget_on_each_record(tmp_path):
    from types import SimpleNamespace
    from clharness.engine.session import Session
    with ResultsStore(tmp_path / "r.sqlite") as store:
        for quick, key in ((True, "k-quick"), (False, "k-full")):
            session = Session.__new__(Session)   # keep() needs only these
            session.options, session.session_id, session._store = SimpleNamespace(quick=quick), "s1", store
            session._harness = SimpleNamespace(run_finished=lambda record: None)
            session.keep(RunRecord(suite="s", scenario="sc", method="er", seed=0, key=key))
        assert store.get("k-quick").budget == "quick" and store.get("k-full").budget == "full"
