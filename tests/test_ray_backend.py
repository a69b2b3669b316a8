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

import clharness.benchmarks.cldyb.kind  # noqa: F401  (loaded before any in-process run: the spy patches it)
import clharness.benchmarks.cldyb.search  # noqa: F401  (loaded once: pytester runs share one torch)
import clharness.engine.ray_backend  # noqa: F401  (one module for the test and its sessions: the spy patches it)
import clharness.engine.runner  # noqa: F401
from clharness.results import ResultsStore
from clharness.benchmarks.gtep import summary as gtep_summary

HOME = os.environ.get("HOME", "")   # pytester moves HOME; Ray's auth token lives under the real one
QUICK = ["--clh-suite", "quickstart", "--clh-quick", "--clh-seeds", "2", "--clh-method", "finetune",
         "--clh-method", "er", "-k", "not gate", "-p", "no:cacheprovider"]


@pytest.fixture(scope="module")
def ray_runtime():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def records(path) -> dict:
    return {r.key: r for r in ResultsStore(path).records()}


@pytest.mark.slow   # ~68 s on 2 cores (CI under 15 min); Ray = serial stays in the default run (quickstart through Ray)
def test_serial_xdist_and_ray_give_bit_identical_matrices_at_the_default_threads(pytester, ray_runtime, monkeypatch):
    """One thread rule for every scheduler (--clh-cpus-per-run, default 1): a fresh serial process
    (torch would default to every core), two xdist workers and Ray workers give the same records. LwF's
    CPU result moves with the thread count, so it is the method that shows it."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parent.parent), str(Path(__file__).parent)]))
    args = ["--clh-suite", "quickstart", "--clh-quick", "--clh-seeds", "2", "--clh-method", "lwf",
            "--clh-method", "er", "-p", "no:cacheprovider"]   # the suite's gates name methods not run: none
    pytester.runpytest_subprocess(*args, "--clh-results", "serial.sqlite").assert_outcomes(passed=4)
    pytester.runpytest_subprocess(*args, "--clh-results", "xdist.sqlite", "-n", "2").assert_outcomes(passed=4)
    pytester.runpytest(*args, "--clh-results", "ray.sqlite", "--clh-ray", "local").assert_outcomes(passed=4)
    runs = [records(pytester.path / f"{name}.sqlite") for name in ("serial", "xdist", "ray")]
    assert sorted(runs[0]) == sorted(runs[1]) == sorted(runs[2]) and len(runs[0]) == 4
    for key in runs[0]:   # bit-identical: exact floats
        assert runs[0][key].acc_matrix == runs[1][key].acc_matrix == runs[2][key].acc_matrix, runs[0][key].case_id
        assert {r[key].cpu_threads for r in runs} == {1}
        # FLOPs (issue 41): the same counts whatever the scheduler, and counted
        assert len({(r[key].train_gflops, r[key].eval_gflops) for r in runs}) == 1
        assert runs[0][key].train_gflops > 0 and runs[0][key].eval_gflops > 0


def test_a_thread_count_other_than_one_is_part_of_the_key(pytester):
    from clharness.engine import runner
    case = runner.Case("s", _spec(), "finetune", 0, {})
    from clharness.plugins import Harness
    cls = Harness(entry_points=False).methods["finetune"]
    one = runner.case_key(case, cls)
    runner.set_cpu_threads(2)
    try:
        assert runner.case_key(case, cls) != one and runner.base_key(case, cls) != one
    finally:
        runner.set_cpu_threads(1)
    assert runner.case_key(case, cls) == one


def _spec():
    from clharness.engine.suites import load_suite
    return load_suite(Path(__file__).parent.parent / "suites" / "quickstart.toml").scenarios[0]


def test_quickstart_through_ray_equals_the_serial_session(pytester, ray_runtime):
    serial = pytester.runpytest(*QUICK, "--clh-results", "serial.sqlite")
    serial.assert_outcomes(passed=4, deselected=1)
    remote = pytester.runpytest(*QUICK, "--clh-results", "ray.sqlite", "--clh-ray", "local")
    remote.assert_outcomes(passed=4, deselected=1)
    a, b = records(pytester.path / "serial.sqlite"), records(pytester.path / "ray.sqlite")
    assert sorted(a) == sorted(b) and len(a) == 4
    for key in a:   # bit-identical: compared as exact floats, not approximately
        assert a[key].acc_matrix == b[key].acc_matrix, a[key].case_id
        assert a[key].status == b[key].status == "passed"
    # progress lines as in a serial session, in collection order
    remote.stdout.fnmatch_lines(["*4 passed*"])


METHODS = '''
"""Test plugin of tests/test_ray_backend.py: methods that say where they ran, a worker that dies once, a
slow one, one that fails, one that blocks; a generated dataset that logs every time it is made."""
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import clharness as clh
from clharness.data import ArrayDataset, DatasetSource

HERE = Path({here!r})


def log(name, line):
    with open(HERE / name, "a") as fh:   # one short append per line: whole lines across processes
        fh.write(line + "\\n")


class Where(clh.Method):
    """A linear classifier that leaves a file named after the process that trained it and logs the
    start of every case it trains (trained.log) and the end of its last task (done.log)."""
    name = "where"
    hparams = {{}}

    def __init__(self, context, **hp):
        super().__init__(context, **hp)
        self.model = context.make_classifier()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.seen = set()

    def learn(self, experience):
        (HERE / f"pid-{{os.getpid()}}").touch()
        if not self.seen:
            log("trained.log", f"{{self.name}} {{self.context.seed}}")
        for x, y in experience.batches(epochs=self.context.epochs):
            self.opt.zero_grad()
            F.cross_entropy(self.model(x), y).backward()
            self.opt.step()
        self.seen |= set(experience.classes)
        if len(self.seen) == self.context.num_classes:
            log("done.log", f"{{self.name}} {{self.context.seed}}")


class Dier(Where):
    """Kills its own worker process in its first task, once (a marker file remembers)."""
    name = "dier"

    def learn(self, experience):
        marker = HERE / "died-once"
        if not marker.exists():
            marker.touch()
            os._exit(1)
        super().learn(experience)


class Napper(Where):
    """Slow: half a second per task, so a session is still running when its driver is killed."""
    name = "napper"

    def learn(self, experience):
        time.sleep(0.5)
        super().learn(experience)


class Failer(Where):
    """Fails in its first task at seed 0."""
    name = "failer"

    def learn(self, experience):
        if self.context.seed == 0:
            raise RuntimeError("failer fails at seed 0")
        super().learn(experience)


class Blocker(Where):
    """Waits in its first task while the file block-<seed> exists (at most ten minutes: a safety net
    against a hung test, far beyond what a loaded CI machine takes to start the rest of the session)."""
    name = "blocker"

    def learn(self, experience):
        if not self.seen:
            log("trained.log", f"{{self.name}} {{self.context.seed}}")
            self.seen.add(-1)
            deadline = time.monotonic() + 600
            while (HERE / f"block-{{self.context.seed}}").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        super().learn(experience)
        if len(self.seen) == self.context.num_classes + 1:
            log("done.log", f"{{self.name}} {{self.context.seed}}")


class Counted(DatasetSource):
    """Generated 4-class 8x8 images (no files); every split it makes is logged (pid, split)."""
    needs_root = False

    def load(self, root, train, download=False):
        log("loads.log", f"{{os.getpid()}} {{'train' if train else 'test'}}")
        g = torch.Generator().manual_seed(int(train))
        labels = torch.arange(4).repeat(30)
        images = (labels.view(-1, 1, 1, 1) * 60 + torch.randint(0, 20, (120, 1, 8, 8), generator=g)).to(torch.uint8)
        return ArrayDataset(images, labels, ["a", "b", "c", "d"], "counted")


@clh.hookimpl
def clharness_add_methods(registry):
    for cls in (Where, Dier, Napper, Failer, Blocker):
        registry.add(cls)


@clh.hookimpl
def clharness_add_datasets(registry):
    registry.add("counted", Counted)
'''


def session_args(*methods, seeds=1):
    return ["--clh-suite", "quickstart", "--clh-quick", "--clh-seeds", str(seeds), "-k", "not gate",
            "-p", "no:cacheprovider", *[a for m in methods for a in ("--clh-method", m)]]


def test_a_conftest_method_runs_on_the_workers(pytester, ray_runtime):
    pytester.makeconftest(METHODS.format(here=str(pytester.path)))
    result = pytester.runpytest(*session_args("where", seeds=2), "--clh-results", "r.sqlite", "--clh-ray", "auto")
    result.assert_outcomes(passed=2)
    pids = {int(p.name.split("-")[1]) for p in pytester.path.glob("pid-*")}
    assert pids and os.getpid() not in pids   # trained in Ray worker processes, not in the driver


def test_a_worker_killed_mid_case_is_retried_and_every_case_is_stored_once(pytester, ray_runtime):
    pytester.makepyfile(raymethods=METHODS.format(here=str(pytester.path)))
    pytester.syspathinsert()
    result = pytester.runpytest(*session_args("dier", seeds=2), "-p", "raymethods", "--clh-results", "r.sqlite",
                                "--clh-ray", "auto")
    result.assert_outcomes(passed=2)
    assert (pytester.path / "died-once").exists()   # one worker did die
    with sqlite3.connect(pytester.path / "r.sqlite") as db:
        keys = [k for (k,) in db.execute("SELECT key FROM runs")]
    assert len(keys) == len(set(keys)) == 2


@pytest.mark.slow   # ~60 s on 2 cores (CI stays under 15 min); Ctrl-C's resume stays in the default run
def test_a_driver_killed_mid_session_resumes_from_its_finished_records(pytester, ray_runtime):
    pytester.makepyfile(raymethods=METHODS.format(here=str(pytester.path)))
    store = pytester.path / "r.sqlite"
    args = [*session_args("napper", "where", seeds=3), "-p", "raymethods", "--clh-results", str(store)]
    driver = subprocess.Popen([sys.executable, "-m", "pytest", *args, "--clh-ray", ray_runtime],
                              cwd=pytester.path, env={**os.environ, "HOME": HOME}, stdout=open(pytester.path / "driver.log", "w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 240
    finished = {}
    while time.monotonic() < deadline and driver.poll() is None:
        if store.exists():
            finished = records(store)
            if finished:
                break
        time.sleep(0.1)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    assert 0 < len(finished) < 6, ("the driver was to be killed with part of its session done:\n"
                                   + (pytester.path / "driver.log").read_text()[-3000:])
    finished = records(store)   # what it stored before it died
    pytester.syspathinsert()
    rerun = pytester.runpytest(*args, "--clh-ray", "auto")
    rerun.assert_outcomes(passed=6)
    rerun.stdout.fnmatch_lines([f"*6 runs, {len(finished)} reused from*"])
    after = records(store)
    assert len(after) == 6
    for key, record in finished.items():   # the finished ones were not trained again
        assert after[key].started_at == record.started_at and after[key].session == record.session


def test_gtep_tuning_fans_out_and_selects_the_serial_h_star(pytester, ray_runtime):
    args = ["--clh-suite", "gtep-digits", "--clh-quick", "--clh-method", "finetune", "--clh-method", "er",
            "-k", "high-synthetic", "-p", "no:cacheprovider"]
    pytester.runpytest(*args, "--clh-results", "serial.sqlite")
    pytester.runpytest(*args, "--clh-results", "ray.sqlite", "--clh-ray", "auto")
    a, b = records(pytester.path / "serial.sqlite"), records(pytester.path / "ray.sqlite")
    assert sorted(a) == sorted(b) and len(a) == 12   # 2 methods x (2 configurations x 2 trials + 2 evaluations)
    for key in a:
        assert a[key].acc_matrix == b[key].acc_matrix and a[key].hparams == b[key].hparams, a[key].case_id
    chosen = [gtep_summary.summarize(r.values())[["method", "config", "hparams"]].to_dict("records") for r in (a, b)]
    assert chosen[0] == chosen[1]   # the same H* for every method


def test_cldyb_lookahead_fans_out_and_chooses_the_serial_sequence(pytester, ray_runtime, monkeypatch):
    from clharness.benchmarks.cldyb import kind as cldyb_kind
    from clharness.benchmarks.cldyb import search
    args = ["--clh-suite", "cldyb-mini", "--clh-quick", "--clh-seeds", "1", "-k", "search-cc", "-p",
            "no:cacheprovider"]
    sequence = pytester.path / ".clharness" / "sequences" / "cldyb-mini-mini-cc-seed0.json"
    pytester.runpytest(*args, "--clh-results", "serial.sqlite").assert_outcomes(passed=1)
    serial = json.loads(sequence.read_text())
    sequence.unlink()
    fanned = []   # (candidates, values) of every step valued through Ray tasks
    make = cldyb_kind.remote_fan_out

    def spy(remote):
        fan_out = make(remote)

        def spied(s, tasks):
            values, rewards = fan_out(s, tasks)
            fanned.append((len(tasks), values))
            return values, rewards
        return spied
    monkeypatch.setattr(cldyb_kind, "remote_fan_out", spy)
    pytester.runpytest(*args, "--clh-results", "ray.sqlite", "--clh-ray", "auto").assert_outcomes(passed=1)
    remote = json.loads(sequence.read_text())
    assert search.Search.fan_out is None   # the hook is removed with the session
    assert [n for n, _ in fanned] == [2, 2]   # steps 1 and 2 valued their 2 candidates as Ray tasks
    assert [s["classes"] for s in remote["steps"]] == [s["classes"] for s in serial["steps"]]
    for s, r in zip(serial["steps"], remote["steps"]):   # the same values, bit for bit, and the same choice
        assert [c["value"] for c in s["candidates"]] == [c["value"] for c in r["candidates"]]
        assert s["chosen"] == r["chosen"]
    assert [v for _, v in fanned] == [[c["value"] for c in s["candidates"]] for s in serial["steps"][1:]]
    # the search's cost is the same on either executor (issue 41): each Ray task's count joins the search's
    searched = [next(r for r in records(pytester.path / f"{n}.sqlite").values() if r.method == "cldyb-search")
                for n in ("serial", "ray")]
    assert (searched[1].train_gflops, searched[1].eval_gflops) == (searched[0].train_gflops, searched[0].eval_gflops)
    assert searched[0].train_gflops > 0 and searched[0].eval_gflops > 0


def test_plugin_files_travel_as_source_and_installed_ones_by_name(tmp_path):
    from clharness.engine import ray_backend
    from clharness.plugins import _import_file
    (tmp_path / "mine_ray.py").write_text("VALUE = 7\n")
    mine = _import_file(tmp_path / "mine_ray.py")
    shipment = ray_backend.ship_plugins([mine, pytest], [])
    shipped = [m for m in shipment.modules if m != "pytest"]
    assert shipment.modules[1] == "pytest" and len(shipped) == 1   # installed: imported by name there
    assert shipment.sources[shipped[0]] == ("VALUE = 7\n", str(tmp_path / "mine_ray.py"))
    assert shipment.aliases == {shipped[0]: "mine_ray"}
    ray_backend.load_sources(shipment.sources)   # what a worker does with them
    assert sys.modules[shipped[0]].VALUE == 7


def test_a_worker_without_an_installed_plugin_or_the_data_root_says_which_node(tmp_path):
    from clharness.engine import ray_backend
    with pytest.raises(ray_backend.RayBackendError, match=r"'no_such_clh_plugin'.*Ray node .+ \(case s::c\[m-seed0\]\)"
                       r".*Install the plugin's package on every node"):
        ray_backend.worker_harness(("no_such_clh_plugin",), "s::c[m-seed0]")
    case = type("C", (), {"id": "s::c[m-seed0]"})()
    missing = tmp_path / "absent"
    with pytest.raises(ray_backend.RayBackendError, match=rf"--clh-data-root {missing} does not exist on Ray node"):
        ray_backend.run_remote(case, (), "cpu", str(missing), False)


COUNTED_SUITE = """
[suite]
name = "counted"
[defaults]
dataset = "counted"
backbone = "mlp"
epochs = 1
batch_size = 32
[[scenario]]
name = "ci-2x2"
setting = "class-incremental"
tasks = 2
[[scenario]]
name = "ci-4x1"
setting = "class-incremental"
tasks = 4
"""


def test_an_in_memory_dataset_goes_to_the_object_store_once_per_session(pytester, ray_runtime, monkeypatch):
    from clharness.data import ArrayDataset
    pytester.makeconftest(METHODS.format(here=str(pytester.path)))
    pytester.makefile(".toml", counted=COUNTED_SUITE)
    put = ray.put
    shipped = []   # the datasets this session serialised into the object store

    def spy(value, *args, **kwargs):
        if isinstance(value, ArrayDataset):
            shipped.append(value)
        return put(value, *args, **kwargs)
    monkeypatch.setattr(ray, "put", spy)
    result = pytester.runpytest("--clh-suite", str(pytester.path / "counted.toml"), "--clh-seeds", "1",
                                "--clh-method", "where", "--clh-method", "finetune", "-p", "no:cacheprovider",
                                "--clh-results", "r.sqlite", "--clh-ray", "auto")
    result.assert_outcomes(passed=4)   # 2 scenarios x 2 methods on the same dataset
    assert len(shipped) == 2 and sorted(len(d) for d in shipped) == [120, 120]   # train and test, once each
    loads = (pytester.path / "loads.log").read_text().split()
    assert loads == [str(os.getpid()), "train", str(os.getpid()), "test"]   # made on the driver only
    assert os.getpid() not in {int(p.name.split("-")[1]) for p in pytester.path.glob("pid-*")}


def test_x_cancels_the_outstanding_tasks_and_keeps_what_finished(pytester, ray_runtime):
    pytester.makeconftest(METHODS.format(here=str(pytester.path)))
    for seed in range(3):   # every blocker case waits until its file goes
        (pytester.path / f"block-{seed}").touch()
    result = pytester.runpytest(*session_args("failer", "blocker", seeds=3), "-x", "--clh-results", "r.sqlite",
                                "--clh-ray", "auto")
    result.assert_outcomes(failed=1)
    log = pytester.path / "trained.log"   # absent when -x stopped the session before any other task began
    trained = log.read_text().splitlines() if log.exists() else []
    stored = {(r.method, r.seed): r.status for r in records(pytester.path / "r.sqlite").values()}
    assert stored[("failer", 0)] == "failed" and not any(m == "blocker" for m, _ in stored)
    assert all(status == "passed" for key, status in stored.items() if key != ("failer", 0))
    # 2 CPUs: at most two blocker cases got to start; their tasks were cancelled with the session
    assert sum(line.startswith("blocker") for line in trained) <= 2
    for seed in range(3):
        (pytester.path / f"block-{seed}").unlink()
    time.sleep(3)   # a task left running (or queued) would now finish (or start)
    assert (log.read_text().splitlines() if log.exists() else []) == trained
    done = pytester.path / "done.log"
    assert not any(line.startswith("blocker") for line in (done.read_text().splitlines() if done.exists() else []))


@pytest.mark.slow   # ~46 s on 2 cores; keeping what finished stays in the default run (x cancels ... keeps what finished)
def test_ctrl_c_keeps_every_finished_record_and_the_rerun_trains_only_the_rest(pytester, ray_runtime):
    pytester.makepyfile(raymethods=METHODS.format(here=str(pytester.path)))
    (pytester.path / "block-0").touch()   # blocker seed 0 holds its item (the first) until Ctrl-C
    store = pytester.path / "r.sqlite"
    args = [*session_args("blocker", "where", seeds=2), "-p", "raymethods", "--clh-results", str(store)]
    # SIGINT restored for the driver: a test run started in the background of a non-interactive shell
    # inherits it ignored, and Python then installs no KeyboardInterrupt handler (the driver would never stop)
    driver = subprocess.Popen([sys.executable, "-m", "pytest", *args, "--clh-ray", ray_runtime],
                              cwd=pytester.path, env={**os.environ, "HOME": HOME},
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                              stdout=open(pytester.path / "driver.log", "w"), stderr=subprocess.STDOUT)
    done = pytester.path / "done.log"
    deadline = time.monotonic() + 280   # generous: on a loaded 2-core CI machine each Ray worker start takes long
    while time.monotonic() < deadline and driver.poll() is None:
        if done.exists() and len(done.read_text().splitlines()) == 3:   # blocker 1, where 0 and 1 trained
            break
        time.sleep(0.1)
    time.sleep(2)   # their records reach the driver, whose first item still waits for blocker 0
    log = lambda: (pytester.path / "driver.log").read_text()[-3000:]   # noqa: E731
    assert driver.poll() is None and not store.exists() or not records(store), log()
    driver.send_signal(signal.SIGINT)
    assert driver.wait(timeout=280) == 2, log()   # pytest's exit status for an interrupted session
    kept = {(r.method, r.seed) for r in records(store).values()}
    assert kept == {("blocker", 1), ("where", 0), ("where", 1)}, log()
    (pytester.path / "block-0").unlink()
    before = (pytester.path / "trained.log").read_text().splitlines()
    pytester.syspathinsert()
    rerun = pytester.runpytest(*args, "--clh-ray", "auto")
    rerun.assert_outcomes(passed=4)
    rerun.stdout.fnmatch_lines(["*4 runs, 3 reused from*"])
    assert (pytester.path / "trained.log").read_text().splitlines() == [*before, "blocker 0"]


GTEP_RESOURCES = """
[suite]
name = "gtep-resources"
methods = ["finetune"]
[defaults]
kind = "gtep"
backbone = "mlp"
validation = 0.2
task_config = "5-equal"
configurations = 2
trials = 2
general = "table4"
fixed = { momentum = 0.9 }
search = { "*" = { epochs = [1], lr = [0.03, 0.1], batch_size = [32] } }
tune_dataset = "synthetic"
tune_dataset_options = { num_classes = 20, image_size = 8, train_per_class = 20, test_per_class = 10 }
eval_dataset = "synthetic"
eval_dataset_options = { num_classes = 20, image_size = 8, train_per_class = 20, test_per_class = 10 }
[[scenario]]
name = "halves"
tune_classes = [0, 10]
eval_classes = [10, 20]
cpus_per_run = 0.5
[[scenario]]
name = "swapped"
tune_classes = [10, 20]
eval_classes = [0, 10]
"""


def test_a_scenarios_cpus_per_run_reaches_its_gtep_tuning_runs(pytester, ray_runtime, monkeypatch):
    """Tuning runs are named by their tuning id, not their scenario; the scenario's default still applies."""
    from clharness.engine import ray_backend
    pytester.makefile(".toml", gtepres=GTEP_RESOURCES)
    submitted = []   # (run name, the options its task was submitted with)

    class Spy:   # records the options; the task is not run (an object that is no record comes back)
        def options(self, **options):
            return type("Bound", (), {"remote": lambda _, case, *a: submitted.append((case.scenario.name, options))
                                      or ray.put("not run")})()
    monkeypatch.setattr(ray_backend, "_remote_case", Spy())
    result = pytester.runpytest("--clh-suite", str(pytester.path / "gtepres.toml"), "--collect-only", "-q",
                                "-p", "no:cacheprovider", "--clh-results", "r.sqlite", "--clh-ray", "auto")
    assert result.ret == 0, result.stdout.str()
    cpus = {}
    for name, options in submitted:
        assert ":tune-c" in name, name   # only the tuning runs go out at collection
        cpus.setdefault(name.split("-5-equal")[0], set()).add(options["num_cpus"])
    assert cpus == {"synthetic[0-10]": {0.5}, "synthetic[10-20]": {1.0}}, submitted
    assert len(submitted) == 2 * 2 * 2   # 2 scenarios x R 2 x S 2


