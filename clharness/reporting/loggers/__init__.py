"""Loggers for finished runs: ``--clh-log tensorboard:DIR|wandb:PROJECT|mlflow:URI`` (repeatable).

Each logger is an ordinary clharness plugin, an object with one ``clharness_run_finished(record)``
hook implementation, in a file of its own (``tensorboard.py``, ``wandb.py``, ``mlflow.py``) a user
could have written from README. Each needs its optional extra (``pip install 'clharness[wandb]'``);
a missing package is an error naming the extra. Under pytest-xdist every worker logs the runs it
trains; a run reused from the results store is not logged again.
"""
from __future__ import annotations

import importlib
import math
from types import ModuleType

import numpy as np

# --clh-log KIND:TARGET -> (module, class, what TARGET is)
LOGGERS = {
    "tensorboard": ("clharness.reporting.loggers.tensorboard", "TensorBoardLogger", "DIR"),
    "wandb": ("clharness.reporting.loggers.wandb", "WandbLogger", "PROJECT"),
    "mlflow": ("clharness.reporting.loggers.mlflow", "MlflowLogger", "URI"),
}


class LoggerError(ValueError):
    """A --clh-log value that names no logger, or a logger whose package is missing."""


def make_logger(spec: str):
    """The logger plugin for one ``--clh-log KIND:TARGET`` value."""
    kind, sep, target = spec.partition(":")
    if kind not in LOGGERS or not sep or not target:
        forms = "|".join(f"{k}:{what}" for k, (_, _, what) in LOGGERS.items())
        raise LoggerError(f"--clh-log {spec}: expected {forms}")
    module, cls, _ = LOGGERS[kind]
    return getattr(importlib.import_module(module), cls)(target)


def require(package: str, extra: str) -> ModuleType:
    """Import a logger's package, or fail naming the extra that installs it."""
    try:
        return importlib.import_module(package)
    except ImportError as exc:
        raise LoggerError(f"--clh-log {extra}:...: the `{package}` package is not installed; "
                          f"install it with: python -m pip install 'clharness[{extra}]' ({exc})") from exc


def task_rows(record) -> list[dict[str, float]]:
    """One row per learned task i: ``task_j`` = R[i][j] (every evaluated task, future ones included)
    and ``seen`` = accuracy on the pooled test data of tasks 0..i (R[i][j] weighted by test samples
    per task, as clharness.reporting.plots.step_accuracy; unweighted where the sizes are missing)."""
    rows = []
    for i, row in enumerate(record.acc_matrix):
        sizes = record.task_sizes if len(record.task_sizes) >= len(row) else [1] * len(row)
        values = {f"task_{j}": float(v) for j, v in enumerate(row) if not math.isnan(v)}
        seen = [(v, sizes[j]) for j, v in enumerate(row[:i + 1]) if not math.isnan(v)]
        if seen and sum(w for _, w in seen) > 0:
            values["seen"] = sum(v * w for v, w in seen) / sum(w for _, w in seen)
        rows.append(values)
    return rows


def final_metrics(record) -> dict[str, float]:
    """The record's metrics and costs, finite values only (trackers reject or mis-plot NaN)."""
    values = dict(record.metrics, train_seconds=record.train_seconds, eval_seconds=record.eval_seconds,
                  memory_mb=record.memory_mb, parameters=float(record.parameters))
    return {k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and math.isfinite(v)}


def run_config(record) -> dict:
    """What identifies the run, for trackers' config/params panels."""
    return {"suite": record.suite, "scenario": record.scenario, "method": record.method, "seed": record.seed,
            "setting": record.setting, "dataset": record.dataset, "status": record.status,
            "method_version": record.method_version, **{f"hp.{k}": v for k, v in record.hparams.items()}}


def matrix_image(record) -> np.ndarray:
    """The accuracy matrix drawn as the report draws it, as an (H, W, 3) uint8 array."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from ..plots import heatmap_figure
    side = max(len(record.acc_matrix), max(map(len, record.acc_matrix)))   # a failed run's matrix is not square
    matrix = np.full((side, side), np.nan)
    for i, row in enumerate(record.acc_matrix):
        matrix[i, :len(row)] = row
    fig = heatmap_figure({record.method: (matrix, 1)})
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()
