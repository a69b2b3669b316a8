"""GTEP protocol points of issue 30 (items 1-6), each pinned against the paper's text
("Hyperparameters in continual learning: a reality check", appendix A.1-A.2)."""
import math
from pathlib import Path

import pytest
import torch

import clharness as clh
from clharness.engine.family_session import FamilyServices
from clharness.toolkit.backbones import MLP
from clharness.benchmarks.gtep import search as gtep_search, summary as gtep_summary

ROOT = Path(__file__).resolve().parent.parent
SUITES = ROOT / "suites"
DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="module")
def harness():
    return clh.Harness()


# --- item 1: Table 3's first task follows the sampled scheduler kind, for exemplar methods too ---------
TABLE3_SMALL = {"epochs": 8, "lr": 0.1, "milestones": [3, 6], "lr_decay": 0.1, "weight_decay": 5e-4}


def first_task_lrs(harness, method, scheduler):
    """lr factor of each of the first task's epochs, read from the trainer ``task_trainer`` builds."""
    from clharness.method import Experience
    ctx = clh.Context(clh.Setting.CLASS_IL, 4, (1, 2, 2), seed=0, epochs=2, batch_size=2, memory_size=4,
                      backbone_factory=lambda: MLP((1, 2, 2), hidden=6, layers=1), first_task_train=TABLE3_SMALL)
    m = harness.methods[method](ctx, scheduler=scheduler, lr=0.03, weight_decay=1e-3)
    exp = type("E", (), {"classes": (0, 1), "task_id": None, "batch_size": 2, "__len__": lambda self: 6})()
    m.labels.add(exp)
    trainer, epochs = m.task_trainer()
    group = trainer.optimizer.param_groups[0]
    if trainer.scheduler is None:
        return epochs, group["weight_decay"], [group["lr"]] * epochs
    base = group["initial_lr"]
    return epochs, group["weight_decay"], [base * trainer.scheduler.lr_lambdas[0](e) for e in range(epochs)]


@pytest.mark.parametrize("method", ["icarl", "bic", "wa", "podnet"])
def test_first_task_of_exemplar_methods_follows_table3_with_the_sampled_scheduler(harness, method):
    # Table 3: init epochs / lr / weight decay always; init milestones "only applied when 'StepLR' is selected"
    epochs, wd, cosine = first_task_lrs(harness, method, "cosine")
    assert (epochs, wd) == (8, 5e-4)
    assert cosine == pytest.approx([0.1 * (1 + math.cos(math.pi * e / 8)) / 2 for e in range(8)])
    _, _, step = first_task_lrs(harness, method, "steplr")
    assert step == pytest.approx([0.1, 0.1, 0.1, 0.01, 0.01, 0.01, 0.001, 0.001])
    _, _, constant = first_task_lrs(harness, method, "constant")
    assert constant == pytest.approx([0.1] * 8)


# --- item 2: every D^HT -> D^E pair the paper reports for pretrained models, in 20 and 10 tasks --------
SIDES = {"CUB-200": ("cub200", {}, []), "ImageNet-R": ("imagenet-r", {}, []),   # paper name -> dataset, options, classes
         "ImageNet-A": ("imagefolder", {"path": "imagenet-a"}, []),
         "CUB-100-1": ("cub200", {}, [0, 100]), "CUB-100-2": ("cub200", {}, [100, 200]),
         "ImageNet-R-1": ("imagenet-r", {}, [0, 100]), "ImageNet-R-2": ("imagenet-r", {}, [100, 200]),
         "ImageNet-A-2": ("imagefolder", {"path": "imagenet-a"}, [100, 200])}


def paper_pairs():
    """{(D^HT, D^E, tasks)} from the captions and column headings of Tables 15-22 (tests/data)."""
    import re
    pairs, dht = set(), None
    for line in (DATA / "gtep_pretrained_pairs.txt").read_text().splitlines():
        caption = re.match(r"^Table (1[5-9]|2[0-2]):.*D\^\{HT\} = \\text\{([^}]+)\}", line)
        if caption:
            dht = caption.group(2)
            continue
        heading = re.match(r"^(10|20) Tasks \(Acc / AvgAcc\)\t(.*)$", line)
        if heading and dht:
            for cell in heading.group(2).split("\t"):
                name = re.search(r"([A-Za-z]+-[A-Za-z0-9-]+?)(?:\}\$)?$", cell.strip()).group(1)
                pairs.add((dht, name, int(heading.group(1))))
            dht = None
    return pairs


