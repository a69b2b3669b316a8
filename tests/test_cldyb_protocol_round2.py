"""CLDyB protocol points of issue 30 (items 7-9), pinned against the paper's text (tests/data)."""
import re
from pathlib import Path

import pytest

import clharness.engine.runner  # noqa: F401  (loaded once: pytester runs share one torch)
import clharness_methods  # noqa: F401
from clharness.benchmarks.cldyb import kind  # noqa: F401
from clharness.engine.suites import load_suite

ROOT = Path(__file__).resolve().parent.parent
SUITES = ROOT / "suites"
DATA = Path(__file__).resolve().parent / "data"
WORDS = {"two": 2, "three": 3, "four": 4, "five": 5}
# the suites that reproduce the paper's tables and figures (Table 1, Fig. 3/4, figs. 9, 11, 13)
TABLE_SUITES = ["cldyb-cc", "cldyb-ic", "cldyb-pool"]


def b3_selection_tasks() -> int:
    text = (DATA / "cldyb_b3.txt").read_text()
    m = re.search(r"hyper-parameters of each CL method are selected on the validation sets of the first (\w+) tasks", text)
    return WORDS[m.group(1)]


# --- item 7: appendix B.3 hyperparameter selection in every CLDyB suite that reproduces a table -----------
@pytest.mark.parametrize("name", TABLE_SUITES)
def test_table_suites_select_hyperparameters_on_the_first_three_tasks_validation(name):
    assert b3_selection_tasks() == 3
    for spec in load_suite(SUITES / f"{name}.toml").scenarios:
        assert spec.select_hparams is not None, spec.name
        assert spec.select_hparams["tasks"] == 3 and spec.select_hparams.get("metric", "aa") == "aa"
        assert spec.validation > 0                                   # selection scores on validation splits


def _collect(pytester, *args):
    result = pytester.runpytest("-p", "no:cacheprovider", "--collect-only", "-q", *args)
    return [line for line in result.outlines if "::" in line]


def test_selection_items_grid_each_methods_tuning_space(pytester):
    import clharness as clh
    methods = clh.Harness().methods

    def grid(name):   # the product of the declared sets active under the method's defaults
        size = 1
        for p in methods[name].tuning_space.values():
            if all(methods[name].hparams[parent].default in allowed for parent, allowed in p.when.items()):
                size *= len(p.values)
        return size
    assert grid("ranpac") == 4 * 5      # projection_dim x ffn_num: prompt tokens only under adapter = "vpt"
    ids = _collect(pytester, "--clh-suite", "cldyb-cc", "--clh-seeds", "1", "--clh-method", "ranpac",
                   "--clh-method", "er")
    for seq in ("cc", "random", "heldout"):
        for name in ("ranpac", "er"):
            picks = [i for i in ids if i.startswith(f"cldyb-cc::cc/{seq}[{name}-seed0-select-c")]
            assert len(picks) == grid(name)                         # the grid over the declared sets
            assert f"cldyb-cc::cc/{seq}[{name}-seed0]" in ids
    quick = _collect(pytester, "--clh-suite", "cldyb-cc", "--clh-quick", "--clh-seeds", "1", "--clh-method", "ranpac")
    assert sum("-select-c" in i for i in quick) == 3                # configurations = 1 per searched sequence


# --- item 8: table 1 / fig. 4 suites: the paper's pool, searching and evaluation-only methods ----------
PAPER_NAMES = {"RanPAC": "ranpac", "HidePrompt": "hide_prompt", "DualPrompt": "dualprompt", "PGP": "pgp",
               "LAE": "lae", "SLCA": "slca", "ER": "er", "CLSER": "clser", "AFEC": "afec"}


def paper_methods():
    """(table 1's methods, fig. 9's searching methods, fig. 9's evaluation-only methods), our names."""
    text = (DATA / "cldyb_table1_fig9.txt").read_text()
    table1 = [PAPER_NAMES[m.group(1)] for m in re.finditer(r"^(\w+) \(.*?\)\t[\d.]+\t", text, re.M)]
    m = re.search(r"\. ([\w, ]+?) are used during searching while ([\w, ]+?) are reserved for evaluation only", text)
    names = lambda s: [PAPER_NAMES[n.strip()] for n in re.split(r",| and ", s) if n.strip()]  # noqa: E731
    return table1, names(m.group(1)), names(m.group(2))


