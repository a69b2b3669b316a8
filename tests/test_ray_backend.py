"""--clh-ray (issue 18): cases as Ray tasks give the serial session's records, plugins travel, a dead
worker's case is retried, an interrupted driver's rerun reuses what finished.

One local Ray runtime of 2 CPUs per test module (per pytest-xdist worker); the sessions run in process
(pytester) and join it, except the driver that is SIGKILLed, which runs in a subprocess and joins it
by address."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray

import clharness.runner  # noqa: F401  (loaded once: pytester runs share one torch)
from clharness.results import ResultsStore

QUICK = ["--clh-suite", "quickstart", "--clh-quick", "--clh-seeds", "2", "--clh-method", "finetune",
         "--clh-method", "er", "-k", "not gate", "-p", "no:cacheprovider"]


@pytest.fixture(scope="module")
def ray_runtime():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def records(path) -> dict:
    return {r.key: r for r in ResultsStore(path).records()}


def test_quickstart_through_ray_equals_the_serial_session(pytester, ray_runtime):
    serial = pytester.runpytest(*QUICK, "--clh-results", "serial.sqlite")
    serial.assert_outcomes(passed=4, deselected=1)
    remote = pytester.runpytest(*QUICK, "--clh-results", "ray.sqlite", "--clh-ray", "auto")
    remote.assert_outcomes(passed=4, deselected=1)
    a, b = records(pytester.path / "serial.sqlite"), records(pytester.path / "ray.sqlite")
    assert sorted(a) == sorted(b) and len(a) == 4
    for key in a:   # bit-identical: compared as exact floats, not approximately
        assert a[key].acc_matrix == b[key].acc_matrix, a[key].case_id
        assert a[key].status == b[key].status == "passed"
    # progress lines as in a serial session, in collection order
    remote.stdout.fnmatch_lines(["*4 passed*"])
