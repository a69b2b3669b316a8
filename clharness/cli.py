"""The ``clharness`` command: ``run`` suites through pytest, ``list`` what is registered."""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="clharness", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_run, _add_list, _add_report, _add_compare,
                _add_init, _add_store, _add_verify, _add_data):
        add(sub)
    from .kinds import family_commands
    for command, run in family_commands(sub).items():   # the benchmark families' own (STF: stream-plot)
        sub.choices[command].set_defaults(handler=run)
    args = parser.parse_args(argv)
    return args.handler(args)


def _plugin_flag(parser, whose: str = "") -> None:
    parser.add_argument("-p", "--plugin", action="append", default=[], metavar="MODULE",
                        help="import MODULE as a clharness plugin" + (f" {whose}" if whose else ""))


def _harness_with_kinds(plugins):
    """The registries with every plugin's kinds installed (what a command that rebuilds cases needs)."""
    from .kinds import install
    from .plugins import Harness
    harness = Harness(plugins=tuple(plugins or ()))
    install(harness.kinds)
    return harness


def _add_run(sub) -> None:
    run = sub.add_parser("run", help="run suites (default: the quickstart) and print the scorecard",
                         description="Runs suites as pytest cases; arguments after -- go to pytest.")
    from .engine.options import add_cli_flags
    add_cli_flags(run)   # the session options, from the one table (engine.options.OPTIONS)
    run.add_argument("-n", "--workers", metavar="N", help="pytest-xdist worker processes (e.g. 2 or auto)")
    run.add_argument("pytest_args", nargs=argparse.REMAINDER, help="extra pytest arguments, after --")
    run.set_defaults(handler=run_suites)


def _add_list(sub) -> None:
    lst = sub.add_parser("list", help="registered methods, kinds, suites, datasets and backbones, with their sources")
    _plugin_flag(lst)
    lst.add_argument("--markdown", action="store_true",
                     help="only the methods, as the markdown table README.md carries (name, settings, paper)")
    lst.set_defaults(handler=list_registered)


def _add_report(sub) -> None:
    rep = sub.add_parser("report", help="scorecard tables of a results store; --html for a page with plots",
                         description="Prints the scorecard (mean and 95% CI over seeds) of every suite, "
                                     "scenario and method in RESULTS; --html also writes one self-contained "
                                     "page with accuracy-matrix heatmaps, accuracy over tasks and method radars.")
    rep.add_argument("results", metavar="RESULTS", help="the SQLite results store (--clh-results)")
    rep.add_argument("--format", default="md", choices=["md", "github", "latex", "csv", "json"],
                     help="text format on stdout (default: md, a Markdown pipe table with alignment colons; github: GitHub's flavour without them)")
    rep.add_argument("--columns", action="append", default=[], metavar="COL[,COL...]",
                     help="metric columns (repeatable or comma-separated; default: "
                          "final_acc,avg_inc_acc,forgetting,bwt, the kinds' own metrics, train_seconds,train_gflops,eval_gflops,memory_mb)")
    rep.add_argument("--suite", action="append", default=[], metavar="NAME", help="only this suite (repeatable)")
    rep.add_argument("--scenario", action="append", default=[], metavar="NAME", help="only this scenario (repeatable)")
    rep.add_argument("--method", action="append", default=[], metavar="NAME", help="only this method (repeatable)")
    rep.add_argument("--all", action="store_true", dest="every",
                     help="every configuration of a case (quick budget, older code, other hyperparameters), each its "
                          "own labelled row after the main one; default: per case only the configuration the current "
                          "code and suite would run (figures and Welch tests use that one either way)")
    rep.add_argument("--per-gflop", action="store_true", dest="per_gflop",
                     help="also rank the methods of each scenario at equal compute: final accuracy per training "
                          "GFLOP, with the Pareto front of accuracy vs training FLOPs marked (md, github, latex)")
    rep.add_argument("--html", metavar="PATH", help="also write the HTML report to PATH")
    rep.add_argument("--figures", metavar="DIR",
                     help="also write every figure of the HTML report to DIR: matplotlib figures as PNG, SVG and PDF, "
                          "the hand-drawn SVG charts (GTEP slope, M2I and CLDyB bars) as SVG only "
                          "(named suite__scenario_kind; with the page as DIR/report.html unless --html is given)")
    rep.add_argument("--jobs", type=int, default=None, metavar="N",
                     help="processes drawing the HTML report's figures (default: one per CPU)")
    rep.set_defaults(handler=report_results)


