"""Issue 17: ViT-B/16 Sup-21K and CLIP ViT-B/16 selectable by name (``vit-b16-in21k``,
``vit-b16-clip``), pretrained by default, weights from a checkpoint file or the local cache only.
Full ViT-B takes ~10 s to build on one CPU core, so building goes through a tiny timm ViT (the
factories take a ``model`` override); the default names are checked without building."""
import inspect

import pytest
import timm
import torch

from clharness.toolkit.backbones import BUILTIN_BACKBONES, WeightsMissing
from test_offline_weights import caches, network  # noqa: F401

NAMES = {"vit-b16-in21k": "vit_base_patch16_224.orig_in21k", "vit-b16-clip": "vit_base_patch16_clip_224.openai"}
TINY = dict(model="vit_tiny_patch16_224", img_size=32, patch_size=8, depth=1)


@pytest.mark.parametrize("name,model", sorted(NAMES.items()))
def test_registered_with_the_paper_weights_and_pretrained_by_default(name, model):
    params = inspect.signature(BUILTIN_BACKBONES[name]).parameters
    assert params["model"].default == model and params["pretrained"].default is True
    assert timm.models.get_pretrained_cfg(model) is not None     # timm knows the weights by that name
    net = BUILTIN_BACKBONES[name]((3, 32, 32), pretrained=False, **TINY)
    assert net.out_dim == 192 and net(torch.randn(2, 3, 32, 32)).shape == (2, 192)


@pytest.mark.parametrize("name,model", sorted(NAMES.items()))
def test_missing_weights_name_the_model_and_never_touch_the_network(name, model, network, caches):
    with pytest.raises(WeightsMissing) as err:
        BUILTIN_BACKBONES[name]((3, 224, 224))        # pretrained, downloads off, empty caches
    assert f"timm backbone {model!r}" in str(err.value) and f"timm/{model}" in str(err.value)
    assert 'checkpoint = "PATH"' in str(err.value) and network == []


def test_weights_load_from_a_checkpoint_file(network, caches):
    torch.manual_seed(1)
    source = BUILTIN_BACKBONES["vit-b16-in21k"]((3, 32, 32), pretrained=False, **TINY)
    path = caches / "vit.pth"
    torch.save(source.model.state_dict(), path)
    torch.manual_seed(2)
    net = BUILTIN_BACKBONES["vit-b16-in21k"]((3, 32, 32), checkpoint=str(path), **TINY)
    assert all(torch.equal(net.model.state_dict()[k], v) for k, v in source.model.state_dict().items())
    assert network == []
