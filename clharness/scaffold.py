"""``clharness init NAME``: a method plugin package with a suite, tests and a CI workflow.

The method file is README's "Write a method" example (``METHOD_TEMPLATE``, kept identical to
README by tests/test_scaffold.py) with its names replaced. The package registers itself through
the ``clharness`` entry-point group; its suite runs the quickstart's scenario with gates against
``finetune`` and ``er``; its test runs that suite with ``--clh-quick`` in a pytest subprocess,
writing the scorecard JSON that the workflow uploads with the HTML report.

clharness is not on PyPI: the package, its README and its CI install it from where this copy came
(``installed_source``: the local checkout, kept editable; the git URL pinned to the installed commit;
the archive URL), or from what ``clharness init --clharness`` names; never from an unpinned URL.
"""
from __future__ import annotations

import importlib.util
import keyword
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

# pyproject.toml [project.urls] Repository, for an installed copy whose metadata predates it
REPOSITORY = "https://github.com/clharness/clharness"

# README.md, "Write a method", verbatim; render_method() renames `my_method.py`, `Mine` and "mine".
METHOD_TEMPLATE = '''\
# my_method.py
import torch, torch.nn.functional as F
import clharness as clh

class Mine(clh.Method):
    name = "mine"
    settings = {clh.Setting.CLASS_IL, clh.Setting.TASK_IL}
    hparams = {"lr": clh.Float(1e-4, 1.0, default=0.05, log=True)}

    def __init__(self, context, **hp):
        super().__init__(context, **hp)                  # validates hp into self.hp
        self.model = context.make_classifier()            # suite's backbone + head over all classes
        self.opt = torch.optim.SGD(self.model.parameters(), lr=self.hp["lr"])

    def learn(self, experience):                          # one task: train data only
        self.model.train()
        for x, y in experience.batches(epochs=self.context.epochs):
            self.opt.zero_grad(); F.cross_entropy(self.model(x), y).backward(); self.opt.step()

    def predict(self, x, task_id=None):                   # logits over global class ids
        self.model.eval()
        return self.model(x)

@clh.hookimpl
def clharness_add_methods(registry):
    registry.add(Mine)
'''

PLUGIN = '''\
"""The clharness plugin of {name}: its method and its suite (entry point `clharness`)."""
from pathlib import Path

import clharness as clh

from .method import clharness_add_methods  # noqa: F401  (the method's hook, registered with this module)


@clh.hookimpl
def clharness_add_suites(registry):
    for path in sorted((Path(__file__).parent / "suites").glob("*.toml")):
        registry.add(path.stem, path)
'''

PYPROJECT = '''\
[build-system]
requires = ["setuptools>=69"]
build-backend = "setuptools.build_meta"

[project]
name = "{dist}"
version = "0.1.0"
description = "The {name} continual-learning method, benchmarked with clharness"
requires-python = ">=3.10"
dependencies = ["{requirement}"]

[project.optional-dependencies]
test = ["pytest>=8"]

[project.entry-points.clharness]
{name} = "{name}.plugin"

[tool.setuptools]
packages = ["{name}"]

[tool.setuptools.package-data]
{name} = ["suites/*.toml"]

[tool.pytest.ini_options]
testpaths = ["tests"]
'''

SUITE = '''\
# {name} on the quickstart's scenario (class-incremental Split-Digits, scikit-learn's bundled
# digits, CPU), beside fine-tuning (the floor) and experience replay (the usual bar).
# The gates are what CI fails on: raise them as {name} improves, e.g.
#   "{name}: final_acc beats er by 0.02 welch 0.05"
gates = [
    "{name}: final_acc beats finetune by -0.05",   # no worse than fine-tuning
    "{name}: final_acc within 0.6 of er",           # the gap to replay (tighten it as {name} improves)
    "er: final_acc beats finetune by 0.1",          # the benchmark itself is sane
]

[suite]
name = "{name}"
description = "{name} vs finetune and er on class-incremental Split-Digits (sklearn digits), MLP, CPU"
seeds = 3
methods = ["{name}", "finetune", "er"]

[defaults]
dataset = "digits"
backbone = "mlp"
epochs = 5
batch_size = 32
memory_size = 200

[[scenario]]
name = "ci-5x2"
setting = "class-incremental"
tasks = 5

[quick]
epochs = 1
'''

