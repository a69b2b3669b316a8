"""Seed ensembles (issue 32, clharness.engine.ensemble): members train as one batched model and
write the records their solo runs write."""
import copy
import dataclasses
import functools
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import clharness
# pytester's in-process runs drop modules first imported during a run: import them here (as test_pytest_plugin)
import clharness.engine.runner  # noqa: F401
import clharness.reporting.scorecard  # noqa: F401
import clharness_methods  # noqa: F401
import sklearn.datasets  # noqa: F401
import sklearn.model_selection  # noqa: F401
from clharness.engine.ensemble_members import _Member
from clharness.engine.ensemble_step import _train_task
from clharness.engine.ensemble_policy import why_solo
from clharness.method import Context, Setting
from clharness.toolkit.backbones import MLP
from mini_suite import mini_suite, paused_members


def _run(tmp_path, name, methods, seeds, **kw):
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        records = clharness.run("quickstart", methods=methods, seeds=seeds, quick=True, device="cpu",
                                results=tmp_path / f"{name}.sqlite", **kw)
    return records, [str(w.message) for w in said]


@pytest.mark.parametrize("method", ["finetune", "joint", "ewc", "er", "derpp", "cbrs", "mas", "gdumb"])
def test_members_equal_their_solo_runs(tmp_path, method):
    """The floor: every member's accuracy matrix is its solo run's, bit for bit (issue 38 item 3),
    under the same key, and says it ran in an ensemble of 3. ER and DER++ draw each step's replay batch
    from the member's own memory with its own generator (STEPS); DER++ stores each step's logits in it.
    CBRS is ER with its own class-balancing memory (ER's STEPS, declared for it); MAS's loss reads its
    per-member importance and anchor (ensemble_state); GDumb retrains a fresh model on its memory with fit."""
    solo, _ = _run(tmp_path, "solo", [method], 3)
    ens, _ = _run(tmp_path, "ens", [method], 3, ensemble=True)
    assert [r.seed for r in ens] == [0, 1, 2] and all(r.status == "passed" for r in ens)
    for a, b in zip(solo, ens):
        assert a.key == b.key
        assert np.array_equal(a.acc_matrix, b.acc_matrix, equal_nan=True)
        assert a.task_sizes == b.task_sizes and a.class_order == b.class_order
        assert "executor" not in a.extra and b.extra["executor"] == "ensemble:3"
        # FLOPs (issue 41): a member's training counts what its solo run counts, exactly (hand-batched steps by
        # their solo step's count, engine.flops.StepLedger; each member's own forward and backward by its meter)
        assert b.train_gflops == a.train_gflops > 0 and "flops" not in b.extra
        assert b.eval_gflops == a.eval_gflops > 0
    assert len({tuple(np.ravel(r.acc_matrix)) for r in ens}) == 3   # three different members, not one copied


def test_stored_member_is_not_retrained(tmp_path):
    """A member already in the store is reused; the ensemble shrinks to the others."""
    first, _ = _run(tmp_path, "store", ["finetune"], 1)
    again, _ = _run(tmp_path, "store", ["finetune"], 3, ensemble=True)
    reused = {u.name: u.reused for u in again.units if u.role == "case"}
    assert reused == {"ci-5x2[finetune-seed0]": True, "ci-5x2[finetune-seed1]": False,
                      "ci-5x2[finetune-seed2]": False}
    assert again[0].key == first[0].key and "executor" not in again[0].extra
    assert [r.extra.get("executor") for r in again[1:]] == ["ensemble:2", "ensemble:2"]


def test_unbatchable_method_runs_solo_and_says_why(tmp_path):
    """lwf at its default optimizer (Adam) runs solo (ensemble_solo_when: chaotic at the rounding level)."""
    records, said = _run(tmp_path, "lwf", ["lwf"], 2, ensemble=True)
    assert all(r.status == "passed" and "executor" not in r.extra for r in records)
    assert any("quickstart::ci-5x2[lwf] runs solo" in s and "optimizer='sgd' is batched" in s for s in said)


