"""Render `clharness report --html` and screenshot it with headless Chromium.

    python scripts/render_report.py                        # demo store, page and PNG under /tmp/clharness-report
    python scripts/render_report.py --store results.sqlite # an existing store
    python scripts/render_report.py --methods 10 --scenarios 10 --seeds 100 --time --no-screenshot
    python scripts/render_report.py --store results.sqlite --per-suite docs/screenshots   # one PNG per suite
    python scripts/render_report.py --figures /tmp/figs --check   # PNG/SVG/PDF per figure, then check them
    python scripts/render_report.py --check --dom                 # ... and the DOM headless Chromium renders

--check (issue 31) reads the page and the --figures folder without a browser: every scenario's figures
are on the page (by alt text) and in the folder as PNG, SVG and PDF (the hand-drawn SVG charts, GTEP's
slope and the bar charts, as SVG: no SVG-to-PDF converter is a dependency), and every method has one
colour in every figure that draws it (read from the SVGs: matplotlib's ``<g id="method-NAME">`` lines
and the families' inline SVG ``data-method`` lines). On the demo store it also requires GTEP's slope
plot, the continual-evaluation figure, the STF radar (a metrics-only scenario) and CLDyB's radar, with
a method drawn in two of them in one colour. ``--dom`` checks a headless Chromium's DOM of the page too.

The demo store holds synthetic but plausible runs (stable methods forget less, replay costs
memory, a few runs fail or diverge) so every part of the page has something to show, and records of
the families' shapes: a GTEP tuning and evaluation phase, an STF stream (metrics only), a CLDyB
searched sequence with its random and held-out replays, and continual evaluation (eval_every) on the
first scenario.
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
                if s_i == 0 and seed == 0 and status == "passed" and m_i < 3:   # continual evaluation (eval_every)
                    rec.extra["continual"] = continual_curve(R, plastic, stable)
                rec.key = run_key({"scenario": scenario, "method": method, "seed": seed})
                yield rec
    yield from family_records(METHODS[:min(max(methods, 2), 4)], max(seeds, 2), tasks)


def continual_curve(R: np.ndarray, plastic: float, stable: float, steps: int = 8) -> dict:
    """A continual-evaluation record (extra["continual"]): every seen task's accuracy every few
    iterations, with the stability gap's dip right after each task switch."""
    points, T = [], len(R)
    for i in range(T):
        for k in range(1, steps + 1):
            dip = (1 - stable) * 0.5 * np.exp(-k / 2) if i else 0.0
            acc = [float(np.clip(R[i, j] - (dip if j < i else 0.0), 0, 1)) if j < i
                   else float(np.clip(plastic * k / steps, 0, 1)) for j in range(i + 1)]
            points.append({"iteration": i * steps + k, "task": i, "acc": acc, "boundary": k == steps})
    return {"points": points, "samples_per_task": [50] * T}


