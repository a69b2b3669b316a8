"""An adversarial spy method, registered as an outside plugin would be: it hands everything the
runner gives it (its context, the backbone it builds, every experience and every batch) to
``LeakSpy.inspect(step, what, obj)``, which tests/test_no_test_data_leak.py sets to a walk of the
object graph. It trains one SGD step per task or batch, so the protocols run to the end quickly."""
import torch
import torch.nn.functional as F

import clharness as clh


class LeakSpy(clh.Method):
    name = "leakspy"
    settings = {clh.Setting.CLASS_IL, clh.Setting.TASK_IL, clh.Setting.ONLINE}
    inspect = None            # set by the test: (step, what, obj) -> None
    task_ids: list = []       # every task_id that predict() was given

    def __init__(self, context, **hp):
        super().__init__(context, **hp)
        self.step = 0         # tasks learnt (offline) or minibatches observed (online) so far
        self._look("context", context)
        self.model = context.make_classifier()
        self._look("backbone", self.model)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05)

    def _look(self, what, obj):
        if LeakSpy.inspect is None:
            raise RuntimeError("LeakSpy.inspect is not set; the leak test sets it to its object-graph walk")
        LeakSpy.inspect(self.step, what, obj)

    def _sgd_step(self, x, y):
        self.opt.zero_grad()
        F.cross_entropy(self.model(x), y).backward()
        self.opt.step()

    def learn(self, experience):
        self._look("experience", experience)
        for i, batch in enumerate(experience.batches(epochs=1)):
            self._look("batch", batch)
            if i == 0:
                self._sgd_step(batch.x, batch.y)
        self.step += 1

    def observe(self, batch):
        self._look("batch", batch)
        self._sgd_step(batch.x, batch.y)
        self.step += 1

    def predict(self, x, task_id=None):
        LeakSpy.task_ids.append(task_id)
        return self.model(x)


@clh.hookimpl
def clharness_add_methods(registry):
    registry.add(LeakSpy)
