"""Results others can check: a suite's records exported as one self-contained bundle, and a bundle's
cases re-run on another machine (``clharness store export``, ``clharness verify``).

A bundle is a zip file holding ``manifest.json`` (where and with what it was made, and per record the
inputs its key was made of: the case's full definition, code digest, weights, dataset identity,
library versions), ``records.jsonl`` (every record as stored), ``scorecard.md`` and ``scorecard.json``,
and ``suite/<file>.toml`` (the suite file the records came from).

``verify`` rebuilds sampled cases from the bundle's suite file on this machine, with this machine's code,
and says per case:
- ``inputs differ`` (naming each one: code digest, a library version, a hyperparameter...) when the case
  here is not the case that was stored: the run is then compared only to the stored seed spread;
- ``reproduced`` when the inputs match and the re-run's accuracy matrix is bit-identical (on CPU a
  record's key fixes its numbers: engine.runner's one thread rule), or, on another device type, when
  its final accuracy lies within the stored seeds' spread;
- ``NOT reproduced`` otherwise.
"""
from __future__ import annotations

import datetime
import json
import platform
import random
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from ..results import RunRecord, ResultsStore

FORMAT = 1


def export_bundle(results: str | Path, suite_path: Path, out: str | Path, harness) -> Path:
    """Write the bundle of ``suite_path``'s records in ``results`` to ``out`` (a .zip)."""
    from .runner import versions
    from .suites import load_suite
    suite = load_suite(suite_path)
    with ResultsStore(results) as store:
        records = [r for r in store.records(suite.name) if r.status in ("passed", "diverged", "failed")]
    if not records:
        raise ValueError(f"{results}: no records of suite {suite.name!r} to export")
    budgets = {quick: {s.name: s for s in load_suite(suite_path, quick=quick).scenarios} for quick in (False, True)}
    cases = []
    for record in records:
        entry = {"key": record.key, "case": record.case_id, "code_digest": record.code_digest,
                 "git_commit": record.git_commit, "weights": record.weights, "dataset": record.dataset,
                 "versions": record.versions, "device": record.device, "cpu_threads": record.cpu_threads}
        entry.update(_definition(record, budgets, suite.name, harness))
        cases.append(entry)
    manifest = {"format": FORMAT, "suite": suite.name, "suite_file": f"suite/{suite_path.name}",
                "created": datetime.datetime.now().isoformat(timespec="seconds"),
                "machine": {"platform": platform.platform(), "python": platform.python_version(), **versions()},
                "records": cases}
    from ..reporting.scorecard import write
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        md, js = write(Path(tmp) / "scorecard.md", records), write(Path(tmp) / "scorecard.json", records)
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("manifest.json", json.dumps(manifest, indent=1, default=str))
            z.writestr("records.jsonl", "\n".join(r.to_json() for r in records) + "\n")
            z.write(md, "scorecard.md")
            z.write(js, "scorecard.json")
            z.write(suite_path, manifest["suite_file"])
    return out


def _definition(record: RunRecord, budgets: dict, suite: str, harness) -> dict:
    """The case a record was made of, rebuilt from the suite file: its budget (full or quick) is the one
    whose definition hashes to the record's base key. ``{"definition": ..., "quick": ...}``, or a reason."""
    from .keys import base_key_of
    from .runner import Case
    if record.method not in harness.methods:
        return {"rebuilt": f"method {record.method!r} is not registered where the bundle was made"}
    method_cls = harness.methods[record.method]
    for quick, specs in budgets.items():
        spec = specs.get(record.scenario)
        if spec is None:
            continue
        definition = Case(suite, spec, record.method, record.seed, dict(record.hparams)).definition(
            method_cls, dict(record.versions))
        if base_key_of(definition) == record.base_key:
            definition["code"] = record.code_digest   # the stored record's code, not this checkout's
            return {"definition": json.loads(json.dumps(definition, default=str)), "quick": quick}
    return {"rebuilt": "no budget of the suite file gives this record's base key (a protocol step, a preset, or a "
                       "suite file edited since): verify does not re-run it"}


def read_bundle(bundle: str | Path, into: Path) -> tuple[dict, list[RunRecord], Path]:
    with zipfile.ZipFile(bundle) as z:
        z.extractall(into)
    manifest = json.loads((into / "manifest.json").read_text())
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{bundle}: bundle format {manifest.get('format')!r}; this clharness reads {FORMAT}")
    records = [RunRecord.from_json(line) for line in (into / "records.jsonl").read_text().splitlines() if line]
    return manifest, records, into / manifest["suite_file"]