def suite_pairs(name):
    from clharness.engine.suites import load_suite
    out = set()
    for s in load_suite(SUITES / f"{name}.toml").scenarios:
        o = s.options
        tasks = int(o["task_config"].split("-")[0])
        out.add(repr(((o["tune_dataset"], dict(o["tune_dataset_options"]), list(o["tune_classes"])),
                      (o["eval_dataset"], dict(o["eval_dataset_options"]), list(o["eval_classes"])), tasks)))
    return sorted(out)


def as_suite(pairs):
    return sorted({repr((SIDES[a], SIDES[b], t)) for a, b, t in pairs})


def test_pretrained_suites_ship_every_pair_of_tables_15_to_22():
    pairs = paper_pairs()
    assert len(pairs) == 2 * 2 * 2 + 2 * 3 * 2            # 200-class: 2 D^HT x 2 D^E x 2; 100-class: 2 x 3 x 2
    assert ("ImageNet-R", "CUB-200", 20) in pairs and ("ImageNet-R", "CUB-200", 10) in pairs   # Tables 17-18
    whole = {p for p in pairs if p[0] in ("CUB-200", "ImageNet-R")}   # Table 2 rows 1-2: whole datasets
    halves = pairs - whole
    assert suite_pairs("gtep-vit-200") == as_suite(whole)
    assert suite_pairs("gtep-vit") == as_suite(halves)


# --- item 4: every Table 4/5 search space equals the paper's, cell by cell ------------------------------
PAPER_METHODS = {"Replay": "er", "iCaRL": "icarl", "BiC": "bic", "WA": "wa", "PODNet": "podnet", "DER": "der",
                 "MEMO": "memo", "FOSTER": "foster", "BEEF": "beef", "L2P": "l2p", "DualPrompt": "dualprompt",
                 "CODA-Prompt": "coda_prompt", "Adam-Adapter": "aper", "Ranpac": "ranpac", "EASE": "ease"}
GENERAL_NAMES = {"Epoch": "epochs", "LR": "lr", "Num milestones": "num_milestones", "LR decay": "lr_decay",
                 "Batch size": "batch_size", "Weigh decay": "weight_decay", "LR Scheduler": "scheduler",
                 "Optimizer": "optimizer"}
# (paper method, paper name) -> our hyperparameter; the paper's row names written as the tables do
OWN_NAMES = {"T (KD)": "temperature", "Split ratio": "split_ratio", "Num proxy": "proxies",
             "Post FT LR": "finetune_lr", "Adaptive factor": "adaptive_factor", "Energy weight": "energy_weight",
             "Logit alignment": "logits_alignment", "$\\beta_1$": "beta1", "$\\beta_2$": "beta2",
             "$\\lambda$ (FE)": "fe_weight", "Length ( $L_p$ )": "prompt_length", "Top k": "top_n",
             "Prompt length of g ( $L_g$ )": "g_length", "Length ( $L_e$ )": "e_length",
             "Orthogonality Mu": "ortho_mu", "FFN num": "ffn_num", "M": "projection_dim",
             "Prompt token num": "prompt_tokens", "$\\alpha$": "alpha", "$\\lambda$": "pull_lambda",
             "Exemplar batch size": "exemplar_batch_size"}
PER_METHOD = {("$\\lambda$ (KD)", "foster"): "kd_weight", ("$\\lambda$ (KD)", None): "kd_lambda",
              ("$\\lambda$ (Aux)", "icarl"): "kd_lambda", ("$\\lambda$ (Aux)", "podnet"): "lambda_f",
              ("$\\lambda$ (Aux)", None): "aux_weight", ("Post FT epochs", "podnet"): "finetune_epochs",
              ("Post FT epochs", "foster"): "compression_epochs", ("Post FT epochs", "beef"): "fusion_epochs",
              ("M Size", None): "pool_size", ("Pool size", None): "pool_size", ("Prompt length", None): "prompt_length"}


def _values(text):
    import ast
    return list(ast.literal_eval(text.replace("'StepLR'", "'steplr'").replace("'Cosine'", "'cosine'")))


