"""Small methods used by the harness's own tests, registered as an outside plugin would be."""
import torch
import torch.nn.functional as F

import clharness as clh


class Tiny(clh.Method):
    """A linear softmax classifier trained with SGD: fast, and learns the digits."""
    name = "tiny"
    hparams = {"lr": clh.Float(1e-3, 1.0, default=0.1, log=True)}

    def __init__(self, context, **hp):
        super().__init__(context, **hp)
        self.model = context.make_classifier()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=self.hp["lr"])

    def learn(self, experience):
        for x, y in experience.batches(epochs=self.context.epochs):
            self.opt.zero_grad()
            F.cross_entropy(self.model(x), y).backward()
            self.opt.step()


class Raiser(Tiny):
    """Raises while learning the third task."""
    name = "raiser"

    def learn(self, experience):
        self.seen = getattr(self, "seen", 0) + 1
        if self.seen == 3:
            raise ValueError("boom in the third task")
        super().learn(experience)


class BadShape(Tiny):
    name = "badshape"

    def predict(self, x, task_id=None):
        return self.model(x)[:, :3]


class NaNLogits(Tiny):
    """Finite logits until it has trained (the contract check before training passes), NaN after."""
    name = "nanlogits"

    def learn(self, experience):
        super().learn(experience)
        self.trained = True

    def predict(self, x, task_id=None):
        if not getattr(self, "trained", False):
            return super().predict(x, task_id)
        return torch.full((len(x), self.context.num_classes), float("nan"))


class Interrupter(Tiny):
    """Stops the session (like Ctrl-C) when run with seed 1."""
    name = "interrupter"

    def learn(self, experience):
        if self.context.seed == 1:
            raise KeyboardInterrupt
        super().learn(experience)


class Spy(Tiny):
    """Records what the runner hands it, to check the protocol."""
    name = "spy"
    settings = {clh.Setting.CLASS_IL, clh.Setting.TASK_IL}
    log = []

    def learn(self, experience):
        Spy.log.append({"task_id": experience.task_id, "classes": experience.classes,
                        "n": len(experience), "labels": sorted(set(experience.data.labels.tolist()))})
        super().learn(experience)


class OnlineOnly(Tiny):
    name = "online-only"
    settings = {clh.Setting.ONLINE}


@clh.hookimpl
def clharness_add_methods(registry):
    for cls in (Tiny, Raiser, BadShape, NaNLogits, Interrupter, Spy, OnlineOnly):
        registry.add(cls)
