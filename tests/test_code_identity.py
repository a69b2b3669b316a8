"""A number belongs to the code that made it (issue 27 item 1): a record's key holds a digest of the
method's source (its file, its base classes' files: a plugin file or a conftest.py) and of the
harness's training and evaluation code; editing any of them retrains, ``--clh-reuse-stale`` reuses and
says so, and the record stores the digest and the git commit of the method's repository."""
import re
import subprocess
import textwrap

from clharness.engine import code_identity

PLUGIN = textwrap.dedent('''
    import torch, torch.nn.functional as F
    import clharness as clh

    class Mine(clh.Method):
        name = "mine"
        settings = {clh.Setting.CLASS_IL}
        hparams = {"lr": clh.Float(1e-4, 1.0, default=0.05, log=True)}

        def __init__(self, context, **hp):
            super().__init__(context, **hp)
            self.model = context.make_classifier()
            self.opt = torch.optim.SGD(self.model.parameters(), lr=self.hp["lr"])

        def learn(self, experience):
            self.model.train()
            for x, y in experience.batches(epochs=self.context.epochs):
                self.opt.zero_grad(); F.cross_entropy(self.model(x), y).backward(); self.opt.step()

        def predict(self, x, task_id=None):
            self.model.eval()
            return self.model(x)

    @clh.hookimpl
    def clharness_add_methods(registry):
        registry.add(Mine)
''')
ARGS = ("-p", "myplug", "--clh-suite", "quickstart", "--clh-method", "mine", "--clh-seeds", "1", "--clh-quick",
        "--clh-device", "cpu", "--clh-results", "r.sqlite", "-p", "no:cacheprovider")


def test_editing_the_plugin_file_retrains_and_reuse_stale_says_what_it_reused(pytester):
    plugin = pytester.path / "myplug.py"
    plugin.write_text(PLUGIN)
    pytester.syspathinsert()
    first = pytester.runpytest_subprocess(*ARGS)
    first.stdout.fnmatch_lines(["*clharness: 1 runs, 0 reused*"])
    pytester.runpytest_subprocess(*ARGS).stdout.fnmatch_lines(["*clharness: 1 runs, 1 reused*"])
    plugin.write_text(PLUGIN.replace("F.cross_entropy(self.model(x), y).backward()",
                                     "(0.5 * F.cross_entropy(self.model(x), y)).backward()"))
    edited = pytester.runpytest_subprocess(*ARGS)
    edited.stdout.fnmatch_lines(["*clharness: 1 runs, 0 reused*"])   # the edit retrained
    plugin.write_text(PLUGIN + "\n# an unrelated edit: the code digest moves, the case does not\n")
    stale = pytester.runpytest_subprocess(*ARGS, "--clh-reuse-stale")
    out = stale.stdout.str()
    assert "clharness: 1 runs, 1 reused" in out, out
    assert "--clh-reuse-stale reused 1 record(s) made by other code" in out, out
    assert re.search(r"quickstart::ci-5x2\[mine-seed0\]: stored record \w+ made by code \w+ .*the code now is \w+", out)


def test_the_digest_follows_the_method_its_base_classes_and_the_harness(tmp_path, monkeypatch):
    (tmp_path / "basemod.py").write_text("import clharness as clh\nclass Base(clh.Method):\n    name = 'b'\n")
    (tmp_path / "childmod.py").write_text("from basemod import Base\nclass Child(Base):\n    name = 'c'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import childmod
    files = {p.name for p in code_identity.method_files(childmod.Child)}
    assert {"childmod.py", "basemod.py", "method.py"} <= files
    before = code_identity.code_digest(childmod.Child)
    assert code_identity.current_digest(childmod.Child) == before
    (tmp_path / "basemod.py").write_text("import clharness as clh\nclass Base(clh.Method):\n    name = 'b'  # edited\n")
    assert code_identity.current_digest(childmod.Child) != before     # a base class's edit counts ...
    assert code_identity.code_digest(childmod.Child) == before        # ... from the next process on: this
    # one runs the code it imported, and its units wait for one another by the keys they were given
    harness = code_identity.current_digest(childmod.Child)
    runner = code_identity.PKG / "engine" / "runner.py"
    assert runner in [p for rel in code_identity.HARNESS for p in code_identity._py_files(rel)]
    assert "reporting" not in " ".join(code_identity.HARNESS)           # a new scorecard column keeps records
    assert code_identity.current_digest(childmod.Child) == harness      # stable while nothing changes


def test_a_record_stores_its_code_digest_and_the_git_commit_of_the_method_repository(tmp_path):
    import clharness as clh
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "myplug.py").write_text(PLUGIN)
    git = ["git", "-C", str(repo), "-c", "user.email=a@b", "-c", "user.name=a"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    records = clh.run("quickstart", methods="mine", seeds=1, quick=True, results=tmp_path / "r.sqlite",
                      device="cpu", plugins=str(repo / "myplug.py"))
    record, = records
    assert record.git_commit == head and len(record.code_digest) == 16
    assert record.key != record.base_key   # the key holds the code; the base key does not
