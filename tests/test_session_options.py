"""Session options declared once (issue 37 item 4) and what a method author reaches for (issue 42 items
1, 2, 4): hyperparameters from the command line and from Python, the suite's methods plus one's own,
trained models saved and loaded back."""
import argparse
import inspect
import json
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
import torch

import clharness as clh
from clharness.engine import options as table
from clharness.engine.session import Options
from clharness.engine.suites import SuiteError

REPO = Path(__file__).resolve().parent.parent
QUICK = dict(quick=True, device="cpu", seeds=1)


# ------------------------------------------------------------------------------ one table, three front ends
def test_pytest_options_cli_flags_and_api_arguments_are_the_tables_rows():
    from clharness.cli import main  # noqa: F401  (the parser is built inside main: read it from its help)
    parser = argparse.ArgumentParser()
    group = parser.add_argument_group("clh")
    group.addoption = group.add_argument   # pytest's OptionGroup.addoption takes argparse's arguments
    table.add_pytest_options(group)
    pytest_flags = {a.option_strings[0] for a in parser._actions if a.option_strings[0].startswith("--clh-")}
    assert pytest_flags == {f"--clh-{o.name}" for o in table.OPTIONS if table.PYTEST in o.where}

    run = argparse.ArgumentParser()
    table.add_cli_flags(run)
    cli_flags = {a.option_strings[0] for a in run._actions if a.option_strings and a.option_strings[0] != "-h"}
    assert cli_flags == {f"--{o.name}" for o in table.OPTIONS if table.CLI in o.where}

    params = inspect.signature(clh.run).parameters
    assert set(params) == {o.argument for o in table.OPTIONS if table.API in o.where}
    for name, field in {f.name: f for f in fields(Options)}.items():   # every default declared once
        option = next((o for o in table.OPTIONS if o.argument == name), None)
        if option is not None and name not in ("ensemble", "max_drops", "hparams"):
            assert getattr(Options(), name) == (tuple(option.default) if isinstance(option.default, list) else option.default), name


def test_the_installed_pytest_plugin_offers_every_table_row(pytester):
    result = pytester.runpytest("--help")
    text = result.stdout.str()
    missing = [o.name for o in table.OPTIONS if table.PYTEST in o.where and f"--clh-{o.name}" not in text]
    assert missing == []


def test_clharness_run_flags_become_the_same_pytest_options():
    run = argparse.ArgumentParser()
    table.add_cli_flags(run)
    args = run.parse_args(["--method", "er", "--hparam", "er.lr=0.01,0.1", "--add-method", "si", "--seeds", "2",
                           "--quick", "--ensemble", "hparams", "-p", "mine.py", "--device", "auto"])
    assert table.pytest_argv(args) == ["--clh-method", "er", "--clh-add-method", "si", "--clh-hparam", "er.lr=0.01,0.1",
                                       "--clh-seeds", "2", "--clh-quick", "--clh-ensemble=hparams",
                                       "--clh-plugin", "mine.py"]


def test_an_unknown_api_argument_names_the_closest_option(tmp_path):
    with pytest.raises(TypeError, match=r"unknown argument 'hparam' \(did you mean 'hparams'\?\)"):
        clh.run("quickstart", hparam={"er": {"lr": 0.1}}, results=tmp_path / "r.sqlite")


# ------------------------------------------------------------------------------ hyperparameters from outside
def test_hparam_values_are_read_as_toml_literals():
    assert table.parse_hparams(["er.lr=0.01,0.1", "er.buffer=reservoir", "ewc.lambda_=3", "lwf.flag=true"]) == {
        "er": {"lr": [0.01, 0.1], "buffer": ["reservoir"]}, "ewc": {"lambda_": [3]}, "lwf": {"flag": [True]}}
    with pytest.raises(ValueError, match="METHOD.NAME=VALUE"):
        table.parse_hparams(["lr=0.1"])


def test_an_hparam_override_makes_its_own_record_and_a_list_one_case_per_value(tmp_path):
    store = tmp_path / "r.sqlite"
    default, = clh.run("quickstart", methods="finetune", results=store, **QUICK)
    records = clh.run("quickstart", methods="finetune", hparams={"finetune": {"lr": [0.001, 0.2]}}, results=store,
                      **QUICK)
    assert [r.hparams["lr"] for r in records] == [0.001, 0.2]
    assert default.hparams["lr"] == 0.1 and len({default.key, *(r.key for r in records)}) == 3   # in the key
    assert records[0].metrics["final_acc"] != records[1].metrics["final_acc"]
    names = [u.name for u in records.units if u.role == "case"]
    assert names == ["ci-5x2[finetune-lr=0.001-seed0]", "ci-5x2[finetune-lr=0.2-seed0]"]


