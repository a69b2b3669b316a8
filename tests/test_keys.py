"""One key module (issue 37 item 2) and one rule for keys, tested per knob (issue 38 items 2 and 3, issue 39
item 7): every record key is built by engine.keys from its declared fields; whatever can change a record's
numbers is in its key (a named weights file by content, the device type, the AMP switch, the torch
version, the CPU threads) or is shown bit-identical here (deterministic algorithms on CPU)."""
import hashlib
import os
from dataclasses import replace
from pathlib import Path

import pytest
import timm
import torch

import clharness as clh
from clharness.engine import keys, runner
from clharness.engine.suites import load_suite
from clharness.toolkit import backbones
from clharness.toolkit.backbones import WeightsMismatch, timm_backbone

HERE = Path(__file__).parent
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def harness():
    return clh.Harness(plugins=(str(HERE / "plugin_methods.py"),))


def quick_case(method="tiny", **spec_changes):
    spec = load_suite(HERE.parent / "suites" / "quickstart.toml", quick=True).scenarios[0]
    return runner.Case("quickstart", replace(spec, **spec_changes), method, 0, {"lr": 0.1})


def test_every_key_field_is_declared_and_an_undeclared_one_is_refused():
    with pytest.raises(ValueError, match="field.* colour .*not declared in engine.keys.FIELDS"):
        keys.record_key({"suite": "s", "colour": "red"})
    # the base key is the same definition without the code it ran: one rule for cases and searches
    d = {"suite": "s", "seed": 0, "code": "abc"}
    assert keys.base_key_of(d) == keys.record_key({"suite": "s", "seed": 0}) != keys.record_key(d)
    # a CLDyB replay names its search by the search's full key; its base key by the search's base key
    replay = {"suite": "s", "scenario": {"options": {"search_key": "FULL", "search_key_base": "BASE"}}, "code": "c"}
    assert keys.record_key(replay) == keys.record_key({**replay, "scenario": {"options": {"search_key": "FULL"}}})
    assert keys.base_key_of(replay) == keys.record_key({"suite": "s", "scenario": {"options": {"search_key": "BASE"}}})


def test_subclassed_cases_leave_out_and_add_fields_through_the_one_builder(harness):
    from clharness.engine.shared_case import SharedCase
    from clharness.engine.hparam_selection import SelectionCase
    cls = harness.methods["tiny"]
    case = quick_case()
    full = case.definition(cls, runner.versions())
    tune = SharedCase(case.suite, case.scenario, case.method, case.seed, case.hparams).definition(cls, runner.versions())
    sel = SelectionCase(case.suite, case.scenario, case.method, case.seed, case.hparams, first_tasks=2) \
        .definition(cls, runner.versions())
    assert tune == {k: v for k, v in full.items() if k != "suite"}
    assert sel == {**tune, "selection": {"first_tasks": 2, "scored_on": "validation"}}
    assert set(full) <= set(keys.FIELDS)


# ------------------------------------------------------------------ knobs: in the key, or bit-identical
def test_device_type_cuda_enters_the_key_and_cpu_keys_stay_as_they_were(harness):
    cls, case = harness.methods["tiny"], quick_case()
    runner.set_device("cpu")
    cpu_def = case.definition(cls, runner.versions())
    assert "device_type" not in cpu_def   # CPU: the keys of existing records do not move
    cpu = runner.case_key(case, cls), runner.base_key(case, cls)
    try:
        runner.set_device("cuda:1")   # a definition built for a CUDA device (no GPU needed to build it)
        assert case.definition(cls, runner.versions())["device_type"] == "cuda"
        cuda = runner.case_key(case, cls), runner.base_key(case, cls)
    finally:
        runner.set_device("cpu")
    assert cuda[0] != cpu[0] and cuda[1] != cpu[1]   # a CUDA record never stands for a CPU one, even stale


def test_amp_torch_version_and_cpu_threads_enter_the_key(harness, monkeypatch):
    cls, case = harness.methods["tiny"], quick_case()
    runner.set_device("cpu")
    one = runner.case_key(case, cls), runner.base_key(case, cls)
    assert runner.case_key(quick_case(amp=not case.scenario.amp), cls) != one[0]   # AMP (float16 on CUDA)
    runner.set_cpu_threads(2)
    try:
        assert runner.case_key(case, cls) != one[0] and runner.base_key(case, cls) != one[1]
    finally:
        runner.set_cpu_threads(1)
    other = {**runner.versions(), "torch": "0.0.1"}
    assert keys.record_key(case.definition(cls, other)) != one[0]
    assert keys.base_key_of(case.definition(cls, other)) != one[1]
    assert (runner.case_key(case, cls), runner.base_key(case, cls)) == one


