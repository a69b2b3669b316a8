"""M2I / I2M (issue 30 items 10 and 11): the report shows the paper's ACC (eq. 1) and BWT (eq. 2) with
the authors' code's BWT beside it, named; under protocol = "authors" inputs are normalised with the
public code's fixed constants (lifelonglab/M2I_I2M_benchmark scenarios/datasets/*.py), not per-task
statistics. Each pinned against the formula written out by hand on a tiny case."""
import math

import numpy as np
import pytest
import torch

import clharness.engine.runner  # noqa: F401
from clharness.benchmarks.m2i import effect
from clharness.benchmarks.m2i import report_html as m2i_html
from clharness.data import BUILTIN_SOURCES
from clharness.engine.scenario import build_scenario
from clharness.engine.suites import load_suite, with_overrides
from clharness.reporting.drawing import DRAWING
from clharness.results import RunRecord

from curriculum_fakedata import write_six

CPU = torch.device("cpu")
ORDER = ["mnist", "omniglot", "fashion-mnist", "svhn", "cifar10", "tinyimagenet"]

# two seeds' 3 x 3 accuracy matrices (R[i][j]: after task i, on task j)
R = {0: [[0.9, 0.1, 0.2], [0.6, 0.8, 0.1], [0.3, 0.5, 0.7]],
     1: [[0.8, 0.2, 0.1], [0.7, 0.9, 0.3], [0.5, 0.4, 0.6]]}


def by_hand(R):
    """Eq. 1, eq. 2, the authors' bwt_from_eval_results and eq. 3, loop by loop."""
    n = len(R)
    acc = [R[i][j] for i in range(n) for j in range(i + 1)]
    bwt = [R[i][j] - R[j][j] for i in range(1, n) for j in range(i)]
    authors = [R[t][e] - R[t - 1][e] for t in range(n) for e in range(t)]
    fwt = [R[i][j] for i in range(n) for j in range(i + 1, n)]
    return {"acc": sum(acc) / len(acc), "bwt": sum(bwt) / len(bwt), "bwt_authors": sum(authors) / len(authors),
            "fwt": sum(fwt) / len(fwt)}


def record(seed, setting="class-incremental", order=ORDER, scenario="ci", R_=None):
    from clharness import metrics as M
    matrix = R_ or R[seed]
    return RunRecord(suite="m2i", scenario=scenario, method="er", seed=seed, setting=setting, status="passed",
                     acc_matrix=matrix, class_order=[f"{t}/{k}" for t in order for k in range(10)],
                     dataset="curriculum(mnist=...; balance=True)", metrics=M.all_metrics(matrix))


def test_hand_values_differ_between_the_two_bwts():
    h = by_hand(R[0])
    assert h["acc"] == pytest.approx((0.9 + 0.6 + 0.8 + 0.3 + 0.5 + 0.7) / 6)
    assert h["bwt"] == pytest.approx(-0.4) and h["bwt_authors"] == pytest.approx(-0.3)


def test_report_shows_the_papers_acc_and_bwt_and_the_authors_bwt_named():
    recs = [record(0), record(1), record(0, "task-incremental", scenario="ti"),
            record(1, "task-incremental", scenario="ti")]
    sections = m2i_html.text_sections(recs, "github")
    title, table = sections[0]
    assert "paper" in title
    head = table.splitlines()[0]
    assert "ACC" in head and "BWT (authors' code)" in head and "FWT" in head
    rows = {(r["scenario"], r["method"]): r for r in m2i_html.paper_rows(recs)}
    for metric in ("acc", "bwt", "bwt_authors"):
        want = np.mean([by_hand(R[s])[metric] for s in (0, 1)])
        assert rows[("ci", "er")][metric][0] == pytest.approx(want)
        assert f"{want:.3f}" in table
    # FWT (eq. 3) only where the paper reports it: task-incremental
    assert math.isnan(rows[("ci", "er")]["fwt"][0])
    assert rows[("ti", "er")]["fwt"][0] == pytest.approx(np.mean([by_hand(R[s])["fwt"] for s in (0, 1)]))
    # the HTML page gets the same table
    html = dict(m2i_html.html_sections(recs, DRAWING))
    assert "BWT (authors&#x27; code)" in html[m2i_html.PAPER_TITLE] or "BWT (authors' code)" in html[m2i_html.PAPER_TITLE]
    # records of other kinds get no such section
    other = RunRecord(suite="q", scenario="x", method="er", seed=0, status="passed", dataset="digits",
                      class_order=["0", "1"], metrics={"acc": 0.5})
    assert m2i_html.paper_rows([other]) == []


