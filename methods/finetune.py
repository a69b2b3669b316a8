"""Fine-tuning: plain training on each task in turn, nothing against forgetting (the lower bound)."""
import clharness as clh
from clharness.toolkit.training import SupervisedMethod, Trainer


class Finetune(SupervisedMethod):
    """Cross-entropy on the current task only (task-incremental: over the task's classes)."""
    name = "finetune"
    ensemble = True   # seeds train as one batched model (engine.ensemble): members equal their solo runs
    paper = ("V. Lomonaco et al., Avalanche: an End-to-End Library for Continual Learning, CVPR Workshops 2021 "
             "(the Naive lower bound)")
    reference = "ContinualAI/avalanche: avalanche/training/supervised/strategy_wrappers.py"
    deviations = ("task-incremental: cross-entropy over the task's own classes of the single head (Avalanche's "
                  "Naive trains whatever head the model has: all outputs, or a multi-head model's task head)",)
    settings = frozenset({clh.Setting.CLASS_IL, clh.Setting.TASK_IL, clh.Setting.ONLINE, clh.Setting.DOMAIN_IL})

    def observe(self, batch):
        self.trainer = getattr(self, "trainer", None) or Trainer.for_method(self)
        self.fit([batch], trainer=self.trainer)
