"""docs/families.md (issue 37 item 1): the smallest complete family, a ``clharness.Family`` subclass, runs
as written; the engine reaches it only through the contract (its defaults stand in for every hook it
leaves out), and its option is checked before anything trains."""
import re
from pathlib import Path

import pytest
import torch

import clharness as clh
from doc_blocks import block
from clharness.engine.suites import SuiteError
from clharness.kinds import HOOKS, Family, ModuleFamily

DOC = Path(__file__).resolve().parent.parent / "docs" / "families.md"


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "pairs_family.py").write_text(block(DOC, "# pairs_family.py", "python"))
    (tmp_path / "pairs.toml").write_text(block(DOC, "# pairs.toml", "toml"))
    return tmp_path


def test_the_smallest_family_runs_as_written(project):
    records = clh.run("pairs.toml", plugins=["pairs_family.py"], device="cpu", results=project / "r.sqlite")
    assert [(r.method, r.status) for r in records] == [("finetune", "passed"), ("er", "passed")]
    assert all(len(r.acc_matrix) == 5 for r in records)            # 10 digits, two a task
    case = clh.load_case("pairs.toml", "fading", "er", plugins=["pairs_family.py"])
    assert [task.classes for task in case.scenario.tasks] == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)]
    # fade = 0.2: task t's test images are darkened by 0.2 * t, its train images are not
    first, last = case.scenario.tasks[0], case.scenario.tasks[4]
    assert last.test.images.max() <= round(255 * (1 - 0.2 * 4)) < first.test.images.max()
    assert last.train.images.max() == 255


def test_its_option_is_checked_before_training(project):
    (project / "bad.toml").write_text((project / "pairs.toml").read_text().replace("fade = 0.2", "fade = 0.7"))
    with pytest.raises(SuiteError, match=r"bad\.toml.*fade = 0\.7 must be in \[0, 0\.5\)"):
        clh.run("bad.toml", plugins=["pairs_family.py"], device="cpu", results=project / "r.sqlite")
    (project / "typo.toml").write_text((project / "pairs.toml").read_text().replace("fade = 0.2", "fdae = 0.2"))
    with pytest.raises(SuiteError, match="fdae"):
        clh.run("typo.toml", plugins=["pairs_family.py"], device="cpu", results=project / "r.sqlite")


def test_a_module_family_gets_every_hook_it_leaves_out_from_the_contract():
    import types
    module = types.ModuleType("tiny_kind")
    module.build = lambda *a: "built"
    module.OPTIONS = {"x": (int, 1)}
    fam = ModuleFamily(module)
    assert fam.build() == "built" and fam.OPTIONS == {"x": (int, 1)}
    assert fam.collect is None and fam.PSEUDO_METHODS == () and fam.report_sections([], "md", None) == []
    assert fam.split_scenario("a:eval") is None and fam.preset_seeds(["x:y"], None) is None
    assert {"build", "collect", "OPTIONS", "check", "terminal_summary", "html_sections"} <= set(HOOKS)
    with pytest.raises(TypeError, match="a family defines build"):
        ModuleFamily(types.ModuleType("no_build"))


def test_the_engine_names_no_family_hook_by_string():
    """No hasattr/getattr probing of a family's hooks outside the contract (clharness/kinds.py)."""
    pkg = Path(clh.__file__).parent
    probes = []
    for path in [*pkg.glob("engine/*.py"), *pkg.glob("*.py"), *pkg.glob("reporting/*.py")]:
        if path.name == "kinds.py":
            continue
        for hook in HOOKS:
            if re.search(rf"(hasattr|getattr)\([^)]*[\"']{hook}[\"']", path.read_text()):
                probes.append(f"{path.name}: {hook}")
    assert probes == []
    assert issubclass(ModuleFamily, Family)
