"""``--clh-log wandb:PROJECT``: one Weights & Biases run per case, grouped by suite.

The run is named after the case id, its group is the suite and its job type the scenario; it logs
``accuracy/task_j`` and ``accuracy/seen`` at step i (after learning task i), the final metrics to
the run summary and the accuracy matrix as an image. ``WANDB_MODE=offline`` keeps it on disk
(``wandb sync`` uploads later). Needs ``pip install 'clharness[wandb]'``.
"""
from __future__ import annotations

import clharness as clh
from clharness.reporting.loggers import final_metrics, matrix_image, require, run_config, task_rows


class WandbLogger:
    def __init__(self, project: str):
        self.wandb = require("wandb", "wandb")
        self.project = project

    @clh.hookimpl
    def clharness_run_finished(self, record):
        wandb = self.wandb
        run = wandb.init(project=self.project, group=record.suite, job_type=record.scenario,
                         name=record.case_id, config=run_config(record), reinit="create_new",
                         settings=wandb.Settings(console="off", silent=True))
        try:
            for i, row in enumerate(task_rows(record)):
                run.log({f"accuracy/{name}": value for name, value in row.items()}, step=i)
            run.summary.update(final_metrics(record))
            if record.acc_matrix:
                run.log({"accuracy_matrix": wandb.Image(matrix_image(record), caption=record.case_id)})
        finally:
            run.finish(exit_code=0 if record.status == "passed" else 1)
