"""Fine-tuning: plain training on each task in turn, nothing against forgetting (the lower bound)."""
import clharness as clh
from clharness.toolkit.training import SupervisedMethod, Trainer


class Finetune(SupervisedMethod):
    """Cross-entropy on the current task only (task-incremental: over the task's classes)."""
    name = "finetune"
    settings = frozenset({clh.Setting.CLASS_IL, clh.Setting.TASK_IL, clh.Setting.ONLINE})

    def observe(self, batch):
        self.trainer = getattr(self, "trainer", None) or Trainer.for_method(self)
        self.fit([batch], trainer=self.trainer)
