"""Continual evaluation (De Lange, van de Ven and Tuytelaars, "Continual evaluation for lifelong
learning: identifying the stability gap", ICLR 2023): with the scenario key ``eval_every = N``, every N
training iterations the learner is scored on a fixed subsample of every task seen so far, and the curve
is stored in the record (``extra["continual"]``) beside the per-task matrix.

- An iteration is one minibatch of a shuffled pass over the task's data (``Experience.batches``),
  counted when the method asks for the next one, i.e. after its optimizer step; methods that train
  without ``experience.batches`` are scored only at task ends.
- The cost is bounded: ``eval_samples`` test images per task (default 100; a fixed subsample, the same
  at every point, drawn once per run), so a point costs at most ``T x eval_samples`` predictions.
- Scoring never changes training: it runs on forked random streams and puts every module of the method
  back in the mode it was in (a method that set ``train()`` once per task keeps training in train mode).
- Evaluation time is not training time.
Metrics from the curve: ``clharness.metrics.continual_metrics``.
"""
from __future__ import annotations

import time

import torch

from .. import metrics


class ContinualEval:
    def __init__(self, method, scenario, device, every: int, samples: int, seed: int, accuracy, isolated_rng):
        self.method, self.scenario, self.device = method, scenario, device
        self.accuracy, self.isolated_rng = accuracy, isolated_rng   # the runner's (no import back up)
        self.every, self.iteration, self.seconds = every, 0, 0.0
        g = torch.Generator().manual_seed(seed * 7919 + 17)
        self.subsets = [Subsample(task.test, samples, g, scenario.spec.eval_batch_size) for task in scenario.tasks]
        self.points: list[dict] = []

    def hook(self, task: int):
        """The ``Experience.on_step`` of ``task``."""
        def on_step():
            self.iteration += 1
            if self.iteration % self.every == 0:
                self.score(task, boundary=False)
        return on_step

    def score(self, task: int, boundary: bool) -> None:
        t0 = time.perf_counter()
        modes = [(m, m.training) for m in _modules(self.method)]
        with self.isolated_rng(self.device):
            acc = [self.accuracy(self.method, self.subsets[j], None, self.scenario.num_classes, self.device,
                            f"iteration {self.iteration}", None, self.scenario.spec.eval_batch_size,
                            f"task {j}'s evaluation subsample")
                   for j in range(task + 1)]
        for module, training in modes:
            module.train(training)
        self.points.append({"iteration": self.iteration, "task": task, "acc": acc, "boundary": boundary})
        self.seconds += time.perf_counter() - t0

    def result(self) -> dict:
        return {"every": self.every, "samples_per_task": [len(s) for s in self.subsets], "points": self.points}

    def metrics(self) -> dict[str, float]:
        return metrics.continual_metrics(self.points, len(self.scenario.tasks))


def _modules(method) -> list[torch.nn.Module]:
    """Every module the method holds (attributes, and modules in its lists and dicts)."""
    seen, out = set(), []
    values = list(vars(method).values())
    for v in values:
        if isinstance(v, (list, tuple)):
            values += [x for x in v if isinstance(x, torch.nn.Module)]
        elif isinstance(v, dict):
            values += [x for x in v.values() if isinstance(x, torch.nn.Module)]
        elif isinstance(v, torch.nn.Module):
            for m in v.modules():
                if id(m) not in seen:
                    seen.add(id(m))
                    out.append(m)
    return out


class Subsample:
    """A fixed random subsample of a task's test data, prepared once and kept (``n`` inputs per task:
    for 224 px images, 100 per task and 10 tasks hold about 600 MB as float32)."""

    def __init__(self, data, n: int, generator: torch.Generator, batch_size: int):
        keep = torch.randperm(len(data), generator=generator)[:min(n, len(data))].sort().values
        xs, ys, start = [], [], 0
        for x, y in data.batches(batch_size):   # in order, unshuffled: pick the kept rows of each batch
            rows = keep[(keep >= start) & (keep < start + len(y))] - start
            xs.append(x[rows.to(x.device)])
            ys.append(y[rows.to(y.device)])
            start += len(y)
        self.x, self.y = torch.cat(xs), torch.cat(ys)

    def __len__(self) -> int:
        return len(self.y)

    def batches(self, batch_size: int):
        for i in range(0, len(self.y), batch_size):
            yield self.x[i:i + batch_size], self.y[i:i + batch_size]
