"""timm's cached pretrained file enters the record key by its content (issue 38, the decision left open):
the same model name with another cached file is another key, as a replaced checkpoint file is."""
import hashlib

import pytest

from clharness.engine.runner import Case, case_key
from clharness.engine.suites import ScenarioSpec
from clharness.toolkit import backbones

OPTIONS = {"model": "vit_tiny_patch16_224", "pretrained": True, "img_size": 32}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """timm's cache as a folder of ours: ``cache(content)`` puts a file there and returns its path."""
    def put(content: bytes, name="model.safetensors"):
        path = tmp_path / f"{len(list(tmp_path.iterdir()))}-{name}"
        path.write_bytes(content)
        monkeypatch.setattr(backbones, "cached_weights", lambda model: path if model == OPTIONS["model"] else None)
        return path
    return put


def test_the_cached_file_is_in_the_key_by_its_sha256(cache):
    cache(b"weights A")
    assert backbones.weights_key("timm", OPTIONS) == "sha256:" + hashlib.sha256(b"weights A").hexdigest()


def test_same_model_name_other_cached_file_other_record_key(cache):
    spec = ScenarioSpec(name="s", dataset="digits", tasks=5, backbone="timm", backbone_options=dict(OPTIONS))
    from clharness import Harness
    er = Harness().methods["er"]
    cache(b"weights A")
    first = case_key(Case("t", spec, "er", 0), er)
    cache(b"weights B")
    second = case_key(Case("t", spec, "er", 0), er)
    cache(b"weights A")   # the first file's content again, at another path: the key follows the content
    assert first != second and case_key(Case("t", spec, "er", 0), er) == first


def test_random_init_and_uncached_weights_add_nothing(monkeypatch):
    assert backbones.weights_key("timm", {**OPTIONS, "pretrained": False}) is None
    assert backbones.weights_key("mlp", {}) is None

    def missing(model):
        raise backbones.WeightsMissing(model)
    monkeypatch.setattr(backbones, "cached_weights", missing)
    assert backbones.weights_key("timm", OPTIONS) is None
    # the built-in pretrained ViT (pretrained by default) looks its cache up too
    calls = []
    monkeypatch.setattr(backbones, "cached_weights", lambda model: calls.append(model))
    backbones.weights_key("vit-b16-in21k", {})
    assert calls == ["vit_base_patch16_224.orig_in21k"]