def test_why_solo_names_each_obstacle():
    from clharness.engine.runner import Case, resolve_hparams
    from clharness.engine.suites import load_suite
    from clharness.plugins import Harness
    harness = Harness()
    suite = load_suite(harness.suites["quickstart"], quick=True)
    spec, cls = suite.scenarios[0], harness.methods["finetune"]
    hp = resolve_hparams(cls)
    assert why_solo(Case("q", spec, "finetune", 0, hp), cls) is None
    # schedules and clipping are batched: each member steps its own trainer (test_ensemble_hparams)
    assert why_solo(Case("q", spec, "finetune", 0, {**hp, "scheduler": "cosine", "clip_grad": 1.0}), cls) is None
    si = harness.methods["si"]
    assert "SI.learn builds its own Trainer" in why_solo(Case("q", spec, "si", 0, resolve_hparams(si)), si)
    lwf = harness.methods["lwf"]
    assert "Adam" in why_solo(Case("q", spec, "lwf", 0, resolve_hparams(lwf)), lwf)
    assert why_solo(Case("q", spec, "lwf", 0, resolve_hparams(lwf, {"optimizer": "sgd"})), lwf) is None


def _toy_methods():
    """Methods for why_solo: one that keeps to fit, an ER subclass, one with its own loss and state."""
    from clharness_methods.er import ER
    from clharness.toolkit.training import SupervisedMethod

    class Plain(SupervisedMethod):
        name = "plain"

        def learn(self, experience):
            super().learn(experience)

    class Replay(ER):
        name = "replay"

    class Weighted(SupervisedMethod):
        name = "weighted"

        def loss(self, x, y):
            return self.weights * self.cross_entropy(self.model(x), y)

    return Plain, Replay, Weighted


@pytest.mark.parametrize("method,obstacle", [
    # its own training loop, outside fit (the class and function named, and what it does there)
    ("si", "trains with a loop of its own, outside fit(): SI.learn builds its own Trainer, steps it, reads or "
           "rewrites the step's gradients (SI's path integral"),
    ("agem", "GradientEpisodicMethod.learn builds its own optimizer, steps it, calls backward(), reads or rewrites "
             "the step's gradients (GEM and A-GEM project each step's gradient"),
    ("gem", "GradientEpisodicMethod.learn builds its own optimizer"),
    ("mir", "MIR.step builds its own Trainer, steps it"),
    ("clser", "CLSER.learn builds its own Trainer, CLSER.step steps it"),
    # not a SupervisedMethod (and its own loop)
    ("l2p", "is not a SupervisedMethod: it has no fit(batches) for the batched step to replace; L2P.learn builds "
            "its own Trainer, steps it"),
    ("simplecil", "is not a SupervisedMethod"),
    # a fit the harness does not batch
    ("icarl", "hands fit() a trainer of its own: ExemplarLearner.learn calls fit(..., trainer=...)"),
    ("cwr", "trains a subset of its parameters: CWRStar.learn calls fit(..., params=...)"),
    ("memo", "DER.learn_task calls fit(..., params=...)"),
    # a loss of its own without declared state; one that keeps to fit: could be opted in
    ("weighted", "overrides loss() (_toy_methods.<locals>.Weighted.loss) without declaring the per-member state "
                 "it reads (ensemble_state): it reads weights"),
    ("replay", "hands fit() a loss of its own (replay_loss, in ER.learn) that no ensemble_steps entry splits"),
    ("plain", "'plain' has not opted in to batched training; nothing in its training keeps it out: it could be "
              "opted in (a class attribute ensemble = True)")])
def test_why_solo_names_the_structural_obstacle_first(method, obstacle):
    """A method that has not opted in hears what in its training keeps it out (read from its source: the
    functions its learn reaches), and "has not opted in" only where nothing does."""
    from clharness.engine.runner import Case, resolve_hparams
    from clharness.engine.suites import load_suite
    from clharness.plugins import Harness
    harness = Harness()
    toys = {cls.name: cls for cls in _toy_methods()}
    cls = toys.get(method) or harness.methods[method]
    spec = load_suite(harness.suites["quickstart"], quick=True).scenarios[0]
    if Setting.CLASS_IL not in cls.settings:
        spec = dataclasses.replace(spec, setting="task-incremental")
    reason = why_solo(Case("q", spec, method, 0, resolve_hparams(cls)), cls)
    assert obstacle in reason, reason
    assert ("opted in" in reason) == (method == "plain")


