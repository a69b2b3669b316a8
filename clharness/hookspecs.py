"""The plugin contract (pluggy project ``clharness``), registry-passing like pytest's hooks.

Implement any of these in a module marked with ``@clharness.hookimpl`` and make the module
known by the ``clharness`` entry-point group, a ``conftest.py``, or ``-p``/``--clh-plugin``.
"""
import pluggy

hookspec = pluggy.HookspecMarker("clharness")
hookimpl = pluggy.HookimplMarker("clharness")


@hookspec
def clharness_add_methods(registry):
    """Add Method classes: ``registry.add(MyMethod)`` (its ``name`` is the key)."""


@hookspec
def clharness_add_datasets(registry):
    """Add dataset sources: ``registry.add("name", source)``."""


@hookspec
def clharness_add_suites(registry):
    """Add suite files: ``registry.add("name", path_to_toml)``."""


@hookspec
def clharness_add_backbones(registry):
    """Add backbone factories: ``registry.add("name", fn)``, ``fn(input_shape, **options) -> nn.Module``
    with an ``out_dim`` attribute."""


@hookspec
def clharness_add_augmentations(registry):
    """Add training augmentation recipes: ``registry.add(recipe)`` (a ``clharness.toolkit.augment.Recipe``
    instance; its ``name`` is what the suite key ``augment`` names)."""


@hookspec
def clharness_add_kinds(registry):
    """Add benchmark families (the ``kind`` a suite scenario names): ``registry.add(clharness.Kind(name,
    module))``; the module's interface is documented in ``clharness.kinds``. The five built-in
    families (``clharness.benchmarks``) register through this hook too."""


@hookspec
def clharness_run_finished(record):
    """Called with every finished RunRecord (loggers, trackers); return value ignored."""


@hookspec
def clharness_training_loss(record, step, loss):
    """Live training loss: called after every ``Trainer`` step of a run this process trains, with the
    run's (unfinished) RunRecord, the step number within the run and the loss as a float. Implemented
    by the loggers; a session with no implementation pays nothing (the loss is never read back)."""
