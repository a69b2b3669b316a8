"""Without --clh-download nothing touches the network: pretrained timm weights come from a local
``checkpoint`` file or timm's local caches (Hugging Face hub cache, torch hub cache), the hub runs in
offline mode for the session, and missing weights or datasets are clear errors naming the model (or
dataset), where the harness looked, and the fixes. Network calls are trapped, not merely failed."""
import os
import socket
import urllib.request
from pathlib import Path

import pytest
import torch

# pytester's in-process runs drop modules first imported during a run; importing the harness (and
# torch) here keeps them loaded, as in test_pytest_plugin.py.
import clharness.engine.runner  # noqa: F401
import clharness.reporting.scorecard  # noqa: F401
import clharness_methods  # noqa: F401
import huggingface_hub
import huggingface_hub.constants
import safetensors.torch
import sklearn.datasets  # noqa: F401
import timm
from clharness.toolkit import backbones
from clharness.toolkit.backbones import WeightsMissing, timm_backbone
from clharness.data import BUILTIN_SOURCES, DatasetMissing, load_split

HERE = Path(__file__).parent


@pytest.fixture
def network(monkeypatch):
    """Every way out of the process records the attempt and fails; the test asserts there was none."""
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args[:2])
        raise OSError("network access attempted")

    for owner, name in [(socket.socket, "connect"), (socket.socket, "connect_ex"), (socket, "create_connection"),
                        (socket, "getaddrinfo"), (urllib.request, "urlopen")]:
        monkeypatch.setattr(owner, name, refuse)
    return attempts


@pytest.fixture
def caches(monkeypatch, tmp_path):
    """Empty Hugging Face and torch hub caches; downloads off, as in a session without --clh-download."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setattr(backbones, "_downloads", {"allowed": False})
    return tmp_path


def hf_cache_entry(cache: Path, repo: str, filename: str, state_dict) -> Path:
    """A file laid out as huggingface_hub caches it: refs/main -> snapshots/<revision>/<filename>."""
    root = cache / "hf" / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text("0123abcd")
    path = root / "snapshots" / "0123abcd" / filename
    path.parent.mkdir(parents=True)
    safetensors.torch.save_file({k: v.contiguous() for k, v in state_dict.items()}, str(path))
    return path


def test_missing_weights_name_the_model_where_it_looked_and_both_fixes_without_a_network_call(network, caches):
    with pytest.raises(WeightsMissing) as err:
        timm_backbone((3, 32, 32), model="resnet18", pretrained=True)
    message = str(err.value)
    assert message.startswith("timm backbone 'resnet18': pretrained weights not found on this machine and "
                              "downloads are off; looked in the Hugging Face cache ")
    assert f"{caches / 'hf'} (timm/resnet18.a1_in1k: model.safetensors or pytorch_model.bin)" in message
    assert str(caches / "torch" / "hub" / "checkpoints" / "resnet18_a1_0-d63eafa0.pth") in message
    assert 'Fix: set checkpoint = "PATH"' in message and "or add --clh-download" in message
    assert network == []

    missing = caches / "no" / "weights.pth"
    with pytest.raises(WeightsMissing, match=f"checkpoint file '{missing}' does not exist. Fix: .*--clh-download"):
        timm_backbone((3, 32, 32), model="resnet18", checkpoint=str(missing))
    assert network == []


def test_weights_load_from_a_written_checkpoint_and_from_both_caches_offline(network, caches):
    torch.manual_seed(1)
    source = timm.create_model("test_resnet", num_classes=0)
    expected = source.state_dict()

    def same(net):
        return all(torch.equal(net.model.state_dict()[k], v) for k, v in expected.items())

    path = caches / "mine.pth"
    torch.save(expected, path)
    torch.manual_seed(2)   # another random init: equality can only come from the file
    assert same(timm_backbone((3, 32, 32), model="test_resnet", checkpoint=str(path)))

    hf_cache_entry(caches, "timm/test_resnet.r160_in1k", "model.safetensors", expected)
    assert same(timm_backbone((3, 32, 32), model="test_resnet", pretrained=True))

    small = timm.create_model("resnet10t", num_classes=0)
    torch_cache = caches / "torch" / "hub" / "checkpoints" / "resnet10t_176_c3-f3215ab1.pth"
    torch_cache.parent.mkdir(parents=True)
    torch.save(small.state_dict(), torch_cache)
    net = timm_backbone((3, 32, 32), model="resnet10t", pretrained=True)
    assert all(torch.equal(net.model.state_dict()[k], v) for k, v in small.state_dict().items())
    assert network == []


def test_missing_dataset_without_download_is_a_clear_error_without_a_network_call(network, tmp_path):
    source = BUILTIN_SOURCES["mnist"]()
    source.name = "mnist"
    with pytest.raises(DatasetMissing, match="dataset 'mnist' not found at .*--clh-data-root.*--clh-download"):
        load_split(source, tmp_path, True, download=False)
    assert network == []


SUITE = """
[suite]
name = "hub"

[[scenario]]
name = "ci"
dataset = "digits"
tasks = 5
epochs = 1
backbone = "timm"
backbone_options = {{ model = "test_resnet", {weights} }}
"""


def test_session_without_download_is_offline_and_reports_missing_weights(network, caches, pytester, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    pytester.syspathinsert(HERE)
    pytester.makefile(".toml", hub=SUITE.format(weights="pretrained = true"))
    pytester.makepyfile(conftest="""
        import os, huggingface_hub
        def pytest_collection_finish(session):   # inside the session: the hub is in offline mode
            print("hub offline:", os.environ.get("HF_HUB_OFFLINE"), huggingface_hub.is_offline_mode())
    """)
    args = ("-p", "plugin_methods", "-p", "no:cacheprovider", "hub.toml", "--clh-method", "tiny",
            "--clh-results", "r.sqlite", "-s")
    result = pytester.runpytest(*args)
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "hub offline: 1 True" in out
    assert "[error] hub::ci[tiny-seed0]: WeightsMissing: timm backbone 'test_resnet': pretrained weights not found" in out
    assert "Traceback" not in out and network == []
    assert "HF_HUB_OFFLINE" not in os.environ and not huggingface_hub.is_offline_mode()   # restored after

    torch.save(timm.create_model("test_resnet", num_classes=0).state_dict(), pytester.path / "w.pth")
    pytester.makefile(".toml", hub=SUITE.format(weights='checkpoint = "w.pth"'))
    pytester.runpytest(*args).assert_outcomes(passed=1)
    assert network == []
