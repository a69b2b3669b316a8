"""The ``clharness_add_kinds`` hook is real: a benchmark family from outside clharness (a
domain-incremental "permuted digits" kind, every task the same ten classes under its own fixed pixel
permutation) registers from a conftest plugin exactly as the five built-in families do, shows in
``clharness list`` with its source, has its suite keys checked, and runs end to end with a scorecard."""
import json
import os
import subprocess
import sys
import textwrap

import torch


DOMAIN_IL = '''
"""Domain-incremental kind: task t = every class of the dataset, pixels permuted by permutation t
(task 0: the identity), drawn from the seed."""
import numpy as np
import torch

from clharness.data import ArrayDataset, TensorData, load_split
from clharness.engine.scenario import Scenario, Task

OPTIONS = {"permutations": (int, 3)}


def check(spec):
    if spec.options["permutations"] < 1:
        raise ValueError(f"permutations = {spec.options['permutations']} must be >= 1")


def build(spec, source, seed, device, data_root=None, download=False):
    train, test = (load_split(source, data_root, split, download) for split in (True, False))
    mean, std = train.channel_stats()
    rng = np.random.default_rng(seed)
    pixels = train.images[0, 0].numel()
    tasks = []
    for t in range(spec.options["permutations"]):
        order = torch.from_numpy(rng.permutation(pixels)) if t else torch.arange(pixels)

        def view(ds):
            images = ds.images.flatten(2)[:, :, order].reshape(ds.images.shape).contiguous()
            return TensorData(ArrayDataset(images, ds.labels, ds.classes, ds.name), mean, std, device)
        tasks.append(Task(tuple(range(len(train.classes))), view(train), view(test)))
    return Scenario(spec, seed, spec.setting_enum, tasks, list(train.classes), tasks[0].train.input_shape,
                    source.identity())
'''

CONFTEST = '''
import clharness as clh


@clh.hookimpl
def clharness_add_kinds(registry):
    registry.add(clh.Kind("domain-il", "domain_il"))
'''

SUITE = '''
[suite]
name = "permuted-digits"
seeds = 1
methods = ["finetune", "er"]

[defaults]
kind = "domain-il"
dataset = "digits"
backbone = "mlp"
epochs = 2
memory_size = 100

[[scenario]]
name = "permuted-3"
permutations = 3
'''


def _project(pytester):
    pytester.makepyfile(domain_il=DOMAIN_IL)
    pytester.makeconftest(CONFTEST)
    pytester.syspathinsert()
    return pytester.makefile(".toml", permuted=SUITE)


def test_outside_kind_runs_end_to_end_with_a_scorecard(pytester, tmp_path):
    suite = _project(pytester)
    card = tmp_path / "card.json"
    result = pytester.runpytest_subprocess("--clh-suite", str(suite), "--clh-device", "cpu", "--clh-scorecard",
                                           str(card), "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    records = json.loads(card.read_text())["records"]
    assert sorted(r["method"] for r in records) == ["er", "finetune"]
    for r in records:
        assert r["scenario"] == "permuted-3" and r["status"] == "passed"
        matrix = r["acc_matrix"]
        assert len(matrix) == 3 and all(len(row) == 3 for row in matrix)
        # every permutation is learnable by an MLP: each task is well above chance when just learned
        assert all(matrix[t][t] > 0.5 for t in range(3)), matrix
    assert "permuted-3" in (tmp_path / "card.json").read_text()


def test_outside_kind_options_are_checked_like_builtin_ones(pytester):
    suite = _project(pytester)
    suite.write_text(SUITE.replace("permutations = 3", "permutatons = 3"))
    result = pytester.runpytest_subprocess("--clh-suite", str(suite), "--clh-device", "cpu", "-p", "no:cacheprovider")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*unknown key(s) 'permutatons'*permutations*"])


def test_clharness_list_shows_the_outside_kind_with_its_source(pytester):
    _project(pytester)
    proc = subprocess.run([sys.executable, "-m", "clharness.cli", "list"], cwd=pytester.path,
                          capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(pytester.path),
                                                                            os.environ.get("PYTHONPATH", "")])})
    assert proc.returncode == 0, proc.stderr
    kinds = proc.stdout.split("\nkinds (")[1].split("\n\n")[0]
    assert "kinds (7)" in "kinds (" + kinds
    for name in ("split", "stf", "curriculum", "gtep", "cldyb", "domain"):
        assert f"\n{name} " in kinds and "clharness.benchmarks" in kinds
    line = next(line for line in kinds.splitlines() if line.startswith("domain-il"))
    assert "conftest" in line


def test_the_permuted_digits_kind_permutes_pixels_per_task(pytester):
    _project(pytester)
    import domain_il
    import clharness as clh
    from clharness.plugins import Harness
    from clharness.engine.suites import load_suite

    class Plugin:
        @clh.hookimpl
        def clharness_add_kinds(self, registry):
            registry.add(clh.Kind("domain-il", domain_il))

    harness = Harness(plugins=(Plugin(),))
    assert harness.kinds["domain-il"].load() is domain_il   # building the registries installs the kinds
    spec = load_suite(pytester.path / "permuted.toml").scenarios[0]
    source = harness.datasets["digits"]()
    source.name = "digits"
    scenario = domain_il.build(spec, source, seed=0, device=torch.device("cpu"))
    first, second = scenario.tasks[0].test, scenario.tasks[1].test
    assert torch.equal(first.labels, second.labels)
    assert not torch.equal(first.images, second.images)
    # the same multiset of pixel values per image, moved: a permutation, not new data
    assert torch.equal(first.images.flatten(1).sort(1).values, second.images.flatten(1).sort(1).values)
    assert all(t.classes == tuple(range(10)) for t in scenario.tasks)
