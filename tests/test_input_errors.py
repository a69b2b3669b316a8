"""Clear errors for two careless inputs: ``methods = []`` in a suite, and a run out of memory."""
import types

import pytest
import torch

import clharness as clh
from clharness.engine.runner import OOM_HINT, Case, run_case
from clharness.engine.suites import ScenarioSpec, SuiteError, load_suite

SUITE = """
[suite]
name = "s"
{methods}

[[scenario]]
name = "ci"
dataset = "digits"
tasks = 5
"""


def test_an_explicit_empty_methods_list_is_an_error_naming_both_fixes(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(SUITE.format(methods="methods = []"))
    with pytest.raises(SuiteError) as err:
        load_suite(path)
    assert str(err.value) == (f"{path}: [suite] methods = [] names no method; remove the methods key to run every "
                              "applicable method, or name the methods to run, e.g. methods = [\"er\", \"ewc\"]")
    path.write_text(SUITE.format(methods=""))   # no key: every applicable method, as documented
    assert load_suite(path).methods == ()
    path.write_text(SUITE.format(methods='methods = ["er"]'))
    assert load_suite(path).methods == ("er",)


class OutOfMemory(clh.Method):
    """Runs out of memory while learning its second task."""
    name = "oom"
    error = MemoryError

    def __init__(self, context, **hp):
        super().__init__(context, **hp)
        self.model = context.make_classifier()
        self.learnt = 0

    def learn(self, experience):
        if self.learnt == 1:
            raise self.error("could not allocate 2.00 GiB")
        self.learnt += 1


class CudaOutOfMemory(OutOfMemory):
    name = "cuda-oom"
    error = torch.cuda.OutOfMemoryError


class Fails(OutOfMemory):
    name = "fails"
    error = RuntimeError


@clh.hookimpl
def _add(registry):
    for cls in (OutOfMemory, CudaOutOfMemory, Fails):
        registry.add(cls)


@pytest.fixture(scope="module")
def harness():
    h = clh.Harness()
    h.register(types.SimpleNamespace(clharness_add_methods=_add), source="test_input_errors")
    return h


@pytest.mark.parametrize("method,error", [("oom", "MemoryError"), ("cuda-oom", "OutOfMemoryError")])
def test_out_of_memory_failure_adds_a_one_line_hint(harness, method, error):
    spec = ScenarioSpec(name="ci", dataset="digits", tasks=5, backbone_options={"hidden": 8, "layers": 1})
    record = run_case(Case("s", spec, method, 0), harness, torch.device("cpu"))
    assert record.status == "failed" and record.failed_task == 1
    first, hint = record.message.splitlines()[:2]
    assert first == f"method {method!r} failed at task 1: {error}: could not allocate 2.00 GiB"
    assert hint == OOM_HINT == ("Hint: out of memory. Lower batch_size (and eval_batch_size) in the suite, run with "
                                "--clh-quick, or run fewer pytest-xdist workers per GPU (-n)")

    other = run_case(Case("s", spec, "fails", 0), harness, torch.device("cpu"))
    assert other.status == "failed" and "Hint: out of memory" not in other.message
