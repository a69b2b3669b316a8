"""Issue 41: records that are not one method's solo run hold their compute cost too. A CLDyB search record
holds the FLOPs of every training and evaluation its search ran (look-ahead clones included) and its peak
memory, through the contract's ``FamilySession.counted`` (a family imports no engine module)."""
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import clharness.benchmarks.cldyb.kind  # noqa: F401  (loaded once: in-process runs share torch)
import clharness.engine.runner  # noqa: F401
import clharness_methods  # noqa: F401
from clharness.results import ResultsStore
import sklearn.cluster  # noqa: F401
import sklearn.datasets  # noqa: F401

SUITE = """
[suite]
name = "dyb"
seeds = 1
methods = ["finetune"]

[defaults]
kind = "cldyb"
backbone = "mlp"
backbone_options = { hidden = 16, layers = 1 }
epochs = 1
validation = 0.25
image_size = [8, 8]
channels = 1
max_train_per_class = 15
pool = [{ dataset = "digits" }]
classes_per_task = 2
steps = 3
candidates = 3
search_space = 2
probe_per_class = 4
search_methods = ["finetune", "er"]

[[scenario]]
name = "s"
use_cases = ["cc"]
"""


def _counted_by_torch(fn, tally: list):
    """``fn`` wrapped so that torch's own FlopCounterMode counts each call into ``tally``."""
    def wrapped(*args, **kwargs):
        with FlopCounterMode(display=False) as mode:
            out = fn(*args, **kwargs)
        tally.append(mode.get_total_flops())
        return out
    return wrapped


def test_a_cldyb_search_record_holds_the_flops_of_all_it_ran_and_its_peaks(tmp_path, monkeypatch):
    """The look-ahead search (two methods, their clones trained on every candidate, the validation accuracies
    and probe features that value them): its record's training + evaluation FLOPs are what torch's own
    FlopCounterMode counts over the whole search, its evaluation FLOPs what it counts in the search's
    validation accuracies and probe features (summed by hand over the calls); the peaks are filled."""
    import clharness
    from clharness.benchmarks.cldyb import kind, search
    monkeypatch.chdir(tmp_path)   # the sequence is written under the invocation folder
    whole, evaluation = [], []
    monkeypatch.setattr(kind, "run_search", _counted_by_torch(kind.run_search, whole))
    monkeypatch.setattr(search.Search, "_task_accuracies", _counted_by_torch(search.Search._task_accuracies, evaluation))
    monkeypatch.setattr(search, "probe_features", _counted_by_torch(search.probe_features, evaluation))
    (tmp_path / "dyb.toml").write_text(SUITE)
    clharness.run(str(tmp_path / "dyb.toml"), results=tmp_path / "r.sqlite", device="cpu")
    records = ResultsStore(tmp_path / "r.sqlite").records()   # the search's record too (a run's list has cases)
    searches = [r for r in records if r.method == kind.SEARCH_METHOD]
    assert len(searches) == 1 and searches[0].status == "passed" and len(whole) == 1
    record = searches[0]
    assert len(evaluation) > 3 and sum(evaluation) > 0   # every step's accuracies; probe features from step 1
    assert round(record.eval_gflops * 1e9) == sum(evaluation)
    assert round(record.train_gflops * 1e9) == whole[0] - sum(evaluation) > 0
    assert record.peak_rss_mb > 0 and record.peak_cuda_mb == 0.0   # on a CPU: resident memory only
    # the replay on its sequence is a case with its own count, not the search's
    replay = next(r for r in records if r.method == "finetune")
    assert replay.train_gflops > 0 and replay.train_gflops < record.train_gflops


def test_a_search_without_methods_counts_nothing_and_says_zero(tmp_path, monkeypatch):
    """A random-order search trains no method: its record says 0 FLOPs (counted, none), never None."""
    import clharness
    from clharness.benchmarks.cldyb import kind
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dyb.toml").write_text(SUITE.replace('use_cases = ["cc"]', 'use_cases = ["random"]'))
    clharness.run(str(tmp_path / "dyb.toml"), results=tmp_path / "r.sqlite", device="cpu")
    record = next(r for r in ResultsStore(tmp_path / "r.sqlite").records() if r.method == kind.SEARCH_METHOD)
    assert record.status == "passed" and record.train_gflops == 0.0 and record.eval_gflops == 0.0
    assert record.peak_rss_mb > 0


# ------------------------------------------------- work done for another thread's run (seed ensembles)
def test_one_backward_over_two_runs_losses_charges_each_run_its_own_nodes():
    """Two runs' losses summed into one backward (an ensemble's per-member step): each run is charged the
    backward of its own graph, by hand: x (7, 5) needs no gradient, so Linear(5, 3) costs its weight gradient
    only, 2*7*5*3 = 210; Linear(5, 4) -> ReLU -> Linear(4, 3) costs 2*7*5*4 = 280 for the first weight, and
    2*7*4*3 = 168 each for the second weight and its input's gradient: 616."""
    from clharness.engine import flops
    torch.manual_seed(0)
    a = torch.nn.Linear(5, 3)
    b = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
    x = torch.randn(7, 5)
    la, lb = a(x).sum(), b(x).sum()   # no meter entered: the forwards count nowhere
    ma, mb = flops.RunMeter(), flops.RunMeter()
    with flops.charged_backward([(flops.Counting((ma,)), la), (flops.Counting((mb,)), lb)]):
        (la + lb).backward()
    assert (ma.train_flops, mb.train_flops) == (210, 616)
    assert a.weight.grad is not None and b[0].weight.grad is not None


def test_a_counted_node_two_runs_reach_cannot_be_split_and_says_so():
    """A layer both losses pass through: its backward's FLOPs belong to neither run alone."""
    from clharness.engine import flops
    shared, a, b = torch.nn.Linear(5, 5), torch.nn.Linear(5, 3), torch.nn.Linear(5, 3)
    h = shared(torch.randn(7, 5))
    la, lb = a(h).sum(), b(h).sum()
    counted = [(flops.Counting((flops.RunMeter(),)), la), (flops.Counting((flops.RunMeter(),)), lb)]
    with pytest.raises(RuntimeError, match="shared by several runs' losses cannot be charged to one run"):
        with flops.charged_backward(counted):
            (la + lb).backward()


def test_work_another_thread_does_for_a_waiting_run_counts_in_its_meter():
    """A paused member's work done by the coordinator's thread (``counting_as`` the member's ``counting_here``)
    counts in the member's meter, its evaluation as evaluation: Linear(5, 3) on 7 rows is 2*7*5*3 = 210."""
    import threading

    from clharness.engine import flops
    layer, x = torch.nn.Linear(5, 3), torch.randn(7, 5)

    def coordinator(counting):
        with flops.counting_as(counting):
            layer(x)
            with flops.evaluating():
                layer(x)
                layer(x)

    with flops.RunMeter() as meter:
        counting = flops.counting_here()
        worker = threading.Thread(target=coordinator, args=(counting,))
        worker.start()
        worker.join()
    assert (meter.train_flops, meter.eval_flops) == (210, 420)
    assert flops.counting_here() is None   # no meter entered in this thread any more
