"""docs/methods.md is generated from the registry (scripts/gen_methods_doc.py) and kept fresh; every
reference method declares its paper, its reference implementation and its deviations (issue 28)."""
import importlib.util
from pathlib import Path

import clharness as clh

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("gen_methods_doc", REPO / "scripts" / "gen_methods_doc.py")
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)


class Complete(clh.Method):
    name = "complete"
    settings = frozenset({clh.Setting.TASK_IL})
    hparams = {"lr": clh.Float(1e-4, 1.0, default=0.05, log=True), "mode": clh.Choice(["a", "b"])}
    version = "3"
    paper = "A. Author, A | title, Venue 2020"
    reference = "owner/repo: src/method.py"
    deviations = ("option x follows the code", "eq. 2 as printed")


class NoReference(clh.Method):
    name = "noref"
    paper = "B. Author, Title, Venue 2021"
    reference = "  "
    deviations = ()


class Inherits(Complete):
    """Declares nothing itself: the parent's paper is not its paper."""
    name = "inherits"


class BadDeviations(clh.Method):
    name = "baddev"
    paper = "C. Author, Title, Venue 2022"
    reference = "owner/repo: x.py"
    deviations = "a string, not a tuple"


def test_missing_attributes_names_each_method_and_what_it_lacks():
    assert gen.missing_attributes([Complete, NoReference, Inherits, BadDeviations]) == [
        "noref: reference", "inherits: paper, reference, deviations", "baddev: deviations"]


def test_a_row_carries_paper_reference_settings_defaults_and_deviations():
    # written out by hand: name and version, pipes escaped, repo and file split, active defaults in order
    assert gen.row(Complete) == (
        "| `complete` (v3) | A. Author, A \\| title, Venue 2020 | owner/repo: `src/method.py` | task-incremental | "
        "lr=0.05, mode=a | 1. option x follows the code<br>2. eq. 2 as printed |")


def test_the_document_lists_every_method_sorted_by_name():
    text = gen.render([NoReference, Complete])
    body = text[len(gen.HEADER):].splitlines()
    assert [line.split("|")[1].strip() for line in body] == ["`complete` (v3)", "`noref` (v1)"]
    assert body[1].endswith("| none |")


def test_every_reference_method_declares_paper_reference_and_deviations():
    missing = gen.missing_attributes(gen.reference_methods())
    assert not missing, "methods lacking the doc attributes (see scripts/gen_methods_doc.py):\n" + "\n".join(missing)


def test_committed_methods_doc_equals_a_fresh_generation():
    fresh = gen.render(gen.reference_methods())
    committed = gen.DOC.read_text() if gen.DOC.exists() else ""
    assert committed == fresh, "docs/methods.md is stale: run python scripts/gen_methods_doc.py"