TEST = '''\
"""Runs the {name} suite with --clh-quick in a pytest subprocess: a failed case or gate fails this
test. The scorecard JSON and the results store land in $CLH_ARTIFACTS (CI uploads them)."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_{name}_suite_passes_its_gates(tmp_path):
    out = Path(os.environ.get("CLH_ARTIFACTS", tmp_path)).resolve()
    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--clh-plugin", "{name}.plugin",
         "--clh-suite", "{name}", "--clh-quick", "--clh-device", "cpu",
         "--clh-results", str(out / "results.sqlite"), "--clh-scorecard", str(out / "scorecard.json")],
        cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads((out / "scorecard.json").read_text())["summary"]
    assert {{"{name}", "finetune", "er"}} <= {{row["method"] for row in rows}}
'''

WORKFLOW = '''\
# Runs {name}'s tests (its suite with --clh-quick); a failed gate fails the job.
# The scorecard JSON and the HTML report are uploaded as artifacts, pass or fail.
name: clharness
on: [push, pull_request]

jobs:
  benchmark:
    runs-on: ubuntu-latest
    env:
      CLH_ARTIFACTS: clharness-artifacts
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with:
          python-version: "3.11"
      - name: Install
        run: |{local_note}
          python -m pip install torch torchvision --index-url https://download.pytorch.org/whl/cpu
          python -m pip install "{requirement}"
          # --no-deps: keep the clharness just installed (pytest comes with it)
          python -m pip install -e ".[test]" --no-deps
      - name: Tests and gates
        run: python -m pytest -v
      - name: HTML report
        if: always()
        run: clharness report "$CLH_ARTIFACTS/results.sqlite" --html "$CLH_ARTIFACTS/report.html"
      - name: Upload the scorecard
        if: always()
        uses: actions/upload-artifact@v4
        with:
          name: clharness-scorecard
          path: clharness-artifacts/scorecard.json
      - name: Upload the report
        if: always()
        uses: actions/upload-artifact@v4
        with:
          name: clharness-report
          path: clharness-artifacts/report.html
'''

README = '''\
# {name}

A continual-learning method packaged as a [clharness]({repository}) plugin.

```bash
{install_clharness}
python -m pip install -e ".[test]" --no-deps   # this package; --no-deps keeps that clharness as installed
CLH_ARTIFACTS=clharness-artifacts python -m pytest   # the {name} suite, quick budgets, with its gates
clharness report clharness-artifacts/results.sqlite --html clharness-artifacts/report.html
pytest --clh-suite {name} --clh-scorecard s.json     # full budgets (runs kept in .clharness/results.sqlite)
```

clharness is not on PyPI; `clharness init` chose its source: {why}. `pytest` comes with clharness.
The method is `{name}/method.py`; the suite and its gates are `{name}/suites/{name}.toml`;
CI (`.github/workflows/clharness.yml`) fails on a gate and uploads the scorecard and the report.
'''


class ScaffoldError(ValueError):
    """A NAME or a target folder that ``clharness init`` cannot use."""