def test_deterministic_algorithms_change_no_cpu_number(harness):
    """torch.use_deterministic_algorithms is not in the key: on CPU a run is bit-identical with it on and
    off (on CUDA the device type keys the run apart)."""
    case = quick_case("er")
    plain = runner.run_case(case, harness, CPU)
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        strict = runner.run_case(case, harness, CPU)
    finally:
        torch.use_deterministic_algorithms(was)
    assert plain.status == strict.status == "passed", (plain.message, strict.message)
    assert plain.acc_matrix == strict.acc_matrix and plain.key == strict.key


# ------------------------------------------------------------------ weights: by content
SUITE = """
[suite]
name = "w"
[[scenario]]
name = "ci"
dataset = "digits"
tasks = 2
epochs = 1
max_train_per_class = 10
max_test_per_class = 5
backbone = "timm"
backbone_options = {{ model = "test_resnet", checkpoint = "{path}" }}
"""


def test_replacing_an_untagged_checkpoint_at_the_same_path_retrains_and_the_record_names_its_content(tmp_path):
    weights = tmp_path / "w.pt"
    (tmp_path / "w.toml").write_text(SUITE.format(path=weights.as_posix()))
    run = lambda: clh.run(tmp_path / "w.toml", methods="tiny", seeds=1, device="cpu",  # noqa: E731
                          results=tmp_path / "r.sqlite", plugins=str(HERE / "plugin_methods.py"))
    torch.manual_seed(0)
    torch.save(timm.create_model("test_resnet", num_classes=0).state_dict(), weights)
    first_sha = hashlib.sha256(weights.read_bytes()).hexdigest()
    first = run()
    (a,) = first
    assert a.status == "passed", a.message
    assert a.weights == f"untagged sha256:{first_sha[:16]}"   # no tag claimed for a file that carries none
    assert run().units[0].reused
    torch.manual_seed(1)
    torch.save(timm.create_model("test_resnet", num_classes=0).state_dict(), weights)   # other weights, same path
    second = run()
    (b,) = second
    assert not second.units[0].reused and b.status == "passed"
    assert b.weights == f"untagged sha256:{hashlib.sha256(weights.read_bytes()).hexdigest()[:16]}" != a.weights
    assert b.key != a.key and b.base_key != a.base_key   # new data, not new code: --clh-reuse-stale keeps it apart


def test_the_weights_hash_is_cached_by_path_size_and_mtime(tmp_path, monkeypatch):
    path = tmp_path / "w.bin"
    path.write_bytes(b"a" * 1000)
    first = backbones.file_sha256(path)
    assert first == hashlib.sha256(b"a" * 1000).hexdigest()
    reads = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda p, *a, **k: reads.append(p) or real_open(p, *a, **k))
    assert backbones.file_sha256(path) == first and reads == []   # unchanged: not read again
    st = path.stat()
    path.write_bytes(b"b" * 1000)                  # the same size ...
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))   # ... a new modification time
    assert backbones.file_sha256(path) == hashlib.sha256(b"b" * 1000).hexdigest() and len(reads) == 1


TINY = dict(img_size=32, patch_size=8)


@pytest.mark.parametrize("other", ["resnet", "wider", "deeper"])
def test_a_checkpoint_of_another_architecture_is_refused(tmp_path, other):
    make = {"resnet": lambda: timm.create_model("test_resnet", num_classes=0),
            "wider": lambda: timm.create_model("vit_small_patch16_224", num_classes=0, depth=2, **TINY),
            "deeper": lambda: timm.create_model("vit_tiny_patch16_224", num_classes=0, depth=3, **TINY)}[other]
    torch.save(make().state_dict(), tmp_path / "w.pt")
    with pytest.raises(WeightsMismatch, match=r"(?s)checkpoint '.*w\.pt' .*another architecture.*Fix: point checkpoint"):
        timm_backbone((3, 32, 32), model="vit_tiny_patch16_224", checkpoint=str(tmp_path / "w.pt"), depth=2, **TINY)
