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


MLP_SUITE = """[suite]
name = "opts"
seeds = 1
methods = ["er"]

[defaults]
dataset = "digits"
backbone = "mlp"
backbone_options = { hidden = 32, checkpoint = "w.pt" }
epochs = 1
tasks = 5

[[scenario]]
name = "ci"
"""


def _collect(tmp_path, text):
    """Collect the suite ``text`` as a session would (clharness.run: validation before anything runs)."""
    path = tmp_path / "opts.toml"
    path.write_text(text)
    with pytest.raises(SuiteError) as err:
        clharness.run(str(path), results=str(tmp_path / "r.sqlite"), device="cpu")
    return path, str(err.value)


def test_a_backbone_option_the_factory_does_not_take_fails_at_collection_with_file_and_line(tmp_path):
    # MLP(input_shape, hidden, layers) has no checkpoint: before this check, construction raised TypeError
    path, message = _collect(tmp_path, MLP_SUITE)
    assert (f"{path}:9: backbone_options: backbone 'mlp' has no option 'checkpoint'; it accepts: hidden, layers"
            in message), message
    assert "nothing was run" in message


def test_a_misspelt_backbone_option_says_the_closest_accepted_one(tmp_path):
    path, message = _collect(tmp_path, MLP_SUITE.replace("hidden = 32, checkpoint = \"w.pt\"", "hiden = 32"))
    assert f"{path}:9: backbone_options: backbone 'mlp' has no option 'hiden' (did you mean 'hidden'?)" in message


def test_timm_backbones_pass_their_options_on_and_are_not_refused():
    from clharness.engine.validate import backbone_options
    from clharness.toolkit.backbones import BUILTIN_BACKBONES
    assert backbone_options("timm", BUILTIN_BACKBONES["timm"], {"depth": 2, "checkpoint": "w.pt"}) == ([], [])
    assert backbone_options("cnn", BUILTIN_BACKBONES["cnn"], {"hiden": 1})[0] == ["hiden"]


def test_an_out_of_range_hyperparameter_names_its_file_and_line(tmp_path):
    text = MLP_SUITE.replace(', checkpoint = "w.pt"', "") + "\n[hparams.er]\nmomentum = 0.9\nlr = 7.0\n"
    path, message = _collect(tmp_path, text)
    # er's lr is declared Float(1e-4, 1.0): 7.0 (line 18) is out of it; momentum (line 17) is fine
    assert f"{path}:18: [hparams.er]: hyperparameter 'lr'=7.0 is outside [0.0001, 1.0]" in message, message
    assert "momentum" not in message


def test_a_scenario_hyperparameter_out_of_range_is_found_on_its_line_however_it_is_written(tmp_path):
    text = MLP_SUITE.replace(', checkpoint = "w.pt"', "").replace(
        'name = "ci"', 'name = "ci"\nhparams = { er = { lr = 2e1 } }')   # 2e1 is read as 20.0
    path, message = _collect(tmp_path, text)
    assert f"{path}:15: scenario 'ci' hparams.er: hyperparameter 'lr'=20.0 is outside [0.0001, 1.0]" in message, message


def test_load_case_validates_as_a_run_does(tmp_path):
    path = tmp_path / "opts.toml"
    path.write_text(MLP_SUITE)
    with pytest.raises(SuiteError, match="backbone 'mlp' has no option 'checkpoint'"):
        clharness.load_case(str(path), "ci", "er")
