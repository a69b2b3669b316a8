"""The built-in benchmark families, one package each, registered through ``clharness_add_kinds``
exactly as an outside package registers its own (see ``clharness.kinds`` for the interface).

    splits/   class- and task-incremental splits of one dataset (kind ``split``)
    stf/      simulated task-free online streams, their protocol and figures 2 and 4 (kind ``stf``)
    m2i/      the M2I / I2M curricula and the curriculum effect (kind ``curriculum``)
    gtep/     the generalizable two-phase evaluation protocol: tuning and evaluation items (kind ``gtep``)
    cldyb/    CLDyB: pool, hard-task sampling, clustering, sequence search and replay (kind ``cldyb``)
    domains/  domain-incremental streams: Permuted / Rotated digits and MNIST, CORe50, DomainNet (kind ``domain``)
"""
from ..hookspecs import hookimpl
from ..kinds import Kind

# The modules are named, not imported: each is imported when a suite first uses its kind.
BUILTIN = (Kind("split", "clharness.benchmarks.splits.kind"),
           Kind("stf", "clharness.benchmarks.stf.kind", cli="clharness.benchmarks.stf.plots"),
           Kind("curriculum", "clharness.benchmarks.m2i.kind", cli="clharness.benchmarks.m2i.effect"),
           Kind("gtep", "clharness.benchmarks.gtep.kind"),
           Kind("cldyb", "clharness.benchmarks.cldyb.kind"),
           Kind("domain", "clharness.benchmarks.domains.kind"))


@hookimpl
def clharness_add_kinds(registry):
    for kind in BUILTIN:
        registry.add(kind)


@hookimpl
def clharness_add_datasets(registry):
    from ..registry import Lazy   # imported when a scenario first uses it (needs torch and the data layer)
    registry.add("cldyb-pool", Lazy("clharness.benchmarks.cldyb.pool", "PoolFolder"))   # docs/cldyb-pool.md
