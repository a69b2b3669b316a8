"""The small digits suite the ensemble tests run under pytest (a helper module, not a test file)."""


def mini_suite(seeds: int = 2, hidden: int = 32, suite_keys: str = "", task_il: bool = False) -> str:
    """A suite file's text: split digits (5 tasks), an MLP of ``hidden`` units, one epoch, ``seeds``
    seeds; ``suite_keys`` are extra [suite] lines; ``task_il`` adds a task-incremental scenario."""
    extra = '\n[[scenario]]\nname = "ti"\nsetting = "task-incremental"\n' if task_il else ""
    return (f'[suite]\nname = "mini"\nseeds = {seeds}\n{suite_keys}\n'
            f'[defaults]\ndataset = "digits"\nbackbone = "mlp"\nbackbone_options = {{ hidden = {hidden}, layers = 1 }}\n'
            f'epochs = 1\ntasks = 5\n\n[[scenario]]\nname = "ci"\n{extra}')
