"""Experience replay (Chaudhry et al. 2019, "On tiny episodic memories in continual learning"):
every step trains on the current minibatch concatenated with an equal-size minibatch drawn
from a memory of ``context.memory_size`` exemplars."""
import functools

import torch

import clharness as clh
from clharness.toolkit.buffers import ClassBalancedBuffer, ReservoirBuffer
from clharness.toolkit.training import OPTIMIZER_SPACE, SupervisedMethod, Trainer


class ER(SupervisedMethod):
    name = "er"
    ensemble = True   # seeds train as one batched model (engine.ensemble): members equal their solo runs
    ensemble_steps = {"replay_loss": ("replay_batch", "loss", None)}   # its replay draw per member
    paper = "Chaudhry et al., On Tiny Episodic Memories in Continual Learning, arXiv 2019"
    reference = "aimagelab/mammoth: models/er.py"
    deviations = (
        "offline tasks offer their samples to the memory after the task (online streams after every "
        "minibatch); the references add each incoming batch after its step, so replay during task t "
        "already holds task t (ER-ACE and GMED do that here)",
        "the memory is class-balanced by default (buffer = 'reservoir' gives the references' reservoir)",
    )
    settings = frozenset({clh.Setting.CLASS_IL, clh.Setting.TASK_IL, clh.Setting.ONLINE, clh.Setting.DOMAIN_IL})
    hparams = {**OPTIMIZER_SPACE, "buffer": clh.Choice(["class-balanced", "reservoir"])}
    # CLDyB B.3 selection space (clharness/engine/hparam_selection.py): the lr values of aimagelab/mammoth's
    # utils/best_args.py for ER: 0.01 (seq-mnist 200), 0.03 (seq-tinyimg 500), 0.1 (seq-cifar10,
    # seq-cifar100, seq-tinyimg 200/5120; our default), 0.2 (perm-/rot-mnist, mnist-360). 4 candidates.
    # GTEP's spaces = "paper" ignores it (Table 4's Replay row is general-only); spaces = "method" searches it.
    tuning_space = {"lr": clh.Choice([0.01, 0.03, 0.1, 0.2])}
    OFFER_ROWS = 256   # rows per buffer.add after a task (224x224 RGB: 154 MB of float inputs at once)

    def __init__(self, context, **hparams):
        super().__init__(context, **hparams)
        kind = ClassBalancedBuffer if self.hp["buffer"] == "class-balanced" else ReservoirBuffer
        self.buffer = kind(context.memory_size, seed=context.seed)
        self.gen = torch.Generator().manual_seed(context.seed)

    def replay_batch(self, x, y, augment=None):
        """B_n ∪ B_M: the stream batch and an equal-size replay batch drawn from the memory with
        ``self.gen``. The memory holds raw views; with the suite's augmentation the joint batch gets
        one random view per sample, fresh and replayed alike (PyCIL augments every sample it loads),
        drawn in one batched call. Every random draw of a step is here (--clh-ensemble draws it per
        seed, then batches the loss over seeds)."""
        if len(self.buffer):
            mx, my = self.buffer.sample(len(y), self.gen)
            x, y = torch.cat([x, mx]), torch.cat([y, my])
        return (x if augment is None else augment(x)), y

    def replay_loss(self, x, y, augment=None):
        # ER loss (Chaudhry et al. 2019, Alg. 1): cross-entropy over B_n ∪ B_M in one forward pass
        x, y = self.replay_batch(x, y, augment)
        return self.cross_entropy(self.model(x), y)

    def learn(self, experience):
        self.labels.add(experience)
        augmenting = experience.augmenting   # then the raw batches, augmented together with the replay
        loss = functools.partial(self.replay_loss, augment=experience.augment) if augmenting else self.replay_loss
        self.fit(experience.batches(epochs=self.task_epochs(), augment=not augmenting), loss)
        # One pass, each sample offered to the memory once, in the shuffled order; in chunks of
        # OFFER_ROWS, not minibatches: the buffer places row by row, so the memory is the same, in
        # fewer calls (the per-call cost dominated this pass on small inputs).
        for x, y in experience.batches(batch_size=max(self.OFFER_ROWS, experience.batch_size), augment=False):
            self.buffer.add(x, y)

    def observe(self, batch):
        self.trainer = getattr(self, "trainer", None) or Trainer.for_method(self)
        self.fit([batch], self.replay_loss, trainer=self.trainer)
        self.buffer.add(batch.x, batch.y)
