"""``--clh-log mlflow:URI``: one MLflow run per case, in an experiment named after the suite.

Params are the run's identity and hyperparameters, tags name suite, scenario, method and seed;
metrics ``accuracy/task_j`` and ``accuracy/seen`` carry step i (after learning task i), the final
metrics the last step; the accuracy matrix is the artifact ``accuracy_matrix.json``. URI is any
tracking URI (``file:///path/mlruns`` for a local file store, ``http://host:5000`` for a server).
Needs ``pip install 'clharness[mlflow]'``.
"""
from __future__ import annotations

import math
import time

import clharness as clh
from clharness.reporting.loggers import LoggerError, final_metrics, require, run_config, task_rows


class MlflowLogger:
    def __init__(self, uri: str):
        self.mlflow = require("mlflow", "mlflow")
        self.uri = uri
        if not uri.startswith(("http:", "https:", "databricks")):   # a local store: unusable is a usage error now
            try:
                self.mlflow.MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
            except self.mlflow.exceptions.MlflowException as exc:
                raise LoggerError(f"--clh-log mlflow:{uri}: MLflow cannot use this tracking store: {exc}") from None

    def experiment_id(self, client, name: str) -> str:
        found = client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return client.create_experiment(name)
        except self.mlflow.exceptions.MlflowException:   # another xdist worker created it first
            return client.get_experiment_by_name(name).experiment_id

    @clh.hookimpl
    def clharness_run_finished(self, record):
        from mlflow.entities import Metric, Param
        client = self.mlflow.MlflowClient(tracking_uri=self.uri)
        tags = {"clharness.suite": record.suite, "clharness.engine.scenario": record.scenario,
                "clharness.method": record.method, "clharness.seed": str(record.seed),
                "clharness.status": record.status}
        run = client.create_run(self.experiment_id(client, record.suite), run_name=record.case_id, tags=tags)
        run_id, now = run.info.run_id, int(time.time() * 1000)
        rows = task_rows(record)
        metrics = [Metric(f"accuracy/{name}", value, now, i) for i, row in enumerate(rows) for name, value in row.items()]
        metrics += [Metric(name, value, now, max(len(rows) - 1, 0)) for name, value in final_metrics(record).items()]
        params = [Param(k, str(v)[:500]) for k, v in run_config(record).items()]
        for start in range(0, max(len(metrics), 1), 1000):   # log_batch takes at most 1000 metrics
            client.log_batch(run_id, metrics=metrics[start:start + 1000], params=params if start == 0 else [])
        matrix = [[None if math.isnan(v) else v for v in row] for row in record.acc_matrix]
        client.log_dict(run_id, {"case": record.case_id, "acc_matrix": matrix}, "accuracy_matrix.json")
        client.set_terminated(run_id, status="FINISHED" if record.status == "passed" else "FAILED")
