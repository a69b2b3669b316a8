"""Averaged Gradient Episodic Memory (Chaudhry, Ranzato, Rohrbach & Elhoseiny 2019, "Efficient lifelong
learning with A-GEM")."""
import clharness as clh
from clharness.toolkit.gradient_projection import GradientEpisodicMethod, agem_project


class AGEM(GradientEpisodicMethod):
    """Keeps ``patterns_per_task`` samples of every finished task. Each step computes the reference
    gradient g_ref on ``sample_size`` samples drawn without replacement from the whole memory (all of it
    while it holds fewer) and, where the current gradient g conflicts with it (g . g_ref < 0), steps
    along g projected as in eq. 11.

    ``sample_size`` 256: the authors' code (facebookresearch/agem, ``EPS_MEM_BATCH_SIZE`` of
    fc_permute_mnist.py and conv_split_cifar.py; 128 in the CUB/AWA scripts; 64 only in an early
    commit, 28e2cd5, raised to 256 in 4f6658b). The M2I suites set M2I Table 9's values themselves
    (256 patterns per task, sample size 1300)."""
    name = "agem"
    version = "2"   # 2: sample_size default 256 (the authors' code), was 1300 (M2I Table 9)
    paper = ("Chaudhry, Ranzato, Rohrbach & Elhoseiny, Efficient Lifelong Learning with A-GEM, "
             "ICLR 2019")
    reference = "facebookresearch/agem: conv_split_cifar.py"
    deviations = ()
    hparams = {**GradientEpisodicMethod.hparams, "sample_size": clh.Int(1, 100000, default=256)}

    def memory_batches(self):
        return [self.memory.sample(self.hp["sample_size"])]

    def project(self, g, references):
        return agem_project(g, references[0])
