"""GDumb (Prabhu et al. 2020, "GDumb: a simple approach that questions our progress in continual
learning"): a greedy class-balanced sampler fills the memory, and the "dumb learner" is a network
trained from scratch on the memory alone; at inference the logits of classes absent from the
memory are masked.

Offline (class-/task-incremental): every sample of the task is offered to the sampler, in the
experience's seeded random order (as a stream would deliver them; in folder order a class over its
quota would keep its first files), then the network is retrained from scratch on the memory.
Task-free (online): the original GDumb trains only after the whole stream (Verwimp et al. 2021);
the task-free variant the STF paper uses keeps sampling greedily and retrains from scratch on the
memory whenever a model is needed, here whenever ``predict``/``features`` is called after new
observations.
"""
import torch

import clharness as clh
from clharness.toolkit.buffers import _Buffer
from clharness.method import MethodError
from clharness.toolkit.training import NEG, OPTIMIZER_SPACE, SupervisedMethod


class GreedyClassBalancedMemory(_Buffer):
    """GDumb's sampler (Prabhu et al. 2020, section 3): store while there is room; when full, a
    sample whose class holds fewer than capacity / (classes seen) slots evicts a random exemplar of
    a largest class; otherwise it is dropped (no reservoir within the class, unlike CBRS)."""

    def __init__(self, capacity: int, seed: int = 0):
        super().__init__(capacity, seed)
        self.slots: dict[int, list[int]] = {}

    def _place(self, labels: list[int]) -> dict[int, int]:
        writes: dict[int, int] = {}
        for row, c in enumerate(labels):
            self.seen += 1
            own = self.slots.setdefault(c, [])
            if self.size < self.capacity:
                slot = self.size
                self.size += 1
            elif len(own) < self.capacity / len(self.slots):
                largest = max(len(s) for s in self.slots.values())
                donor = self.slots[self.rng.choice([k for k, s in self.slots.items() if len(s) == largest])]
                slot = donor.pop(self.rng.randrange(len(donor)))
            else:
                continue
            own.append(slot)
            writes.pop(slot, None)
            writes[slot] = row
        return writes

    def class_counts(self) -> dict[int, int]:
        return {c: len(s) for c, s in sorted(self.slots.items()) if s}


class GDumb(SupervisedMethod):
    name = "gdumb"
    ensemble = True   # seeds train as one batched model (engine.ensemble): members equal their solo runs (retrains on its memory with the standard fit)
    version = "2"   # 2: offline tasks feed the sampler in a seeded random order, not folder order
    paper = ("A. Prabhu, P. H. S. Torr, P. K. Dokania, GDumb: A simple approach that questions our progress in "
             "continual learning, ECCV 2020")
    reference = "drimpossible/GDumb: src/main.py"
    deviations = ("trained with the method's optimizer hyperparameters (constant SGD lr 0.1 by default); the "
                  "authors' code uses SGD momentum 0.9 with a 1-epoch warm-up, SGDR cosine restarts, cutmix and "
                  "gradient-norm clipping, and reports the best test accuracy over its epochs (no such selection here)",
                  "offline tasks offer their samples to the sampler in the experience's seeded random order",
                  "task-free: retrains from scratch whenever a model is needed after new observations (the STF "
                  "paper's variant), not once after the whole stream")
    settings = frozenset({clh.Setting.CLASS_IL, clh.Setting.TASK_IL, clh.Setting.ONLINE})
    hparams = {**OPTIMIZER_SPACE,
               "epochs": clh.Int(0, 1000, default=0)}      # passes over the memory per retraining; 0: context.epochs

    def __init__(self, context, **hparams):
        super().__init__(context, **hparams)
        if context.memory_size < 1:
            raise MethodError("gdumb learns from its memory alone; it needs memory_size >= 1 "
                              f"(got {context.memory_size}); set memory_size in the suite")
        self.memory = GreedyClassBalancedMemory(context.memory_size, seed=context.seed)
        self.gen = torch.Generator().manual_seed(context.seed)
        self.retrains = 0
        self.stale = False              # observations since the last retraining

    def learn(self, experience):
        self.labels.add(experience)
        for x, y in experience.batches(shuffle=True, augment=False):   # seeded; the memory keeps raw views
            self.memory.add(x, y)
        self.retrain(experience.augment if experience.augmenting else None)

    def observe(self, batch):
        self.memory.add(batch.x, batch.y)
        self.stale = True

    def retrain(self, augment=None):
        """A fresh network (seeded by the method, so snapshots replay exactly) trained on the memory;
        ``augment`` (the suite's recipe, offline tasks) draws a fresh view of every memory batch."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(hash((self.context.seed, self.retrains)) % 2**31)
            self.model = self.context.make_classifier()
        self.retrains += 1
        x, y = self.memory.tensors()
        epochs = self.hp["epochs"] or self.context.epochs
        bs = self.context.batch_size

        def batches():
            for _ in range(epochs):
                order = torch.randperm(len(y), generator=self.gen).to(y.device)
                for start in range(0, len(y), bs):
                    idx = order[start:start + bs]
                    yield (x[idx] if augment is None else augment(x[idx])), y[idx]
        self.fit(batches())
        self.stale = False

    def consolidate(self):
        """Retrain on the memory if it changed since the last retraining (task-free: before each
        evaluation, so the harness times it as training)."""
        if self.stale:
            with torch.enable_grad():       # predict and features run under no_grad
                self.retrain()

    def _mask_unseen(self, logits):
        seen = torch.zeros(logits.shape[1], dtype=torch.bool, device=logits.device)
        seen[list(self.memory.class_counts())] = True
        return logits.masked_fill(~seen, NEG)

    def predict(self, x, task_id=None):
        self.consolidate()
        return self._mask_unseen(super().predict(x, task_id))

    def features(self, x):
        self.consolidate()
        return super().features(x)

