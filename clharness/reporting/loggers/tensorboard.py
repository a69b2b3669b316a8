"""``--clh-log tensorboard:DIR``: one TensorBoard run per case under DIR/suite/scenario/method/seedN.

The training loss ``train/loss`` at every step while a run trains; scalars ``accuracy/task_j`` and
``accuracy/seen`` at step i (after learning task i), the final
``metrics/*`` at the last step, the accuracy matrix as the image ``accuracy_matrix``, and the
run's identity as text. Needs ``pip install 'clharness[tensorboard]'``.
"""
from __future__ import annotations

import re
from pathlib import Path

import clharness as clh
from clharness.reporting.loggers import final_metrics, matrix_image, require, run_config, task_rows


class TensorBoardLogger:
    def __init__(self, log_dir: str):
        require("tensorboard", "tensorboard")   # torch.utils.tensorboard writes through it
        self.log_dir = Path(log_dir)
        self.live = {}   # run dir -> the SummaryWriter taking its training loss while it trains

    @clh.hookimpl
    def clharness_training_loss(self, record, step, loss):
        """``train/loss`` at every step, while the run trains (flushed by TensorBoard's own writer)."""
        path = self.run_dir(record)
        if path not in self.live:
            from torch.utils.tensorboard import SummaryWriter
            self.live[path] = SummaryWriter(log_dir=str(path))
        self.live[path].add_scalar("train/loss", loss, global_step=step)

    def run_dir(self, record) -> Path:
        parts = [record.suite, record.scenario, record.method, f"seed{record.seed}"]
        return self.log_dir.joinpath(*(re.sub(r"[^\w.=-]+", "_", p) for p in parts))

    @clh.hookimpl
    def clharness_run_finished(self, record):
        from torch.utils.tensorboard import SummaryWriter
        rows = task_rows(record)
        live = self.live.pop(self.run_dir(record), None)
        if live is not None:
            live.close()
        with SummaryWriter(log_dir=str(self.run_dir(record))) as writer:
            for i, row in enumerate(rows):
                for name, value in row.items():
                    writer.add_scalar(f"accuracy/{name}", value, global_step=i)
            for name, value in final_metrics(record).items():
                writer.add_scalar(f"metrics/{name}", value, global_step=max(len(rows) - 1, 0))
            if rows:
                writer.add_image("accuracy_matrix", matrix_image(record), dataformats="HWC")
            writer.add_text("run", "\n".join(f"    {k}: {v}" for k, v in run_config(record).items())
                            + (f"\n\n{record.message}" if record.message else ""))
