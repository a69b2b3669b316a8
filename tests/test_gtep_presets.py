r"""The GTEP paper's own configurations (appendix A.1, A.2) as data: the appendix strings parsed by
hand-checked cases, the shipped paper_configs.json, and --clh-preset gtep:<name> running the
paper's H* on D^E beside the tuned one."""
from pathlib import Path

import pytest

import clharness.engine.runner  # noqa: F401  (loaded once: pytester runs share one torch)
import clharness.reporting.scorecard  # noqa: F401
import clharness_methods  # noqa: F401
from clharness.benchmarks.gtep import kind  # noqa: F401  (loads torchvision once: it registers torch ops)
from clharness.benchmarks.gtep import paper_configs as pc
from clharness.benchmarks.gtep import protocol as gtep
from clharness.results import ResultsStore
from clharness.benchmarks.gtep import summary as gtep_summary

# Verbatim from the paper text (gtep.txt), markdown escapes included.
EXCERPT = r"""
**Best hyperparameters (CIFAR-50, 10 Tasks)** The following represents the best hyperparameters of each algorithm selected in the hyperparameter tuning phase using CIFAR-50 (10 Tasks).

- Replay: ep\_160\_milestone\_3\_lr\_0.15\_lr\_decay\_0.3\_batch\_32\_w\_decay\_0.0001\_scheduler\_cosine
- FOSTER: ep\_120\_milestone\_3\_lr\_0.1\_lr\_decay\_0.5\_batch\_32\_w\_decay\_0.0001\_scheduler\_steplr  
T\_2\_lambda\_kd\_1.5\_fe\_0.5\_beta\_0.97\_0.93\_comp\_ep\_160
- MEMO: ep\_120\_milestone\_3\_lr\_0.15\_lr\_decay\_0.1\_batch\_512\_w\_decay\_0.001\_scheduler\_steplr  
ambda\_aux\_0.5\_examplar\_bs\_32

**Best hyperparameters (ImageNet-50, 10 Tasks)** The following represents ...

- BEEF NaN

**Original hyperparameters** The following shows the original hyperparameters of each algorithm reported in PILOT.

- L2P\_ep\_10\_milestone\_3\_lr\_0.001875\_lr\_decay\_0\_batch\_32\_w\_decay\_0  
scheduler\_constant\_optimizer\_adam\_size\_10\_length\_5\_top\_k\_5\_lamb\_0.1

## B Additional Experimental Results on the Evaluation Phase
"""


def test_appendix_strings_parse_into_the_hand_checked_configurations():
    presets = pc.parse_appendix(EXCERPT)
    assert list(presets) == ["cifar50-1-10tasks", "imagenet50-1-10tasks", "pycil-original"]
    replay = presets["cifar50-1-10tasks"]["Replay"]
    assert replay["paper"] == {"ep": 160, "milestone": 3, "lr": 0.15, "lr_decay": 0.3, "batch": 32,
                               "w_decay": 0.0001, "scheduler": "cosine"}
    # cosine: the milestones and decay are ignored (appendix A.1), so they are not applied
    assert replay["method"] == "er" and replay["hparams"] == {"epochs": 160, "lr": 0.15, "batch_size": 32,
                                                             "weight_decay": 0.0001, "scheduler": "cosine"}
    foster = presets["cifar50-1-10tasks"]["FOSTER"]
    assert foster["paper"]["beta"] == [0.97, 0.93] and foster["paper"]["comp_ep"] == 160
    assert foster["hparams"] == {"epochs": 120, "num_milestones": 3, "lr": 0.1, "lr_decay": 0.5, "batch_size": 32,
                                 "weight_decay": 0.0001, "scheduler": "steplr", "temperature": 2, "kd_weight": 1.5,
                                 "fe_weight": 0.5, "beta1": 0.97, "beta2": 0.93, "compression_epochs": 160}
    memo = presets["cifar50-1-10tasks"]["MEMO"]   # the appendix's typos read as the keys they misspell
    assert memo["paper"]["lambda_aux"] == 0.5 and memo["paper"]["exemplar_bs"] == 32
    assert memo["hparams"]["aux_weight"] == 0.5 and memo["hparams"]["exemplar_batch_size"] == 32 and memo["unmapped"] == []
    assert presets["imagenet50-1-10tasks"]["BEEF"] == {"paper": None, "method": "beef", "hparams": None, "unmapped": []}
    l2p = presets["pycil-original"]["L2P"]   # the first "Original" section of an excerpt; names by position
    assert l2p["hparams"] == {"epochs": 10, "lr": 0.001875, "batch_size": 32, "weight_decay": 0, "scheduler": "constant",
                              "optimizer": "adam", "pool_size": 10, "prompt_length": 5, "top_n": 5, "pull_lambda": 0.1}
    with pytest.raises(pc.PresetError, match="'lr' has no value"):
        pc.parse_config("ep_10_lr")