def _add_compare(sub) -> None:
    cmp = sub.add_parser("compare", help="two scorecards side by side; exit 1 on a regression or a mismatch",
                         description="A and B are scorecard JSONs (--clh-scorecard x.json) or results stores. "
                                     "For each --max-drop METRIC=DROP, a row regresses when a one-sided Welch "
                                     "t-test over the seeds (mean, sd from the stored 95% CI half-width and n) "
                                     "rejects 'B is worse than A by at most DROP' at level --alpha; a drop beyond "
                                     "DROP that the seeds do not make significant is a note. Rows with one seed "
                                     "are judged on the means. A suite, scenario, method or judged metric on one "
                                     "side only is a mismatch (with a did-you-mean). Exit 1 on a regression or a "
                                     "mismatch, 0 if none, 2 on unusable input (a --max-drop metric in neither).")
    cmp.add_argument("a", metavar="A", help="the baseline scorecard JSON or results store")
    cmp.add_argument("b", metavar="B", help="the candidate scorecard JSON or results store")
    cmp.add_argument("--max-drop", action="append", default=[], metavar="METRIC=VALUE",
                     help="allowed drop of a metric's seed mean (repeatable; default: final_acc=0.02)")
    cmp.add_argument("--alpha", type=float, default=0.05, metavar="P",
                     help="level of the one-sided Welch t-test (default: 0.05)")
    cmp.add_argument("--means-only", action="store_true",
                     help="judge the seed means alone, without the spread (the drop itself decides)")
    cmp.add_argument("--format", default="md", choices=["md", "github", "latex"], help="table format")
    cmp.set_defaults(handler=compare_scorecards)


def _add_init(sub) -> None:
    init = sub.add_parser("init", help="scaffold a method plugin package: method, suite with gates, tests, CI workflow",
                          description="Creates the folder NAME: pyproject.toml (entry point `clharness`), "
                                      "NAME/method.py (README's example), NAME/suites/NAME.toml (gates against "
                                      "finetune and er), tests/ (the suite with --clh-quick) and "
                                      ".github/workflows/clharness.yml (pytest; scorecard and report as artifacts).")
    init.add_argument("name", metavar="NAME", help="method name = package import name (a Python identifier)")
    init.add_argument("--dir", default=".", metavar="PARENT", help="create NAME inside PARENT (default: .)")
    init.add_argument("--clharness", default=None, metavar="REQUIREMENT|URL|PATH",
                      help="how the package, its README and its CI install clharness (not on PyPI): a pip "
                           "requirement, a git URL or a local clharness checkout (default: where this clharness "
                           "came from, as pip recorded it: its local checkout, installed editable by the README, "
                           "or its git URL pinned to the installed commit; init prints which and why)")
    init.set_defaults(handler=init_package)


def _add_store(sub) -> None:
    store = sub.add_parser("store", help="see, prune and export a results store")
    store_sub = store.add_subparsers(dest="store_command", required=True)
    export = store_sub.add_parser("export", help="a suite's records as one self-contained bundle (zip) that "
                                                 "`clharness verify` re-runs anywhere")
    export.add_argument("results", metavar="RESULTS", help="the SQLite results store")
    export.add_argument("--suite", required=True, metavar="NAME|PATH", help="the suite whose records to export")
    export.add_argument("-o", "--output", required=True, metavar="BUNDLE", help="the bundle file to write (.zip)")
    _plugin_flag(export, "(the records' methods)")
    export.set_defaults(handler=export_command)
    lst = store_sub.add_parser("list", help="suite / scenario / method / configuration: seeds, dates, code, budget, stale")
    lst.add_argument("results", metavar="RESULTS", help="the SQLite results store")
    lst.set_defaults(handler=store_command)
    rm = store_sub.add_parser("rm", help="remove the selected records (prints them; removes only with --yes)",
                              description="Every given filter must hold; a repeated name flag takes any of its names. "
                                          "Safe while a session writes to the store (short transactions).")
    rm.add_argument("results", metavar="RESULTS", help="the SQLite results store")
    for flag in ("method", "suite", "scenario"):
        rm.add_argument(f"--{flag}", action="append", default=[], metavar="NAME", help=f"only this {flag} (repeatable)")
    rm.add_argument("--stale", action="store_true", help="only records a newer run of the same case by other code superseded")
    rm.add_argument("--quick", action="store_true", help="only records made under --clh-quick")
    rm.add_argument("--older-than", metavar="AGE", help="only records finished more than AGE ago (30d, 12h, 2w)")
    rm.add_argument("--yes", action="store_true", help="really remove them (without it: print what would go)")
    rm.set_defaults(handler=store_command)
    vac = store_sub.add_parser("vacuum", help="give removed records' space back to the file system")
    vac.add_argument("results", metavar="RESULTS", help="the SQLite results store")
    vac.set_defaults(handler=store_command)


