import os
import random

import numpy as np
import pytest
import torch
from _pytest import pytester as _pytester

# Every test starts from the same random state, whatever ran before it in the session (or whether it
# runs alone): torch's, numpy's and Python's global generators are seeded per test. CLH_TEST_SEED
# picks another seed, to look for tests that pass for one draw only.
TEST_SEED = int(os.environ.get("CLH_TEST_SEED", "0"))

# pytester's in-process runs (`runpytest`) restore sys.modules afterwards, dropping every module first
# imported during the run, and the next import executes it again. Libraries with process-wide native
# state refuse that: torch's operator libraries (`torch.library.Library("_inductor_test", "DEF")` in
# torch/_inductor/test_operators.py, pulled in by torch._dynamo, which torch imports lazily on the
# first optimizer step) raise "Only a single TORCH_LIBRARY can be used to register the namespace ...",
# and single-phase C extensions (numpy.fft's _pocketfft_umath, imported lazily by scipy.sparse) raise
# "cannot load module more than once per process". These packages are kept across runs.
NATIVE_STATE = ("torch", "torchvision", "functorch", "triton", "numpy", "scipy", "sklearn")


def _keeps_native_state(name: str) -> bool:
    return name.split(".", 1)[0] in NATIVE_STATE


class _SysModulesSnapshot(_pytester.SysModulesSnapshot):
    """pytester's snapshot of sys.modules, also preserving the NATIVE_STATE packages."""

    def __init__(self, preserve=None) -> None:
        super().__init__(preserve=lambda name: _keeps_native_state(name) or bool(preserve and preserve(name)))


_pytester.SysModulesSnapshot = _SysModulesSnapshot   # looked up by name when pytester takes a snapshot


@pytest.fixture(autouse=True)
def seeded():
    """Seed torch, numpy and random before every test, so a test's draws do not depend on the tests
    that ran before it (and a test passes or fails alone as in the full suite)."""
    random.seed(TEST_SEED)
    np.random.seed(TEST_SEED)
    torch.manual_seed(TEST_SEED)
    yield TEST_SEED


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """The tests train tiny models: one intra-op thread is faster than several and immune to
    other processes on the cores (pytest-xdist workers, a loaded CI machine)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
