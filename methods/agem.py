"""Averaged Gradient Episodic Memory (Chaudhry, Ranzato, Rohrbach & Elhoseiny 2019, "Efficient lifelong
learning with A-GEM")."""
import clharness as clh
from clharness.toolkit.gradient_projection import GradientEpisodicMethod, agem_project


class AGEM(GradientEpisodicMethod):
    """Keeps ``patterns_per_task`` samples of every finished task. Each step computes the reference
    gradient g_ref on ``sample_size`` samples drawn from the whole memory and, where the current
    gradient g conflicts with it (g . g_ref < 0), steps along g projected as in eq. 11.
    M2I Table 9: 256 patterns per task, sample size 1300."""
    name = "agem"
    hparams = {**GradientEpisodicMethod.hparams, "sample_size": clh.Int(1, 100000, default=1300)}

    def memory_batches(self):
        return [self.memory.sample(self.hp["sample_size"])]

    def project(self, g, references):
        return agem_project(g, references[0])
