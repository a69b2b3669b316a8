"""Issue 29, items 1 and 2: what the pretrained-model (PTM) suites feed their ViT, and which weights.

1. Inputs. LAMDA-PILOT (the code GTEP's PTM numbers come from) and the L2P/DualPrompt/HiDe codes the
   CLDyB methods come from feed [0, 1] tensors (``build_transform``: ToTensor, no Normalize), so a
   black pixel is 0.0 and a white one 1.0; timm's augreg ViT weights were trained on mean = std = 0.5
   (black -1.0); the harness used to apply ImageNet's statistics to every image tree (black -2.118).
   Each PTM suite declares ``normalize``; the scenario of each is built here on image files the test
   writes (left half black, right half white) and its first batch is read back.
2. Weights. timm >= 1.0 resolves the bare ``vit_base_patch16_224`` to ``augreg2_in21k_ft_in1k``;
   PILOT loads ``augreg_in21k_ft_in1k``. Every PTM suite names the full tag, the record stores it,
   and a checkpoint that names other weights is refused.
"""
import hashlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import clharness as clh
from clharness.engine.runner import Case, run_case
from clharness.engine.scenario import ScenarioError, build_scenario
from clharness.engine.suites import ScenarioSpec, SuiteError, load_suite
from clharness.results import RunRecord
from clharness.toolkit import backbones

CPU = torch.device("cpu")
SUITES = Path(__file__).resolve().parent.parent / "suites"
PILOT = "vit_base_patch16_224.augreg_in21k_ft_in1k"   # LAMDA-PILOT's ViT-B/16 (its inc_net timm.create_model name)
SUP21K = "vit_base_patch16_224.orig_in21k"           # CLDyB's Sup-21K ViT-B/16 (Google's ViT-B_16.npz)
# suite -> the full tag of its weights (first scenario)
PTM_SUITES = {"imagenet-r-vit": PILOT, "gtep-vit": PILOT, "gtep-vit-200": PILOT,
              "cldyb-cc": SUP21K, "cldyb-ic": SUP21K, "cldyb-pool": SUP21K}
WNIDS = [f"n{9100000 + i:08d}" for i in range(200)]
# ImageNet's statistics, channel 0 (R): what every image tree used to get
IMAGENET_BLACK, IMAGENET_WHITE = -0.485 / 0.229, (1 - 0.485) / 0.229


