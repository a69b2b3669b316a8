"""How fast a misspelled suite is refused (issue 37 item 6): `pytest` on a suite file whose backbone is a typo,
against the bare `python -c "import torch"` it cannot avoid, side by side, median of repeats.

    python bench/fast_answers.py --repeats 5

Goal: the refusal within 2 s of the import. Both run as whole processes in an empty folder (the
session's own plugins included: pytest-xdist, hypothesis... whatever the environment loads).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUITE = Path(__file__).resolve().parent.parent / "suites" / "quickstart.toml"


def timed(cmd: list[str], cwd: Path) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    return time.perf_counter() - start, done


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "typo.toml").write_text(SUITE.read_text().replace('backbone = "mlp"', 'backbone = "mpl"'))
        torch_s, typo_s, bare_s = [], [], []
        pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        for _ in range(args.repeats):   # interleaved: the machine's load hits all three alike
            torch_s.append(timed([sys.executable, "-c", "import torch"], folder)[0])
            for extra, out in (([], typo_s), (["-p", "no:hypothesispytest"], bare_s)):
                seconds, done = timed([*pytest, *extra, "typo.toml"], folder)
                if "did you mean 'mlp'" not in done.stdout + done.stderr:
                    sys.exit("the typo was not refused with a did-you-mean:\n" + done.stdout[-2000:] + done.stderr[-2000:])
                out.append(seconds)
    a, b, c = statistics.median(torch_s), statistics.median(typo_s), statistics.median(bare_s)
    print(f"load {os.getloadavg()[0]:.2f}; medians of {args.repeats}: import torch {a:.2f} s; typo refused {b:.2f} s "
          f"(+{b - a:.2f} s; goal <= +2 s), {c:.2f} s without the hypothesis plugin this environment autoloads "
          f"(+{c - a:.2f} s)")


if __name__ == "__main__":
    main()