def _add_verify(sub) -> None:
    ver = sub.add_parser("verify", help="re-run sampled cases of an exported bundle here; per case: same inputs? "
                                        "reproduced? (exit 1 if any is not)",
                         description="BUNDLE is a zip that `clharness store export` wrote. Each sampled case is rebuilt "
                                     "from the bundle's suite file with this machine's code and run; its key inputs "
                                     "(code digest, library versions, hyperparameters, weights, ...) are compared "
                                     "with the stored ones and named where they differ, and its result with the "
                                     "stored one: bit-identical on CPU where the inputs match, else within the "
                                     "stored seeds' spread.")
    ver.add_argument("bundle", metavar="BUNDLE", help="a bundle written by clharness store export")
    ver.add_argument("--sample", type=int, default=3, metavar="N", help="cases to re-run (default: %(default)s)")
    ver.add_argument("--seed", type=int, default=0, help="which cases the sample draws (default: %(default)s)")
    ver.add_argument("--device", default="cpu", help="device of the re-runs (default: cpu)")
    ver.add_argument("--data-root", default=os.environ.get("CLH_DATA_ROOT"), metavar="DIR")
    _plugin_flag(ver, "(the bundle's methods)")
    ver.set_defaults(handler=verify_command)


def _add_data(sub) -> None:
    data = sub.add_parser("data", help="datasets: check what a suite needs, fetch what can be downloaded")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    dcheck = data_sub.add_parser("check", help="each dataset a suite needs: present under the data root or not, "
                                               "and the command that gets it (exit 1 if any is missing)")
    dcheck.add_argument("--suite", required=True, metavar="NAME|PATH", help="a registered suite or a .toml file")
    dcheck.add_argument("--root", default=os.environ.get("CLH_DATA_ROOT"), metavar="DIR",
                        help="the data root (default: $CLH_DATA_ROOT)")
    _plugin_flag(dcheck)
    dfetch = data_sub.add_parser("fetch", help="download, verify, unpack and lay out datasets under --root",
                                 description="torchvision datasets through torchvision; tinyimagenet, imagenet-r, "
                                             "imagenet-a and cub200 from their published archives (md5-checked, "
                                             "resumable). ImageNet and Kaggle sources are listed with instructions.")
    dfetch.add_argument("names", nargs="+", metavar="NAME", help="datasets (see `clharness data check`)")
    dfetch.add_argument("--root", default=os.environ.get("CLH_DATA_ROOT"), metavar="DIR",
                        help="the data root (default: $CLH_DATA_ROOT)")
    dfetch.add_argument("--base-url", metavar="URL", help="fetch archives from URL/<file> instead of their "
                                                          "published hosts (default: $CLH_DATA_MIRROR)")
    data.set_defaults(handler=data_command)


def verify_command(args: argparse.Namespace) -> int:
    from .engine.bundle import verify_bundle
    harness = _harness_with_kinds(args.plugin)
    try:
        return verify_bundle(args.bundle, args.sample, harness, device=args.device, data_root=args.data_root,
                             seed=args.seed)
    except (OSError, ValueError, KeyError) as exc:
        print(f"clharness verify: {exc}", file=sys.stderr)
        return 2