def test_an_item_interrupted_while_it_waits_leaves_its_task_to_be_cancelled(ray_runtime, monkeypatch):
    from clharness.engine import ray_backend
    runner = ray_backend.RayRunner(ray_backend.Shipment(), "cpu", None, False, None, None)
    case = type("C", (), {"id": "s::c[m-seed0]"})()
    runner.pending["k"] = ray_backend.Pending(ray.put("waiting"), case, None)

    def interrupted(ref, *args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(ray, "get", interrupted)
    with pytest.raises(KeyboardInterrupt):
        runner.result("k", case)
    assert list(runner.pending) == ["k"]   # still there for cancel_all at the session's end


def test_a_node_whose_data_root_lacks_the_dataset_names_itself_and_the_path(tmp_path):
    """The data root exists on the node but the dataset is not under it: the case's record says where."""
    import dataclasses

    from clharness.engine import ray_backend
    from clharness.results import RunRecord
    from clharness.engine.runner import Case
    from clharness.engine.suites import load_suite
    spec = load_suite(Path(__file__).parents[1] / "suites" / "quickstart.toml", quick=True).scenarios[0]
    case = Case("quickstart", dataclasses.replace(spec, dataset="cifar10"), "finetune", 0)
    record = RunRecord.from_json(ray_backend.run_remote(case, (), "cpu", str(tmp_path), False))
    assert record.status == "error"
    assert f"not found at {tmp_path}" in record.message and f"on Ray node {ray_backend._node()}" in record.message