def test_every_reference_method_is_batched_or_hears_its_obstacle():
    """No reference method is left with a bare "has not opted in": each is batched on a plain case of a
    setting it supports, or why_solo names what in its training keeps it out (the module docstring's list)."""
    from clharness.engine.runner import Case, resolve_hparams
    from clharness.engine.suites import load_suite
    from clharness.plugins import Harness
    harness = Harness()
    spec = load_suite(harness.suites["quickstart"], quick=True).scenarios[0]
    batched = set()
    for name in harness.methods:
        cls = harness.methods[name]
        if not cls.__module__.startswith("clharness_methods."):
            continue
        if Setting.CLASS_IL not in cls.settings:
            case_spec = dataclasses.replace(spec, setting="task-incremental")
        else:
            case_spec = spec
        hp = resolve_hparams(cls, {"optimizer": "sgd"} if "optimizer" in resolve_hparams(cls) else {})
        reason = why_solo(Case("q", case_spec, name, 0, hp), cls)
        assert reason is None or "has not opted in" not in reason, (name, reason)
        if reason is None:
            batched.add(name)
    assert batched == {"finetune", "joint", "ncm", "ewc", "er", "derpp", "lwf", "cbrs", "mas", "gdumb", "mste"}


def test_why_solo_not_opted_in_case_protocol_and_subclasses():
    """Where the method's structure allows batching, the case's protocol comes before "has not opted in"
    (continual evaluation is never batched, opted in or not); opting in is per class: a subclass of an opted-in
    method hears that its base has (CBRS, opted in itself, is batched)."""
    from clharness.engine.runner import Case, resolve_hparams
    from clharness.engine.suites import load_suite
    from clharness.plugins import Harness
    harness = Harness()
    spec = load_suite(harness.suites["quickstart"], quick=True).scenarios[0]
    Plain, Replay, _ = _toy_methods()
    continual = dataclasses.replace(spec, eval_every=1)
    assert "continual evaluation" in why_solo(Case("q", continual, "plain", 0, resolve_hparams(Plain)), Plain)

    class Subclass(harness.methods["finetune"]):
        name = "sub"
    assert "its base Finetune has" in why_solo(Case("q", spec, "sub", 0, resolve_hparams(Subclass)), Subclass)
    for name in ("cbrs", "mas", "gdumb"):
        cls = harness.methods[name]
        assert why_solo(Case("q", spec, name, 0, resolve_hparams(cls)), cls) is None
    mste = harness.methods["mste"]
    task_il = dataclasses.replace(spec, setting="task-incremental")
    assert why_solo(Case("q", task_il, "mste", 0, resolve_hparams(mste)), mste) is None


# --------------------------------------------------------------- the batched step, against a hand loop
def _members(optimizer, **hp):
    from clharness.toolkit.training import SupervisedMethod
    torch.manual_seed(0)
    ctx = Context(Setting.CLASS_IL, 3, (4,), backbone_factory=functools.partial(MLP, (4,), hidden=5, layers=1))
    members = []
    for _ in range(2):
        method = SupervisedMethod(ctx, optimizer=optimizer, lr=0.1, **hp)
        method.labels.add(_FakeExp())
        members.append(method)
    return members


class _FakeExp:
    classes, batch_size = (0, 1, 2), 4

    def __len__(self):
        return 8


def _data():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(12, 4, generator=g)
    y = torch.randint(0, 3, (12,), generator=g)
    # member 0: batches of 4, 4, 2 (a ragged last batch); member 1: 4, 4 (runs out a step early)
    return [[(x[0:4], y[0:4]), (x[4:8], y[4:8]), (x[8:10], y[8:10])],
            [(x[2:6], y[2:6]), (x[6:10], y[6:10])]]


