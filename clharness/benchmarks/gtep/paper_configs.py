"""The GTEP paper's own configurations (appendix A.1 and A.2 of "Hyperparameters in continual
learning: a reality check"): the original hyperparameters each algorithm reported (PyCIL, PILOT)
and the best ones the paper's tuning phase selected, per D^HT and scenario, as data.

The appendix writes a configuration as one underscore-joined string, e.g.
``ep_170_milestone_3_lr_0.1_lr_decay_0.1_batch_128_w_decay_0.0002_scheduler_steplr`` followed by the
method's own ``T_2_lambda_aux_1``. ``parse_appendix`` turns the appendix text into
``{preset: {paper method: {"paper": raw key -> value, "method": our name | None, "hparams": ours}}}``;
``paper_configs.json`` beside this file holds its output for the paper text (regenerate with
``python -m clharness.benchmarks.gtep.paper_configs PAPER.txt > paper_configs.json``), and ``load``
reads it. ``--clh-preset gtep:<preset>`` runs these configurations (protocol.py).

Deliberate readings (the appendix is not uniform):
- Two typos are read as the key they misspell: ``ambda_aux`` -> ``lambda_aux``, ``examplar_bs`` ->
  ``exemplar_bs``. ``BEEF NaN`` / ``BEEF: NaN`` (no configuration: every one diverged) is None.
- ``milestone`` and ``lr_decay`` are kept only when the scheduler is StepLR: "the num_milestones is
  ignored when another LR scheduler is selected" (appendix A.1); PILOT's ``lr_decay_0`` with a
  constant scheduler means the same.
- The paper's names map to ours where a method here has the same parameter (MAPPING); the others
  (e.g. DualPrompt's top k, always 1, WA's stray split ratio in the ImageNet-100 10-task entry) are
  listed as ``unmapped`` and not applied.
"""
from __future__ import annotations

import json
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

DATA = Path(__file__).with_name("paper_configs.json")

# Section headings -> preset names (the D^HT each was tuned on, and its task count)
SECTION = re.compile(r"^\*\*(?:Best hyperparameters \((?P<data>[^,]+), (?P<tasks>\d+) Tasks\)|Original hyperparameters)\*\*")
DHT = {"ImageNet-100": "imagenet100-1", "CIFAR-50": "cifar50-1", "ImageNet-50": "imagenet50-1",
       "CUB-200": "cub200", "ImageNet-R": "imagenet-r", "CUB-100-1": "cub100-1", "ImageNet-R-1": "imagenet-r-1"}
ORIGINAL = ("pycil-original", "pilot-original")   # A.1 (PyCIL's reported values), A.2 (PILOT's)
ENTRY = re.compile(r"^- (?P<name>[A-Za-z0-9-]+?)(?::\s*|_(?=ep_)|\s+(?=NaN))(?P<rest>.*)$")
NUMBER = re.compile(r"^-?\d+(\.\d+)?$")
WORD_KEYS = ("scheduler", "optimizer")   # keys whose value is a word
TYPOS = {"ambda_aux": "lambda_aux", "examplar_bs": "exemplar_bs"}

GENERAL = {"ep": "epochs", "milestone": "num_milestones", "lr": "lr", "lr_decay": "lr_decay", "batch": "batch_size",
           "w_decay": "weight_decay", "scheduler": "scheduler", "optimizer": "optimizer"}
# paper method -> (our method, {paper key: our hyperparameter}); the general keys map by GENERAL
MAPPING = {
    "Replay": ("er", {}),
    "iCaRL": ("icarl", {"T": "temperature", "lambda_aux": "kd_lambda"}),
    "BiC": ("bic", {"T": "temperature", "lambda_kd": "kd_lambda", "split_ratio": "split_ratio"}),
    "WA": ("wa", {"T": "temperature", "lambda_kd": "kd_lambda"}),
    "PODNet": ("podnet", {"lambda_c": "lambda_c", "lambda_f": "lambda_f", "nb_proxy": "proxies",
                          "ft_epochs": "finetune_epochs", "ft_lrate": "finetune_lr", "adaptive_factor": "adaptive_factor"}),
    "DER": ("der", {"lambda_aux": "aux_weight"}),
    "MEMO": ("memo", {"lambda_aux": "aux_weight", "exemplar_bs": "exemplar_batch_size"}),
    "FOSTER": ("foster", {"T": "temperature", "lambda_kd": "kd_weight", "fe": "fe_weight", "beta": ("beta1", "beta2"),
                          "comp_ep": "compression_epochs"}),
    "BEEF": ("beef", {"fusion_ep": "fusion_epochs", "energy_w": "energy_weight", "logits_align": "logits_alignment"}),
    "L2P": ("l2p", {"size": "pool_size", "length": "prompt_length", "top_k": "top_n", "lamb": "pull_lambda"}),
    "DualPrompt": ("dualprompt", {"L_e": "e_length", "L_g": "g_length", "lamb": "pull_lambda", "size": "pool_size"}),
    "CODA-Prompt": ("coda_prompt", {"e_pool_size": "pool_size", "e_p_length": "prompt_length", "ortho_mu": "ortho_mu"}),
    "Adam": ("aper", {"ffn_num": "ffn_num"}),   # Adam-Adapter: APER with AdaptFormer adapters
    "Ranpac": ("ranpac", {"ffn_num": "ffn_num", "M": "projection_dim", "pt_num": "prompt_tokens"}),
    "EASE": ("ease", {"ffn_num": "ffn_num", "alpha": "alpha"}),
}


