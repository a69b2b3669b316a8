"""Render `clharness report --html` and screenshot it with headless Chromium.

    python scripts/render_report.py                        # demo store, page and PNG under /tmp/clharness-report
    python scripts/render_report.py --store results.sqlite # an existing store
    python scripts/render_report.py --methods 10 --scenarios 10 --seeds 100 --time --no-screenshot
    python scripts/render_report.py --store results.sqlite --per-suite docs/screenshots   # one PNG per suite
    python scripts/render_report.py --figures /tmp/figs --check   # PNG/SVG/PDF per figure, then check them

--check (issue 31) reads the page and the --figures folder without a browser: every scenario's figures
are on the page (by alt text) and in the folder as PNG, SVG and PDF, and every method has one colour
in every figure that draws it (read from the SVGs: matplotlib's ``<g id="method-NAME">`` lines and the
families' inline SVG ``data-method`` lines).

The demo store holds synthetic but plausible runs (stable methods forget less, replay costs
memory, a few runs fail or diverge) so every part of the page has something to show.
"""
from __future__ import annotations

import argparse
import html
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from xml.etree import ElementTree

from clharness.metrics import all_metrics
from clharness.reporting.plots import figure_stem
from clharness.results import ResultsStore, RunRecord, run_key

METHODS = ["er", "ewc", "lwf", "finetune", "der", "icarl", "agem", "si", "gdumb", "slca", "ranpac", "l2p"]
SCENARIOS = ["split-cifar10", "split-mnist", "cldyb-seq", "stf-digits", "m2i", "i2m", "gtep-heldout",
             "split-svhn", "split-tiny", "omniglot", "emnist", "fashion"]


def demo_records(methods: int, scenarios: int, seeds: int, tasks: int):
    rng = np.random.default_rng(0)
    for s_i, scenario in enumerate(SCENARIOS[:scenarios] + [f"extra-{k}" for k in range(scenarios - len(SCENARIOS))]):
        sizes = [int(x) for x in rng.integers(150, 400, tasks)]
        for m_i, method in enumerate(METHODS[:methods] + [f"method-{k}" for k in range(methods - len(METHODS))]):
            if s_i == 1 and m_i == 0 and methods > 2:   # scenarios with other method sets: colours must still agree
                continue
            plastic = 0.72 + 0.2 * ((m_i * 7 + s_i) % 5) / 4       # accuracy right after learning
            stable = 0.15 + 0.8 * ((m_i * 3) % 7) / 6                # fraction kept per later task
            memory = 5.0 + 60.0 * ((m_i * 5) % 4) / 3
            for seed in range(seeds):
                noise = rng.normal(0, 0.02, (tasks, tasks))
                R = np.full((tasks, tasks), 0.1) + noise * 0.3        # future tasks: about chance
                for i in range(tasks):
                    for j in range(i + 1):
                        R[i, j] = plastic * stable ** ((i - j) / 2) + noise[i, j] + 0.1 * (1 - stable ** (i - j))
                R = np.clip(R, 0, 1)
                status, message, failed = "passed", "", None
                if (m_i, seed) == (3, 1) or (s_i == 2 and m_i == 1 and seed == 0):
                    status, failed = "failed", 2
                    message = f"RuntimeError: loss is NaN at task {failed} (lr too high?)"
                    R[failed:] = np.nan
                elif (m_i, s_i, seed) == (2, 0, 2):
                    status, message = "diverged", "accuracy at chance level after task 1"
                metrics = all_metrics(R, sizes) if status == "passed" else {}
                if scenario == "cldyb-seq" and metrics:
                    metrics["robustness"] = float(np.clip(metrics["final_acc"] - 0.15 + rng.normal(0, .02), 0, 1))
                rec = RunRecord(suite="demo" if s_i < 3 else "more", scenario=scenario, method=method, seed=seed,
                                setting="class-incremental", status=status, message=message, failed_task=failed,
                                acc_matrix=R.tolist(), task_sizes=sizes, metrics=metrics,
                                train_seconds=float(20 + 15 * m_i + rng.normal(0, 2)), eval_seconds=2.0,
                                memory_mb=memory, parameters=11_000_000)
                rec.key = run_key({"scenario": scenario, "method": method, "seed": seed})
                yield rec


def make_store(path: Path, methods: int, scenarios: int, seeds: int, tasks: int) -> Path:
    path.unlink(missing_ok=True)
    store = ResultsStore(path)
    # One transaction for all records: put() commits per record, far too slow for 10,000 demo runs.
    store._db.execute("BEGIN")
    for rec in demo_records(methods, scenarios, seeds, tasks):
        store._db.execute("INSERT OR REPLACE INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                          (rec.key, rec.suite, rec.scenario, rec.method, rec.seed, rec.status,
                           rec.finished_at, rec.to_json()))
    store._db.execute("COMMIT")
    store.close()
    return path


FIGURE_KINDS = ("accuracy over tasks", "method radar", "accuracy matrices")


def figure_colors(svg: str) -> dict[str, str]:
    """method -> colour (#rrggbb) of one SVG figure: matplotlib's ``<g id="method-NAME">`` groups
    (plots.method_gid) and the families' inline lines (``data-method='NAME' ... stroke='#...'``)."""
    out = {}
    for name, colour in re.findall(r'<g id="method-([^"]+)">\s*<path [^>]*?stroke: (#[0-9a-fA-F]{6})', svg, re.S):
        out.setdefault(name, colour.lower())
    for name, colour in re.findall(r"<line class='slope' data-method='([^']+)'[^>]*stroke='(#[0-9a-fA-F]{6})'", svg):
        out.setdefault(name, colour.lower())
    return out