@pytest.mark.parametrize("optimizer,hp", [("sgd", {"momentum": 0.9, "weight_decay": 1e-3}), ("adam", {})])
def test_batched_step_equals_independent_optimizers(optimizer, hp):
    """Hand reference: each member alone, torch.optim over its own parameters, mean cross-entropy,
    one step per batch. The ensemble steps both at once; the member that runs out keeps its weights
    (SGD momentum and weight decay, Adam's moments would move them on a zero gradient)."""
    methods, data = _members(optimizer, **hp), _data()
    expected = []
    for method, batches in zip(methods, data):
        model = copy.deepcopy(method.model)
        opt = (torch.optim.SGD(model.parameters(), lr=0.1, **hp) if optimizer == "sgd"
               else torch.optim.Adam(model.parameters(), lr=0.1))
        for x, y in batches:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        expected.append([p.detach().clone() for p in model.parameters()])
    members = paused_members(methods, data)
    _train_task(members)
    for method, want in zip(methods, expected):
        for p, q in zip(method.model.parameters(), want):
            assert torch.allclose(p, q, atol=1e-6), (p - q).abs().max()
    moved = [torch.cat([p.flatten() for p in m.model.parameters()]) for m in methods]
    assert not torch.allclose(moved[0], moved[1])


def test_nonfinite_loss_fails_only_that_member():
    methods, data = _members("sgd"), _data()
    data[1][1] = (torch.full((4, 4), float("nan")), data[1][1][1])
    members = paused_members(methods, data)
    before = [p.detach().clone() for p in methods[1].model.parameters()]
    _train_task(members)
    assert members[0].error is None
    assert "non-finite loss (nan) at or before training step 2" in str(members[1].error)
    after_one = list(methods[1].model.parameters())
    assert all(torch.isfinite(p).all() for p in after_one)
    assert any(not torch.equal(p, q) for p, q in zip(after_one, before))   # its first step was taken


@pytest.mark.parametrize("name,loss", [("er", "replay_loss"), ("derpp", "train_loss")])
def test_replay_members_draw_from_their_own_memories_and_diverge_alone(name, loss):
    """Members 0 and 1 hold different memories: each ends where its solo fit ends (its replay draws from
    its own memory with its own generator, ER's replay_batch and DER++'s draw; DER++ stores each step's
    logits in its own memory). Member 2 meets a non-finite loss at step 2 and fails alone."""
    from clharness.engine.ensemble_members import _step
    from clharness.plugins import Harness
    cls, data = Harness().methods[name], _data()
    data.append([data[0][1], (torch.full((4, 4), float("nan")), data[0][0][1])])
    g = torch.Generator().manual_seed(2)
    methods = []
    for seed in range(3):
        torch.manual_seed(seed)
        ctx = Context(Setting.CLASS_IL, 3, (4,), seed=seed, batch_size=4, memory_size=6,
                      backbone_factory=functools.partial(MLP, (4,), hidden=5, layers=1))
        method = cls(ctx, lr=0.1)
        method.labels.add(_FakeExp())
        x, y = torch.randn(6, 4, generator=g), torch.randint(0, 3, (6,), generator=g)
        if name == "derpp":
            method.store(x, y, torch.randn(6, 3, generator=g))
        else:
            method.buffer.add(x, y)
        methods.append(method)
    solo = [copy.deepcopy(m) for m in methods[:2]]
    for method, batches in zip(solo, data):
        method.fit(batches, getattr(method, loss))
    members = paused_members(methods, data, lambda method: _step(method, getattr(method, loss)))
    _train_task(members)
    for method, want, m in zip(methods, solo, members):
        assert m.error is None
        for p, q in zip(method.model.parameters(), want.model.parameters()):
            assert torch.allclose(p, q, atol=1e-6), (p - q).abs().max()
        assert torch.equal(method.buffer.x, want.buffer.x) and method.gen.get_state().equal(want.gen.get_state())
        if name == "derpp":
            assert torch.allclose(method.buffer_logits, want.buffer_logits, atol=1e-6)
    assert "non-finite loss (nan) at or before training step 2" in str(members[2].error)


