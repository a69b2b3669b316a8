"""M2I / I2M: the authors' protocol (issue 15 item 11), each definition pinned on a hand-made case.

The authors' public code (lifelonglab/M2I_I2M_benchmark, Avalanche 0.2.1) differs from the paper's
text: task-incremental runs share one head with labels 0-9 in every task, EWC keeps one penalty per
past task (Avalanche's mode="separate"), LwF adds distillation to plain cross-entropy over all
outputs, and their analysis code computes BWT as the mean of R[t,e] - R[t-1,e]."""
import numpy as np
import pytest

from clharness import metrics as M


# --- BWT as the authors' analysis code computes it --------------------------------------------

R3 = [[0.9, 0.1, 0.2],
      [0.6, 0.8, 0.1],
      [0.3, 0.5, 0.7]]


def test_bwt_authors_is_the_mean_of_consecutive_changes_on_earlier_tasks():
    # bwt_from_eval_results: for t in 1..2, e < t: R[t,e] - R[t-1,e]; three pairs
    by_hand = ((0.6 - 0.9) + (0.3 - 0.6) + (0.5 - 0.8)) / 3
    assert M.bwt_authors(R3) == pytest.approx(by_hand) == pytest.approx(-0.3)
    # eq. 2 compares every later step with R[j,j]: (0.6-0.9) + (0.3-0.9) + (0.5-0.8) over 3 pairs
    assert M.bwt(R3) == pytest.approx(-0.4)
    # the sum telescopes per task to R[T-1,e] - R[e,e], divided by T(T-1)/2 pairs
    R = np.random.default_rng(0).uniform(size=(6, 6))
    assert M.bwt_authors(R) == pytest.approx(sum(R[5, e] - R[e, e] for e in range(5)) / 15)
    assert M.bwt_authors([[0.4]]) == 0.0
    assert M.all_metrics(R3)["bwt_authors"] == M.bwt_authors(R3)


def test_bwt_authors_ignores_the_upper_triangle():
    R = np.array(R3)
    R[0, 1:] = np.nan
    R[1, 2] = np.nan
    assert M.bwt_authors(R) == pytest.approx(-0.3)


# --- the shared head of the authors' task-incremental protocol --------------------------------

import json  # noqa: E402
import math  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

import clharness as clh  # noqa: E402
import clharness.engine.runner  # noqa: E402,F401  (keep torch loaded across pytester's in-process runs)
import clharness_methods  # noqa: E402,F401
from clharness.toolkit.backbones import MLP  # noqa: E402
from clharness.benchmarks.m2i import effect  # noqa: E402
from clharness.data import BUILTIN_SOURCES  # noqa: E402
from clharness.results import RunRecord  # noqa: E402
from clharness.engine.scenario import build_scenario  # noqa: E402
from clharness.engine.suites import SuiteError, load_suite, spec_definition, with_overrides  # noqa: E402

from curriculum_fakedata import write_six  # noqa: E402
from test_methods_reference import METHODS, split  # noqa: E402,F401
from test_methods_reference import digits  # noqa: E402,F401  (fixture)

CPU = torch.device("cpu")
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return write_six(tmp_path_factory.mktemp("six"))


def _spec(suite, setting, **options):
    spec = next(s for s in load_suite(f"suites/{suite}.toml").scenarios if s.setting == setting)
    return with_overrides(spec, options={**spec.options, **options}) if options else spec


def test_authors_task_incremental_shares_one_ten_way_head(root):
    spec = _spec("m2i", "task-incremental")
    assert spec.options["protocol"] == "authors"          # the real suites run the authors' protocol
    sc = build_scenario(spec, BUILTIN_SOURCES, 0, CPU, root)
    assert sc.num_classes == 10 and all(t.classes == tuple(range(10)) for t in sc.tasks)
    svhn = sc.tasks[3]                                     # task 3 (0-based) of M2I: SVHN, labels 0..9
    svhn_classes = BUILTIN_SOURCES["svhn"]().load(root, True).classes
    assert sc.extra["task_names"][3] == "svhn"
    for data in (svhn.train, svhn.test):
        assert sorted(set(data.labels.tolist())) == list(range(10))
    # output k names class k of each task, in learning order
    parts = sc.class_names[0].split(" | ")
    assert [p.split("/")[0] for p in parts] == sc.extra["task_names"] and parts[3] == "svhn/" + svhn_classes[0]
    # the textbook protocol: global labels, task 3 owns 30..39
    text = build_scenario(_spec("m2i", "task-incremental", protocol="textbook"), BUILTIN_SOURCES, 0, CPU, root)
    assert text.num_classes == 60 and text.tasks[3].classes == tuple(range(30, 40))
    assert sorted(set(text.tasks[3].test.labels.tolist())) == list(range(30, 40))
    # same images either way: only the labels move
    assert torch.equal(text.tasks[3].train.labels - 30, svhn.train.labels)
    # class-incremental runs are the same under both protocols (class_ids_from_zero_from_first_exp)
    ci = build_scenario(_spec("m2i", "class-incremental"), BUILTIN_SOURCES, 0, CPU, root)
    assert ci.num_classes == 60 and ci.tasks[3].classes == tuple(range(30, 40))


