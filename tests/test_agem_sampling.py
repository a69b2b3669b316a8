"""A-GEM's ``sampling="per-task-cycle"``: the reference batch read as Avalanche 0.6.0's AGEMPlugin reads it
(consecutive ``sample_size // T`` rows of each task's memory in stored order, a short last chunk, a restart,
every walk restarting when a task's memory is added; checked against Avalanche's
GroupBalancedInfiniteDataLoader by hand: /work/venv-parity, 2 buffers of 5 rows, batch 2 per buffer)."""
import torch

import clharness as clh
import clharness_methods  # noqa: F401
from clharness.toolkit.backbones import MLP


def _agem(**hp):
    ctx = clh.Context(clh.Setting.CLASS_IL, 6, (1, 1, 1), seed=0, epochs=1, batch_size=4, memory_size=10,
                      backbone_factory=lambda: MLP((1, 1, 1), hidden=5, layers=1))
    from clharness_methods.agem import AGEM as cls
    return cls(ctx, **hp)


def _task(first: int, n: int, label: int):
    """``n`` rows whose single input value is its id (first, first + 1, ...), stored in that order."""
    return torch.arange(first, first + n, dtype=torch.float).view(n, 1, 1, 1), torch.full((n,), label)


def _ids(agem):
    (mx, my), = agem.memory_batches()
    return mx.flatten().long().tolist(), my.tolist()


def test_per_task_cycle_walks_each_tasks_memory_in_order_with_a_short_last_chunk_then_restarts():
    agem = _agem(sample_size=4, sampling="per-task-cycle", memory="per-task")
    agem.memory.tasks += [_task(0, 5, 0), _task(100, 5, 1)]          # 4 // 2 = 2 rows of each task a step
    steps = [_ids(agem)[0] for _ in range(4)]
    assert steps == [[0, 1, 100, 101], [2, 3, 102, 103], [4, 104], [0, 1, 100, 101]]   # Avalanche's order
    assert _ids(agem)[1] == [0, 0, 1, 1]                                 # labels travel with their rows


def test_per_task_cycle_restarts_every_walk_when_a_task_is_added():
    agem = _agem(sample_size=6, sampling="per-task-cycle", memory="per-task")
    agem.memory.tasks.append(_task(0, 7, 0))                           # one task: 6 rows a step
    assert _ids(agem)[0] == [0, 1, 2, 3, 4, 5]
    agem.memory.tasks.append(_task(100, 4, 1))                         # a new loader: 3 rows of each, from row 0
    assert _ids(agem)[0] == [0, 1, 2, 100, 101, 102]
    assert _ids(agem)[0] == [3, 4, 5, 103]                             # task 1 has one row left
    assert _ids(agem)[0] == [6, 100, 101, 102]                         # task 0's last row; task 1 restarted


def test_per_task_cycle_takes_at_least_one_row_of_each_task():
    agem = _agem(sample_size=2, sampling="per-task-cycle", memory="per-task")
    agem.memory.tasks += [_task(0, 2, 0), _task(10, 2, 1), _task(20, 2, 2)]   # 2 // 3 = 0: one row each
    assert [_ids(agem)[0] for _ in range(3)] == [[0, 10, 20], [1, 11, 21], [0, 10, 20]]


def test_default_sampling_is_unchanged():
    assert _agem().hp["sampling"] == "uniform"