def _cells(text, methods):
    """'[a] (for X, Y) / [b] (for Z)' or '[a] / [b] (Z and W)' -> {our method: values}."""
    import re
    parts = [p.strip() for p in text.split(" / ")]
    out = {}
    if len(parts) == 1:
        return {m: _values(re.sub(r"\s*\(.*\)$", "", parts[0])) for m in methods}
    named = {}
    for part in parts:
        m = re.match(r"^(\[.*?\])\s*(?:\((?:for )?(.*)\))?$", part)
        names = [n.strip() for n in re.split(r",| and ", m.group(2) or "") if n.strip()]
        named[tuple(PAPER_METHODS[n] for n in names)] = _values(m.group(1))
    rest = [k for k in named if not k]
    for m in methods:
        hit = [v for k, v in named.items() if m in k]
        out[m] = hit[0] if hit else named[rest[0]]
    return out


def paper_table(path, all_methods):
    """{(our method, our hyperparameter or the paper's name): values} of one table's text."""
    rows, current = {}, None
    for line in (DATA / path).read_text().splitlines():
        cols = line.split("\t")
        if len(cols) != 3 or cols[1] == "Hyperparameter Name":
            continue
        who, name, cells = cols
        if who:
            current = who
        if current == "All algorithms":
            methods, ours = all_methods, GENERAL_NAMES[name]
        else:
            import re
            methods = [PAPER_METHODS[n.strip()] for n in re.split(r",| and ", current) if n.strip()]
            ours = None
        for m, values in _cells(cells, methods).items():
            from clharness.benchmarks.gtep.spaces import NO_COUNTERPART
            key = (name if (m, name) in NO_COUNTERPART
                   else ours or OWN_NAMES.get(name) or PER_METHOD.get((name, m)) or PER_METHOD.get((name, None)))
            assert key, (name, m)
            rows[(m, key)] = values
    return rows


def our_table(harness, general, methods):
    from clharness.benchmarks.gtep import protocol as gtep
    from clharness.benchmarks.gtep.spaces import NO_COUNTERPART
    rows = {}
    for m in methods:
        ms = gtep_search.method_space(harness.methods[m], {"general": general, "fixed": {"momentum": 0.9}})
        for key, p in ms.space.items():
            rows[(m, key)] = list(p.values)
        rows.update({(m, n): "no counterpart" for (mm, n) in NO_COUNTERPART if mm == m})
    return rows


def _same(paper, ours):
    assert set(paper) == set(ours), (sorted(set(paper) - set(ours)), sorted(set(ours) - set(paper)))
    for key in sorted(paper):
        if ours[key] == "no counterpart":
            continue
        assert [float(v) if not isinstance(v, (bool, str)) else v for v in paper[key]] == \
               [float(v) if not isinstance(v, (bool, str)) else v for v in ours[key]], key


TABLE4_METHODS = ["er", "icarl", "bic", "wa", "podnet", "der", "memo", "foster", "beef"]
TABLE5_METHODS = ["l2p", "dualprompt", "coda_prompt", "aper", "ranpac", "ease"]


def test_table4_spaces_equal_the_papers_cell_by_cell(harness):
    paper = paper_table("gtep_table4.txt", TABLE4_METHODS)
    # Table 4's optimizer is SGD for all (sec. 5), not a printed row
    paper.update({(m, "optimizer"): ["sgd"] for m in TABLE4_METHODS})
    assert paper[("memo", "exemplar_batch_size")] == [16, 32, 64, 128, 256]   # PyCIL memo.py's herding batch
    _same(paper, our_table(harness, "table4", TABLE4_METHODS))


def test_table5_spaces_equal_the_papers_cell_by_cell(harness):
    paper = paper_table("gtep_table5.txt", TABLE5_METHODS)
    for m in ("ranpac", "ease"):   # the batch-size row names L2P..Adam-Adapter; the appendix samples it for all
        paper[(m, "batch_size")] = paper[("l2p", "batch_size")]
    assert paper[("dualprompt", "pool_size")] == [10, 15, 20, 25, 30]         # M Size: the code's --size
    _same(paper, our_table(harness, "table5", TABLE5_METHODS))


def test_spaces_option_method_reading_keeps_the_methods_declared_space(harness):
    from clharness.benchmarks.gtep import protocol as gtep
    coda = harness.methods["coda_prompt"]
    paper = gtep_search.method_space(coda, {"general": "table5"})
    method = gtep_search.method_space(coda, {"general": "table5", "spaces": "method"})
    assert paper.space["lr"].values == (0.000875, 0.001375, 0.001875, 0.002375, 0.0025)   # prompt column
    assert method.space["lr"].values == (0.01, 0.02, 0.03, 0.04, 0.05)
    podnet = harness.methods["podnet"]
    assert "lambda_f" in gtep_search.method_space(podnet, {"general": "table4"}).space
    assert "lambda_f" not in gtep_search.method_space(podnet, {"general": "table4", "spaces": "method"}).space