def test_shipped_data_holds_every_appendix_configuration():
    data = pc.load()
    assert len(data) == 16 and sum(len(v) for v in data.values()) == 7 * 9 + 9 * 6   # A.1: 7 x 9, A.2: 9 x 6
    assert data["cifar50-1-10tasks"]["FOSTER"] == pc.parse_appendix(EXCERPT)["cifar50-1-10tasks"]["FOSTER"]
    assert data["pilot-original"]["L2P"]["hparams"] == pc.parse_appendix(EXCERPT)["pycil-original"]["L2P"]["hparams"]
    # ImageNet-R (20 tasks), Ranpac: ep_20_milestone_2_lr_0.05_lr_decay_0.3_batch_24_w_decay_0.0005
    #   scheduler_constant_optimizer_sgd_ffn_num_16_M_15000_pt_num_20
    assert pc.preset("imagenet-r-20tasks")["ranpac"] == {"epochs": 20, "lr": 0.05, "batch_size": 24,
                                                         "weight_decay": 0.0005, "scheduler": "constant",
                                                         "optimizer": "sgd", "ffn_num": 16, "projection_dim": 15000,
                                                         "prompt_tokens": 20}
    assert "beef" not in pc.preset("imagenet50-1-6tasks")   # BEEF: NaN (no configuration)
    with pytest.raises(pc.PresetError, match="no such GTEP preset; available: cifar50-1-10tasks, cifar50-1-6tasks"):
        pc.preset("cifar-10tasks")


SUITE = """
[suite]
name = "g"
methods = ["er"]

[defaults]
kind = "gtep"
backbone = "mlp"
backbone_options = { hidden = 16, layers = 1 }
validation = 0.25
task_config = "2-equal"
configurations = 1
trials = 1
memory_size = 20
search = { "*" = { epochs = [1], lr = [0.01], batch_size = [16] } }

[[scenario]]
name = "high"
tune_dataset = "synthetic"
tune_dataset_options = { num_classes = 8, image_size = 4, train_per_class = 12, test_per_class = 4 }
tune_classes = [0, 4]
eval_dataset = "synthetic"
eval_dataset_options = { num_classes = 8, image_size = 4, train_per_class = 12, test_per_class = 4 }
eval_classes = [4, 8]
"""


def test_preset_runs_the_papers_hstar_beside_the_tuned_one(pytester):
    pytester.makefile(".toml", g=SUITE)
    store = pytester.path / "r.sqlite"
    result = pytester.runpytest("-p", "no:cacheprovider", "--clh-results", str(store), "g.toml",
                                "--clh-preset", "gtep:cifar50-1-10tasks", "-v")
    # tuning c0, evaluation with the tuned H*, the paper's on D^E and on D^HT (issue 30 item 6)
    result.assert_outcomes(passed=4)
    assert "g.toml::high[er-paper-eval-t0]" in result.stdout.str()
    records = {r.scenario.split("@")[-1]: r for r in ResultsStore(store).records() if ":eval@" in r.scenario}
    paper = records["paper-cifar50-1-10tasks"]
    assert paper.hparams["lr"] == 0.15 and paper.hparams["epochs"] == 160 and paper.hparams["batch_size"] == 32
    assert paper.hparams["scheduler"] == "cosine" and paper.hparams["weight_decay"] == 0.0001
    frame = gtep_summary.summarize(ResultsStore(store).records())
    assert sorted(frame.scenario) == ["high", "high [paper H* cifar50-1-10tasks]"]
    row = next(line for line in gtep_summary.render(frame).splitlines() if "| paper: " in line)
    assert "epochs=160" in row and "lr=0.15" in row and "scheduler=cosine" in row
    bad = pytester.runpytest("-p", "no:cacheprovider", "--clh-results", str(store), "g.toml",
                             "--clh-preset", "gtep:nope")
    assert "--clh-preset gtep:nope: no such GTEP preset" in bad.stdout.str()


def test_a_dht_preset_configures_only_the_scenarios_of_its_dht_and_task_count():
    from clharness.benchmarks.gtep.presets import preset_applies
    from clharness.engine.suites import load_suite
    root = Path(__file__).parent.parent / "suites"
    vit200 = load_suite(root / "gtep-vit-200.toml")
    assert [s.name for s in vit200.scenarios if preset_applies("cub200-10tasks", s)] == ["cub-imr-10", "cub-ima-10"]
    assert [s.name for s in vit200.scenarios if preset_applies("imagenet-r-20tasks", s)] == ["imr-ima-20", "imr-cub-20"]
    assert all(preset_applies("pilot-original", s) for s in vit200.scenarios)
    # every D^HT preset of appendix A configures some shipped scenario (its name reads as one)
    specs = [s for path in root.glob("gtep-*.toml") for s in load_suite(path).scenarios]
    names = [n for n in pc.load() if n not in ("pilot-original", "pycil-original")]
    assert names and all(any(preset_applies(n, s) for s in specs) for n in names)


def test_a_preset_for_no_scenario_of_the_suite_is_refused_before_training(pytester):
    suite = (Path(__file__).parent.parent / "suites" / "gtep-vit-200.toml").read_text()
    pytester.makefile(".toml", v=suite)
    result = pytester.runpytest("-p", "no:cacheprovider", "--clh-results", "r.sqlite", "v.toml",
                                "--clh-preset", "gtep:cifar50-1-10tasks", "--co")
    assert result.ret != 0
    assert "--clh-preset gtep:cifar50-1-10tasks is for another D^HT or task count than every scenario" in result.stdout.str()


def test_collection_adds_the_papers_runs_only_to_the_scenarios_a_preset_configures(pytester):
    suite = (Path(__file__).parent.parent / "suites" / "gtep-cifar50.toml").read_text()
    pytester.makefile(".toml", c=suite)
    result = pytester.runpytest("-p", "no:cacheprovider", "--clh-results", "r.sqlite", "c.toml", "--clh-method", "er",
                                "--clh-preset", "gtep:cifar50-1-6tasks", "--co", "-q")
    paper = [line for line in result.stdout.lines if "-paper-" in line]
    assert paper and all("::high-6[" in line or "::low-6[" in line for line in paper)