@pytest.mark.parametrize("hparams, message", [
    ({"finetune": {"lrr": 0.1}}, r"finetune\.lrr: finetune has no hyperparameter 'lrr' \(did you mean 'lr'\?\)"),
    ({"finetune": {"lr": 7}}, r"--clh-hparam finetune\.lr=7: .*outside \[0\.0001, 1\.0\]"),
    ({"si": {"lr": 0.1}}, r"method 'si' does not run in suite 'quickstart'.*--clh-add-method si"),
    ({"finetun": {"lr": 0.1}}, r"unknown method 'finetun' \(did you mean 'finetune'\?\)"),
])
def test_a_bad_hparam_override_is_refused_before_anything_trains(tmp_path, hparams, message):
    with pytest.raises(SuiteError, match=message):
        clh.run("quickstart", hparams=hparams, results=tmp_path / "r.sqlite", **QUICK)
    assert not (tmp_path / "r.sqlite").exists() or len(clh.results.open(tmp_path / "r.sqlite")) == 0


# ------------------------------------------------------------------------------ mine against the baselines
def test_add_method_runs_the_suites_methods_plus_mine(tmp_path):
    records = clh.run("quickstart", add_methods=["si"], results=tmp_path / "r.sqlite", **QUICK)
    assert [r.method for r in records] == ["finetune", "joint", "er", "ewc", "lwf", "ncm", "si"]
    picked = clh.run("quickstart", methods=["er"], add_methods=["si", "er"], results=tmp_path / "r.sqlite", **QUICK)
    assert [r.method for r in picked] == ["er", "si"]   # --clh-method keeps selecting
    with pytest.raises(SuiteError, match=r"--clh-add-method sii: unknown method \(did you mean 'si'\?\)"):
        clh.run("quickstart", add_methods=["sii"], results=tmp_path / "r.sqlite", **QUICK)


def _pytest(cwd, *args):
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--clh-suite", "quickstart",
                           "--clh-quick", "--clh-device", "cpu", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def test_the_command_line_sets_a_hparam_and_adds_a_method(tmp_path):
    """The issue's two commands: `--clh-hparam finetune.lr=0.001` makes its own record;
    `--clh-add-method si` runs the quickstart's six methods and si."""
    done = _pytest(tmp_path, "--clh-seeds", "1", "--clh-method", "finetune", "--clh-hparam", "finetune.lr=0.001",
                   "--clh-scorecard", "a.json")
    assert done.returncode == 0, done.stdout[-3000:]
    (record,) = json.loads((tmp_path / "a.json").read_text())["records"]
    assert record["hparams"]["lr"] == 0.001 and "[finetune-lr=0.001-seed0]" in done.stdout
    done = _pytest(tmp_path, "--clh-seeds", "1", "--clh-add-method", "si", "--clh-scorecard", "b.json")
    methods = [r["method"] for r in json.loads((tmp_path / "b.json").read_text())["records"]]
    assert methods == ["finetune", "joint", "er", "ewc", "lwf", "ncm", "si"], done.stdout[-3000:]


# ------------------------------------------------------------------------------ trained models
def test_saved_models_load_back_ready_to_evaluate_and_reused_cases_say_when_none_was_saved(tmp_path):
    from clharness.engine.runner import evaluate
    models, store = tmp_path / "models", tmp_path / "r.sqlite"
    record, = clh.run("quickstart", methods="er", save_models=models, results=store, **QUICK)
    assert (models / f"{record.key}.pt").exists()
    case = clh.load_case("quickstart", "ci-5x2", "er", seed=0, quick=True, trained=True, models=models)
    assert case.key == record.key and case.method.context is case.context
    assert len(case.method.buffer) > 0   # the memory came back too, not only the weights
    last = len(case.scenario.tasks) - 1
    with torch.no_grad():
        row = evaluate(case.method, case.scenario, case.context.device, last)
    assert list(row) == pytest.approx(record.acc_matrix[-1], abs=1e-6)   # the trained method, not a fresh one
    fresh = clh.load_case("quickstart", "ci-5x2", "er", seed=0, quick=True)
    assert not torch.equal(next(fresh.model.parameters()), next(case.model.parameters()))
    with pytest.warns(UserWarning, match=r"no trained model saved in .*other.*rerun it with --clh-fresh"):
        clh.run("quickstart", methods="er", save_models=tmp_path / "other", results=store, **QUICK)
    with pytest.raises(FileNotFoundError, match="--clh-save-models"):
        clh.load_case("quickstart", "ci-5x2", "er", seed=0, quick=True, trained=True, models=tmp_path / "other")