def family_records(methods: list[str], seeds: int, tasks: int):
    """Records of the families' shapes, so --check sees their figures: a GTEP tuning and evaluation
    phase (the slope plot), an STF stream (metrics only, no accuracy matrix: its radar and the neutral
    note) and a CLDyB searched sequence with its random and held-out replays (bars, fig. 4 radar)."""
    from clharness.benchmarks.cldyb.summary import SEARCH_METHOD
    rng = np.random.default_rng(1)

    def record(suite, scenario, method, seed, acc, matrix=True, **kw):
        R = np.tril(np.full((tasks, tasks), acc)) + np.triu(np.full((tasks, tasks), np.nan), 1)
        R[np.arange(tasks), np.arange(tasks)] = min(1.0, acc + 0.2)
        metrics = {**(all_metrics(R, [100] * tasks) if matrix else {"final_acc": acc}), **kw.pop("metrics", {})}
        r = RunRecord(suite=suite, scenario=scenario, method=method, seed=seed, setting="class-incremental",
                      status="passed", acc_matrix=R.tolist() if matrix else [], task_sizes=[100] * tasks if matrix else [],
                      metrics=metrics, train_seconds=float(30 + 10 * methods.index(method) + rng.normal(0, 1)),
                      eval_seconds=1.0, memory_mb=5.0 + 10 * methods.index(method), **kw)
        r.key = run_key({"suite": suite, "scenario": scenario, "method": method, "seed": seed})
        return r

    for m_i, method in enumerate(methods):
        for seed in range(seeds):
            noise = float(rng.normal(0, 0.01))
            # GTEP: two tuning configurations on D^HT, the better one (lr 0.1) run on D^E; rankings change
            for k, lr in enumerate((0.1, 0.01)):
                yield record("demo-gtep", f"gtep-digits:tune-c{k}", method, seed,
                             0.8 - 0.05 * m_i - 0.1 * k + noise, hparams={"lr": lr})
            yield record("demo-gtep", "gtep-digits:eval", method, seed, 0.55 + 0.04 * m_i + noise, hparams={"lr": 0.1})
            # STF: a stream, no task sequence (metrics only)
            yield record("demo-stf", "stf-stream", method, seed, 0.5 + 0.05 * m_i + noise, matrix=False,
                         metrics={"info_retention": 0.9 - 0.1 * m_i + noise},
                         extra={"info_retention": [0.95 - 0.1 * m_i * x + noise for x in (1 / 3, 2 / 3, 1.0)],
                                "eval_at": [1 / 3, 2 / 3, 1.0]})
            # CLDyB: the searched CC sequence, a random order and the held-out benchmark
            classes = [f"pool/c{c}" for c in range(2 * tasks)]
            for use_case, drop in (("cc", 0.15), ("random", 0.0), ("heldout", 0.05)):
                r = record("demo-cldyb", f"pool/{use_case}", method, seed, 0.7 - 0.05 * m_i - drop + noise,
                           class_order=classes, metrics={"ar": -0.1 - 0.02 * m_i, "ala": 0.85 - 0.02 * m_i})
                r.metrics["aa"] = r.metrics["final_acc"]
                yield r
    for seed in range(seeds):
        search = RunRecord(suite="demo-cldyb", scenario="pool/cc", method=SEARCH_METHOD, seed=seed,
                           setting="class-incremental", status="passed", message="(demo: no sequence file)",
                           class_order=[f"pool/c{c}" for c in range(2 * tasks)], metrics={"lookahead_seconds": 1.0})
        search.key = run_key({"suite": "demo-cldyb", "scenario": "pool/cc", "method": SEARCH_METHOD, "seed": seed})
        yield search


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
# The families' and protocols' figures the demo store draws (--check on it requires each; a store of yours
# may hold none of them). Each: how it is found on the page.
DEMO_FIGURES = ("GTEP slope", "continual evaluation", "STF radar", "CLDyB radar")
METRICS_ONLY_NOTE = "store metrics, not a per-task accuracy matrix"
_Q = "['\"]"   # the page quotes attributes with ', a browser's DOM (--dump-dom) with "


def figure_colors(svg: str) -> dict[str, str]:
    """method -> colour (#rrggbb) of one SVG figure: matplotlib's ``<g id="method-NAME">`` groups
    (plots.method_gid) and the families' inline lines (``data-method='NAME' ... stroke='#...'``)."""
    out = {}
    for name, colour in re.findall(r'<g id="method-([^"]+)">\s*<path [^>]*?stroke: (#[0-9a-fA-F]{6})', svg, re.S):
        out.setdefault(name, colour.lower())
    for name, colour in re.findall(rf"<line class={_Q}slope{_Q} data-method={_Q}([^'\"]+){_Q}[^>]*"
                                   rf"stroke={_Q}(#[0-9a-fA-F]{{6}}){_Q}", svg):
        out.setdefault(html.unescape(name), colour.lower())
    return out


def _svg_title(svg: str) -> str:
    m = re.search(r"<title>([^<]*)</title>", svg)
    return html.unescape(m.group(1)) if m else ""


def check_page(page: Path, figures: Path | None = None, require: tuple[str, ...] = ()) -> list[str]:
    """:func:`check_html` of a rendered page file."""
    return check_html(page.read_text(encoding="utf-8"), figures, require)


