"""Every session option, declared once: the pytest options ``--clh-NAME``, the ``clharness run`` flags
``--NAME`` and the arguments of ``clharness.run`` are built from ``OPTIONS`` (tests/test_session_options.py
checks that the three agree), and ``engine.session.Options`` takes its defaults from it.

Each row says how the option enters a record's key (``key``): most choose which cases run or where
records go and change no number; the ones that can change a record's numbers name the key field.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

PYTEST, CLI, API = "pytest", "cli", "api"
EVERYWHERE = frozenset({PYTEST, CLI, API})


@dataclass(frozen=True)
class Option:
    name: str                          # --clh-NAME, clharness run --NAME, clharness.run(NAME_WITH_UNDERSCORES=)
    default: Any
    help: str
    metavar: str | None = None
    kind: str = "value"                # value | flag | append (repeatable) | optional (a value may follow)
    type: Callable | None = None       # argparse's type= for values
    key: str = ""                      # "" : never in a record's key; else the key field it sets and when
    where: frozenset = EVERYWHERE      # the front ends that offer it
    short: str | None = None           # clharness run's short flag
    env: str | None = None             # an environment variable that gives the default
    const: Any = None                  # kind "optional": the value of the bare flag
    api_name: str | None = None        # clharness.run's argument when it differs from NAME

    @property
    def dest(self) -> str:             # pytest's and argparse's attribute name
        return "clh_" + self.name.replace("-", "_")

    @property
    def argument(self) -> str:         # clharness.run's keyword
        return self.api_name or self.name.replace("-", "_")

    @property
    def value(self) -> Any:            # the default, the environment's where it gives one
        return os.environ.get(self.env, self.default) if self.env else self.default

    def argparse_kwargs(self) -> dict:
        kwargs: dict[str, Any] = {"help": self.help}
        if self.kind == "flag":
            return {**kwargs, "action": "store_true"}
        kwargs["metavar"] = self.metavar
        if self.type is not None:
            kwargs["type"] = self.type
        if self.kind == "append":
            return {**kwargs, "action": "append", "default": []}
        if self.kind == "optional":
            kwargs.update(nargs="?", const=self.const)
        return {**kwargs, "default": self.value}


OPTIONS: tuple[Option, ...] = (
    Option("suite", [], "run this suite (a registered name or a .toml path); repeatable; clharness run's default: "
           "quickstart", "NAME|PATH", "append", api_name="suite"),
    Option("method", [], "only these methods (default: the suite's list, else every applicable one); repeatable",
           "NAME", "append", api_name="methods"),
    Option("add-method", [], "run the suite's own methods plus NAME (your method beside the suite's baselines); "
           "repeatable; with --clh-method, those plus NAME", "NAME", "append", api_name="add_methods"),
    Option("hparam", [], "set a method's hyperparameter: METHOD.NAME=VALUE, checked like a suite's [hparams.METHOD] "
           "(did-you-mean, range); a comma list (lr=0.01,0.1) makes one case per value; repeatable",
           "METHOD.NAME=VALUE[,VALUE...]", "append", key="hparams: the resolved hyperparameters", api_name="hparams"),
    Option("seeds", None, "seeds 0..N-1 (default: the suite's)", "N", type=int, key="seed: one case per seed"),
    Option("device", "auto", "device for every case (auto: CUDA when present)", "auto|cpu|cuda|cuda:K",
           key="device: the device type a record ran on (cpu or cuda)"),
    Option("data-root", None, "folder holding the datasets (default: $CLH_DATA_ROOT)", "DIR", env="CLH_DATA_ROOT"),
    Option("download", False, "let torchvision download missing datasets and timm pretrained weights", kind="flag"),
    Option("results", ".clharness/results.sqlite", "SQLite results store: finished runs are reused on a rerun "
           "(default: %(default)s)", "PATH"),
    Option("fresh", False, "rerun every case, even those already stored", kind="flag"),
    Option("reuse-stale", False, "reuse a stored record of the same case even when the code that made it has changed "
           "since (each one is listed at the end, with both code digests)", kind="flag"),
    Option("scorecard", None, "write the session's scorecard (.md, .json or .csv by suffix)", "PATH"),
    Option("figures", None, "write every figure of the session's report to DIR: matplotlib figures as PNG, SVG and PDF, "
           "the hand-drawn SVG charts (GTEP slope, M2I and CLDyB bars) as SVG only (the page: DIR/report.html)",
           "DIR", where=frozenset({PYTEST, CLI})),
    Option("save-models", None, "write each case's final method state to DIR, named by its record key "
           "(clharness.load_case(..., trained=True, models=DIR) loads it back)", "DIR"),
    Option("compare", None, "add regression gates against a saved scorecard (see --clh-max-drop)", "SCORECARD.json"),
    Option("max-drop", [], "allowed drop of a metric's seed mean against --clh-compare (repeatable; default: "
           "final_acc=0.02)", "METRIC=VALUE", "append", api_name="max_drops"),
    Option("gate-timeout", 3600.0, "how long a gate waits for the cases it judges (pytest-xdist) (default: "
           "%(default)s)", "SECONDS", type=float),
    Option("quick", False, "shrunk budgets: the suites' [quick] settings", kind="flag",
           key="scenario: the budgets the quick settings shrink"),
    Option("ensemble", None, "cases that differ only in seed train as one batched model (opted-in methods; others "
           "solo); =hparams: also cases that differ only in float hyperparameters (lr, a loss weight); =off: every "
           "case solo; default: a suite's [suite] ensemble key; with -n an ensemble is one xdist unit of work "
           "(--dist loadgroup), with --clh-ray one task", "seeds|hparams|off", "optional", const="seeds",
           key="none: members equal their solo runs bit for bit (tests/test_ensemble.py)"),
    Option("preset", [], "a family's published configurations, e.g. gtep:cifar50-1-10tasks (GTEP: also run the "
           "paper's H* on D^E beside the tuned one); repeatable", "FAMILY:NAME", "append", api_name="presets",
           key="hparams and scenario: what the preset sets"),
    Option("plugin", [], "import MODULE (a module in the current folder, an importable module or a .py file) as a "
           "clharness plugin; repeatable", "MODULE", "append", short="-p", api_name="plugins"),
    Option("log", [], "log every run this session trains (optional extras clharness[tensorboard|wandb|mlflow]); "
           "repeatable", "tensorboard:DIR|wandb:PROJECT|mlflow:URI", "append", where=frozenset({PYTEST, CLI})),
    Option("ray", None, "run the cases as Ray tasks (pip install 'clharness[ray]'): local starts a Ray runtime here, "
           "auto joins the cluster of `ray start`, ray://HOST:PORT uses Ray Client", "local|auto|ray://HOST:PORT",
           where=frozenset({PYTEST, CLI})),
    Option("gpus-per-run", None, "GPUs per Ray task, fractional allowed: 0.25 packs four runs on one GPU (default: "
           "the scenario's gpus_per_run, else 0)", "F", type=float, where=frozenset({PYTEST, CLI})),
    Option("cpus-per-run", None, "torch CPU threads of every run, serial, pytest-xdist and Ray alike (default 1, so "
           "results never depend on scheduling; a count other than 1 enters the record key), and the CPUs a Ray task "
           "reserves (default: the scenario's cpus_per_run, else 1)", "N", type=float,
           key="cpu_threads: a count other than 1"),
)

BY_NAME = {o.name: o for o in OPTIONS}


def default(name: str) -> Any:
    """The declared default of option ``name`` (engine.session.Options reads its defaults here)."""
    value = BY_NAME[name].default
    return list(value) if isinstance(value, list) else value


def add_pytest_options(group) -> None:
    for option in OPTIONS:
        if PYTEST in option.where:
            group.addoption(f"--clh-{option.name}", dest=option.dest, **option.argparse_kwargs())


def add_cli_flags(parser) -> None:
    """``clharness run``'s flags: the same options without the ``clh-`` prefix."""
    for option in OPTIONS:
        if CLI in option.where:
            flags = [f"--{option.name}", *([option.short] if option.short else [])]
            kwargs = option.argparse_kwargs()
            if option.name == "suite":
                kwargs["help"] = "suite to run (repeatable; default: quickstart)"
            parser.add_argument(*flags, dest=option.dest, **kwargs)


