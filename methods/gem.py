"""Gradient Episodic Memory (Lopez-Paz & Ranzato 2017, "Gradient episodic memory for continual learning")."""
import clharness as clh
from clharness.toolkit.gradient_projection import GradientEpisodicMethod, gem_project


class GEM(GradientEpisodicMethod):
    """Keeps ``patterns_per_task`` samples of every finished task. Each step computes one gradient per
    past task on its memory (eq. 7's constraints <g, g_k> >= 0) and, if the current gradient violates
    any, replaces it by the closest gradient that satisfies all (eqs. 10-13, a QP solved in its dual;
    ``memory_strength`` is the margin of the authors' code, M2I Table 9: 0.5)."""
    name = "gem"
    paper = "D. Lopez-Paz, M. Ranzato, Gradient Episodic Memory for Continual Learning, NeurIPS 2017"
    reference = "facebookresearch/GradientEpisodicMemory: model/gem.py"
    deviations = ("the memory holds patterns_per_task random samples of each finished task, stored after the task "
                  "(as Avalanche's GEMPlugin); the authors' single-pass code keeps a ring buffer of the task's "
                  "latest samples",
                  "the dual QP is solved as non-negative least squares (scipy nnls) instead of quadprog, same "
                  "margin (memory_strength 0.5) and eps ridge 1e-3 as the authors' code",
                  "SGD with momentum 0.9 by default (M2I Table 9); the authors' code uses plain SGD")
    hparams = {**GradientEpisodicMethod.hparams, "memory_strength": clh.Float(0.0, 10.0, default=0.5)}

    def memory_batches(self):
        return self.memory.tasks

    def project(self, g, references):
        return gem_project(g, references, self.hp["memory_strength"])