def export_command(args: argparse.Namespace) -> int:
    """``clharness store export RESULTS --suite NAME -o BUNDLE``."""
    from .engine.bundle import export_bundle
    harness = _harness_with_kinds(args.plugin)
    suite = Path(harness.suites[args.suite]) if args.suite in harness.suites else Path(args.suite)
    if not suite.exists():
        print(f"clharness store export: unknown suite {args.suite!r} (a registered name or a .toml path)", file=sys.stderr)
        return 2
    try:
        out = export_bundle(args.results, suite, args.output, harness)
    except ValueError as exc:
        print(f"clharness store export: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out}: the records of suite {args.suite} with their key inputs, scorecard and suite file; "
          f"check it anywhere with: clharness verify {out} --sample N")
    return 0


def store_command(args: argparse.Namespace) -> int:
    """``clharness store list|rm|vacuum RESULTS``."""
    from .reporting.report import ReportError, load_records
    from .reporting.store_admin import Selection, SelectionError, listing, parse_age
    from .results import ResultsStore, StoreError
    try:
        records = load_records(args.results)   # checks the file is a store; never creates one
        if args.store_command == "list":
            print(listing(records))
            return 0
        if args.store_command == "vacuum":
            with ResultsStore(args.results) as store:
                store.vacuum()
            print(f"vacuumed {args.results}")
            return 0
        selection = Selection(args.method, args.suite, args.scenario, args.stale, args.quick,
                              parse_age(args.older_than) if args.older_than else None)
        if selection.empty():
            print("clharness store rm: select records with --method, --suite, --scenario, --stale, --quick or "
                  "--older-than (nothing is removed without a filter)", file=sys.stderr)
            return 2
        chosen = selection.select(records)
        for r in chosen:
            print(f"{'remove' if args.yes else 'would remove'} {r.case_id} {r.key}")
        if args.yes:
            with ResultsStore(args.results) as store:
                removed = store.delete([r.key for r in chosen])
            print(f"removed {removed} record(s) from {args.results}")
        else:
            print(f"{len(chosen)} record(s) selected; nothing removed (add --yes to remove them)")
    except (ReportError, StoreError, SelectionError, OSError) as exc:
        print(f"clharness store {args.store_command}: {exc}", file=sys.stderr)
        return 2
    return 0


def run_suites(args: argparse.Namespace) -> int:
    import pytest

    from .engine.options import pytest_argv
    pytest_args = ["-v", "-o", "cache_dir=.clharness/pytest_cache", "-W", "ignore::pytest.PytestAssertRewriteWarning"]
    if not args.clh_suite:
        pytest_args += ["--clh-suite", "quickstart"]
    pytest_args += pytest_argv(args)
    if args.workers:
        pytest_args += ["-n", args.workers]
    extra = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    return int(pytest.main(pytest_args + extra))


def list_registered(args: argparse.Namespace) -> int:
    import warnings

    from .plugins import Harness, PluginWarning
    from .registry import RegistryError

    with warnings.catch_warnings(record=True) as caught:   # a broken entry point: one line, listed without it
        warnings.simplefilter("always", PluginWarning)
        try:
            harness = Harness(plugins=tuple(args.plugin))
        except RegistryError as exc:
            print(f"clharness list: {exc}", file=sys.stderr)
            return 2
    for w in caught:
        if issubclass(w.category, PluginWarning):
            print(f"clharness list: warning: {w.message}", file=sys.stderr)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    try:
        if getattr(args, "markdown", False):
            print(methods_markdown(harness), end="")
            return 0
        return _print_registered(harness)
    except RegistryError as exc:   # e.g. two plugins registering one name: one line, no traceback
        print(f"clharness list: {exc}", file=sys.stderr)
        return 2


def methods_markdown(harness) -> str:
    """Every registered method as a markdown table (README's list is this output, checked by a test)."""
    rows = ["| method | settings | paper |", "|---|---|---|"]
    for name in sorted(harness.methods):
        cls = harness.methods[name]
        settings = ", ".join(sorted(str(s) for s in cls.settings))
        rows.append(f"| `{name}` | {settings} | {getattr(cls, 'paper', '') or '-'} |")
    return "\n".join(rows) + "\n"