def test_prepare_draws_in_the_members_own_global_streams():
    """A declared step (``ensemble_steps``) whose prepare draws from the global torch stream: each member
    draws from its own (the streams it paused with), as its solo fit would, not from a shared one."""
    from clharness.engine.ensemble_members import _rng_state, _step
    from clharness.toolkit.training import SupervisedMethod

    class Noisy(SupervisedMethod):
        ensemble_steps = {"noisy_loss": ("noisy_batch", "loss", None)}

        def noisy_batch(self, x, y):
            return x + torch.randn(x.shape), y

        def noisy_loss(self, x, y):
            return self.loss(*self.noisy_batch(x, y))

    methods, data = _members("sgd"), _data()
    methods = [Noisy(m.context, optimizer="sgd", lr=0.1) for m in methods]
    for m in methods:
        m.labels.add(_FakeExp())
    data[1].append(data[0][0])   # equal lengths: member 1's draws are not all after member 0's
    solo = [copy.deepcopy(m) for m in methods]
    for e, (method, batches) in enumerate(zip(solo, data)):
        torch.manual_seed(10 + e)
        method.fit(batches, method.noisy_loss)
    members = []
    for e, (method, batches) in enumerate(zip(methods, data)):
        m = _Member(None, None)
        m.method, m.batches, m.step = method, iter(batches), _step(method, method.noisy_loss)
        torch.manual_seed(10 + e)
        m.rng = _rng_state()
        members.append(m)
    _train_task(members)
    for method, want in zip(methods, solo):
        for p, q in zip(method.model.parameters(), want.model.parameters()):
            assert torch.allclose(p, q, atol=1e-6), (p - q).abs().max()


class _BNNet(torch.nn.Module):
    """A layer the hand-batched forward does not know (BatchNorm): each member runs its own forward."""
    out_dim = 5

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.BatchNorm1d(5), torch.nn.ReLU())

    def forward(self, x):
        return self.net(x)


def test_batchnorm_members_with_ragged_batches_match_their_solo_steps():
    """Member 0's last batch has 2 samples while member 1 has 4: stepped in groups of equal size, so
    BatchNorm normalises each member's batch over its own samples only (padding would not) and the
    running statistics are each member's own."""
    from clharness.toolkit.training import SupervisedMethod
    torch.manual_seed(0)
    ctx = Context(Setting.CLASS_IL, 3, (4,), backbone_factory=_BNNet)
    methods = [SupervisedMethod(ctx, optimizer="sgd", lr=0.1, momentum=0.9) for _ in range(2)]
    for m in methods:
        m.labels.add(_FakeExp())
    data = _data()
    data[1].append((data[0][0][0] * 2, data[0][0][1]))   # member 1: 4, 4, 4 (full where member 0 is ragged)
    expected = []
    for method, batches in zip(methods, data):
        model = copy.deepcopy(method.model).train()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for x, y in batches:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        expected.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    members = paused_members(methods, data)
    _train_task(members)
    for method, want in zip(methods, expected):
        for k, v in method.model.state_dict().items():
            assert torch.allclose(v.float(), want[k].float(), atol=1e-6), k


@pytest.mark.parametrize("method,hp,scenario", [
    ("ncm", {"train_backbone": "frozen"}, {}), ("ncm", {"train_backbone": "first-task"}, {}),
    ("ewc", {"ewc_mode": "separate"}, {}), ("ewc", {"ewc_fisher": "minibatch"}, {}),
    ("er", {"buffer": "reservoir"}, {"setting": "task-incremental"}), ("er", {}, {"augment": "cifar"}),
    ("derpp", {"forward": "concat"}, {"setting": "task-incremental"}), ("derpp", {}, {"augment": "cifar"}),
    ("lwf", {"optimizer": "sgd", "lr": 0.05}, {}),
    ("cbrs", {}, {"setting": "task-incremental"}), ("cbrs", {}, {"augment": "cifar"}),
    ("mas", {"mas_variant": "aljundi-code"}, {}), ("mas", {"mas_variant": "avalanche"}, {"setting": "task-incremental"}),
    ("gdumb", {}, {"setting": "task-incremental"}), ("mste", {}, {"setting": "task-incremental"}),
    ("lwf", {"optimizer": "sgd", "lr": 0.05, "lwf_loss": "avalanche-0.6"}, {"setting": "task-incremental"})])