def class_name(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_") if part) or "Method"


def render_method(name: str) -> str:
    text = METHOD_TEMPLATE.replace("# my_method.py", f"# {name}/method.py", 1)
    text = re.sub(r"\bMine\b", class_name(name), text)
    return text.replace('name = "mine"', f'name = "{name}"', 1)


def check_name(name: str) -> None:
    if not name.isidentifier() or keyword.iskeyword(name):
        raise ScaffoldError(f"clharness init: {name!r} is not a valid Python identifier; the name is the method's "
                            "registry key and the package's import name (use letters, digits and _, e.g. my_method)")
    if importlib.util.find_spec(name) is not None:
        raise ScaffoldError(f"clharness init: a module named {name!r} is already importable here; the new "
                            "package would shadow it or be shadowed. Pick another name")


def repository_url() -> str:
    """clharness's git repository: the ``Repository`` Project-URL of the installed distribution's
    metadata (pyproject.toml [project.urls]), else :data:`REPOSITORY`."""
    from importlib import metadata
    try:
        urls = metadata.metadata("clharness").get_all("Project-URL") or []
    except metadata.PackageNotFoundError:
        urls = []
    for entry in urls:
        label, _, url = entry.partition(",")
        if label.strip().lower() in ("repository", "source", "source code") and url.strip():
            return url.strip()
    return REPOSITORY


@dataclass(frozen=True)
class Source:
    """Where the new package takes clharness from: ``requirement`` (its pyproject's dependency and
    CI's install), ``why`` (one sentence, printed by ``clharness init``) and ``folder``, a local
    checkout that the README installs editable (``pip install -e``), as it is installed here."""
    requirement: str
    why: str
    folder: Path | None = None


def installed_source() -> Source:
    """Where this copy of clharness came from: :func:`source_from` over what pip recorded of the
    installed ``clharness`` distributions (PEP 610 ``direct_url.json``; a build's ``*.egg-info`` in
    the working directory has none and is passed over) and the checkout the imported package sits
    in, if any."""
    import json
    from importlib import metadata
    records, version = [], None
    for dist in metadata.distributions(name="clharness"):
        version = version or dist.version
        try:
            direct = json.loads(dist.read_text("direct_url.json") or "null")
        except ValueError:
            direct = None
        if isinstance(direct, dict):
            records.append(direct)
    checkout = Path(__file__).resolve().parents[1]
    is_checkout = (checkout / "pyproject.toml").is_file() and (checkout / "clharness" / "scaffold.py").is_file()
    return source_from(records, checkout if is_checkout else None, version)


def source_from(records: list[dict], checkout: Path | None = None, version: str | None = None) -> Source:
    """The source of clharness given pip's PEP 610 records of its installs (``direct_url.json``, first
    found first) and ``checkout``, the source tree the imported package lives in (None: it lives in
    site-packages). A checkout -> that checkout, editable (which it is in effect: the code runs from
    it); a record of a local folder -> that folder (editable only if pip installed it so); of git ->
    the git URL pinned to the installed commit; of an archive -> that URL with its sha256. Nothing
    (an index or wheel-file install) -> ScaffoldError naming ``--clharness``; never an unpinned URL,
    which would install whatever the repository holds that day (and needs the network)."""
    from urllib.parse import unquote, urlparse

    def folder_of(direct):
        url = direct.get("url", "")
        return Path(unquote(urlparse(url).path)) if "dir_info" in direct and url.startswith("file:") else None

    if checkout is not None:
        pip = next((d for d in records if folder_of(d) == checkout), None)
        how = (f"which pip installed {'editable' if pip['dir_info'].get('editable') else 'in place'} (its "
               "direct_url.json)") if pip else "imported from there, not installed there by pip"
        return Source(f"clharness @ {checkout.as_uri()}", f"clharness runs from the checkout {checkout}, {how}; "
                      "the package installs that checkout, editable", checkout)
    for direct in records:
        url = direct.get("url", "")
        if direct.get("vcs_info") and url and direct["vcs_info"].get("commit_id"):
            vcs = direct["vcs_info"]
            commit = vcs["commit_id"]   # PEP 610: the exact commit pip installed
            return Source(f"clharness @ {vcs.get('vcs', 'git')}+{url}@{commit}",
                          f"pip installed clharness from {url} at commit {commit} (its direct_url.json); "
                          "the package pins that commit")
        folder = folder_of(direct)
        if folder is not None:
            editable = bool(direct["dir_info"].get("editable"))
            how = "editable" if editable else "a regular install"
            if not (folder / "pyproject.toml").is_file():
                raise ScaffoldError(_NO_SOURCE.format(what=f"clharness was installed from the folder {folder} "
                                                           f"({how}), which holds no pyproject.toml any more"))
            return Source(f"clharness @ {folder.as_uri()}", f"pip installed clharness from the local checkout "
                          f"{folder} ({how}, its direct_url.json); the package installs that checkout"
                          + (", editable" if editable else ""), folder if editable else None)
        if "archive_info" in direct and url:
            hashes = direct["archive_info"].get("hashes") or {}
            pin = f"#sha256={hashes['sha256']}" if "sha256" in hashes and "#" not in url else ""
            return Source(f"clharness @ {url}{pin}", f"pip installed clharness from the archive {url} "
                          "(its direct_url.json)")
    raise ScaffoldError(_NO_SOURCE.format(what=f"pip recorded no source of clharness{f' {version}' if version else ''} "
                                               "(no PEP 610 direct_url.json: an index or wheel-file install)"))


_NO_SOURCE = ("clharness init: cannot tell where this clharness came from: {what}. clharness is not on PyPI, "
              "so give the source with --clharness: a checkout's path, a git URL pinned to a commit "
              "(git+https://github.com/clharness/clharness@COMMIT) or a requirement")


def chosen_source(spec: str | None = None) -> Source:
    """``--clharness SPEC`` when given (:func:`requirement_from`; a local checkout is installed
    editable when this clharness is that checkout, editable), else :func:`installed_source`."""
    if not spec:
        return installed_source()
    requirement = requirement_from(spec)
    check_requirement(requirement)
    try:
        here = installed_source()
    except ScaffoldError:
        here = None
    editable = here is not None and here.folder is not None and requirement == here.requirement
    return Source(requirement, "--clharness " + spec.strip() + (" (this clharness's own checkout, kept editable)"
                                                                if editable else ""), here.folder if editable else None)


def requirement_from(spec: str) -> str:
    """``--clharness``: a pip requirement naming clharness, a git URL (``git+https://...`` or an
    ``https://`` repository URL) or a local clharness checkout (a folder with pyproject.toml)."""
    spec = spec.strip()
    if spec.startswith(("git+", "file:")):
        return f"clharness @ {spec}"
    if re.match(r"https?://", spec):
        return f"clharness @ {spec}" if spec.endswith((".whl", ".tar.gz", ".zip")) else f"clharness @ git+{spec}"
    path = Path(spec).expanduser()
    if (path / "pyproject.toml").is_file():
        return f"clharness @ {path.resolve().as_uri()}"
    return spec


def check_requirement(requirement: str) -> None:
    from packaging.requirements import InvalidRequirement, Requirement
    try:
        parsed = Requirement(requirement)
    except InvalidRequirement as exc:
        raise ScaffoldError(f"clharness init: --clharness {requirement!r} is not a pip requirement ({exc}); "
                            "give e.g. 'clharness>=0.1' or 'clharness @ git+https://github.com/ORG/clharness'") from None
    if parsed.name.lower() != "clharness":
        raise ScaffoldError(f"clharness init: --clharness {requirement!r} names {parsed.name!r}; it must "
                            "install the clharness distribution")


def files(name: str, source: Source | str | None = None) -> dict[str, str]:
    """Relative path -> content of the package for ``name``; ``source`` (a Source or a --clharness
    spec; default: installed_source()) is how its pyproject, README and CI install clharness."""
    source = source if isinstance(source, Source) else chosen_source(source)
    requirement = source.requirement
    install = (f"python -m pip install -e {shlex.quote(str(source.folder))}   # clharness: this checkout, editable"
               if source.folder else f'python -m pip install "{requirement}"   # clharness itself (not on PyPI)')
    fill = {"name": name, "dist": f"clharness-{name.replace('_', '-')}", "requirement": requirement,
            "repository": repository_url(), "install_clharness": install, "why": source.why.rstrip("."),
            "local_note": ("\n          # clharness from a local path, which CI cannot reach: run `clharness init "
                           "--clharness git+URL@COMMIT` or edit the next lines" if "file:" in requirement else "")}
    return {
        "pyproject.toml": PYPROJECT.format(**fill),
        "README.md": README.format(**fill),
        f"{name}/__init__.py": f'"""{name}: a continual-learning method (clharness plugin in {name}.plugin)."""\n',
        f"{name}/method.py": render_method(name),
        f"{name}/plugin.py": PLUGIN.format(**fill),
        f"{name}/suites/{name}.toml": SUITE.format(**fill),
        f"tests/test_{name}.py": TEST.format(**fill),
        ".github/workflows/clharness.yml": WORKFLOW.format(**fill),
    }


def scaffold(name: str, parent: Path | str = ".", requirement: str | None = None,
             on_source=lambda source: None) -> Path:
    """Write the package ``parent/name`` and return its folder. ``requirement``: a --clharness spec
    (default: where this clharness came from, installed_source()); ``on_source(Source)`` hears the
    choice before anything is written (the CLI prints it)."""
    root = Path(parent) / name
    if root.exists():   # first: an existing folder in the current directory may also be importable
        raise ScaffoldError(f"clharness init: {root} already exists; remove it or give another NAME "
                            "(or --dir PARENT to create it elsewhere)")
    check_name(name)
    source = chosen_source(requirement)
    on_source(source)
    for rel, text in files(name, source).items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root
