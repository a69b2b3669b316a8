"""Helpers of the ensemble tests (a helper module, not a test file): the small digits suite they run
under pytest, and members paused at their fit as engine.ensemble pauses them."""


def mini_suite(seeds: int = 2, hidden: int = 32, suite_keys: str = "", task_il: bool = False) -> str:
    """A suite file's text: split digits (5 tasks), an MLP of ``hidden`` units, one epoch, ``seeds``
    seeds; ``suite_keys`` are extra [suite] lines; ``task_il`` adds a task-incremental scenario."""
    extra = '\n[[scenario]]\nname = "ti"\nsetting = "task-incremental"\n' if task_il else ""
    return (f'[suite]\nname = "mini"\nseeds = {seeds}\n{suite_keys}\n'
            f'[defaults]\ndataset = "digits"\nbackbone = "mlp"\nbackbone_options = {{ hidden = {hidden}, layers = 1 }}\n'
            f'epochs = 1\ntasks = 5\n\n[[scenario]]\nname = "ci"\n{extra}')


def paused_members(methods, data, step=None) -> list:
    """One ``engine.ensemble._Member`` per method, paused at its ``fit(batches)`` with ``data``'s batches
    (and ``step(method)`` as its declared step, when given): what ``_train_task`` trains."""
    from clharness.engine.ensemble_members import _Member
    members = []
    for method, batches in zip(methods, data):
        m = _Member(None, None)
        m.method, m.batches = method, iter(batches)
        if step is not None:
            m.step = step(method)
        members.append(m)
    return members