# --- item 6: the paper's configurations run on D^HT too (the "Original" bars, Tables 7 and 14) ----------
PRESET_SUITE = """
[suite]
name = "g"
methods = ["er"]

[defaults]
kind = "gtep"
backbone = "mlp"
backbone_options = { hidden = 8, layers = 1 }
memory_size = 8
validation = 0.25
configurations = 1
trials = 1
general = "table4"
search = { "*" = { epochs = [1], batch_size = [16] } }
tune_dataset = "synthetic"
tune_dataset_options = { num_classes = 8, image_size = 4, train_per_class = 12, test_per_class = 4 }
eval_dataset = "synthetic"
eval_dataset_options = { num_classes = 8, image_size = 4, train_per_class = 12, test_per_class = 4 }
task_config = "2-equal"
tune_classes = [0, 4]

[[scenario]]
name = "high"
eval_classes = [4, 8]

[[scenario]]
name = "high-too"
eval_classes = [4, 8]
"""


def test_preset_runs_the_papers_configuration_on_dht_and_on_de(pytester):
    import clharness.engine.runner  # noqa: F401
    from clharness.benchmarks.gtep import protocol as gtep
    from clharness.results import ResultsStore
    pytester.makefile(".toml", g=PRESET_SUITE)
    store = pytester.path / "r.sqlite"
    result = pytester.runpytest("-p", "no:cacheprovider", "--clh-results", str(store), "g.toml",
                                "--clh-preset", "gtep:pycil-original", "-v")
    out = result.stdout.str()
    # per scenario: tuning c0, tuned evaluation, paper on D^E, paper on D^HT; the two scenarios share one D^HT
    result.assert_outcomes(passed=8)
    assert "g.toml::high[er-paper-tune-t0]" in out and "g.toml::high-too[er-paper-tune-t0]" in out
    records = ResultsStore(store).records()
    on_dht = [r for r in records if ":tune@paper-" in r.scenario]
    assert len(on_dht) == 1                                 # one run, shared by the scenarios of one D^HT
    r = on_dht[0]
    # Replay's original (appendix A.1): ep 70, lr 0.1, batch 128, w_decay 2e-4, steplr
    assert (r.hparams["epochs"], r.hparams["lr"], r.hparams["batch_size"]) == (70, 0.1, 128)
    assert r.hparams["weight_decay"] == 0.0002 and r.hparams["scheduler"] == "steplr"
    tuned = next(t for t in records if ":tune-c0" in t.scenario)
    assert r.scenario.split(":")[0] == tuned.scenario.split(":")[0]    # the same tuning id: D^HT's validation split
    frame = gtep_summary.summarize(records)
    row = frame[frame.scenario == "high [paper H* pycil-original]"].iloc[0]
    assert row.tune_acc == pytest.approx(r.metrics["final_acc"])     # its D^HT score beside its D^E score
    paper_eval = next(e for e in records if e.scenario == "high:eval@paper-pycil-original")
    assert row.eval_acc == pytest.approx(paper_eval.metrics["final_acc"])
    assert row.gap == pytest.approx(r.metrics["final_acc"] - paper_eval.metrics["final_acc"])


# --- item 5: SGD momentum 0.9 for every GTEP method (sec. 5; LAMDA-PILOT's get_optimizer for ViT methods) ---
GTEP_SUITES = ["gtep-cifar50", "gtep-imagenet100", "gtep-imagenet50", "gtep-vit", "gtep-vit-200"]


@pytest.mark.parametrize("suite_name", GTEP_SUITES)
def test_every_gtep_method_trains_with_sgd_momentum_0_9(harness, suite_name):
    from clharness.benchmarks.gtep import protocol as gtep
    from clharness.benchmarks.gtep.spaces import PAPER_SPACES
    from clharness.engine.suites import load_suite
    suite = load_suite(SUITES / f"{suite_name}.toml")
    spec = suite.scenarios[0]
    methods = set(suite.methods) | set(PAPER_SPACES[spec.options["general"]])
    checked = 0
    for m in sorted(methods):
        cls = harness.methods[m]
        if "momentum" not in cls.hparams:
            continue
        space = gtep_search.method_space(cls, spec.options)
        config = {**gtep_search.draw(space.space, "t", m, 0), "optimizer": "sgd"}   # momentum exists with SGD only
        case = gtep.make_case(FamilyServices(), suite, spec, cls, suite.hparams.get(m, {}), space, config, "eval", 0)
        assert case.hparams.get("momentum", cls.hparams["momentum"].default) == 0.9, m   # defaults stay implicit
        checked += 1
    assert checked >= 4