def test_members_equal_their_solo_runs_other_options(method, hp, scenario):
    """NCM trains its backbone on the first task only ("first-task") or never ("frozen"): a member
    pauses at that fit alone, and its class means are computed from the batched-trained weights.
    EWC's own loss reads its per-member Fishers and anchors (one per task in "separate" mode); so does
    LwF (its old model, stacked, and the classes it distils), batched with SGD (ensemble_solo_when). ER and DER++
    under augmentation draw each view with the member's own augmentation generator. MAS's importance
    variants run in the member, after its batched fit; MSTE (task-incremental only) trains a fresh expert
    per task with fit; GDumb retrains from scratch on its memory (task-incremental too)."""
    from clharness.engine.ensemble import run_ensemble
    from clharness.engine.runner import Case, resolve_hparams, run_case
    from clharness.engine.suites import load_suite
    from clharness.kinds import install
    from clharness.plugins import Harness
    harness = Harness()
    install(harness.kinds)
    suite = load_suite(harness.suites["quickstart"], quick=True)
    cls = harness.methods[method]
    spec = dataclasses.replace(suite.scenarios[0], **scenario)
    cases = [Case(suite.name, spec, method, s, resolve_hparams(cls, hp)) for s in range(3)]
    solo = [run_case(c, harness, torch.device("cpu")) for c in cases]
    ens = run_ensemble(cases, harness, torch.device("cpu"))
    for a, b in zip(solo, ens):
        assert a.status == b.status == "passed" and a.key == b.key and b.extra["executor"] == "ensemble:3"
        assert np.array_equal(a.acc_matrix, b.acc_matrix, equal_nan=True)
        assert (b.train_gflops, b.eval_gflops) == (a.train_gflops, a.eval_gflops) and a.train_gflops > 0


MINI = mini_suite(seeds=2, hidden=32, task_il=True)


def test_pytest_option_runs_members_as_ensembles(pytester, tmp_path):
    """``--clh-ensemble`` reaches the engine: the same records as a solo session (class- and
    task-incremental), each saying it ran in an ensemble of 2."""
    from clharness.results import ResultsStore
    pytester.makefile(".toml", mini=MINI)
    stores = {}
    for name, extra in (("solo", ()), ("ens", ("--clh-ensemble",))):
        stores[name] = tmp_path / f"{name}.sqlite"
        pytester.runpytest("-p", "no:cacheprovider", "mini.toml", "--clh-method", "finetune", "--clh-results",
                           str(stores[name]), *extra).assert_outcomes(passed=4)
    solo, ens = ({r.key: r for r in ResultsStore(stores[n]).records()} for n in ("solo", "ens"))
    assert solo.keys() == ens.keys() and len(ens) == 4
    for key, record in ens.items():
        assert record.extra["executor"] == "ensemble:2" and "executor" not in solo[key].extra
        assert np.array_equal(record.acc_matrix, solo[key].acc_matrix, equal_nan=True)


OPT_IN_PLUGIN = '''
import clharness as clh
from clharness.toolkit.training import SupervisedMethod


class OptedIn(SupervisedMethod):
    name = "opted-in"
    ensemble = True


class NotOptedIn(SupervisedMethod):
    name = "not-opted-in"


@clh.hookimpl
def clharness_add_methods(registry):
    registry.add(OptedIn)
    registry.add(NotOptedIn)
'''


def test_a_plugin_method_opts_in_by_its_class_attribute(tmp_path, monkeypatch):
    """Capabilities live on the method (issue 37.3): a plugin's method that declares ``ensemble = True``
    trains its seeds as one batched model; the same method without it runs solo and hears why."""
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "optplug.py").write_text(OPT_IN_PLUGIN)
    records, said = _run(tmp_path, "plug", ["opted-in", "not-opted-in"], 2, ensemble=True,
                         plugins=[str(tmp_path / "optplug.py")])
    executor = {(r.method, r.seed): r.extra.get("executor") for r in records}
    assert executor == {("opted-in", 0): "ensemble:2", ("opted-in", 1): "ensemble:2",
                        ("not-opted-in", 0): None, ("not-opted-in", 1): None}
    assert any("[not-opted-in] runs solo" in s and "'not-opted-in' has not opted in to batched training" in s
               for s in said), said


