import random

import pytest

from clharness.hparams import Choice, Float, HParamError, Int, resolve, sample, validate_space

SPACE = {
    "lr": Float(1e-4, 1.0, default=0.1, log=True),
    "epochs": Int(1, 100, default=10),
    "scheduler": Choice(["constant", "steplr", "cosine"]),
    "milestones": Int(2, 4, default=2, when={"scheduler": ["steplr"]}),
}


def test_defaults_overrides_and_conditional_parameters():
    assert resolve("m", SPACE, {}) == {"lr": 0.1, "epochs": 10, "scheduler": "constant"}
    assert resolve("m", SPACE, {"scheduler": "steplr"})["milestones"] == 2
    assert resolve("m", SPACE, {"lr": 1})["lr"] == 1.0


@pytest.mark.parametrize("overrides, message", [
    ({"lr": 2.0}, "'lr'=2.0 is outside [0.0001, 1.0]"),
    ({"epochs": 1.5}, "'epochs'=1.5 must be an integer in [1, 100]"),
    ({"scheduler": "exp"}, "'scheduler'='exp' is not one of ['constant', 'steplr', 'cosine']"),
    ({"momentum": 0.9}, "unknown hyperparameter(s) ['momentum']"),
])
def test_bad_values_name_the_parameter_and_range(overrides, message):
    with pytest.raises(HParamError) as err:
        resolve("m", SPACE, overrides)
    assert message in str(err.value)


def test_sampling_stays_in_the_space_and_respects_conditions():
    rng = random.Random(0)
    draws = [sample(SPACE, rng) for _ in range(300)]
    assert all(1e-4 <= d["lr"] <= 1 and 1 <= d["epochs"] <= 100 for d in draws)
    assert all(("milestones" in d) == (d["scheduler"] == "steplr") for d in draws)
    # log-uniform: about half the draws below the geometric middle 1e-2
    assert 0.4 < sum(d["lr"] < 1e-2 for d in draws) / len(draws) < 0.6


def test_empty_or_contradictory_spaces_are_rejected():
    with pytest.raises(HParamError, match="Choice needs at least one value"):
        Choice([])
    with pytest.raises(HParamError, match="range"):
        Float(1.0, 0.1)
    with pytest.raises(HParamError, match="conditional on 'scheduler', which the space does not declare"):
        validate_space("m", {"milestones": Int(2, 4, when={"scheduler": ["steplr"]})})
    with pytest.raises(HParamError, match="use clharness.Choice, Float or Int"):
        validate_space("m", {"lr": 0.1})


def test_settle_conditions_on_unsearched_parents_by_the_runs_values():
    from clharness.hparams import Choice, settle_conditions
    space = {"a": Choice([1, 2], when={"mode": ["x"]}), "b": Choice([3, 4], when={"mode": ["y"]}),
             "c": Choice([5, 6], when={"ghost": [1]}), "d": Choice([7, 8], when={"a": [1]})}
    settled = settle_conditions(space, {"mode": "x", "a": 2})
    assert list(settled) == ["a", "c", "d"]
    assert settled["a"].when == {} and list(settled["a"].values) == [1, 2]   # active under mode = x, now plain
    assert settled["c"].when == {"ghost": [1]}                          # not a run hyperparameter: check_space names it
    assert settled["d"].when == {"a": [1]}                              # a searched parent stays a condition
