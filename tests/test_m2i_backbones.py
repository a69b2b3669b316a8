"""The M2I/I2M backbones: Wide-VGG9 (the paper's public code) and timm's EfficientNet-B1 and ResNet-34."""
import pytest
import torch

from clharness.toolkit.backbones import BUILTIN_BACKBONES, TimmBackbone, WideVGG9


def _count(module):
    return sum(p.numel() for p in module.parameters())


def test_wide_vgg9_layout_and_size():
    net = BUILTIN_BACKBONES["wide-vgg9"]((3, 64, 64))
    assert isinstance(net, WideVGG9) and net.out_dim == 512
    convs = [m for m in net.features if isinstance(m, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [64, 128, 256, 256, 512, 512]
    assert _count(net.features) == 4_504_320                 # the paper's "4.5M parameters" feature extractor
    assert net.classifier[0].in_features == 8192              # 512 x 4 x 4 at 64x64, as in model_provider.py
    assert net(torch.randn(2, 3, 64, 64)).shape == (2, 512)
    assert BUILTIN_BACKBONES["wide-vgg9"]((3, 16, 16))(torch.randn(1, 3, 16, 16)).shape == (1, 512)
    with pytest.raises(ValueError, match="at least 16x16"):
        BUILTIN_BACKBONES["wide-vgg9"]((3, 8, 8))


@pytest.mark.parametrize("name, out_dim, params", [("efficientnet-b1", 1280, 6_513_184), ("resnet34", 512, 21_284_672)])
def test_timm_backbones_random_init_by_default(name, out_dim, params):
    torch.manual_seed(0)
    a = BUILTIN_BACKBONES[name]((3, 64, 64))
    torch.manual_seed(1)
    b = BUILTIN_BACKBONES[name]((3, 64, 64))
    assert isinstance(a, TimmBackbone) and a.out_dim == out_dim and _count(a) == params
    first = next(a.parameters())
    assert not torch.equal(first, next(b.parameters()))      # not pretrained: seeded random weights
    assert a.eval()(torch.randn(2, 3, 64, 64)).shape == (2, out_dim)