def _print_registered(harness) -> int:
    from tabulate import tabulate

    from .plugins import has_hookimpls

    conftest = Path("conftest.py")
    if conftest.exists():   # what `pytest` here would load, `list` shows too
        spec = importlib.util.spec_from_file_location("conftest", conftest.resolve())
        module = importlib.util.module_from_spec(spec)
        sys.modules.setdefault("conftest", module)
        spec.loader.exec_module(module)
        if has_hookimpls(module):
            harness.register(module, source=f"conftest {conftest.resolve()}")

    def hp(cls):
        return ", ".join(f"{k}={p.default}" for k, p in cls.hparams.items()) or "-"

    sections = [
        ("methods", ["name", "settings", "hyperparameters (defaults)", "source"],
         [[e.name, ", ".join(sorted(str(s) for s in e.obj.settings)), hp(e.obj), e.source]
          for e in harness.methods.entries()]),
        ("kinds", ["name", "module", "source"],
         [[e.name, e.obj.where, e.source] for e in harness.kinds.entries()]),
        ("suites", ["name", "file", "source"],
         [[e.name, str(e.obj), e.source] for e in harness.suites.entries()]),
        ("datasets", ["name", "description", "source"],
         [[e.name, e.obj.describe(), e.source] for e in harness.datasets.entries()]),
        ("backbones", ["name", "description", "source"],
         [[e.name, _first_line(e.obj.__doc__) or e.obj.__name__, e.source] for e in harness.backbones.entries()]),
    ]
    for title, headers, rows in sections:
        print(f"\n{title} ({len(rows)})")
        print(tabulate(rows, headers=headers, tablefmt="simple", maxcolwidths=[None, 40, 60, 60][:len(headers)]))
    return 0


def report_results(args: argparse.Namespace) -> int:
    from .registry import RegistryError
    from .reporting.report import ReportError, check_columns, load_records, render_text, write_figures, write_html
    from .results import StoreError
    from .reporting.scorecard import default_columns

    columns = [c.strip() for arg in args.columns for c in arg.split(",") if c.strip()]
    try:
        records = load_records(args.results, args.suite)
        records = [r for r in records if (not args.scenario or r.scenario in args.scenario)
                   and (not args.method or r.method in args.method)]
        if not records:
            raise ReportError(f"no runs of scenario {args.scenario or 'any'} and method {args.method or 'any'} "
                              f"in {args.results}; `clharness store list {args.results}` shows what it holds")
        current = current_codes(records)
        columns = columns or default_columns(records)
        check_columns(records, columns)
        if args.per_gflop and args.format in ("csv", "json"):
            raise ReportError(f"--per-gflop prints a table: use --format md, github or latex, not {args.format} "
                              "(the csv and json summaries carry train_gflops and final_acc per row)")
        print(render_text(records, columns, args.format, current=current, every=args.every))
        if args.format in ("csv", "json"):   # one document on stdout: the note on hidden rows goes to stderr
            from .reporting.report import shown_rows
            from .reporting.scorecard import summarize
            note = shown_rows(summarize(records, columns[:1], current=current), args.every)[1]
            if note:
                print(f"clharness report: {note}", file=sys.stderr)
        if args.format not in ("csv", "json"):   # csv/json stay one document
            from .kinds import report_sections
            from .plugins import Harness
            from .reporting.report import FORMATS
            from .reporting.scorecard import main_records   # a kind's section pools no configurations either
            for title, text in report_sections(main_records(records, current), FORMATS[args.format], Harness):
                print(f"\n{title}\n{text}")
            if args.per_gflop:
                from .reporting.report import per_gflop_text
                print("\nAt equal compute (accuracy per training GFLOP, Pareto front):\n"
                      + per_gflop_text(records, args.format, current))
        if args.html or args.figures:
            from .plugins import Harness
            source = str(Path(args.results).resolve())
            if args.html:
                path = write_html(args.html, records, columns, source=source, make_harness=Harness,
                                  workers=args.jobs, figures=args.figures, current=current, every=args.every)
            else:
                path = write_figures(args.figures, records, columns, source=source, make_harness=Harness,
                                     workers=args.jobs, current=current, every=args.every)
            print(f"wrote {path}" + (f" and its figures to {args.figures}" if args.figures else ""),
                  file=sys.stderr)   # stderr: stdout stays parseable csv/json
    except (ReportError, StoreError, OSError, RegistryError) as exc:
        print(f"clharness report: {exc}", file=sys.stderr)
        return 2
    return 0


