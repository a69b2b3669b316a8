"""The pretrained-model methods of issue 17 (CODA-Prompt, APER, EASE, LAE, ...) on the tiny
"pretrained" ViT of test_ptm_methods (2 blocks, 32x32 inputs, 8x8 patches, 6 synthetic classes in
3 tasks): each method's defining rule from its paper, checked by hand on the trained method."""
import torch
import torch.nn.functional as F

import clharness as clh
from clharness.vit_prompts import embed, forward_blocks
from clharness_methods import REFERENCE_METHODS
from test_ptm_methods import (CLASSES, accuracy, context, data, experiences, pretrained,  # noqa: F401
                              task_il_accuracy)

METHODS = {cls.name: cls for cls in REFERENCE_METHODS}
CODA = dict(lr=0.01, pool_size=6, num_tasks=3, prompt_length=4, layers="0-1")


def test_coda_prompt_is_the_attention_weighted_sum_of_components(data):
    method = METHODS["coda_prompt"](context(epochs=2), **CODA)
    exps = experiences(data)
    method.learn(exps[0])
    first = [t.detach().clone() for t in (method.pool.P, method.pool.K, method.pool.A)]
    method.learn(exps[1])
    P, K, A = (t.detach() for t in (method.pool.P, method.pool.K, method.pool.A))
    assert P.shape == (2, 4, 4, 192) and K.shape == A.shape == (2, 4, 192)     # 2 components per task
    for old, new in zip(first, (P, K, A)):
        assert torch.equal(new[:, :2], old)                                     # task 1's are frozen
    x, _ = next(data[2][1].batches(5, shuffle=False))
    q = method.frozen.backbone(x)
    layer = 1
    # by hand: alpha_m = cos(q * A_m, K_m); p = sum_m alpha_m P_m
    alpha = torch.tensor([[float(torch.dot(q[b] * A[layer, m], K[layer, m])
                                 / ((q[b] * A[layer, m]).norm() * K[layer, m].norm())) for m in range(4)]
                          for b in range(5)])
    p = sum(alpha[:, m, None, None] * P[layer, m][None] for m in range(4))
    torch.testing.assert_close(method.pool.prompt(q, layer), p, rtol=1e-5, atol=1e-6)
    # the prompt's halves are the key and value prefixes of the block's attention
    vit = method.frozen.backbone.model
    prefixes = {b: sum(alpha_b[:, m, None, None] * P[b, m][None] for m in range(4)).view(5, 2, 2, 192)
                for b, alpha_b in ((0, method.pool.weights(q, 0)[0]), (1, alpha))}
    expected = method.head(vit.forward_head(forward_blocks(vit, embed(vit, x), prefixes), pre_logits=True))
    torch.testing.assert_close(method.predict(x), expected.masked_fill(~method.seen, -1e4), rtol=1e-4, atol=1e-4)


def test_coda_prompt_new_components_are_gram_schmidt_orthogonal(data):
    method = METHODS["coda_prompt"](context(epochs=1), **CODA)
    method.learn(experiences(data)[0])
    method.pool.grow(2, method.gen)                     # what the next task does first
    for t in (method.pool.K, method.pool.A, method.pool.P.flatten(2)):
        new, old = t[:, 2:].detach(), t[:, :2].detach()
        torch.testing.assert_close(new @ new.transpose(1, 2), torch.eye(2).expand(2, 2, 2), atol=1e-5, rtol=0)
        assert (new @ F.normalize(old, dim=2).transpose(1, 2)).abs().max() < 1e-4


def test_coda_prompt_learns_and_checks_its_settings(data):
    method = METHODS["coda_prompt"](context(epochs=3), **{**CODA, "ortho_mu": 0.1})
    for exp in experiences(data):
        method.learn(exp)
    assert min(task_il_accuracy(method, data)) > 0.8
    assert accuracy(method, data) > 1 / CLASSES + 0.05
    assert method.memory_report().parameters >= 3 * 2 * 2 * (4 * 192 + 2 * 192)   # the components
    try:
        METHODS["coda_prompt"](context(), **{**CODA, "pool_size": 2})
    except clh.HParamError as e:
        assert "pool_size=2 gives no component to each of 3 tasks" in str(e)
    else:
        raise AssertionError("a pool smaller than the task count must be refused")
