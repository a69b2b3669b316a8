"""Validation before training (issue 38 item 6): a misspelt suite key is named with its file, line
and the closest allowed key; a misspelt hyperparameter with the closest declared one."""
import pytest

import clharness
from clharness.engine.suites import SuiteError, load_suite
from clharness.hparams import Float, HParamError, Int, resolve

SUITE = """[suite]
name = "typo"
seeds = 1

[defaults]
dataset = "digits"
backbone = "mlp"
epocs = 1
tasks = 5

[[scenario]]
name = "ci"
"""


def test_unknown_suite_key_names_file_line_and_closest_key(tmp_path):
    path = tmp_path / "typo.toml"
    path.write_text(SUITE)
    with pytest.raises(SuiteError) as err:
        load_suite(path)
    # 'epocs' is written on line 8 of the file; 'epochs' is the allowed key it resembles.
    assert str(err.value).startswith(f"{path}:8: [defaults]: unknown key(s) 'epocs' (did you mean 'epochs'?); allowed:")


def test_unknown_key_inside_an_inline_table_is_found_on_its_line(tmp_path):
    path = tmp_path / "typo.toml"
    path.write_text(SUITE.replace("epocs = 1\n", "epochs = 1\n").replace('name = "ci"', 'name = "ci"\nfirst_tsk = 2'))
    with pytest.raises(SuiteError) as err:
        load_suite(path)
    assert f"{path}:13:" in str(err.value) and "(did you mean 'first_task'?)" in str(err.value)


def test_unknown_hyperparameter_says_the_closest_declared_one():
    space = {"alpha": Float(0.0, 1.0, default=0.5), "epochs": Int(1, 10, default=1)}
    with pytest.raises(HParamError) as err:
        resolve("method 'm'", space, {"alpah": 0.3, "zzz": 1})
    message = str(err.value)
    assert "'alpah' (did you mean 'alpha'?)" in message
    assert "'zzz' (did you mean" not in message and "declared: ['alpha', 'epochs']" in message


def test_load_case_hparams_typo_says_the_closest_declared_one():
    with pytest.raises(HParamError, match=r"'bufer' \(did you mean 'buffer'\?\)"):
        clharness.load_case("quickstart", "ci-5x2", "er", hparams={"bufer": "reservoir"})
