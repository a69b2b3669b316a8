"""Results others can check (issue 42 item 6): `clharness store export` writes a suite's records with
their key inputs as one bundle; `clharness verify` re-runs sampled cases and tells "same inputs,
reproduced" from "inputs differ" (another machine's code) and from "NOT reproduced"."""
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import clharness as clh
from clharness.cli import main
from clharness.results import ResultsStore
from doc_blocks import REPO, block

README = REPO / "README.md"

PLUGIN = block(README, "# my_method.py")   # README's example method, "mine"


@pytest.fixture
def bundle(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "mine.py").write_text(PLUGIN)
    clh.run("quickstart", methods=["mine", "finetune"], seeds=2, quick=True, device="cpu",
            results=tmp_path / "r.sqlite", plugins=["mine.py"])
    assert main(["store", "export", str(tmp_path / "r.sqlite"), "--suite", "quickstart", "-o", "b.zip",
                 "-p", "mine.py"]) == 0
    return tmp_path / "b.zip"


def test_the_bundle_holds_records_key_inputs_scorecard_and_suite_file(bundle):
    with zipfile.ZipFile(bundle) as z:
        names = set(z.namelist())
        manifest = json.loads(z.read("manifest.json"))
        records = z.read("records.jsonl").decode().splitlines()
    assert {"manifest.json", "records.jsonl", "scorecard.md", "scorecard.json", "suite/quickstart.toml"} <= names
    assert len(records) == len(manifest["records"]) == 4
    with ResultsStore(bundle.parent / "r.sqlite") as store:
        stored = {r.key: r for r in store.records("quickstart")}
    for entry in manifest["records"]:
        record = stored[entry["key"]]
        assert entry["code_digest"] == record.code_digest == entry["definition"]["code"]
        assert entry["definition"]["versions"]["torch"] == record.versions["torch"]
        assert entry["definition"]["hparams"] == {k: v for k, v in record.hparams.items()}


def test_verify_on_the_same_machine_reproduces_every_case_bit_for_bit(bundle, capsys):
    assert main(["verify", str(bundle), "--sample", "4", "-p", "mine.py"]) == 0
    out = capsys.readouterr().out
    assert out.count("same inputs; reproduced: bit-identical accuracy matrix") == 4


def test_verify_after_a_code_change_names_the_changed_input_not_a_failed_reproduction(bundle):
    source = bundle.parent / "mine.py"
    source.write_text(source.read_text().replace("lr=self.hp[\"lr\"])", "lr=self.hp[\"lr\"], momentum=0.5)"))
    # a new process, as on another machine: this one imported mine.py (and hashed it) already
    done = subprocess.run([str(Path(sys.executable).parent / "clharness"), "verify", str(bundle), "--sample", "4",
                           "-p", "mine.py"], cwd=bundle.parent, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    mine = [line for line in lines if "[mine-seed" in line]
    finetune = [line for line in lines if "[finetune-seed" in line]
    assert len(mine) == 2 and all("inputs differ (code digest: stored" in line and "not a reproduction" in line
                                  for line in mine)
    assert all("NOT reproduced" not in line for line in mine)
    assert len(finetune) == 2 and all("same inputs; reproduced" in line for line in finetune)


def test_verify_says_not_reproduced_when_the_same_inputs_give_other_numbers(bundle, capsys):
    """A bundle whose stored numbers were altered: same inputs, so the re-run must match and does not."""
    altered = bundle.parent / "altered.zip"
    with zipfile.ZipFile(bundle) as src, zipfile.ZipFile(altered, "w") as dst:
        for name in src.namelist():
            data = src.read(name)
            if name == "records.jsonl":
                rows = [json.loads(line) for line in data.decode().splitlines()]
                for row in rows:
                    row["acc_matrix"][-1][0] += 0.01
                data = ("\n".join(json.dumps(r) for r in rows) + "\n").encode()
            dst.writestr(name, data)
    assert main(["verify", str(altered), "--sample", "1", "-p", "mine.py"]) == 1
    out = capsys.readouterr().out
    assert "same inputs; NOT reproduced: the accuracy matrix differs by up to 0.01" in out