def test_momentum_knob_reaches_the_sgd_optimizer():
    from clharness.toolkit.training import make_optimizer
    w = torch.nn.Parameter(torch.ones(1))
    for momentum, expected in ((0.9, 1.0 + 1.9), (0.0, 1.0 + 1.0)):   # two steps of grad 1, lr 1: m_2 = 1 + momentum
        w.data.fill_(0.0)
        opt = make_optimizer([w], "sgd", 1.0, momentum, 0.0)
        for _ in range(2):
            opt.zero_grad()
            (-w).sum().backward()                                      # grad -1: w grows by the step
            opt.step()
        assert w.item() == pytest.approx(expected)


# --- item 3: D^E runs the architecture and input size the paper uses for that dataset (sec. 5) ---------
# "We use ResNet-18 and ResNet-32 architectures": ResNet-32 on CIFAR (32x32), ResNet-18 on ImageNet (224x224)
PAPER_ARCH = {"cifar100": ("resnet32", [32, 32]), "imagefolder:imagenet": ("resnet18", [224, 224])}


def _arch(spec):
    name = spec.backbone_options.get("model", spec.backbone) if spec.backbone == "timm" else spec.backbone
    size = spec.image_size or (spec.dataset_options.get("image_size") if spec.dataset_options else None)
    return name, list(size) if size else [32, 32]   # cifar100's own size when none is given


@pytest.mark.parametrize("suite_name", ["gtep-cifar50", "gtep-imagenet50", "gtep-imagenet100"])
def test_each_phase_runs_the_papers_architecture_for_its_dataset(harness, suite_name):
    from clharness.benchmarks.gtep import protocol as gtep
    from clharness.engine.suites import load_suite
    suite = load_suite(SUITES / f"{suite_name}.toml")
    cls = harness.methods["finetune"]
    for spec in suite.scenarios:
        space = gtep_search.method_space(cls, spec.options)
        config = gtep_search.draw(space.space, "t", "finetune", 0)
        for phase in ("tune", "eval"):
            case = gtep.make_case(FamilyServices(), suite, spec, cls, {}, space, config, phase, 0, k=0 if phase == "tune" else None)
            run = case.scenario
            where = run.dataset + (f":{run.dataset_options['path']}" if "path" in run.dataset_options else "")
            assert _arch(run) == PAPER_ARCH[where], (spec.name, phase)
            assert run.augment == ("cifar" if where == "cifar100" else "imagenet"), (spec.name, phase)
            # trained from scratch, as section 5 does (no pretrained weights in the non-pretrained suites)
            assert not run.backbone_options.get("pretrained", False) and "checkpoint" not in run.backbone_options


def test_eval_spec_changes_only_the_evaluation_phase(harness):
    from clharness.benchmarks.gtep import protocol as gtep
    from clharness.engine.suites import load_suite, with_overrides
    suite = load_suite(SUITES / "gtep-cifar50.toml")
    spec = next(s for s in suite.scenarios if s.name == "low-10")
    cls = harness.methods["finetune"]
    space = gtep_search.method_space(cls, spec.options)
    config = gtep_search.draw(space.space, "t", "finetune", 0)
    tune = gtep.make_case(FamilyServices(), suite, spec, cls, {}, space, config, "tune", 0, k=0, tuning="x")
    plain = with_overrides(spec, options={**spec.options, "eval_spec": {}})
    assert gtep.tuning_id(spec) == gtep.tuning_id(plain)          # the D^HT runs are shared either way
    assert tune.scenario.backbone == "resnet32"
    evaluated = gtep.make_case(FamilyServices(), suite, spec, cls, {}, space, config, "eval", 0).scenario
    assert (evaluated.backbone, evaluated.image_size) == ("timm", [224, 224])
    assert gtep.make_case(FamilyServices(), suite, plain, cls, {}, space, config, "eval", 0).scenario.backbone == "resnet32"
