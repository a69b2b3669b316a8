"""MIR's replay_loss option (issue 28): the paper's one mean over B_n u B_C against the authors' code's
mean over B_n plus mean over the retrieved samples, written out by hand on a 2-layer net."""
import torch

import clharness as clh
from clharness_methods.mir import MIR


class TwoLayer(torch.nn.Module):
    out_dim = 3

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.relu(self.fc(x.flatten(1)))


def nll(logits, y):
    """-log softmax(logits)[y] per row, by hand."""
    z = logits - logits.max(1, keepdim=True).values
    return -(z.gather(1, y[:, None]).squeeze(1) - z.exp().sum(1).log())


def make(replay_loss):
    torch.manual_seed(0)
    ctx = clh.Context(clh.Setting.CLASS_IL, 3, (1, 2, 2), seed=0, batch_size=2, memory_size=2,
                      backbone_factory=TwoLayer)
    m = MIR(ctx, replay_loss=replay_loss, candidates=2, lr=0.1)
    mem_x = torch.tensor([[1.0, 0.0, 2.0, -1.0], [0.5, 1.5, -0.5, 0.0]]).view(2, 1, 2, 2)
    m.buffer.add(mem_x, torch.tensor([0, 1]))
    return m, mem_x


def test_mir_replay_loss_union_and_sum_against_hand_written_losses():
    x = torch.tensor([[0.0, 1.0, 1.0, 0.5], [2.0, -1.0, 0.0, 1.0]]).view(2, 1, 2, 2)
    y = torch.tensor([2, 2])
    values = {}
    for kind in ("union", "sum"):
        m, mem_x = make(kind)
        # memory of 2, candidates 2, k = batch size 2: the retrieved samples are the whole memory
        loss = m.mir_loss(x, y).detach()
        with torch.no_grad():
            w, b, hw, hb = m.model.backbone.fc.weight, m.model.backbone.fc.bias, m.model.head.weight, m.model.head.bias
            logits = lambda v: torch.relu(v.flatten(1) @ w.T + b) @ hw.T + hb   # noqa: E731
            new = nll(logits(x), y)
            old = nll(logits(mem_x), torch.tensor([0, 1]))
        expected = torch.cat([new, old]).mean() if kind == "union" else new.mean() + old.mean()
        assert torch.allclose(loss, expected, atol=1e-6), (kind, loss, expected)
        values[kind] = loss.item()
    assert values["sum"] > values["union"]      # the code's form weighs the replay about twice as much


def test_mir_default_is_the_paper_and_stays_out_of_record_keys():
    assert MIR.hparams["replay_loss"].default == "union"
    assert MIR.later_hparams == {"replay_loss": "union"}
