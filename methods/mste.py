"""MSTE, "multiple single-task experts" (the M2I/I2M paper's architectural baseline, sec. 4.2): one
independent network per task, each trained only on its own task and asked only about it."""
import torch

import clharness as clh
from clharness.toolkit.training import NEG, SupervisedMethod, optimizer_space


class MSTE(SupervisedMethod):
    """A fresh backbone + head per task (``context.make_classifier``), trained on that task alone;
    ``predict(x, task_id)`` answers with the expert of ``task_id`` over its task's classes. Needs the
    task id at test time, so it is task-incremental only (class-incremental cases are not applicable)."""
    name = "mste"
    ensemble = True   # seeds train as one batched model (engine.ensemble): members equal their solo runs (a fresh expert per task, standard fit)
    paper = ("K. Faber, D. Zurek, M. Pietron, N. Japkowicz, A. Vergari, R. Corizzo, From MNIST to ImageNet and back: "
             "benchmarking continual curriculum learning, Machine Learning 2024 (sec. 4.2)")
    reference = "lifelonglab/M2I_I2M_benchmark: experiment.py"
    deviations = ("the authors' public code runs the other baselines through Avalanche but has no MSTE: it follows "
                  "the paper's sec. 4.2 text (one independent network per task, asked only about its task)",
                  "each expert is the suite's backbone + head, seeded by run and task")
    settings = frozenset({clh.Setting.TASK_IL})
    hparams = optimizer_space(lr=0.01, momentum=0.9)

    def __init__(self, context, **hparams):
        super().__init__(context, **hparams)
        self.experts = torch.nn.ModuleList()
        self.expert_classes: list[tuple[int, ...]] = []
        self.model = None   # the expert being trained (fit trains self.model)

    def learn(self, experience):
        self.labels.add(experience)
        # each expert's initialisation depends on the run seed and its task only (not on the global RNG's
        # history), so a restored snapshot learns the same expert again
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.context.seed * 1000 + len(self.experts))
            self.model = self.context.make_classifier()
        self.fit(experience.batches(epochs=self.context.epochs))
        self.experts.append(self.model)
        self.expert_classes.append(tuple(experience.classes))

    @torch.no_grad()
    def predict(self, x, task_id=None):
        """With ``task_id``: its expert's logits over its task's classes, every other class NEG (a task
        not learned yet has no expert: all NEG). Without one (never in task-incremental cases, e.g. a
        user's own probe): every expert answers for its own classes."""
        logits = torch.full((len(x), self.context.num_classes), NEG, device=x.device)
        if task_id is None:
            chosen = range(len(self.experts))
        else:
            chosen = [task_id] if 0 <= task_id < len(self.experts) else []
        for t in chosen:
            expert, classes = self.experts[t].eval(), list(self.expert_classes[t])
            with torch.autocast("cuda", dtype=torch.float16, enabled=self.context.amp and x.is_cuda):
                logits[:, classes] = expert(x).float()[:, classes]
        return logits

    @torch.no_grad()
    def features(self, x):
        expert = self.experts[-1] if len(self.experts) else self.context.make_classifier()
        return expert.eval().features(x)
