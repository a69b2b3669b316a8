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
    plugin.write_text(PLUGIN.replace("lr=self.hp[\"lr\"])", "lr=float(self.hp[\"lr\"]))"))
    stale = pytester.runpytest_subprocess(*ARGS, "--clh-reuse-stale")   # a code edit, reused on request
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
    (tmp_path / "basemod.py").write_text("import clharness as clh\nclass Base(clh.Method):\n    name = 'b2'\n")
    assert code_identity.current_digest(childmod.Child) != before     # a base class's edit counts ...
    assert code_identity.code_digest(childmod.Child) == before        # ... from the next process on: this
    # one runs the code it imported, and its units wait for one another by the keys they were given
    harness = code_identity.current_digest(childmod.Child)
    runner = code_identity.PKG / "engine" / "runner.py"
    harness_files = [p for rel in code_identity.HARNESS for p in code_identity._py_files(rel)]
    assert runner in harness_files
    assert code_identity.PKG / "engine" / "flops.py" in harness_files   # its counts are numbers of the record
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


# ---- issue 38 item 1: the digest covers the method's import closure, as normalised syntax trees
HELPED = PLUGIN.replace("import clharness as clh\n", "import clharness as clh\nfrom helper import learning_rate\n") \
    .replace('default=0.05', 'default=learning_rate()')


def test_editing_a_helper_the_method_imports_retrains_and_a_comment_edit_of_the_method_reuses(pytester):
    plugin, helper = pytester.path / "myplug.py", pytester.path / "helper.py"
    plugin.write_text(HELPED)
    helper.write_text("def learning_rate():\n    return 0.05\n")
    pytester.syspathinsert()
    pytester.runpytest_subprocess(*ARGS).stdout.fnmatch_lines(["*clharness: 1 runs, 0 reused*"])
    helper.write_text("def learning_rate():\n    return 0.2\n")        # the helper's code: a new run
    pytester.runpytest_subprocess(*ARGS).stdout.fnmatch_lines(["*clharness: 1 runs, 0 reused*"])
    plugin.write_text('"""My method."""\n# a comment, a docstring and blank lines change no number\n\n'
                      + HELPED.replace("class Mine(clh.Method):\n", 'class Mine(clh.Method):\n    """Mine."""\n\n'))
    pytester.runpytest_subprocess(*ARGS).stdout.fnmatch_lines(["*clharness: 1 runs, 1 reused*"])


def _module(tmp_path, monkeypatch, name: str, files: dict):
    import importlib
    import sys
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    for mod in [m for m in sys.modules if m.split(".")[0] in {p.split("/")[0].removesuffix(".py") for p in files}]:
        monkeypatch.delitem(sys.modules, mod)
    importlib.invalidate_caches()
    return importlib.import_module(name)


METHOD = '''
    """Docstring."""
    import math
    import tabulate
    import clharness as clh
    from helper import lr


    class M(clh.Method):
        name = "m"

        def learn(self, experience):
            from lazyhelper import steps   # imported inside a function: in the closure too
            return steps() * lr()
'''


def test_the_closure_follows_own_imports_transitively_and_names_installed_distributions(tmp_path, monkeypatch):
    from importlib.metadata import version
    mod = _module(tmp_path, monkeypatch, "meth", {
        "meth.py": METHOD, "helper.py": "from deeper import k\ndef lr():\n    return k\n", "deeper.py": "k = 0.1\n",
        "lazyhelper.py": "def steps():\n    return 3\n", "unrelated.py": "x = 1\n"})
    files, dists = code_identity.import_closure(mod.M)
    names = {p.name for p in files}
    assert {"meth.py", "helper.py", "deeper.py", "lazyhelper.py"} <= names and "unrelated.py" not in names
    assert f"tabulate=={version('tabulate')}" in dists and f"clharness=={version('clharness')}" in dists
    assert not any(d.startswith("math") for d in dists)   # the standard library is python's version, in the key
    before = code_identity.current_digest(mod.M)
    (tmp_path / "deeper.py").write_text("k = 0.2\n")   # two imports away
    assert code_identity.current_digest(mod.M) != before
    (tmp_path / "deeper.py").write_text("k = 0.1\n")
    assert code_identity.current_digest(mod.M) == before
    (tmp_path / "unrelated.py").write_text("x = 2\n")   # in the folder, never imported: not the method's code
    assert code_identity.current_digest(mod.M) == before


def test_relative_imports_of_a_plugin_package_are_followed(tmp_path, monkeypatch):
    mod = _module(tmp_path, monkeypatch, "plug.methods.meth", {
        "plug/__init__.py": "", "plug/methods/__init__.py": "",
        "plug/methods/meth.py": "import clharness as clh\nfrom .. import util\nclass M(clh.Method):\n    name = 'm'\n",
        "plug/util.py": "from .sub.deep import f\n", "plug/sub/__init__.py": "", "plug/sub/deep.py": "def f():\n    return 1\n"})
    names = {p.relative_to(tmp_path).as_posix() for p in code_identity.method_files(mod.M) if tmp_path in p.parents}
    assert {"plug/methods/meth.py", "plug/util.py", "plug/sub/deep.py"} <= names


def test_comments_docstrings_and_formatting_keep_the_digest_and_any_code_change_moves_it(tmp_path, monkeypatch):
    mod = _module(tmp_path, monkeypatch, "meth", {"meth.py": METHOD, "helper.py": "def lr():\n    return 1\n",
                                                  "lazyhelper.py": "def steps():\n    return 3\n"})
    path = tmp_path / "meth.py"
    before = code_identity.current_digest(mod.M)
    text = textwrap.dedent(METHOD)
    same = [text.replace('"""Docstring."""', '"""Another docstring."""'),
            text.replace("        name = \"m\"\n", "        '''A class docstring.'''\n        name = \"m\"  # named\n"),
            text.replace("return steps() * lr()", "return (steps()\n                * lr())"),
            "# a header comment\n" + text.replace("\n\n\n", "\n")]
    for variant in same:
        path.write_text(variant)
        assert code_identity.current_digest(mod.M) == before, variant
    for variant in (text.replace("steps() * lr()", "lr() * steps()"), text.replace('name = "m"', 'name = "n"'),
                    text.replace("return steps() * lr()", "'''Now a docstring-like statement.'''\n            "
                                                          "x = 'a string that is code'\n            return steps() * lr()")):
        path.write_text(variant)
        assert code_identity.current_digest(mod.M) != before, variant