def test_table1_suite_searches_with_fig9s_methods_and_evaluates_table1s_on_the_cldyb_pool():
    from clharness.benchmarks.cldyb.pool import POOL_DATASETS
    table1, searchers, evaluated = paper_methods()
    assert table1 == ["ranpac", "hide_prompt", "dualprompt", "pgp", "lae", "slca", "er"]
    assert searchers == ["clser", "hide_prompt", "ranpac", "pgp", "afec"]
    suite = load_suite(SUITES / "cldyb-cc.toml")
    assert list(suite.methods) == table1
    for spec in suite.scenarios:
        o = spec.options
        assert o["search_methods"] == searchers
        assert [e["options"]["folder"] for e in o["pool"]] == list(POOL_DATASETS)
        assert not any("imagenet-r" in (e["dataset"], e.get("options", {}).get("folder")) for e in o["pool"])
        assert {e["name"] for e in o["heldout_pool"]}.isdisjoint(e["name"] for e in o["pool"])
        assert (o["classes_per_task"], o["steps"]) == (20, 10)
        assert "heldout" in o["use_cases"] and "cc" in o["use_cases"]


def test_fig4_suite_searches_one_sequence_per_method_of_the_nine_on_the_cldyb_pool():
    from clharness.benchmarks.cldyb.pool import POOL_DATASETS
    _, searchers, evaluated = paper_methods()
    suite = load_suite(SUITES / "cldyb-ic.toml")
    assert sorted(suite.methods) == sorted(searchers + evaluated) and len(suite.methods) == 9
    for spec in suite.scenarios:
        assert [e["options"]["folder"] for e in spec.options["pool"]] == list(POOL_DATASETS)
        assert spec.options["use_cases"] == ["ic"]


# --- item 9: appendix B.4 memory: "in addition to the ViT Encoder" -------------------------------------
# B.4: "we account for the storage space used by each Learner in addition to the ViT Encoder. This includes
# model replicas (such as old models and models updated using EMA), PET modules, dataset statistics, and
# samples from previous tasks." Default reading (issue 30 item 9): frozen parameters excluded, trained ones
# included, wherever they sit. The literal reading (one live encoder never counted, trained or not; its
# replicas counted) is the suite key memory_encoder = "never".
def _b4_method(reading="trained"):
    import copy

    import torch

    import clharness as clh
    from clharness.toolkit.backbones import MLP

    ctx = clh.Context(clh.Setting.CLASS_IL, 2, (1, 2, 2), memory_encoder=reading, pretrained_encoder=True,
                      backbone_factory=lambda: MLP((1, 2, 2), hidden=3, layers=2))

    class PartTuner(clh.Method):
        name = "b4-part-tuner"

    m = PartTuner(ctx)
    m.model = ctx.make_classifier()        # the run's encoder (MLP 4 -> 3 -> 3) + head (3 -> 2)
    first, second = [mod for mod in m.model.backbone.modules() if isinstance(mod, torch.nn.Linear)]
    first.requires_grad_(False)            # frozen: still the pretrained bytes
    with torch.no_grad():
        for p in second.parameters():
            p.add_(0.5)                    # fine-tuned: no longer the pretrained bytes
    m.old_model = copy.deepcopy(m.model)   # a model replica (old model)
    return m


FROZEN, TUNED, HEAD = 4 * 3 + 3, 3 * 3 + 3, 3 * 2 + 2


def test_b4_memory_excludes_frozen_encoder_parameters_and_counts_trained_ones_in_every_copy():
    m = _b4_method()
    assert sum(p.numel() for p in m.model.backbone.parameters()) == FROZEN + TUNED
    # live model: tuned layer + head; replica: the same (its frozen layer is the encoder's bytes too)
    assert m.memory_report().parameters == (TUNED + HEAD) + (TUNED + HEAD)


def test_b4_memory_literal_reading_leaves_out_the_live_encoder_even_fine_tuned_and_counts_its_replicas():
    m = _b4_method("never")
    # live model: head only; replica: its tuned layer and head (its frozen layer is the encoder's bytes)
    assert m.memory_report().parameters == HEAD + (TUNED + HEAD)


def test_b4_memory_reading_is_a_scenario_key_with_checked_values(tmp_path):
    from clharness.engine.suites import SuiteError, load_suite
    path = tmp_path / "s.toml"
    path.write_text('[suite]\nname = "s"\n[[scenario]]\nname = "a"\ndataset = "digits"\ntasks = 5\nmemory_encoder = "never"\n')
    assert load_suite(path).scenarios[0].memory_encoder == "never"
    path.write_text(path.read_text().replace('"never"', '"none"'))
    with pytest.raises(SuiteError, match="memory_encoder = 'none'; allowed values: trained, never"):
        load_suite(path)