def differences(stored: dict, here: dict, prefix: str = "") -> list[str]:
    """The key inputs that differ between two case definitions, by their path ("versions.torch")."""
    out = []
    for name in sorted(set(stored) | set(here)):
        a, b = stored.get(name), here.get(name)
        where = f"{prefix}{name}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, where + ".")
        elif json.dumps(a, sort_keys=True, default=str) != json.dumps(b, sort_keys=True, default=str):
            label = {"code": "code digest"}.get(where, where)
            out.append(f"{label}: stored {_short(a)}, here {_short(b)}")
    return out


def _short(value) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= 40 else text[:37] + "..."


def verify_bundle(bundle: str | Path, sample: int, harness, device: str = "cpu", data_root=None,
                  seed: int = 0, say=print) -> int:
    """Re-run ``sample`` cases of ``bundle`` here; returns the exit status (0: every sampled case has the
    same inputs and reproduced)."""
    from .runner import Case, pick_device, run_case, versions
    from .suites import load_suite
    with tempfile.TemporaryDirectory() as tmp:
        manifest, records, suite_file = read_bundle(bundle, Path(tmp))
        budgets = {quick: load_suite(suite_file, quick=quick) for quick in (False, True)}
        by_key = {r.key: r for r in records}
        runnable = [c for c in manifest["records"] if "definition" in c and by_key[c["key"]].status == "passed"]
        chosen = random.Random(seed).sample(runnable, min(sample, len(runnable)))
        say(f"verify {bundle}: suite {manifest['suite']}, {len(chosen)} of {len(runnable)} re-runnable cases "
            f"(made {manifest['created']} on {manifest['machine'].get('platform', '?')})")
        status = 0
        for entry in chosen:
            stored = by_key[entry["key"]]
            suite = budgets[entry["quick"]]
            spec = next(s for s in suite.scenarios if s.name == stored.scenario)
            if stored.method not in harness.methods:
                say(f"  {stored.case_id}: inputs differ: method {stored.method!r} is not registered here")
                status = 1
                continue
            method_cls = harness.methods[stored.method]
            case = Case(suite.name, spec, stored.method, stored.seed, dict(stored.hparams))
            here = json.loads(json.dumps(case.definition(method_cls, versions()), default=str))
            diff = differences(entry["definition"], here)
            rerun = run_case(case, harness, pick_device(device), Path(data_root) if data_root else None)
            ok, detail = _compare(stored, rerun, [r for r in records if r.suite == stored.suite and
                                                  r.scenario == stored.scenario and r.method == stored.method and
                                                  r.hparams == stored.hparams], same_inputs=not diff)
            if diff:
                say(f"  {stored.case_id}: inputs differ ({'; '.join(diff)}): not the stored case, so not a "
                    f"reproduction; its re-run here: {detail}")
                status = 1
            else:
                say(f"  {stored.case_id}: same inputs; {'reproduced' if ok else 'NOT reproduced'}: {detail}")
                status = status or (0 if ok else 1)
        return status


def _compare(stored: RunRecord, rerun: RunRecord, seeds: list[RunRecord], same_inputs: bool) -> tuple[bool, str]:
    """(reproduced?, how): bit-identical on CPU where the inputs match, else within the stored seed spread."""
    if rerun.status != "passed":
        return False, f"the re-run {rerun.status}: {rerun.message.splitlines()[0] if rerun.message else ''}"
    a, b = np.array(stored.acc_matrix, float), np.array(rerun.acc_matrix, float)
    same_device = stored.device.split(":")[0] == rerun.device.split(":")[0]
    if same_inputs and same_device and rerun.device.startswith("cpu"):
        if a.shape == b.shape and np.array_equal(a, b, equal_nan=True):
            return True, "bit-identical accuracy matrix"
        gap = np.nanmax(np.abs(a - b)) if a.shape == b.shape else float("nan")
        return False, f"the accuracy matrix differs by up to {gap:.4g} (bit-identical expected on CPU)"
    finals = [r.metrics.get("final_acc", float("nan")) for r in seeds]
    low, high = min(finals), max(finals)
    got = rerun.metrics.get("final_acc", float("nan"))
    inside = low <= got <= high if len(finals) > 1 else abs(got - finals[0]) < 1e-9
    where = "in" if inside else "outside"
    return inside, f"final acc {got:.4f} {where} the stored [{low:.4f}, {high:.4f}] over {len(finals)} seed(s)"
