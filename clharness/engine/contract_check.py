"""The method contract checked before anything trains (issue 38 item 5): one dry ``predict`` on a
batch of the first task's training inputs, so a wrong logits shape, an integer dtype or a non-finite
logit fails the case in a second, not after task 0 has trained.

The dry call changes nothing a record depends on: it runs without gradients, under the caller's
random-stream guard (Python, NumPy, torch CPU and the device's generators put back as they were),
under the evaluation guard (the method's tensors unchanged, clharness.state_guard), and every module is
put back in the training mode it was in. So a run with the check has the same numbers as one without.
"""
from __future__ import annotations

import torch

from ..method import MethodError, Setting
from .continual_eval import _modules
from ..state_guard import unchanged


def first_inputs(scenario) -> torch.Tensor | None:
    """A batch of the inputs the method trains on first, in data order (no shuffling, no augmentation):
    task 0's training data, or the head of a task-free stream; None for a scenario with neither."""
    if getattr(scenario, "tasks", None):
        batches = scenario.experience(0).batches(shuffle=False, augment=False)
        return next(iter(batches)).x
    stream = getattr(scenario, "stream", None)
    if stream is not None:
        return next(iter(stream.batches(scenario.spec.batch_size)))[0]
    return None


def dry_predict(method, scenario, device: torch.device, rng_guard) -> None:
    """Raise MethodError (without a chained traceback: one message, printed once) when ``method.predict``
    on the first task's training inputs returns anything but finite floating logits of shape
    (batch, num_classes). ``rng_guard(device)``: the runner's ``isolated_rng``."""
    with rng_guard(device):
        x = first_inputs(scenario)
        if x is None:
            return
        task_id = 0 if scenario.setting is Setting.TASK_IL else None
        modes = [(m, m.training) for m in _modules(method)]
        try:
            with torch.no_grad(), unchanged(method, "predict() before training"):
                logits = method.predict(x, task_id=task_id)
        finally:
            for module, training in modes:
                module.train(training)
    problem = _problem(logits, len(x), scenario.num_classes)
    if problem:
        raise MethodError(f"method {method.name!r}: predict() on a batch of task 0's training inputs, before "
                          f"training, {problem}; the contract: predict(x) returns floating-point logits of "
                          f"shape (N, num_classes) over the global class ids") from None


def _problem(logits, n: int, num_classes: int) -> str | None:
    if not isinstance(logits, torch.Tensor):
        return f"returned a {type(logits).__name__}, expected a tensor of shape ({n}, {num_classes})"
    if tuple(logits.shape) != (n, num_classes):
        return f"returned shape {tuple(logits.shape)}, expected ({n}, {num_classes})"
    if not logits.is_floating_point():
        return f"returned dtype {logits.dtype}, expected a floating dtype"
    if not torch.isfinite(logits).all():
        return f"returned {int((~torch.isfinite(logits)).sum())} non-finite logit(s)"
    return None
