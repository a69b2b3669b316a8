"""ER-ACE, experience replay with the asymmetric cross-entropy (Caccia, Aljundi, Asadi, Tuytelaars,
Pineau & Belilovsky 2022, "New insights on reducing abrupt representation change in online continual
learning", ICLR; Algorithm 1 and the authors' code pclucas14/AML ``methods/er_ace.py``, also Mammoth
``models/er_ace.py``).

Each step, on the incoming minibatch B_n and an equal-size minibatch B_M drawn from the memory:

    L = L_inc(B_n) + L_CE(B_M)

- L_inc: cross-entropy on B_n in which the logits of the *old* classes absent from B_n are masked out:
  classes seen in earlier incoming batches but not present in this one. Classes present in B_n and
  classes never seen yet keep their logits (the references unmask ``[:, seen.max():]``), so new classes
  do not push the old classes' features away while unseen outputs still learn to stay low;
- L_CE: the ordinary cross-entropy over every class on the replayed minibatch.

After every step the incoming batch (raw views) is offered to the memory (reservoir sampling), so
replay during task t already holds task t, as in both references.

``first_task``: what the first task of an offline run does. "replay" (default; AML, the authors' code,
which forces ER-ACE task-free): replay and the asymmetric mask from the first step. "plain" (Mammoth):
the first task trains with the plain cross-entropy, no mask and no replay (both start with task 2).
A task-free stream (``observe``) always behaves as "replay".
"""
import torch
import torch.nn.functional as F

import clharness as clh
from clharness.toolkit.training import NEG, OPTIMIZER_SPACE, Trainer
from clharness_methods.er import ER


class ACE(ER):
    name = "ace"
    version = "2"   # 2: memory updated after every step, old-absent mask, augmentation (issue 28)
    paper = ("Caccia, Aljundi, Asadi, Tuytelaars, Pineau & Belilovsky, New Insights on Reducing Abrupt "
             "Representation Change in Online Continual Learning, ICLR 2022")
    reference = "pclucas14/AML: methods/er_ace.py"
    deviations = (
        "unseen classes are those no incoming batch has held (a set); the references take the labels >= "
        "the largest seen so far, which is the same when labels arrive in increasing order (harness class "
        "orders are shuffled) except that they also leave the largest seen label unmasked",
        "first_task='plain' gives Mammoth's models/er_ace.py: no mask and no replay during the first task",
        "in task-incremental runs each cross-entropy also competes within the sample's task (TaskLabels)",
    )
    settings = frozenset({clh.Setting.CLASS_IL, clh.Setting.TASK_IL, clh.Setting.ONLINE})
    hparams = {**OPTIMIZER_SPACE, "buffer": clh.Choice(["reservoir", "class-balanced"]),
               "first_task": clh.Choice(["replay", "plain"])}

    def __init__(self, context, **hparams):
        super().__init__(context, **hparams)
        self.seen = torch.zeros(context.num_classes, dtype=torch.bool, device=context.device)
        self.plain = False   # the first task under first_task="plain"

    def incoming_loss(self, logits, y):
        """L_inc: the logits of old classes absent from the batch set to a very low value."""
        present = torch.zeros_like(self.seen)
        present[y] = True
        self.seen |= present
        return F.cross_entropy(self.labels.mask(logits, y).masked_fill(self.seen & ~present, NEG), y)

    def replay_loss(self, x, y, augment=None):
        # L_ACE = L_inc(B_n) + L_CE(B_M), the replay batch the same size as the incoming one; with the
        # suite's augmentation both get a fresh random view (the memory keeps raw views)
        view = augment or (lambda v: v)
        if self.plain:
            self.seen[y] = True
            return self.cross_entropy(self.model(view(x)), y)
        loss = self.incoming_loss(self.model(view(x)), y)
        if len(self.buffer):
            mx, my = self.buffer.sample(len(y), self.gen)
            loss = loss + self.cross_entropy(self.model(view(mx)), my)
        return loss

    def learn(self, experience):
        self.labels.add(experience)
        self.plain = self.hp["first_task"] == "plain" and len(self.labels.tasks) == 1
        augment = experience.augment if experience.augmenting else None
        trainer = Trainer.for_method(self)
        self.model.train()
        for x, y in experience.batches(epochs=self.task_epochs(), augment=False):
            trainer.step(self.replay_loss, x, y, augment)
            self.buffer.add(x, y)   # the raw incoming batch, after the step (both references)
        trainer.check()
        self.plain = False