def test_protocol_option_is_checked_and_left_out_of_old_keys(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[suite]\nname = "bad"\n[[scenario]]\nname = "x"\nkind = "curriculum"\nprotocol = "paper"\n')
    with pytest.raises(SuiteError, match="protocol = 'paper'; allowed: 'textbook', 'authors'"):
        load_suite(path)
    mini = load_suite("suites/m2i-mini.toml").scenarios[0]
    assert mini.options["protocol"] == "textbook"
    assert "protocol" not in spec_definition(mini)["options"]     # m2i-mini's stored keys do not move
    authors = with_overrides(mini, options={**mini.options, "protocol": "authors"})
    assert spec_definition(authors)["options"]["protocol"] == "authors"


def test_curriculum_effect_reads_the_direction_of_shared_head_runs(root):
    for suite, expected in (("m2i", "m2i"), ("i2m", "i2m")):
        sc = build_scenario(_spec(suite, "task-incremental"), BUILTIN_SOURCES, 0, CPU, root)
        record = RunRecord(suite=suite, scenario="ti", method="finetune", seed=0, class_order=sc.class_names)
        assert effect.direction(record) == expected


# --- LwF as Avalanche 0.2.1 computes it --------------------------------------------------------

NEW = [1.0, 2.0, 0.5, -1.0]
OLD = [0.3, -0.2, 1.5, 0.1]


def _softmax(v, T):
    e = [math.exp(a / T) for a in v]
    return [a / sum(e) for a in e]


def _lwf_by_hand(y, units, alpha, T):
    ce = -math.log(_softmax(NEW, 1.0)[y])                   # plain cross-entropy over all four outputs
    q = _softmax([OLD[u] for u in units], T)                  # old model, distilled units only
    p = _softmax([NEW[u] for u in units], T)
    return ce + alpha * sum(qi * (math.log(qi) - math.log(pi)) for qi, pi in zip(q, p))   # KL(q || p)


@pytest.mark.parametrize("setting, units", [(clh.Setting.CLASS_IL, [2, 3]), (clh.Setting.TASK_IL, [0, 1])])
@pytest.mark.parametrize("T", [1.0, 2.0])
def test_lwf_avalanche_loss_by_hand(setting, units, T):
    ctx = clh.Context(setting, 4, (1, 1, 1), backbone_factory=lambda: MLP((1, 1, 1)),
                      task_classes=((0, 1), (2, 3)) if setting is clh.Setting.TASK_IL else ())
    lwf = METHODS["lwf"](ctx, lwf_loss="avalanche-0.2.1", lwf_lambda=2.0, temperature=T)
    lwf.labels.tasks = [(0, 1), (2, 3)]
    lwf.avalanche_units = units                               # prev_classes["0"] (tests/test_fidelity_replay.py)
    lwf.model = lambda x: x                                   # the "inputs" are the new logits
    lwf.old_model = lambda x: torch.tensor([OLD])
    x = torch.tensor([NEW])
    assert float(lwf.loss(x, torch.tensor([2]))) == pytest.approx(_lwf_by_hand(2, units, 2.0, T), rel=1e-6)
    lwf.old_model = None                                      # first task: cross-entropy alone
    assert float(lwf.loss(x, torch.tensor([2]))) == pytest.approx(-math.log(_softmax(NEW, 1.0)[2]), rel=1e-6)


def test_lwf_default_loss_is_unchanged_and_keeps_old_keys():
    from clharness.engine.runner import Case, versions
    lwf = METHODS["lwf"]
    spec = load_suite("suites/quickstart.toml").scenarios[0]
    default = Case("q", spec, "lwf", 0, clharness.engine.runner.resolve_hparams(lwf, {}))
    assert default.hparams["lwf_loss"] == "li-hoiem"
    assert "lwf_loss" not in default.definition(lwf, versions())["hparams"]
    avalanche = Case("q", spec, "lwf", 0, clharness.engine.runner.resolve_hparams(lwf, {"lwf_loss": "avalanche-0.2.1"}))
    assert avalanche.definition(lwf, versions())["hparams"]["lwf_loss"] == "avalanche-0.2.1"


# --- EWC in Avalanche's separate mode -----------------------------------------------------------

def test_ewc_separate_penalty_is_the_sum_over_past_tasks_by_hand():
    torch.manual_seed(0)
    ctx = clh.Context(clh.Setting.CLASS_IL, 2, (1, 1, 1), backbone_factory=lambda: MLP((1, 1, 1)))
    ewc = METHODS["ewc"](ctx, ewc_mode="separate", ewc_lambda=3.0)
    w = {k: p.detach().clone() for k, p in ewc.model.named_parameters()}
    # two past tasks: Fisher 1 anchored 0.5 below the weights, Fisher 2 anchored 1 above
    ewc.task_fishers = [{k: torch.ones_like(v) for k, v in w.items()}, {k: torch.full_like(v, 2.0) for k, v in w.items()}]
    ewc.task_anchors = [{k: v - 0.5 for k, v in w.items()}, {k: v + 1.0 for k, v in w.items()}]
    n = sum(v.numel() for v in w.values())
    by_hand = n * (1 * 0.25) + n * (2 * 1.0)                  # sum_t sum_i F_t,i (w_i - w*_t,i)^2
    assert float(ewc.separate_penalty().detach()) == pytest.approx(by_hand)
    x, y = torch.zeros(4, 1, 1, 1), torch.tensor([0, 1, 0, 1])
    ce = torch.nn.functional.cross_entropy(ewc.model(x), y)
    assert float(ewc.loss(x, y).detach()) == pytest.approx(float(ce.detach()) + 3.0 / 2 * by_hand, rel=1e-6)   # eq. 3: lambda / 2


def _per_sample_grads(model, x, y):
    out = []
    for i in range(len(x)):
        loss = torch.nn.functional.cross_entropy(model(x[i:i + 1]), y[i:i + 1])
        out.append(torch.autograd.grad(loss, [model.head.weight])[0])
    return torch.stack(out)


def test_ewc_minibatch_fisher_is_avalanches_squared_minibatch_gradient(digits):  # noqa: F811
    tasks, exps, _ = split(digits, 0)
    torch.manual_seed(0)
    ewc = METHODS["ewc"](clh.Context(clh.Setting.CLASS_IL, 10, (1, 8, 8), batch_size=32,
                                     backbone_factory=lambda: MLP((1, 8, 8))), ewc_fisher="minibatch")
    exp = exps[0]
    ewc.labels.add(exp)
    x, y = exp.tensors()
    g = _per_sample_grads(ewc.model.eval(), x, y)
    # Avalanche: mean over minibatches (in order) of (minibatch-mean gradient)^2
    batches = [slice(i, i + exp.batch_size) for i in range(0, len(x), exp.batch_size)]
    by_hand = sum(g[b].mean(0).pow(2) for b in batches) / len(batches)
    fisher = ewc.minibatch_fisher(exp)
    assert torch.allclose(fisher["head.weight"], by_hand, atol=1e-7)
    # the per-sample (empirical) Fisher is the mean of squared per-sample gradients: larger here
    per_sample = ewc.sample_fisher(exp)["head.weight"]
    assert torch.allclose(per_sample, g.pow(2).mean(0), atol=1e-7)
    assert float(per_sample.sum()) > 2 * float(fisher["head.weight"].sum())


# --- a quick m2i-mini run under the authors' protocol ---------------------------------------------

AUTHORS_MINI = '''
[[scenario]]
name = "ti-m2i"
setting = "task-incremental"
curriculum = "m2i"

[hparams.ewc]
optimizer = "sgd"
lr = 0.05
momentum = 0.9
ewc_lambda = 2.0
ewc_mode = "separate"
ewc_fisher = "minibatch"

[hparams.lwf]
optimizer = "sgd"
lr = 0.05
momentum = 0.9
lwf_lambda = 2.0
temperature = 1.0
lwf_loss = "avalanche-0.2.1"
'''


def test_m2i_mini_runs_under_the_authors_protocol_quick(pytester, tmp_path):
    text = (REPO / "suites" / "m2i-mini.toml").read_text()
    text = text.replace('name = "m2i-mini"', 'name = "m2i-mini-authors"', 1)
    text = text.replace('kind = "curriculum"\n', 'kind = "curriculum"\nprotocol = "authors"\n', 1)
    suite = tmp_path / "m2i-mini-authors.toml"
    suite.write_text(text + AUTHORS_MINI)
    card = tmp_path / "card.json"
    result = pytester.runpytest("--clh-suite", str(suite), "--clh-quick", "--clh-seeds", "1", "--clh-method", "ewc",
                                "--clh-method", "lwf", "--clh-device", "cpu", "-k", "ti-m2i",
                                "--clh-results", str(tmp_path / "r.sqlite"), "--clh-scorecard", str(card),
                                "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    records = json.loads(card.read_text())["records"]
    assert sorted(r["method"] for r in records) == ["ewc", "lwf"]
    for r in records:
        R = np.array(r["acc_matrix"])
        assert r["status"] == "passed" and R.shape == (6, 6) and np.isfinite(R).all()
        assert len(r["class_order"]) == 10                      # one shared 10-way head
        assert r["metrics"]["bwt_authors"] == pytest.approx(M.bwt_authors(R))
        assert r["metrics"]["bwt"] == pytest.approx(M.bwt(R))
    hp = {r["method"]: r["hparams"] for r in records}
    assert hp["ewc"]["ewc_mode"] == "separate" and hp["ewc"]["ewc_fisher"] == "minibatch"
    assert hp["lwf"]["lwf_loss"] == "avalanche-0.2.1"
