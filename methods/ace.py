"""ER-ACE, asymmetric cross-entropy (Caccia et al. 2021, "New insights on reducing abrupt
representation change in online continual learning"): the incoming minibatch's cross-entropy
only lets the classes present in that minibatch compete (the other logits are masked out), so
new classes do not push the old classes' features away; the replayed minibatch uses the
ordinary cross-entropy over every class. Memory: reservoir sampling, as in ER."""
import torch.nn.functional as F

import clharness as clh
from clharness.toolkit.training import NEG, OPTIMIZER_SPACE
from clharness_methods.er import ER


class ACE(ER):
    name = "ace"
    settings = frozenset({clh.Setting.CLASS_IL, clh.Setting.TASK_IL, clh.Setting.ONLINE})
    hparams = {**OPTIMIZER_SPACE, "buffer": clh.Choice(["reservoir", "class-balanced"])}

    def incoming_loss(self, logits, y):
        # L_inc: logits of classes absent from the incoming batch set to a very low value
        present = logits.new_zeros(logits.shape[1], dtype=bool)
        present[y] = True
        return F.cross_entropy(self.labels.mask(logits, y).masked_fill(~present, NEG), y)

    def replay_loss(self, x, y):
        # L_ACE = L_inc(B_n) + L_CE(B_M), the replay batch the same size as the incoming one
        loss = self.incoming_loss(self.model(x), y)
        if len(self.buffer):
            mx, my = self.buffer.sample(len(y), self.gen)
            loss = loss + self.cross_entropy(self.model(mx), my)
        return loss
