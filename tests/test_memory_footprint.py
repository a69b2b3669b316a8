"""Issue 15 item 8: the memory footprint is counted "in addition to the ViT encoder" (CLDyB
appendix B.4). The frozen pretrained encoder shared by all methods is left out; what a method adds
(prompts, keys, heads, statistics) and every weight it trains is counted."""
import pytest
import torch

import clharness as clh
from clharness.toolkit.backbones import timm_backbone
from clharness.data.base import TensorData
from clharness.data.synthetic import Synthetic
from clharness.toolkit.feature_cache import clear_shared
from clharness_methods import REFERENCE_METHODS

METHODS = {cls.name: cls for cls in REFERENCE_METHODS}
CLASSES, SHAPE = 4, (3, 32, 32)
VIT = dict(model="vit_tiny_patch16_224", img_size=32, patch_size=8, depth=1)
WEIGHTS = {}


def tiny_vit():
    """The "pretrained" encoder: the same weights whoever builds it."""
    if not WEIGHTS:
        torch.manual_seed(0)
        WEIGHTS.update(timm_backbone(SHAPE, **VIT).state_dict())
    backbone = timm_backbone(SHAPE, **VIT)
    backbone.load_state_dict(WEIGHTS)
    return backbone


VIT_PARAMS = sum(p.numel() for p in tiny_vit().parameters())


@pytest.fixture(autouse=True)
def fresh_pool():
    clear_shared()
    yield
    clear_shared()


@pytest.fixture(scope="module")
def tasks():
    src = Synthetic(num_classes=CLASSES, channels=3, image_size=32, train_per_class=4, test_per_class=1, seed=1)
    train = src.load(None, True)
    mean, std = train.channel_stats()
    out = []
    for t, classes in enumerate([(0, 1), (2, 3)]):
        idx = torch.isin(train.labels, torch.tensor(classes)).nonzero().squeeze(1)
        out.append(clh.Experience(TensorData(train.subset(idx), mean, std), classes, None, 8, t))
    return out


def run(name, tasks, **hp):
    ctx = clh.Context(clh.Setting.CLASS_IL, CLASSES, SHAPE, epochs=1, batch_size=8, backbone_factory=tiny_vit)
    method = METHODS[name](ctx, **hp)
    for exp in tasks:
        method.learn(exp)
    return method


def test_simplecil_counts_its_prototypes_not_the_vit(tasks):
    method = run("simplecil", tasks)
    report = method.memory_report()
    assert report.parameters == 0                                        # nothing trained, no head
    assert report.tensor_elements == CLASSES * 192 + CLASSES             # class sums and counts
    assert report.mb < 0.01 < 4 * VIT_PARAMS / 2**20


def test_l2p_counts_prompts_keys_and_head_not_the_vit(tasks):
    method = run("l2p", tasks, pool_size=3, top_n=1, prompt_length=2)
    report = method.memory_report()
    prompts, keys = method.pool.prompts.numel(), method.pool.keys.numel()
    assert (prompts, keys) == (3 * 2 * 192, 3 * 192)
    head = sum(p.numel() for p in method.head.parameters())
    assert report.parameters == prompts + keys + head


def test_the_shared_encoder_is_left_out_also_when_the_pool_hands_over_another_copy(tasks):
    first = run("simplecil", tasks)
    second = run("simplecil", tasks)
    assert second.frozen.backbone is first.frozen.backbone               # the feature pool's encoder
    assert second.memory_report() == first.memory_report()


def test_a_changed_encoder_weight_is_the_methods_own_storage(tasks):
    method = run("simplecil", tasks)
    before = method.memory_report().parameters
    with torch.no_grad():
        weight = method.frozen.backbone.model.norm.weight
        weight.add_(1.0)                                                  # no longer the pretrained bytes
    assert method.memory_report().parameters == before + weight.numel()


def test_a_trained_backbone_counts_in_full(tasks):
    method = run("finetune", tasks, lr=0.01)
    assert method.memory_report().parameters == sum(p.numel() for p in method.model.parameters()) > VIT_PARAMS
