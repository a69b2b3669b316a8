"""A scenario's spec, as families read it: the common keys of a suite's ``[[scenario]]`` table
(``ScenarioSpec``), which of them joined the record key later (``LATER_KEYS``), the spec as a run's
definition holds it (``spec_definition``), and the error a bad suite raises (``SuiteError``).

Part of the contract: the engine parses suite files into these (engine.suites) and families build
scenarios from them; neither owns the other.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from . import kinds


class SuiteError(ValueError):
    """A suite file that cannot be used."""


@dataclass(frozen=True)
class ScenarioSpec:
    name: str
    dataset: str = ""                     # required by "split"; other kinds may name theirs in options
    kind: str = "split"
    setting: str = "class-incremental"
    dataset_options: dict = field(default_factory=dict)
    tasks: int | None = None              # N equal tasks ...
    first_task: int | None = None         # ... or a first task of this many classes,
    increment: int | None = None          #     then tasks of this many
    num_classes: int | None = None        # use only the first num_classes classes of the (seeded) order
    validation: float = 0.0               # fraction of each class's train data held out for validation
    class_order: str = "seed"             # "seed": shuffled per seed; "fixed": dataset order
    epochs: int = 1
    batch_size: int = 32
    eval_batch_size: int = 512
    memory_size: int = 0
    backbone: str = "mlp"
    backbone_options: dict = field(default_factory=dict)
    image_size: list | None = None        # [H, W] to resize to, default: the dataset's own
    channels: int | None = None           # 3 to replicate grey images
    max_train_per_class: int | None = None
    max_test_per_class: int | None = None
    amp: bool = True                      # mixed precision where the device is CUDA
    options: dict = field(default_factory=dict)   # the kind's own keys (see KINDS), checked by it
    augment: str = "none"                 # training augmentation recipe (clharness.toolkit.augment)
    first_task_train: dict | None = None  # the first task's fixed training (FIRST_TASK_KEYS), e.g. GTEP Table 3
    select_hparams: dict | None = None    # hyperparameters chosen on the first tasks' validation (hparam_selection)
    # how pixels become the backbone's inputs: "dataset" | "none" | "imagenet" | "timm"
    # (clharness.toolkit.backbones.input_normalization; pretrained-model suites name their papers' choice)
    normalize: str = "dataset"
    # continual evaluation (De Lange et al. 2023): every N training iterations, accuracy on a fixed
    # subsample of eval_samples test images of every task seen so far (engine.continual_eval); 0: off
    eval_every: int = 0
    eval_samples: int = 100
    # the memory footprint's reading of CLDyB appendix B.4 (Method.memory_report): "trained" counts every
    # tensor that is not the pretrained encoder's own bytes; "never" leaves one live encoder out entirely
    memory_encoder: str = "trained"
    # per-method hyperparameters of this scenario over the suite's [hparams.<method>] (van de Ven et al.'s
    # EWC lambda and SI c differ per scenario): hparams = { ewc = { ewc_lambda = 1e9 } }
    hparams: dict = field(default_factory=dict)

    @property
    def setting_enum(self):
        from .method import Setting   # lazy: suite parsing needs no torch
        return Setting(self.setting)


# Keys added after records were first stored: left out of a run's definition (its record key)
# while they hold these defaults, so the keys of existing runs do not change.
LATER_KEYS = {"augment": "none", "first_task_train": None, "select_hparams": None, "normalize": "dataset",
              "eval_every": 0, "eval_samples": 100, "memory_encoder": "trained", "hparams": {}}


def spec_definition(spec: ScenarioSpec) -> dict[str, Any]:
    """The spec as it enters a run's definition (and record key): every field, except the
    ``LATER_KEYS`` that hold their defaults."""
    out = asdict(spec)
    for key, default in LATER_KEYS.items():
        if out[key] == default:
            del out[key]
    # the same for a kind's own keys added later (its module's LATER_OPTIONS: key -> default)
    for key, default in kinds.family(spec.kind).LATER_OPTIONS.items():
        if key in out["options"] and out["options"][key] == default:
            del out["options"][key]
    return out