def check_html(text: str, figures: Path | None = None, require: tuple[str, ...] = ()) -> list[str]:
    """Problems of a rendered report (empty: none): a scenario's figure missing from the page or
    from ``figures`` (PNG, SVG, PDF; the hand-drawn SVG charts as SVG), a file that is not what its
    suffix says, or a method drawn in two colours. ``text`` is the page as written or a browser's DOM
    of it (``--headless --dump-dom``). ``require``: kinds of DEMO_FIGURES that must be on the page,
    with one method drawn in at least two of them in one colour (the colours of the matplotlib ones
    are read from their SVG files: ``figures`` is needed). Needs no browser."""
    problems = []
    alts = {html.unescape(a) for a in re.findall(r'<img alt="([^"]+)"', text)}
    scenarios: dict[str, str] = {}
    # a scenario's heading and what follows it up to the next heading (families' headings say "(GTEP)")
    for scenario, body in re.findall(r"<h3>([^<(]+::[^<(]+)</h3>(.*?)(?=<h[23]|$)", text, re.S):
        scenario = html.unescape(scenario)
        scenarios[scenario] = body
        if "no passed runs to plot" in body or "protocol steps" in body:
            continue
        kinds = FIGURE_KINDS[1:2] if METRICS_ONLY_NOTE in body else FIGURE_KINDS
        problems += [f"page: no figure '{scenario}: {kind}'" for kind in kinds if f"{scenario}: {kind}" not in alts]
    colours: dict[str, dict[str, str]] = {}   # method -> colour -> first figure with it
    inline = re.findall(r"<svg.*?</svg>", text, re.S)
    svgs = [(_svg_title(svg) or f"page <svg> {k}", svg) for k, svg in enumerate(inline)]
    files: dict[str, str] = {}                 # alt -> its SVG file's text
    if figures is not None:
        for alt in sorted(alts):
            stem = figure_stem(alt)   # may hold a dot ("(fig. 4)"): no Path.with_suffix
            for suffix, magic in ((".png", b"\x89PNG"), (".svg", b"<?xml"), (".pdf", b"%PDF")):
                path = figures / f"{stem}{suffix}"
                if not path.exists() or not path.read_bytes().startswith(magic):
                    problems.append(f"{path}: missing or not a {suffix[1:].upper()} file")
            if (figures / f"{stem}.svg").exists():
                svg = (figures / f"{stem}.svg").read_text(encoding="utf-8")
                try:
                    ElementTree.fromstring(svg)
                except ElementTree.ParseError as exc:
                    problems.append(f"{figures / stem}.svg: not well-formed XML ({exc})")
                svgs.append((stem, svg))
                files[alt] = svg
        for title, svg in svgs[:len(inline)]:   # hand-drawn charts: exported as SVG only (no converter to PDF)
            name = title.replace(": tuned vs evaluated final accuracy", ": GTEP slope")
            path = figures / f"{figure_stem(name)}.svg"
            if not path.exists():
                problems.append(f"{path}: missing (the page's inline SVG '{title}')")
            else:
                try:
                    ElementTree.parse(path)
                except ElementTree.ParseError as exc:
                    problems.append(f"{path}: not well-formed XML ({exc})")
    for where, svg in svgs:
        for method, colour in figure_colors(svg).items():
            colours.setdefault(method, {}).setdefault(colour, where)
    for method, seen in sorted(colours.items()):
        if len(seen) > 1:
            problems.append(f"method {method} has {len(seen)} colours: " + ", ".join(f"{c} in {w}" for c, w in seen.items()))
    if require:
        problems += _check_required(require, alts, scenarios, inline, files, figures)
    return problems


def family_figures(alts, scenarios, inline, files) -> dict[str, list[tuple[str, dict[str, str] | None]]]:
    """DEMO_FIGURES kind -> [(figure, its method colours, None where it colours no method)] on the page."""
    found: dict[str, list] = {kind: [] for kind in DEMO_FIGURES}
    for svg in inline:
        if re.search(rf"class={_Q}slope{_Q}", svg):
            found["GTEP slope"].append((_svg_title(svg), figure_colors(svg)))
    for alt in sorted(alts):
        if alt.endswith(": continual evaluation"):
            found["continual evaluation"].append((alt, None))   # one line per task, not per method
        elif alt.endswith(": CLDyB radar (fig. 4)"):
            found["CLDyB radar"].append((alt, figure_colors(files[alt]) if alt in files else {}))
    for scenario, body in scenarios.items():
        alt = f"{scenario}: method radar"
        if METRICS_ONLY_NOTE in body and alt in alts:
            found["STF radar"].append((alt, figure_colors(files[alt]) if alt in files else {}))
    return found