# ------------------------------------------- the executor changes no number (issue 38 item 3): per backbone
@pytest.mark.parametrize("inputs,hidden,batch,threads", [(784, 400, 128, 1), (64, 32, 32, 1), (784, 400, 32, 2)])
def test_batched_mlp_step_is_bit_identical_to_solo_fit(inputs, hidden, batch, threads):
    """The hand-batched forward at split-fmnist's MLP (784 inputs, 2 x 400 units, batches of 128) and a narrow
    one: one baddbmm per Linear, the bias inside the product as the solo addmm adds it (a bmm plus the bias
    differs by ~1e-7 at 784 inputs); a last batch of one sample, and any step at two threads, run each
    member's own forward (a batched product differs there from the solo one: 64-32 at one sample, 784-400 at
    two threads, measured). Every member's weights after the task equal its solo fit's, bit for bit."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _bit_identical_mlp_task(inputs, hidden, batch)
    finally:
        torch.set_num_threads(before)


def _bit_identical_mlp_task(inputs, hidden, batch):
    from clharness.toolkit.training import SupervisedMethod
    torch.manual_seed(0)
    ctx = Context(Setting.CLASS_IL, 3, (inputs,),
                  backbone_factory=functools.partial(MLP, (inputs,), hidden=hidden, layers=2))
    methods = [SupervisedMethod(ctx, optimizer="sgd", lr=0.1, momentum=0.9) for _ in range(2)]
    for m in methods:
        m.labels.add(_FakeExp())
    g = torch.Generator().manual_seed(3)
    data = []
    for _ in methods:
        x, y = torch.randn(2 * batch + 1, inputs, generator=g), torch.randint(0, 3, (2 * batch + 1,), generator=g)
        data.append([(x[:batch], y[:batch]), (x[batch:2 * batch], y[batch:2 * batch]), (x[2 * batch:], y[2 * batch:])])
    solo = [copy.deepcopy(m) for m in methods]
    for method, batches in zip(solo, data):
        method.fit(batches)
    _train_task(paused_members(methods, data))
    for method, want in zip(methods, solo):
        for p, q in zip(method.model.parameters(), want.model.parameters()):
            assert torch.equal(p, q), (p - q).abs().max()


@pytest.mark.parametrize("backbone", ["mlp", "cnn"])
def test_members_are_bit_identical_to_their_solo_runs_on_each_backbone(backbone):
    """The rule for keys (README, "What a record's key holds"): the ensemble executor is in no key because
    it changes no number. On the MLP the members' steps are hand-batched; on the small conv net (convolutions,
    BatchNorm, pooling) each member runs its own forward, as vmap's batched convolution summed in another
    order (members ended up to 0.019 from their solo runs). Either way every member's accuracy matrix equals
    its solo run's exactly, under the same key, so a solo session may reuse an ensemble's record and back."""
    from clharness.engine.ensemble import run_ensemble
    from clharness.engine.runner import Case, resolve_hparams, run_case
    from clharness.engine.suites import load_suite
    from clharness.kinds import install
    from clharness.plugins import Harness
    harness = Harness()
    install(harness.kinds)
    suite = load_suite(harness.suites["quickstart"], quick=True)
    spec = dataclasses.replace(suite.scenarios[0], backbone=backbone, epochs=1)
    cases = [Case(suite.name, spec, "finetune", s, resolve_hparams(harness.methods["finetune"])) for s in range(2)]
    solo = [run_case(c, harness, torch.device("cpu")) for c in cases]
    ens = run_ensemble(cases, harness, torch.device("cpu"))
    for a, b in zip(solo, ens):
        assert a.status == b.status == "passed" and b.extra["executor"] == "ensemble:2"
        assert a.key == b.key and a.acc_matrix == b.acc_matrix
        # and the same FLOPs (issue 41): the MLP's batched steps by their solo step's count, the cnn's per member
        assert (b.train_gflops, b.eval_gflops) == (a.train_gflops, a.eval_gflops) and a.train_gflops > 0
    assert solo[0].acc_matrix != solo[1].acc_matrix