def current_codes(records) -> dict[tuple[str, str, str], str]:
    """(suite, scenario, method) -> the digest of the code this checkout would run it with (the engine's
    code_identity), for the cases whose suite and method are registered here; a report's main row per
    case is the configuration of that code (others are labelled, a stale one "(stale)")."""
    from .engine.runner import _kind_file, code_digest
    from .engine.suites import load_suite
    from .kinds import install
    from .plugins import Harness
    harness, kinds, out = Harness(), {}, {}
    install(harness.kinds)
    for suite in sorted({r.suite for r in records}):
        try:
            kinds[suite] = {spec.name: spec.kind for spec in load_suite(harness.suites[suite]).scenarios}
        except Exception:   # an unregistered or changed suite: its cases have no current code here
            kinds[suite] = {}
    for case in sorted({(r.suite, r.scenario, r.method) for r in records}):
        kind = kinds[case[0]].get(case[1])
        if kind is not None and case[2] in harness.methods:
            out[case] = code_digest(harness.methods[case[2]], _kind_file(kind))
    return out


def data_command(args: argparse.Namespace) -> int:
    from .data.fetch import FetchError, check, fetch
    if args.data_command == "fetch":
        if not args.root:
            print("clharness data fetch: give --root DIR (or set CLH_DATA_ROOT)", file=sys.stderr)
            return 2
        try:
            for line in fetch(args.names, Path(args.root), args.base_url):
                print(line)
        except (FetchError, OSError) as exc:
            print(f"clharness data fetch: {exc}", file=sys.stderr)
            return 1
        return 0
    from tabulate import tabulate

    from .plugins import Harness
    harness = Harness(plugins=tuple(args.plugin))
    suite = Path(harness.suites[args.suite]) if args.suite in harness.suites else Path(args.suite)
    if not suite.is_file():
        print(f"clharness data check: unknown suite {args.suite!r}; known: {', '.join(harness.suites)} "
              "(or a path to a .toml suite file)", file=sys.stderr)
        return 2
    rows, ok = check(suite, Path(args.root) if args.root else None, harness)
    print(f"suite {args.suite} ({suite}), data root {args.root or '(none)'}")
    notes: list[str] = []   # long instructions go below the table, so paths and commands stay unwrapped
    for row in rows:
        if not row[2].startswith("clharness ") and len(row[2]) > 40:
            if row[2] not in notes:
                notes.append(row[2])
            row[2] = f"see note {notes.index(row[2]) + 1}"
    print(tabulate(rows, headers=["dataset", "status", "how to get it"], tablefmt="simple"))
    for k, note in enumerate(notes, 1):
        print(f"\n{k}. {note}")
    return 0 if ok else 1


def init_package(args: argparse.Namespace) -> int:
    from .scaffold import ScaffoldError, scaffold
    try:
        root = scaffold(args.name, args.dir, args.clharness,
                        on_source=lambda source: print(f"clharness source: {source.requirement}\n  why: {source.why}"))
    except (ScaffoldError, OSError) as exc:
        print(exc, file=sys.stderr)
        return 2
    print(f"created {root}: cd {root}, install as its README.md says, then python -m pytest")
    return 0


def compare_scorecards(args: argparse.Namespace) -> int:
    from .reporting.compare import compare, load_summary, parse_drops
    from .reporting.report import FORMATS, ReportError
    from .results import StoreError
    try:
        drops = parse_drops(args.max_drop)
        result = compare(load_summary(args.a), load_summary(args.b), drops, alpha=args.alpha,
                         means_only=args.means_only)
    except (ReportError, StoreError, OSError) as exc:
        print(f"clharness compare: {exc}", file=sys.stderr)
        return 2
    print(result.render(FORMATS[args.format]))
    return 1 if result.failed else 0


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0] if text and text.strip() else ""


if __name__ == "__main__":
    sys.exit(main())
