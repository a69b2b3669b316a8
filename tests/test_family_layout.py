"""Issue 13's layout: every family lives in its own folder and the five built-in families come
through the ``clharness_add_kinds`` hook with their sources. (Import direction and circles, lazy
imports included: tests/test_layers.py.)"""
from clharness.plugins import Harness

from test_layers import MODULES  # noqa: E402  (one walk of the package for both files)


def test_every_family_lives_in_its_own_folder():
    for family in ("splits", "stf", "m2i", "gtep", "cldyb", "domains"):
        assert f"clharness.benchmarks.{family}.kind" in MODULES
    for gone in ("scenarios", "cldyb", "stream_plots"):
        assert f"clharness.{gone}" not in MODULES


def test_builtin_kinds_register_through_the_hook():
    harness = Harness(entry_points=False)
    entries = {e.name: e for e in harness.kinds.entries()}
    assert set(entries) == {"split", "stf", "curriculum", "gtep", "cldyb", "domain"}
    assert all(e.source.startswith("clharness.benchmarks") for e in entries.values())
    assert entries["gtep"].obj.load().__name__ == "clharness.benchmarks.gtep.kind"
    impls = [i.plugin_name for i in harness.pm.hook.clharness_add_kinds.get_hookimpls()]
    assert any(name.startswith("clharness.benchmarks") for name in impls)
