"""Joint training: the cumulative upper bound. Keeps every training set seen and, at each task,
trains on the union of all of them, starting from the current weights."""
import torch

import clharness as clh
from clharness.toolkit.buffers import DataStore
from clharness.toolkit.training import SupervisedMethod, optimizer_space


class Joint(SupervisedMethod):
    name = "joint"
    ensemble = True   # seeds train as one batched model (engine.ensemble): members equal their solo runs
    settings = frozenset({clh.Setting.CLASS_IL, clh.Setting.TASK_IL, clh.Setting.DOMAIN_IL})
    paper = ("V. Lomonaco et al., Avalanche: an End-to-End Library for Continual Learning, CVPR Workshops 2021 "
             "(the Cumulative upper bound)")
    reference = "ContinualAI/avalanche: avalanche/training/supervised/cumulative.py"
    deviations = ("this is Avalanche's Cumulative (at each task, retrain from the current weights on every "
                  "training set seen so far), not its JointTraining (one offline run on the union of all tasks)",
                  "SGD with momentum 0.9 by default (mixed batches of every class seen; Avalanche takes the "
                  "user's optimizer)")
    # Mixed batches of every class seen: no task-switch shock, so momentum is safe and steadier here.
    hparams = optimizer_space(lr=0.05, momentum=0.9)

    def __init__(self, context, **hparams):
        super().__init__(context, **hparams)
        self.store = DataStore()

    def learn(self, experience):
        self.labels.add(experience)
        self.store.add(experience.data)
        self.labels.epoch_steps = -(-len(self.store) // experience.batch_size)   # an epoch = the whole store
        gen = torch.Generator().manual_seed(experience.seed)
        # the store batches raw views; each gets the suite's augmentation (identity when none)
        self.fit((experience.augment(x), y) for _ in range(self.task_epochs())
                 for x, y in self.store.batches(experience.batch_size, gen))
