"""Gradient Episodic Memory (Lopez-Paz & Ranzato 2017, "Gradient episodic memory for continual learning")."""
import clharness as clh
from clharness.toolkit.gradient_projection import GradientEpisodicMethod, gem_project


class GEM(GradientEpisodicMethod):
    """Keeps ``patterns_per_task`` samples of every finished task. Each step computes one gradient per
    past task on its memory (eq. 7's constraints <g, g_k> >= 0) and, if the current gradient violates
    any, replaces it by the closest gradient that satisfies all (eqs. 10-13, a QP solved in its dual;
    ``memory_strength`` is the margin of the authors' code, M2I Table 9: 0.5)."""
    name = "gem"
    hparams = {**GradientEpisodicMethod.hparams, "memory_strength": clh.Float(0.0, 10.0, default=0.5)}

    def memory_batches(self):
        return self.memory.tasks

    def project(self, g, references):
        return gem_project(g, references, self.hp["memory_strength"])
