"""Issue 17: RanPAC, SLCA, L2P and DualPrompt as their papers and reference code run them, on the
tiny "pretrained" ViT of test_ptm_methods (its fixtures are reused here)."""
import copy

import pytest
import torch

from test_ptm_methods import METHODS, PROMPTED, context, data, experiences, pretrained  # noqa: F401


def test_ranpac_gram_is_shared_by_clones_until_one_side_updates(data):
    exps = experiences(data)
    method = METHODS["ranpac"](context(), projection_dim=64)
    method.learn(exps[0])
    twin, snap = method.clone(), method.snapshot()
    assert twin.state is method.state and snap["state"] is method.state      # no copy of G, C or W
    assert twin.gram.data_ptr() == method.gram.data_ptr()
    gram, corr = method.gram.clone(), method.corr.clone()
    twin.learn(exps[1])                                                     # the twin updates: copy on write
    assert twin.state is not method.state
    assert torch.equal(method.gram, gram) and torch.equal(method.corr, corr)  # the original is unchanged
    assert not torch.equal(twin.gram, gram) and torch.equal(twin.projection, method.projection)
    method.learn(exps[1])                                                   # and the other way round
    torch.testing.assert_close(method.gram, twin.gram)
    method.restore(snap)
    assert torch.equal(method.gram, gram)
    assert method.memory_report().tensor_elements >= 192 * 64 + 64 * 64 + 64 * 6   # W, G, C counted


def test_ranpac_vpt_phase_one_trains_deep_prompts_then_freezes_them(data):
    method = METHODS["ranpac"](context(), projection_dim=64, adapter="vpt", prompt_tokens=3)
    method.learn(experiences(data)[0])
    vpt = method.frozen.backbone.vpt
    assert method.adaptation == "vpt" and vpt.shape == (2, 3, 192)      # one prompt set per block
    assert vpt.abs().sum() > 0 and not vpt.requires_grad
    none = METHODS["ranpac"](context(), projection_dim=64, adapter="none")
    none.learn(experiences(data)[0])
    assert none.adaptation == "none" and type(none.frozen.backbone).__name__ == "TimmBackbone"


def test_ranpac_tunes_gtep_table5_sets():
    from clharness.gtep import method_space
    space = method_space(METHODS["ranpac"], {"general": "table5"}).space
    assert list(space["ffn_num"].values) == [4, 8, 16, 32, 64]                  # "FFN num"
    assert list(space["prompt_tokens"].values) == [3, 5, 10, 20, 30, 50]        # "Prompt token num"
    assert list(space["projection_dim"].values) == [5000, 10000, 15000, 20000]  # M