def test_b4_memory_of_a_scratch_run_counts_an_untouched_replica_of_its_random_init():
    # without pretrained weights there is no encoder all methods share: CLS-ER's EMA copies that no
    # update has reached yet are still replicas the method stores
    import copy

    import clharness as clh
    from clharness.toolkit.backbones import MLP
    ctx = clh.Context(clh.Setting.CLASS_IL, 2, (1, 2, 2), backbone_factory=lambda: MLP((1, 2, 2), hidden=3, layers=1))

    class Replicas(clh.Method):
        name = "b4-replicas"

    m = Replicas(ctx)
    m.model = ctx.make_classifier()
    m.stable_model = copy.deepcopy(m.model).requires_grad_(False)
    assert m.memory_report().parameters == 2 * ((4 * 3 + 3) + (3 * 2 + 2))
    pretrained = clh.Context(clh.Setting.CLASS_IL, 2, (1, 2, 2), pretrained_encoder=True,
                             backbone_factory=ctx.backbone_factory)
    m.context = pretrained
    pretrained.shared_backbone = ctx.shared_backbone
    assert m.memory_report().parameters == 2 * (3 * 2 + 2)   # both encoders are the pretrained bytes


def test_the_runner_marks_pretrained_and_checkpoint_backbones_only():
    from clharness.toolkit.backbones import pretrained_weights
    assert pretrained_weights("vit-b16-in21k") and pretrained_weights("timm", {"pretrained": True})
    assert pretrained_weights("timm", {"checkpoint": "w.safetensors"})
    assert not pretrained_weights("mlp") and not pretrained_weights("vit-b16-in21k", {"pretrained": False})


# --- item 7: every method of the table suites has a selection space (its tuning_space) ------------------
def _table_suite_methods():
    """(suite, method) for every method the CLDyB table suites run or search with."""
    pairs = []
    for name in TABLE_SUITES:
        suite = load_suite(SUITES / f"{name}.toml")
        names = set(suite.methods)
        for spec in suite.scenarios:
            names |= set(spec.options.get("search_methods", ()))
        pairs += [(name, m) for m in sorted(names)]
    return pairs


@pytest.mark.parametrize("suite_name, method", _table_suite_methods())
def test_every_table_suite_method_selects_over_a_declared_space_holding_its_defaults(suite_name, method):
    """B.3: each method's hyperparameters are selected: a non-empty tuning_space whose grid candidates all
    resolve as the method's hyperparameters, the method's defaults (with the suite's values) among them."""
    import clharness as clh
    from clharness.engine.hparam_selection import candidates, search_space
    from clharness.engine.runner import resolve_hparams
    cls = clh.Harness().methods[method]
    assert getattr(cls, "tuning_space", None), f"{method} declares no tuning_space: CLDyB would run it unselected"
    suite = load_suite(SUITES / f"{suite_name}.toml")
    fixed = suite.hparams.get(method, {})
    defaults = resolve_hparams(cls, fixed)
    for spec in suite.scenarios:
        space = search_space(cls, spec.select_hparams.get("search", {}), defaults)
        assert space and set(space) <= set(cls.tuning_space)      # the suites name no sets: the declared space
        grid = candidates(space, spec.select_hparams.get("configurations", 0), f"{spec.name}/{method}")
        assert len(grid) >= 2
        for config in grid:
            resolved = resolve_hparams(cls, fixed, config)        # raises on a value out of range
            assert {k: resolved[k] for k in config} == config
        assert {k: defaults[k] for k in space} in grid, f"{method}'s defaults are not a candidate"


SELECT_ER = """
[suite]
name = "sel-er"
methods = ["er"]

[[scenario]]
name = "digits"
dataset = "digits"
setting = "class-incremental"
tasks = 5
backbone = "mlp"
epochs = 1
batch_size = 32
memory_size = 40
validation = 0.2
select_hparams = { tasks = 2 }
"""


def test_selection_picks_the_validation_best_of_ers_declared_space_offline(pytester):
    """ER's own tuning_space (no suite sets) is searched on the first 2 tasks of Split-Digits: one selection
    run per candidate, and the full run takes the candidate with the best validation aa (ties: the lowest)."""
    import clharness as clh
    from clharness.results import ResultsStore
    er = clh.Harness().methods["er"]
    pytester.makefile(".toml", sel=SELECT_ER)
    store = pytester.path / "r.sqlite"
    result = pytester.runpytest("-p", "no:cacheprovider", "--clh-device", "cpu", "--clh-results", str(store), "sel.toml")
    grid = [{"lr": v} for v in er.tuning_space["lr"].values]
    result.assert_outcomes(passed=len(grid) + 1)
    records = {r.scenario: r for r in ResultsStore(store).records()}
    runs = [records[f"digits:select-c{k}"] for k in range(len(grid))]
    assert [{"lr": r.hparams["lr"]} for r in runs] == grid
    scores = [r.metrics["aa"] for r in runs]
    assert len(set(scores)) > 1                                   # the candidates differ: a real choice
    full = records["digits"]
    best = scores.index(max(scores))
    assert full.selection["chosen"] == best and full.selection["scores"] == scores
    assert full.hparams["lr"] == grid[best]["lr"] and full.selection["candidates"] == len(grid)
