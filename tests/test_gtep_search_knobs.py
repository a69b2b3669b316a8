"""The two GTEP search knobs issue 30 item 4 left without a counterpart, pinned by their effect:
MEMO's "Exemplar batch size" (Table 4; PyCIL ``models/memo.py``'s ``batch_size = 64``, the batch size
of the loaders ``_construct_exemplar`` runs the network over to herd exemplars) and DualPrompt's
"M Size" (Table 5; the code's E-prompt pool size ``--size``)."""
import pytest
import torch
import torch.nn.functional as F

from test_methods_reference import METHODS as REF_METHODS, context as ref_context, digits, split  # noqa: F401
from test_ptm_methods import METHODS, context, data, experiences, fresh_feature_pool, pretrained  # noqa: F401

PROMPT = dict(lr=0.16, g_layers="0-0", e_layers="1-1")


# --- MEMO: exemplar_batch_size --------------------------------------------------------------------------

def herding_rows(digits, bs):
    """(rows of each forward pass while the memory is rebuilt after task 2, the memory, steps per epoch)."""
    from clharness.toolkit.expansion import update_memory
    _, exps, _ = split(digits, 0)
    torch.manual_seed(0)
    method = REF_METHODS["memo"](ref_context(0, epochs=1), exemplar_batch_size=bs)
    method.learn(exps[0])
    method.learn(exps[1])
    steps = method.labels.epoch_steps
    rows, forward = [], method.model.features
    method.model.features = lambda x: (rows.append(len(x)), forward(x))[1]
    update_memory(method, method.memory, exps[1], len(method.labels.seen))
    return rows, method.memory, steps, exps[1]


def test_memo_exemplar_batch_size_is_the_herding_extraction_batch_not_a_training_batch(digits):
    base_rows, base_memory, base_steps, exp = herding_rows(digits, 0)
    x, y = exp.tensors()
    sizes = [int((y == c).sum()) for c in exp.classes]
    assert base_rows == sizes                                   # default: one pass per class (< 512 rows)
    for bs in (16, 64):
        rows, memory, steps, _ = herding_rows(digits, bs)
        # by hand: each class's samples in batches of bs rows, the last one shorter
        assert rows == [r for n in sizes for r in [bs] * (n // bs) + ([n % bs] if n % bs else [])], bs
        # what the steps train on is unchanged: as many exemplars, as many steps per epoch
        assert steps == base_steps and len(memory) == len(base_memory) == 200
        assert [len(memory.x[c]) for c in memory.x] == [len(base_memory.x[c]) for c in base_memory.x]


def test_memo_exemplar_batch_size_leaves_the_features_as_they_are(digits):
    _, exps, _ = split(digits, 0)
    torch.manual_seed(0)
    method = REF_METHODS["memo"](ref_context(0, epochs=1))
    method.learn(exps[0])
    method.model.eval()
    x = exps[0].tensors()[0]
    whole = method.features(x)
    method.hp["exemplar_batch_size"] = 16
    torch.testing.assert_close(method.features(x), whole, rtol=1e-5, atol=1e-6)


# --- DualPrompt: pool_size (M) --------------------------------------------------------------------------

def test_dualprompt_pool_size_holds_m_prompts_and_keys_from_the_start(data):
    grown = METHODS["dualprompt"](context(epochs=1), **PROMPT)
    pooled = METHODS["dualprompt"](context(epochs=1), pool_size=4, **PROMPT)
    assert grown.e_prompts.shape[0] == grown.e_keys.shape[0] == 0
    assert pooled.e_prompts.shape == (4, 1, 2, 20, 192) and pooled.e_keys.shape == (4, 192)
    start_prompts, start_keys = pooled.e_prompts.detach().clone(), pooled.e_keys.detach().clone()
    assert pooled.predict(torch.zeros(2, 3, 32, 32)).max() < -1e3        # nothing learned yet
    for t, exp in enumerate(experiences(data)):
        grown.learn(exp)
        pooled.learn(exp)
        assert grown.e_prompts.shape[0] == t + 1 and pooled.e_prompts.shape[0] == 4
        # task t trains E-prompt t and key t only; the later ones are still as drawn
        assert not torch.equal(pooled.e_keys[t], start_keys[t])
        assert torch.equal(pooled.e_prompts[t + 1:], start_prompts[t + 1:])
        assert torch.equal(pooled.e_keys[t + 1:], start_keys[t + 1:])


def test_dualprompt_pool_copies_the_previous_prompt_and_matches_every_key(data):
    exps = experiences(data)
    method = METHODS["dualprompt"](context(epochs=1), pool_size=3, **PROMPT)
    method.learn(exps[0])
    first = method.e_prompts.detach()[0].clone()
    method.context.epochs = 0                                  # no training: task 1's prompt as initialised
    method.learn(exps[1])
    assert torch.equal(method.e_prompts[1], first)             # the code's transfer: prompt 1 := prompt 0
    x = next(data[2][0].batches(4, shuffle=False))[0]
    q = method.frozen(x)
    with torch.no_grad():                                      # the never-trained key 2 takes part in matching
        method.e_keys[2] = q[0]
    assert method.match(q)[0] == 2
    with torch.no_grad():
        torch.testing.assert_close(method.features(x)[:1], method.represent(x[:1], torch.tensor([2])),
                                   rtol=1e-5, atol=1e-5)


def test_dualprompt_tasks_past_the_pool_train_their_matched_prompts(data):
    exps = experiences(data)
    method = METHODS["dualprompt"](context(epochs=1), pool_size=1, **PROMPT)
    method.learn(exps[0])
    assert method.task_of_id == {} and method.e_prompts.shape[0] == 1
    before = method.e_prompts.detach().clone(), method.e_keys.detach().clone()
    method.learn(exps[1])                                      # past the pool: the one prompt is everyone's match
    assert method.e_prompts.shape[0] == 1
    assert not torch.equal(method.e_prompts, before[0]) and not torch.equal(method.e_keys, before[1])
    # M = 2 with task ids: task 0 keeps its own prompt, tasks 1.. (past the pool from 2) match
    task_il = METHODS["dualprompt"](context(epochs=1), pool_size=2, **PROMPT)
    for exp in experiences(data, task_il=True):
        task_il.learn(exp)
    assert task_il.task_of_id == {0: 0, 1: 1}
    x = next(data[2][2].batches(3, shuffle=False))[0]
    with torch.no_grad():
        own = (F.normalize(task_il.frozen(x), dim=1) @ F.normalize(task_il.e_keys, dim=1).T).argmax(1)
        torch.testing.assert_close(task_il.features(x, task_id=2), task_il.represent(x, own), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,knob,values", [("memo", "exemplar_batch_size", [16, 32, 64, 128, 256]),
                                              ("dualprompt", "pool_size", [10, 15, 20, 25, 30])])
def test_gtep_paper_space_searches_the_knob(name, knob, values):
    import clharness as clh
    from clharness.benchmarks.gtep.search import method_space
    from clharness.benchmarks.gtep.spaces import NO_COUNTERPART
    method = clh.Harness().methods[name]
    general = "table4" if name == "memo" else "table5"
    assert list(method_space(method, {"general": general}).space[knob].values) == values
    assert not [k for k in NO_COUNTERPART if k[0] == name]
    for v in values:                                           # every value is one the method accepts
        method.hparams[knob].check(knob, v)