def half_black_half_white(path: Path, size: int = 16) -> None:
    """Left half 0, right half 255: two uniform 8x8 JPEG blocks each, so both survive JPEG exactly."""
    a = np.zeros((size, size, 3), dtype=np.uint8)
    a[:, size // 2:] = 255
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(a).save(path, quality=100)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """<root>/imagenet-r/<wnid>/*.jpg with 200 classes of 5 images (the GTEP suites slice [100, 200))."""
    base = tmp_path_factory.mktemp("data")
    for w in WNIDS:
        for i in range(5):
            half_black_half_white(base / "imagenet-r" / w / f"art_{i}.jpg")
    return base


def first_batch(spec: ScenarioSpec, root: Path) -> torch.Tensor:
    """The first batch (test split of task 0, no augmentation) of the scenario ``spec`` makes."""
    from clharness.benchmarks.cldyb import kind as cldyb
    from clharness.benchmarks.gtep import protocol as gtep
    datasets = clh.Harness().datasets
    if spec.kind == "gtep":   # the evaluation phase of the scenario (D^E) with its own data
        scenario = build_scenario(gtep.phase_spec(spec, "eval", {}), datasets, 0, CPU, root)
        data = scenario.tasks[0].test
    elif spec.kind == "cldyb":   # the pool the suite's scenario draws from (here: imagenet-r alone)
        pool = cldyb.make_pool([{"dataset": "imagenet-r"}], cldyb.pool_settings(spec, 0), datasets, CPU, root,
                               augment=spec.augment, spec=spec)
        data = pool.data(pool.available()[:2], "test")
    else:
        data = build_scenario(spec, datasets, 0, CPU, root).tasks[0].test
    x, _ = next(iter(data.batches(4)))
    return x


def suite_spec(name: str, quick: bool = True, **overrides) -> ScenarioSpec:
    spec = load_suite(SUITES / f"{name}.toml", quick=quick).scenarios[0]
    if name == "gtep-vit":   # the imagenet-r pair, so the evaluation phase reads the tree written here
        spec = next(s for s in load_suite(SUITES / f"{name}.toml", quick=quick).scenarios
                    if s.options["eval_dataset"] == "imagenet-r")
    if name == "gtep-vit-200":
        spec = next(s for s in load_suite(SUITES / f"{name}.toml", quick=quick).scenarios
                    if s.options["eval_dataset"] == "imagenet-r")
    return replace(spec, **overrides)


@pytest.mark.parametrize("name", sorted(PTM_SUITES))
def test_each_ptm_suite_feeds_its_reference_code_inputs_black_0_white_1(root, name):
    spec = suite_spec(name)
    assert spec.normalize == "none"
    x = first_batch(spec, root)
    assert x.shape[1] == 3
    # the recipe's test view (resize, centre crop) keeps pure black and pure white columns
    assert float(x.amin()) == 0.0 and float(x.amax()) == 1.0


@pytest.mark.parametrize("name", ["imagenet-r-vit", "gtep-vit", "cldyb-cc"])
def test_normalize_knob_moves_the_black_pixel_as_each_choice_says(root, name):
    black = {}
    for choice in ("none", "timm", "imagenet", "dataset"):
        x = first_batch(suite_spec(name, normalize=choice), root)
        black[choice], white = float(x[:, 0].amin()), float(x[:, 0].amax())
        if choice == "timm":   # the tiny ViT of the quick run: augreg weights, mean = std = 0.5
            assert black[choice] == pytest.approx(-1.0) and white == pytest.approx(1.0)
    assert black["none"] == 0.0
    # "imagenet" is what image trees got before; "dataset" keeps that for trees (their source's statistics)
    assert black["imagenet"] == pytest.approx(IMAGENET_BLACK, abs=1e-5)
    assert black["dataset"] == pytest.approx(IMAGENET_BLACK, abs=1e-5)


def test_timm_normalize_reads_the_named_models_pretrained_cfg(root):
    # the suite's real backbone (not the quick one): augreg ViT-B/16, 0.5 / 0.5
    assert backbones.input_normalization("timm", "timm", {"model": PILOT}) == ([0.5] * 3, [0.5] * 3)
    # CLIP's own statistics (cldyb-pool scenario clip), through the registered backbone's default model
    mean, std = backbones.input_normalization("timm", "vit-b16-clip", {})
    assert mean == pytest.approx([0.48145466, 0.4578275, 0.40821073])
    assert std == pytest.approx([0.26862954, 0.26130258, 0.27577711])
    spec = suite_spec("imagenet-r-vit", normalize="timm",
                      backbone="vit-b16-clip", backbone_options={"pretrained": False, "img_size": 32})
    x = first_batch(spec, root)
    assert float(x[:, 0].amin()) == pytest.approx(-0.48145466 / 0.26862954, abs=1e-5)


def test_in_memory_data_under_none_is_the_pixels_over_255():
    """ptm-mini (synthetic arrays, random tiny ViT) feeds [0, 1] too: no dataset statistics."""
    spec = suite_spec("ptm-mini")
    assert spec.normalize == "none"
    task = build_scenario(spec, clh.Harness().datasets, 0, CPU).tasks[0]
    x, _ = next(iter(task.test.batches(8)))
    torch.testing.assert_close(x, task.test.images[:8].float() / 255, rtol=0, atol=1e-7)
    stats = build_scenario(replace(spec, normalize="dataset"), clh.Harness().datasets, 0, CPU).tasks[0]
    assert not torch.allclose(next(iter(stats.test.batches(8)))[0], x)   # the old default differs


def test_timm_normalize_needs_a_timm_backbone_and_unknown_choices_are_refused(tmp_path):
    spec = ScenarioSpec(name="s", dataset="digits", tasks=5, backbone="mlp", normalize="timm")
    with pytest.raises(ScenarioError, match="needs a timm backbone"):
        build_scenario(spec, clh.Harness().datasets, 0, CPU)
    path = tmp_path / "bad.toml"
    path.write_text('[suite]\nname = "bad"\n[[scenario]]\nname = "s"\ndataset = "digits"\ntasks = 5\n'
                    'normalize = "clip"\n')
    with pytest.raises(SuiteError, match="normalize = 'clip'; allowed values: dataset, none, imagenet, timm"):
        load_suite(path)


def test_the_default_keeps_the_record_keys_of_existing_suites():
    """normalize = "dataset" is a later key: left out of a run's definition while it holds its default."""
    from clharness.engine.suites import spec_definition
    spec = ScenarioSpec(name="s", dataset="digits", tasks=5)
    assert "normalize" not in spec_definition(spec)
    assert spec_definition(replace(spec, normalize="none"))["normalize"] == "none"


# --------------------------------------------------------------------------------- item 2: the weights

@pytest.mark.parametrize("name", sorted(PTM_SUITES))
def test_each_ptm_suite_names_the_full_tag_of_its_papers_weights(name):
    for spec in load_suite(SUITES / f"{name}.toml").scenarios:
        model = backbones.timm_model(spec.backbone, spec.backbone_options)
        if spec.backbone == "vit-b16-clip":
            assert model == "vit_base_patch16_clip_224.openai"
            continue
        assert model == PTM_SUITES[name], spec.name
        assert backbones.weights_identity(spec.backbone, spec.backbone_options) == PTM_SUITES[name]


def test_a_bare_architecture_means_the_weights_timm_resolves_it_to():
    assert backbones.full_tag("vit_base_patch16_224") == "vit_base_patch16_224.augreg2_in21k_ft_in1k"
    assert backbones.full_tag(PILOT) == PILOT
    assert backbones.weights_identity("timm", {"model": "vit_base_patch16_224", "pretrained": True}) \
        == "vit_base_patch16_224.augreg2_in21k_ft_in1k"
    assert backbones.weights_identity("timm", {"model": "vit_tiny_patch16_224"}) == "vit_tiny_patch16_224 (random init)"
    assert backbones.weights_identity("vit-b16-in21k", {}) == SUP21K   # pretrained by default
    assert backbones.weights_identity("mlp", {"hidden": 8}) == ""


TINY = dict(img_size=32, patch_size=8, depth=2)


def test_the_record_stores_the_weights(tmp_path):
    spec = ScenarioSpec(name="s", dataset="synthetic", tasks=2, epochs=1, batch_size=8, backbone="timm",
                        dataset_options={"num_classes": 4, "channels": 3, "image_size": 32, "train_per_class": 4,
                                         "test_per_class": 2},
                        backbone_options={"model": "vit_tiny_patch16_224", "pretrained": False, **TINY},
                        normalize="none")
    record = run_case(Case("t", spec, "simplecil", 0), clh.Harness(), CPU)
    assert record.status == "passed", record.message
    assert record.weights == "vit_tiny_patch16_224 (random init)"
    # a checkpoint of the named weights: the record names them in full
    torch.manual_seed(0)
    sd = backbones.timm_backbone((3, 32, 32), model="vit_tiny_patch16_224", **TINY).model.state_dict()
    torch.save({"state_dict": sd, "timm_model": "vit_tiny_patch16_224.augreg_in21k"}, tmp_path / "w.pth")
    options = {"model": "vit_tiny_patch16_224.augreg_in21k", "checkpoint": str(tmp_path / "w.pth"), **TINY}
    record = run_case(Case("t", replace(spec, backbone_options=options), "simplecil", 0), clh.Harness(), CPU)
    assert record.status == "passed", record.message
    # ... by the tag the file carries and its content (issue 38 item 2)
    digest = hashlib.sha256((tmp_path / "w.pth").read_bytes()).hexdigest()[:16]
    assert record.weights == f"vit_tiny_patch16_224.augreg_in21k sha256:{digest}"
    assert RunRecord.from_json(record.to_json()).weights == record.weights


def tiny_state_dict():
    torch.manual_seed(0)
    return backbones.timm_backbone((3, 32, 32), model="vit_tiny_patch16_224", **TINY).model.state_dict()


def test_a_checkpoint_of_other_weights_is_refused_with_both_names(tmp_path):
    sd = tiny_state_dict()
    torch.save({"state_dict": sd, "timm_model": "vit_tiny_patch16_224.augreg_in21k"}, tmp_path / "in21k.pth")
    with pytest.raises(backbones.WeightsMismatch) as info:
        backbones.timm_backbone((3, 32, 32), model="vit_tiny_patch16_224.augreg_in21k_ft_in1k",
                                checkpoint=str(tmp_path / "in21k.pth"), **TINY)
    text = str(info.value)
    assert "'vit_tiny_patch16_224.augreg_in21k'" in text and "'vit_tiny_patch16_224.augreg_in21k_ft_in1k'" in text
    # the bare name means what timm resolves it to (augreg_in21k_ft_in1k), so it is refused too
    with pytest.raises(backbones.WeightsMismatch, match="timm resolves 'vit_tiny_patch16_224' to it"):
        backbones.timm_backbone((3, 32, 32), model="vit_tiny_patch16_224", checkpoint=str(tmp_path / "in21k.pth"),
                                **TINY)
    # the named weights load, bit for bit
    net = backbones.timm_backbone((3, 32, 32), model="vit_tiny_patch16_224.augreg_in21k",
                                  checkpoint=str(tmp_path / "in21k.pth"), **TINY)
    for k, v in net.model.state_dict().items():
        assert torch.equal(v, sd[k]), k


def test_the_tag_is_read_from_safetensors_metadata_a_hub_config_or_the_hub_cache_folder(tmp_path):
    from safetensors.torch import save_file
    sd = {k: v.contiguous() for k, v in tiny_state_dict().items()}
    other = "vit_tiny_patch16_224.augreg_in21k"
    named = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"
    meta = tmp_path / "meta.safetensors"
    save_file(sd, str(meta), metadata={"timm_model": other})
    hub = tmp_path / "hub" / "model.safetensors"   # timm's hub repo layout: config.json beside the weights
    hub.parent.mkdir()
    save_file(sd, str(hub))
    (hub.parent / "config.json").write_text('{"architecture": "vit_tiny_patch16_224", '
                                            '"pretrained_cfg": {"tag": "augreg_in21k"}}')
    cache = tmp_path / f"models--timm--{other}" / "snapshots" / "abc" / "model.safetensors"
    cache.parent.mkdir(parents=True)
    save_file(sd, str(cache))
    for path in (meta, hub, cache):
        assert backbones.checkpoint_tag(path) == other
        with pytest.raises(backbones.WeightsMismatch):
            backbones.timm_backbone((3, 32, 32), model=named, checkpoint=str(path), **TINY)
        backbones.timm_backbone((3, 32, 32), model=other, checkpoint=str(path), **TINY)
    plain = tmp_path / "plain.safetensors"   # names no weights: nothing to compare, it loads
    save_file(sd, str(plain))
    assert backbones.checkpoint_tag(plain) is None
    backbones.timm_backbone((3, 32, 32), model=named, checkpoint=str(plain), **TINY)
    # save_checkpoint writes the tag where checkpoint_tag reads it, in both formats
    for suffix in (".pth", ".safetensors"):
        path = backbones.save_checkpoint(sd, tmp_path / f"saved{suffix}", other)
        assert backbones.checkpoint_tag(path) == other


def test_a_wrong_checkpoint_is_a_setup_error_of_the_run(tmp_path):
    torch.save({"state_dict": tiny_state_dict(), "timm_model": "vit_tiny_patch16_224.augreg_in21k"},
               tmp_path / "w.pth")
    spec = ScenarioSpec(name="s", dataset="synthetic", tasks=2, epochs=1, batch_size=8, backbone="timm",
                        dataset_options={"num_classes": 4, "channels": 3, "image_size": 32, "train_per_class": 4,
                                         "test_per_class": 2},
                        backbone_options={"model": "vit_tiny_patch16_224.augreg_in21k_ft_in1k",
                                          "checkpoint": str(tmp_path / "w.pth"), **TINY})
    record = run_case(Case("t", spec, "simplecil", 0), clh.Harness(), CPU)
    assert record.status == "error" and "WeightsMismatch" in record.message and "augreg_in21k'" in record.message
