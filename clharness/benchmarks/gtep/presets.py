"""``--clh-preset gtep:<D^HT>-<T>tasks``: the paper's appendix A configurations (paper_configs.py), and which
scenarios a preset configures (those with its D^HT and task count)."""
from __future__ import annotations

import re

from ...scenario_spec import SuiteError


PRESET_DHT = {"cifar50-1": ("cifar100", None, [0, 50]), "imagenet50-1": ("imagefolder", "imagenet", [0, 50]),
              "imagenet100-1": ("imagefolder", "imagenet", [0, 100]), "cub100-1": ("cub200", None, [0, 100]),
              "cub200": ("cub200", None, None), "imagenet-r-1": ("imagenet-r", None, [0, 100]),
              "imagenet-r": ("imagenet-r", None, None)}
PRESET_NAME = re.compile(r"^(?P<dht>.+)-(?P<tasks>\d+)tasks$")
PAPER_DHT = {(dataset, path) for dataset, path, _ in PRESET_DHT.values()}   # the paper's D^HT datasets


def preset_applies(name: str, spec) -> bool:
    """Whether preset ``name`` configures scenario ``spec``: a preset named for a D^HT and a task count
    ("cub200-10tasks") configures the scenarios tuned on that D^HT (dataset and class range) with that
    many tasks; a preset named for neither ("pycil-original") configures every scenario, and so does any
    preset on a stand-in scenario (a D^HT the paper does not use: synthetic data, digits)."""
    match = PRESET_NAME.match(name)
    if match is None or match["dht"] not in PRESET_DHT:
        return True
    o = spec.options
    own = (o["tune_dataset"], o.get("tune_dataset_options", {}).get("path") if o["tune_dataset"] == "imagefolder" else None)
    if own not in PAPER_DHT:
        return True
    dataset, path, classes = PRESET_DHT[match["dht"]]
    tasks = int(o["task_config"].split("-")[0])
    return own == (dataset, path) and (o["tune_classes"] or None) == classes and tasks == int(match["tasks"])


def check_preset_scope(name: str, suite) -> None:
    """A preset that configures none of the suite's GTEP scenarios is a mistake, said before any training."""
    specs = [s for s in suite.scenarios if s.kind == "gtep"]
    if specs and not any(preset_applies(name, s) for s in specs):
        have = ", ".join(f"{s.name} ({s.options['tune_dataset']}{s.options['tune_classes'] or ''}, "
                         f"{s.options['task_config']})" for s in specs)
        raise SuiteError(f"{suite.path}: --clh-preset gtep:{name} is for another D^HT or task count than every "
                         f"scenario of suite {suite.name!r}: {have}; pick the preset of a scenario's D^HT and task count")


def session_presets(presets) -> list[tuple[str, dict]]:
    """The presets ``gtep:<name>`` -> [(name, {our method: the paper's configuration})]; other
    families' presets are theirs to read."""
    from .paper_configs import PresetError, preset
    out = []
    for text in presets or []:
        family, _, name = text.partition(":")
        if family != "gtep":
            continue
        try:
            out.append((name, preset(name)))
        except PresetError as exc:
            raise SuiteError(str(exc)) from None
    return out


