"""Where a worker process's runs go: its share of the CPU threads and one GPU of those it may see.

Front ends call it at a worker's start (the pytest plugin for each pytest-xdist worker), before torch
starts: OMP_NUM_THREADS and CUDA_VISIBLE_DEVICES are read when torch and CUDA start, later.
"""
from __future__ import annotations

import os
from typing import MutableMapping


def pin_worker(index: int, workers: int, device: str, environ: MutableMapping[str, str] | None = None,
               cpus: int | None = None) -> None:
    """Worker ``index`` of ``workers``: its share of the CPU threads (N workers x all-core torch pools
    thrash the cores), unless the caller set OMP_NUM_THREADS; under ``--clh-device auto|cuda``, GPU
    ``index`` modulo the caller's CUDA_VISIBLE_DEVICES (default: every device torch counts)."""
    environ = os.environ if environ is None else environ
    share = max(1, (cpus or os.cpu_count() or 1) // max(1, workers))
    environ.setdefault("OMP_NUM_THREADS", str(share))
    if device not in ("auto", "cuda"):
        return
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        import torch   # only counting devices; CUDA_VISIBLE_DEVICES is read at CUDA init, later
        visible = ",".join(str(i) for i in range(torch.cuda.device_count()))
    gpus = [g for g in visible.split(",") if g.strip()]
    if gpus:
        environ["CUDA_VISIBLE_DEVICES"] = gpus[index % len(gpus)]