class PresetError(ValueError):
    """An unknown preset or a configuration that cannot be read."""


def _value(token: str):
    if token in ("True", "False"):
        return token == "True"
    return float(token) if "." in token else int(token)


def parse_config(text: str) -> dict[str, Any]:
    """``ep_70_lr_0.1_..._beta_0.96_0.97`` -> {"ep": 70, "lr": 0.1, ..., "beta": [0.96, 0.97]}: a key is
    the underscore-joined words before a value (a number, True/False, or the word after a WORD_KEYS
    key); consecutive values make a list."""
    pairs: list[tuple[str, list]] = []
    key: list[str] = []
    values: list = []
    for token in text.replace("\\_", "_").strip().strip("_").split("_"):
        if key and (NUMBER.match(token) or token in ("True", "False")
                    or ("_".join(key) in WORD_KEYS and not values)):
            values.append(token if "_".join(key) in WORD_KEYS else _value(token))
            continue
        if values:
            pairs.append(("_".join(key), values))
            key, values = [], []
        key.append(token)
    if key and not values:
        raise PresetError(f"configuration {text!r}: {'_'.join(key)!r} has no value")
    if key:
        pairs.append(("_".join(key), values))
    out = {}
    for k, v in pairs:
        out[TYPOS.get(k, k)] = v[0] if len(v) == 1 else v
    return out


def to_hparams(method: str, paper: dict[str, Any]) -> tuple[str | None, dict[str, Any], list[str]]:
    """(our method name or None, its hyperparameters by our names, paper keys not applied)."""
    ours, own = MAPPING.get(method, (None, {}))
    hparams, unmapped = {}, []
    steplr = str(paper.get("scheduler", "steplr")).lower() == "steplr"
    for key, value in paper.items():
        if key in ("milestone", "lr_decay") and not steplr:
            continue   # ignored under another scheduler (appendix A.1)
        name = GENERAL.get(key) or own.get(key)
        if name is None or ours is None:
            unmapped.append(key)
        elif isinstance(name, tuple):
            hparams.update(zip(name, value))
        else:
            hparams[name] = value.lower() if key in WORD_KEYS else value
    return ours, hparams, unmapped


def parse_appendix(text: str) -> dict[str, dict[str, Any]]:
    """Every configuration of appendices A.1 and A.2, by preset (section) and paper method name."""
    presets: dict[str, dict[str, Any]] = {}
    current, originals, entry = None, 0, None
    lines = [line.rstrip().replace("\\_", "_") for line in text.splitlines()]

    def close():
        if current is not None and entry is not None:
            name, rest = entry
            paper = None if rest.strip() == "NaN" else parse_config(rest)
            ours, hparams, unmapped = to_hparams(name, paper) if paper is not None else (MAPPING.get(name, (None,))[0], None, [])
            presets[current][name] = {"paper": paper, "method": ours, "hparams": hparams, "unmapped": unmapped}

    for line in lines:
        heading = SECTION.match(line)
        if heading:
            close()
            entry = None
            if heading["data"]:
                current = f"{DHT[heading['data']]}-{heading['tasks']}tasks"
            else:
                current, originals = ORIGINAL[originals], originals + 1
            presets[current] = {}
            continue
        if current is None:
            continue
        if line.startswith("#") or line.startswith("**"):
            close()
            current, entry = None, None
            continue
        match = ENTRY.match(line)
        if match:
            close()
            entry = (match["name"], match["rest"])
        elif entry is not None and line.strip() and " " not in line.strip():
            entry = (entry[0], entry[1].strip() + "_" + line.strip())   # a configuration broken over lines
    close()
    return presets


@lru_cache(maxsize=1)
def load() -> dict[str, dict[str, Any]]:
    """The shipped presets (paper_configs.json)."""
    return json.loads(DATA.read_text())


def preset(name: str) -> dict[str, dict[str, Any]]:
    """Our method name -> the paper's configuration for it (by our hyperparameter names) in preset
    ``name`` (e.g. "cifar50-1-10tasks"); methods with no configuration there (BEEF's NaN) are absent."""
    presets = load()
    if name not in presets:
        raise PresetError(f"--clh-preset gtep:{name}: no such GTEP preset; available: {', '.join(sorted(presets))}")
    return {e["method"]: e["hparams"] for e in presets[name].values() if e["method"] and e["hparams"] is not None}


if __name__ == "__main__":
    print(json.dumps(parse_appendix(Path(sys.argv[1]).read_text()), indent=1, sort_keys=True))