def family_figures_of(text: str, figures: Path) -> dict[str, list[tuple[str, dict[str, str] | None]]]:
    """:func:`family_figures` of a page (or its DOM) and its --figures folder."""
    alts = {html.unescape(a) for a in re.findall(r'<img alt="([^"]+)"', text)}
    scenarios = {html.unescape(s): body for s, body in re.findall(r"<h3>([^<(]+::[^<(]+)</h3>(.*?)(?=<h[23]|$)", text, re.S)}
    files = {alt: (figures / f"{figure_stem(alt)}.svg").read_text(encoding="utf-8") for alt in alts
             if (figures / f"{figure_stem(alt)}.svg").exists()}
    return family_figures(alts, scenarios, re.findall(r"<svg.*?</svg>", text, re.S), files)


def _check_required(require, alts, scenarios, inline, files, figures) -> list[str]:
    found = family_figures(alts, scenarios, inline, files)
    problems = [f"page: no {kind} figure" for kind in require if not found[kind]]
    if figures is None:
        return problems + ["the figures' colours are read from their SVG files: give --figures"]
    drawn: dict[str, dict[str, str]] = {}       # method -> figure -> colour, over the required kinds
    for kind in require:
        for where, colors in found[kind]:
            for method, colour in (colors or {}).items():
                drawn.setdefault(method, {})[where] = colour
    shared = {m: seen for m, seen in drawn.items() if len(seen) >= 2}
    if not shared:
        problems.append(f"no method is drawn in two of the {', '.join(require)} figures: their colours "
                        "cannot be compared")
    for method, seen in sorted(shared.items()):
        if len(set(seen.values())) > 1:
            problems.append(f"method {method} differs between the family figures: "
                            + ", ".join(f"{c} in {w}" for w, c in seen.items()))
    return problems


def dump_dom(page: Path) -> str:
    """The page as a headless Chromium's DOM after rendering it (``--headless --dump-dom``)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if chromium is None:
        sys.exit("no chromium found: apt-get install -y chromium")
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                               "--disable-component-update", "--disable-sync", "--no-first-run",
                               f"--user-data-dir={profile}", "--dump-dom", page.resolve().as_uri()],
                              check=True, capture_output=True, text=True, timeout=120)
    return done.stdout


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
    ap.add_argument("--dom", action="store_true",
                    help="with --check: also check the DOM a headless Chromium renders of the page (--dump-dom)")
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
    if args.check and args.figures is None:   # the figures' colours are read from their SVG files
        args.figures = args.out / "figures"
    figures = ["--figures", str(args.figures)] if args.figures else []
    if args.time:
        print(f"clharness report (text): {timed(cli):.2f}s")
        print(f"clharness report --html: {timed(cli + ['--html', str(page), *figures]):.2f}s")
    else:
        subprocess.run(cli + ["--html", str(page), *figures], check=True, stdout=subprocess.DEVNULL)
    print(f"page {page} ({page.stat().st_size / 1e6:.2f} MB)")
    if args.check:
        require = DEMO_FIGURES if args.store is None else ()
        problems = check_page(page, args.figures, require)
        if args.dom:
            problems += [f"DOM: {p}" for p in check_html(dump_dom(page), args.figures, require)]
        for line in problems:
            print(f"CHECK {line}")
        if require and args.figures:
            text = page.read_text(encoding="utf-8")
            for kind, found in family_figures_of(text, args.figures).items():
                print(f"{kind}: " + "; ".join(w + ("" if c is None else " (" + ", ".join(f"{m} {v}" for m, v in sorted(c.items())) + ")")
                                             for w, c in found) if found else f"{kind}: none")
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