def check_page(page: Path, figures: Path | None = None) -> list[str]:
    """Problems of a rendered report (empty: none): a scenario's figure missing from the page or
    from ``figures`` (PNG, SVG, PDF), a file that is not what its suffix says, or a method drawn in
    two colours. Needs no browser."""
    text = page.read_text(encoding="utf-8")
    problems = []
    alts = set(re.findall(r'<img alt="([^"]+)"', text))
    # a scenario's heading and what follows it up to the next heading (families' headings say "(GTEP)")
    for scenario, body in re.findall(r"<h3>([^<(]+::[^<(]+)</h3>(.*?)(?=<h[23]|$)", text, re.S):
        if "no passed runs to plot" in body or "protocol steps" in body:
            continue
        kinds = FIGURE_KINDS[1:2] if "store metrics, not a per-task accuracy matrix" in body else FIGURE_KINDS
        problems += [f"page: no figure '{scenario}: {kind}'" for kind in kinds if f"{scenario}: {kind}" not in alts]
    colours: dict[str, dict[str, str]] = {}   # method -> colour -> first figure with it
    svgs = [(f"page <svg> {k}", svg) for k, svg in enumerate(re.findall(r"<svg.*?</svg>", text, re.S))]
    if figures is not None:
        for alt in sorted(alts):
            stem = figures / figure_stem(html.unescape(alt))
            for suffix, magic in ((".png", b"\x89PNG"), (".svg", b"<?xml"), (".pdf", b"%PDF")):
                path = stem.with_suffix(suffix)
                if not path.exists() or not path.read_bytes().startswith(magic):
                    problems.append(f"{path}: missing or not a {suffix[1:].upper()} file")
            if stem.with_suffix(".svg").exists():
                svg = stem.with_suffix(".svg").read_text(encoding="utf-8")
                try:
                    ElementTree.fromstring(svg)
                except ElementTree.ParseError as exc:
                    problems.append(f"{stem}.svg: not well-formed XML ({exc})")
                svgs.append((stem.name, svg))
    for where, svg in svgs:
        for method, colour in figure_colors(svg).items():
            colours.setdefault(method, {}).setdefault(colour, where)
    for method, seen in sorted(colours.items()):
        if len(seen) > 1:
            problems.append(f"method {method} has {len(seen)} colours: " + ", ".join(f"{c} in {w}" for c, w in seen.items()))
    return problems


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def screenshot(page: Path, png: Path, width: int, height: int) -> Path:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if chromium is None:
        sys.exit("no chromium found: apt-get install -y chromium")
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                        "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
                        f"--user-data-dir={profile}", f"--screenshot={png}", f"--window-size={width},{height}",
                        page.resolve().as_uri()], check=True, capture_output=True, timeout=120)
    return png


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", type=Path, help="an existing results store (default: write a demo store)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/clharness-report"), help="folder for store, page, PNG")
    ap.add_argument("--methods", type=int, default=5)
    ap.add_argument("--scenarios", type=int, default=3)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=5)
    ap.add_argument("--size", default="1400,3000", help="screenshot window WIDTH,HEIGHT")
    ap.add_argument("--time", action="store_true", help="time `clharness report` (text and --html) on the store")
    ap.add_argument("--no-screenshot", action="store_true")
    ap.add_argument("--figures", type=Path, metavar="DIR", help="also write every figure as PNG, SVG and PDF to DIR")
    ap.add_argument("--check", action="store_true",
                    help="check the page (and --figures) for every figure and one colour per method; exit 1 if not")
    ap.add_argument("--per-suite", type=Path, metavar="DIR",
                    help="also render each suite of the store on its own page and screenshot it to DIR/report-SUITE.png "
                         "(the family screenshots README links)")
    args = ap.parse_args()

    args.out.mkdir(parents=True, exist_ok=True)
    store = args.store
    if store is None:
        start = time.perf_counter()
        store = make_store(args.out / "results.sqlite", args.methods, args.scenarios, args.seeds, args.tasks)
        print(f"demo store {store} ({len(ResultsStore(store).records())} runs, "
              f"{time.perf_counter() - start:.1f}s)")
    page = args.out / "report.html"
    cli = [sys.executable, "-m", "clharness.cli", "report", str(store)]
    figures = ["--figures", str(args.figures)] if args.figures else []
    if args.time:
        print(f"clharness report (text): {timed(cli):.2f}s")
        print(f"clharness report --html: {timed(cli + ['--html', str(page), *figures]):.2f}s")
    else:
        subprocess.run(cli + ["--html", str(page), *figures], check=True, stdout=subprocess.DEVNULL)
    print(f"page {page} ({page.stat().st_size / 1e6:.2f} MB)")
    if args.check:
        problems = check_page(page, args.figures)
        for line in problems:
            print(f"CHECK {line}")
        print(f"check: {len(problems)} problem(s)")
        if problems:
            sys.exit(1)
    if not args.no_screenshot:
        width, height = (int(v) for v in args.size.split(","))
        print(f"screenshot {screenshot(page, args.out / 'report.png', width, height)}")
    if args.per_suite:
        width, height = (int(v) for v in args.size.split(","))
        args.per_suite.mkdir(parents=True, exist_ok=True)
        for suite in suites_of(store):
            one = args.out / f"report-{suite}.html"
            subprocess.run(cli + ["--suite", suite, "--html", str(one)], check=True, stdout=subprocess.DEVNULL)
            png = screenshot(one, args.per_suite / f"report-{suite}.png", width, height)
            print(f"screenshot {png} ({png.stat().st_size / 1e3:.0f} kB)")


def suites_of(store: Path) -> list[str]:
    db = ResultsStore(store)
    try:
        return sorted({r.suite for r in db.records()})
    finally:
        db.close()


if __name__ == "__main__":
    main()
