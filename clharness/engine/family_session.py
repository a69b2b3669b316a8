"""The engine's side of the family contract's session (``kinds.FamilySession``): what a collecting
family (GTEP, CLDyB) asks of the engine, on the runner, the keys and hyperparameter selection.

``Session`` inherits it; ``FamilyServices()`` alone serves the part that needs no session (cases,
hyperparameters, keys, contexts, seeding) to a family's helpers called outside one, as tests do.
Everything torch-backed is imported on first use: a session starts light.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator


class FamilyServices:
    """``kinds.FamilySession``'s engine services (the session's own state, records and store, are
    ``Session``'s)."""

    def case(self, suite: str, spec, method: str, seed: int, hparams: dict, shared: bool = False):
        if shared:
            from .shared_case import SharedCase
            return SharedCase(suite, spec, method, seed, hparams)
        from .runner import Case
        return Case(suite, spec, method, seed, hparams)

    def resolve_hparams(self, method_cls, *layers: dict) -> dict:
        from .runner import resolve_hparams
        return resolve_hparams(method_cls, *layers)

    def search_keys(self, suite: str, scenario: dict, job: str, seed: int, search_version: int,
                    methods: list, code) -> tuple[str, str]:
        from . import keys
        definition = keys.search_definition(suite, scenario, job, seed, self.versions(), search_version, methods, code)
        return keys.record_key(definition), keys.base_key_of(definition)   # base: the same search under any code

    def code_digest(self, obj, family_file: str | None) -> str:
        from .code_identity import code_digest
        return code_digest(obj, family_file)

    def versions(self) -> dict[str, str]:
        from .runner import versions
        return versions()

    def method_context(self, case, shape, harness, device):
        from .runner import make_context
        return make_context(case, shape, harness, device)

    def seed_everything(self, seed: int) -> None:
        from .runner import seed_everything
        seed_everything(seed)

    @contextlib.contextmanager
    def counted(self, record) -> Iterator[Callable]:
        """What runs inside counted as ``record``'s run, as the runner counts a case (engine.flops, engine.peak_memory):
        at the exit ``record`` holds its train_gflops and eval_gflops (None, with ``extra["flops"]`` saying why,
        where the count is incomplete) and its peaks since the start. Yields ``flops.evaluating``: work inside it
        is evaluation; a module function (picklable), it marks the counted run of the thread it runs in."""
        from . import flops, peak_memory
        peak_memory.reset(self.device)
        meter = flops.RunMeter()
        try:
            with meter:
                yield flops.evaluating
        finally:
            meter.stamp(record)
            record.peak_rss_mb, record.peak_cuda_mb = peak_memory.read(self.device)

    # --- these need the session (its harness, its device) ---
    harness: Any
    device: Any

    def case_unit(self, suite, name: str, case, **fields):
        from .units import case_unit
        return case_unit(suite, name, case, self.harness.methods[case.method], **fields)

    def selection_units(self, suite, case, name: str, *, after: str | None, make_plain: Callable):
        from .hparam_selection import units
        return units(self, suite, case, name, self.harness.methods[case.method], after=after, make_plain=make_plain)