def test_curriculum_effect_has_the_authors_bwt_beside_eq2():
    i2m = list(reversed(ORDER))
    other = {0: [[0.5, 0.1, 0.1], [0.05, 0.6, 0.1], [0.1, 0.3, 0.9]],
             1: [[0.4, 0.1, 0.1], [0.3, 0.7, 0.2], [0.2, 0.2, 0.8]]}
    recs = [record(s) for s in (0, 1)] + [record(s, order=i2m, R_=other[s]) for s in (0, 1)]
    rows = {r["metric"]: r for r in effect.curriculum_effect(recs)}
    assert list(rows) == ["acc", "bwt", "bwt_authors", "fwt"]
    for metric in ("bwt", "bwt_authors"):
        want = np.mean([by_hand(R[s])[metric] - by_hand(other[s])[metric] for s in (0, 1)])
        assert rows[metric]["effect"] == pytest.approx(want)
    assert rows["bwt"]["effect"] != pytest.approx(rows["bwt_authors"]["effect"])
    assert "BWT (authors' code)" == m2i_html.METRIC_NAMES["bwt_authors"]


# --- item 11: the authors' fixed normalisation constants ---------------------------------------

# lifelonglab/M2I_I2M_benchmark scenarios/datasets/*.py, the *_with_resize transforms, by hand
AUTHORS = {"mnist": (0.1307, 0.3081), "omniglot": (0.9221, 0.2681), "fashion-mnist": (0.1307, 0.3081),
           "svhn": (0.0, 1.0), "cifar10": (0.9221, 0.2681), "tinyimagenet": (0.0, 1.0)}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return write_six(tmp_path_factory.mktemp("six"))


def _spec(protocol):
    spec = next(s for s in load_suite("suites/m2i.toml").scenarios if s.setting == "class-incremental")
    return with_overrides(spec, options={**spec.options, "protocol": protocol})


def _value_of(data, pixel):
    """What the scenario feeds the model for a constant image of ``pixel`` (uint8) of the task's shape."""
    shape = data.images.shape[1:]
    x = data.prepare(torch.full((1, *shape), pixel, dtype=torch.uint8))
    return x.flatten().unique()


def test_authors_protocol_normalises_with_the_public_codes_constants(root):
    sc = build_scenario(_spec("authors"), BUILTIN_SOURCES, 0, CPU, root)
    assert sc.extra["task_names"] == ORDER
    for name, task in zip(ORDER, sc.tasks):
        mean, std = AUTHORS[name]
        for data in (task.train, task.test):
            got = _value_of(data, 200)                           # one constant over the three channels
            assert got.tolist() == pytest.approx([(200 / 255 - mean) / std] * got.numel(), rel=1e-4, abs=1e-4), name


def test_textbook_protocol_keeps_each_tasks_own_statistics(root):
    sc = build_scenario(_spec("textbook"), BUILTIN_SOURCES, 0, CPU, root)
    mnist = sc.tasks[0]
    # the train split's own mean and std of the balanced subset (as the paper's text reads)
    raw = mnist.train.images.float() / 255
    mean, std = float(raw.mean()), float(raw.std())
    assert float(_value_of(mnist.train, 200)[0]) == pytest.approx((200 / 255 - mean) / std, rel=1e-3)
    assert float(_value_of(mnist.train, 200)[0]) != pytest.approx((200 / 255 - 0.1307) / 0.3081, rel=1e-3)


def test_an_explicit_normalize_wins_over_the_authors_constants(root):
    spec = _spec("authors")
    spec = with_overrides(spec, normalize="none")
    sc = build_scenario(spec, BUILTIN_SOURCES, 0, CPU, root)
    assert float(_value_of(sc.tasks[0].train, 200)[0]) == pytest.approx(200 / 255, rel=1e-5)


def test_an_md_scorecard_gets_the_papers_acc_bwt_and_the_authors_bwt_appended(tmp_path):
    from clharness.benchmarks.m2i.kind import write_scorecard
    path = tmp_path / "card.md"
    path.write_text("scorecard\n")
    write_scorecard(path, [record(0), record(1)], None)
    text = path.read_text()
    assert text.startswith("scorecard\n") and "## " in text
    assert "BWT (authors' code)" in text and f"{np.mean([by_hand(R[s])['acc'] for s in (0, 1)]):.3f}" in text
    json_path = tmp_path / "card.json"
    json_path.write_text("{}")
    write_scorecard(json_path, [record(0)], None)
    assert json_path.read_text() == "{}"   # .json and .csv already hold every run's metrics


def test_m2i_interval_captions_say_student_t_and_n():
    for text in (m2i_html.PAPER_TITLE, m2i_html.TEXT_TITLE):
        assert "Student-t" in text and "n seeds" in text.replace("n paired seeds", "n seeds")