def pytest_argv(namespace) -> list[str]:
    """``clharness run``'s parsed flags as the pytest command line that runs them: every flag given
    (one that differs from its default) becomes its ``--clh-NAME``."""
    argv: list[str] = []
    for option in OPTIONS:
        if CLI not in option.where:
            continue
        value = getattr(namespace, option.dest)
        flag = f"--clh-{option.name}"
        if option.kind == "flag":
            argv += [flag] if value else []
        elif option.kind == "append":
            for item in value:
                argv += [flag, str(item)]
        elif option.kind == "optional":
            argv += [] if value is None else [f"{flag}={value}"]
        elif value is not None and value != option.value:
            argv += [flag, str(value)]
    return argv


def parse_hparams(items, methods_known=None) -> dict[str, dict[str, list]]:
    """``--clh-hparam METHOD.NAME=VALUE[,VALUE...]`` items -> {method: {name: [values]}}; values read as
    TOML literals (0.1, 3, true, "x"), a bare word as a string. ``clharness.run``'s dict form
    ({method: {name: value or [values]}}) passes through the same checks."""
    if isinstance(items, dict):
        out: dict[str, dict[str, list]] = {}
        for method, table in items.items():
            if not isinstance(table, dict):
                raise ValueError(f"hparams={{{method!r}: {table!r}}}: give {{METHOD: {{NAME: value or [values]}}}}")
            out[method] = {name: list(v) if isinstance(v, (list, tuple)) else [v] for name, v in table.items()}
        return out
    out = {}
    for item in items:
        target, sep, values = str(item).partition("=")
        method, dot, name = target.partition(".")
        if not sep or not dot or not method or not name or not values:
            raise ValueError(f"--clh-hparam {item}: write METHOD.NAME=VALUE (e.g. finetune.lr=0.001), or a comma "
                             "list METHOD.NAME=V1,V2 for one case per value")
        out.setdefault(method, {})[name] = [_literal(v) for v in values.split(",")]
    return out


def _literal(text: str) -> Any:
    import tomllib
    try:
        return tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        return text.strip()
