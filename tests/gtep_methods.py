"""Methods for the GTEP tests, registered as an outside plugin's would be (``-p gtep_methods``)."""
import clharness as clh
from clharness.toolkit.training import OPTIMIZER_SPACE, SupervisedMethod


class Scaled(SupervisedMethod):
    """Fine-tuning with logits multiplied by ``scale``: a method with its own declared GTEP space."""
    name = "gtep-scaled"
    hparams = {**OPTIMIZER_SPACE, "scale": clh.Float(0.1, 10.0, default=1.0)}
    tuning_space = {"scale": clh.Choice([0.5, 1.0, 2.0])}

    def loss(self, x, y):
        return self.cross_entropy(self.model(x) * self.hp["scale"], y)


class Diverger(SupervisedMethod):
    """Diverges (a non-finite loss, as a too-high learning rate would) whenever lr >= 0.1."""
    name = "gtep-diverger"

    def loss(self, x, y):
        loss = super().loss(x, y)
        return loss * float("nan") if self.hp["lr"] >= 0.1 else loss


class Orphan(SupervisedMethod):
    """Declares a conditional parameter whose parent is not in its space: a GTEP collection error."""
    name = "gtep-orphan"
    hparams = {**OPTIMIZER_SPACE, "beta": clh.Float(0.0, 1.0, default=0.5)}
    tuning_space = {"beta": clh.Choice([0.1, 0.9], when={"use_beta": [True]})}


@clh.hookimpl
def clharness_add_methods(registry):
    for cls in (Scaled, Diverger, Orphan):
        registry.add(cls)
