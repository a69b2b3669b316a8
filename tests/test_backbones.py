"""Built-in backbones: feature shapes, the papers' architectures, timm loading from local files."""
import pytest
import torch

import clharness as clh
from clharness.toolkit.backbones import BUILTIN_BACKBONES, MLP, TimmBackbone


def n_params(module):
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("name, shape, options, out_dim", [
    ("mlp", (1, 8, 8), {}, 256),
    ("mlp", (3, 32, 32), {"hidden": 100, "layers": 3}, 100),
    ("cnn", (1, 28, 28), {}, 64),             # STF Table 2: the EMNIST CNN
    ("cnn", (1, 8, 8), {}, 64),
    ("resnet18-reduced", (3, 32, 32), {}, 160),   # GEM's reduced ResNet-18, nf=20
    ("resnet18-reduced", (3, 64, 64), {}, 160),   # TinyImageNet size: pooling adapts
    ("resnet18-reduced", (1, 8, 8), {"nf": 8}, 64),
    ("resnet32", (3, 32, 32), {}, 64),
    ("timm", (3, 32, 32), {"model": "vit_tiny_patch16_224"}, 192),   # img_size offered from the input
    ("timm", (3, 32, 32), {"model": "resnet18"}, 512),                # no img_size: retried without
])
def test_backbone_features(name, shape, options, out_dim):
    torch.manual_seed(0)
    net = BUILTIN_BACKBONES[name](shape, **options)
    assert net.out_dim == out_dim
    net.train()
    feats = net(torch.randn(4, *shape))
    assert feats.shape == (4, out_dim) and torch.isfinite(feats).all()
    feats.sum().backward()   # trainable end to end


def test_paper_architectures_have_the_published_sizes():
    # ResNet-32 for CIFAR (He et al. 2016): ~0.46M parameters, 31 convs + the classifier.
    r32 = BUILTIN_BACKBONES["resnet32"]((3, 32, 32))
    assert 0.45e6 < n_params(r32) < 0.48e6
    assert sum(isinstance(m, torch.nn.Conv2d) for m in r32.modules()) == 31   # option A: no projection convs
    # GEM's reduced ResNet-18 (nf=20): ~1.09M parameters, 17 3x3 convs + 3 projection shortcuts.
    r18 = BUILTIN_BACKBONES["resnet18-reduced"]((3, 32, 32))
    assert 1.0e6 < n_params(r18) < 1.2e6
    assert sum(isinstance(m, torch.nn.Conv2d) for m in r18.modules()) == 20
    # STF EMNIST CNN: ConvBlock(1, 32), ConvBlock(32, 64), each two 3x3 convs with BN, then max-pool.
    cnn = BUILTIN_BACKBONES["cnn"]((1, 28, 28))
    convs = [m for m in cnn.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.in_channels, c.out_channels) for c in convs] == [(1, 32), (32, 32), (32, 64), (64, 64)]
    assert sum(isinstance(m, torch.nn.MaxPool2d) for m in cnn.modules()) == 2


def test_builtin_backbones_are_registered():
    names = set(clh.Harness(entry_points=False).backbones)
    assert {"mlp", "cnn", "resnet18-reduced", "resnet32", "timm"} <= names
    assert BUILTIN_BACKBONES["mlp"] is MLP


def test_timm_checkpoint_loads_the_saved_weights(tmp_path):
    timm = pytest.importorskip("timm")
    torch.manual_seed(1)
    source = timm.create_model("vit_tiny_patch16_224", img_size=32, num_classes=7)
    path = tmp_path / "vit_tiny_32.pth"
    torch.save(source.state_dict(), path)

    torch.manual_seed(2)   # a different random init, so equality can only come from the file
    net = BUILTIN_BACKBONES["timm"]((3, 32, 32), model="vit_tiny_patch16_224", checkpoint=str(path))
    assert isinstance(net, TimmBackbone) and net.out_dim == 192
    loaded = net.model.state_dict()
    expected = {k: v for k, v in source.state_dict().items() if not k.startswith("head.")}
    assert set(loaded) == set(expected)          # num_classes=0: the classifier is dropped
    for key, value in expected.items():
        assert torch.equal(loaded[key], value), key
    x = torch.randn(2, 3, 32, 32)
    source.eval(), net.eval()
    assert torch.allclose(net(x), source.forward_head(source.forward_features(x), pre_logits=True), atol=1e-5)


def test_timm_checkpoint_adapts_input_channels_and_freezes(tmp_path):
    timm = pytest.importorskip("timm")
    source = timm.create_model("resnet18", num_classes=0)
    path = tmp_path / "resnet18.pth"
    torch.save(source.state_dict(), path)
    net = BUILTIN_BACKBONES["timm"]((1, 16, 16), model="resnet18", checkpoint=str(path), freeze=True)
    # timm's pretrained path sums the RGB filters for a one-channel input
    assert torch.allclose(net.model.conv1.weight, source.conv1.weight.sum(1, keepdim=True))
    assert torch.equal(net.model.layer4[1].conv2.weight, source.layer4[1].conv2.weight)
    assert not any(p.requires_grad for p in net.parameters())
    net.train()
    assert not net.model.training   # frozen BN statistics stay frozen
    assert net(torch.randn(2, 1, 16, 16)).shape == (2, 512)


def test_timm_missing_checkpoint_names_the_path(tmp_path):
    missing = tmp_path / "no" / "such_weights.pth"
    with pytest.raises(FileNotFoundError, match="such_weights.pth") as info:
        BUILTIN_BACKBONES["timm"]((3, 32, 32), model="resnet18", checkpoint=str(missing))
    assert str(missing) in str(info.value)


def test_timm_checkpoint_of_another_model_is_an_error(tmp_path):
    timm = pytest.importorskip("timm")
    path = tmp_path / "resnet.pth"
    torch.save(timm.create_model("resnet18", num_classes=0).state_dict(), path)
    from clharness.toolkit.backbones import WeightsMismatch   # refused as other weights (issue 39 item 7)
    with pytest.raises(WeightsMismatch, match="another architecture.*Missing keys"):
        BUILTIN_BACKBONES["timm"]((3, 32, 32), model="vit_tiny_patch16_224", checkpoint=str(path))
