"""scripts/mutate.py's table stays pointed at the code: every mutation's original text occurs exactly once
in its file and every test it names exists. A refactor that moves the text fails here, in CI, instead of
leaving the mutation run to stop on it (five entries had drifted unnoticed)."""
import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent


def mutations():
    spec = importlib.util.spec_from_file_location("clh_mutate_table", ROOT / "scripts" / "mutate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.MUTATIONS


def test_every_mutation_still_finds_its_text_once_and_names_existing_tests():
    problems = []
    for m in mutations():
        count = (ROOT / m.file).read_text().count(m.original)
        if count != 1:
            problems.append(f"{m.name}: its original text occurs {count} times in {m.file}")
        for test in m.tests:
            path, _, name = test.partition("::")
            if not (ROOT / path).exists():
                problems.append(f"{m.name}: test file {path} does not exist")
            elif name and not re.search(rf"def {re.escape(name.split('[')[0])}\(", (ROOT / path).read_text()):
                problems.append(f"{m.name}: {path} has no test {name}")
    assert problems == []


def test_mutation_names_are_unique():
    names = [m.name for m in mutations()]
    assert len(names) == len(set(names))
