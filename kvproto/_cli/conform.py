"""``kvproto conform [TARGET ...]``: run the conformance kit (and the type check) against tiers.

With no TARGET it runs against every installed reference tier (the
``kvproto.tiers`` entry points of distributions whose metadata carries the
keyword ``kvproto-reference``: kvproto itself, kvproto-cpu, ...), on embedded
defaults. A TARGET is ``pkg.module:factory`` or the name of an installed
tier (see ``--list``). Exit code 0 only if every check that is not an
expected failure passed and every type check passed; 2 for a usage error
(a target that cannot be resolved or imported, a report path that cannot be
written, an unknown check or clause), said in one line before any check runs;
130 when interrupted (KIT-11). ``--clause ID`` runs only the checks of a clause
(KIT-11). Each tier's report says what share of the tier's own code the checks ran and names
each function of it that never ran, as not checked (KIT-24; ``--no-coverage``, ``--cover
PACKAGE``). ``--explain CHECK`` says what a check does, where the kit defines it,
the signature of each hook it needs, and how to run it in the author's own
pytest (KIT-16); ``--hooks`` lists every hook the kit can use (KIT-5).
"""

from __future__ import annotations

import argparse
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

    from kvproto._cli.mypy_check import TypecheckResult
    from kvproto._cli.runner import CheckOutcome, TierReport
    from kvproto.testing._harness.tier_spec import TierSpec

__all__ = ["add_arguments", "have_kit", "kit_missing", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.splitlines()[0] if __doc__ else None
    parser.add_argument(
        "targets",
        nargs="*",
        metavar="TARGET",
        help="pkg.module:factory or an installed tier name (default: every installed reference tier)",
    )
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an argument for each target's factory, repeatable: for a kvproto tier VALUE is text converted by the "
        "factory's annotations (values may contain ':' and '='); for an ENGINE:MODULE:CLASS target (vllm:..., "
        "lmcache:...) VALUE is JSON, else a string",
    )
    parser.add_argument("--list", action="store_true", help="list the installed tiers and exit")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write a JSON report")
    parser.add_argument("--junit", type=Path, metavar="PATH", help="write a JUnit XML report")
    parser.add_argument(
        "--profile",
        choices=("fast", "default", "thorough"),
        default=None,
        help="how hard the Hypothesis-driven checks search (default: default)",
    )
    parser.add_argument("--thorough", action="store_true", help="same as --profile thorough")
    parser.add_argument("--no-typecheck", action="store_true", help="skip the strict mypy type check")
    _add_coverage_arguments(parser)
    parser.add_argument(
        "--check",
        action="append",
        metavar="NAME",
        help="run only this kit check (repeatable; e.g. lookup_does_not_block)",
    )
    parser.add_argument(
        "--clause",
        action="append",
        metavar="ID",
        help="run only the checks of this clause (repeatable, or comma-separated; e.g. TIER-26)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        metavar="N",
        help="seed Hypothesis with N (a run with a seed repeats exactly; the report names the seed of each run)",
    )
    parser.add_argument(
        "-x", "--failfast", action="store_true", help="stop at the first check that fails (the rest are not run)"
    )
    parser.add_argument(
        "-k",
        dest="keyword",
        metavar="EXPR",
        help="run only the checks whose names match EXPR (pytest -k syntax, e.g. 'lookup and not many')",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="run the selected checks N times over in one session; a check whose verdict differs between "
        "runs is an error (KIT-19: the same verdict every run)",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="show each failure's details and traceback under its table"
    )
    parser.add_argument(
        "--explain",
        metavar="CHECK",
        help="say what a kit check does, its clause, where it is defined, what it needs (each hook's "
        "signature), and how to run it in your own pytest",
    )
    parser.add_argument(
        "--hooks",
        action="store_true",
        help="list every backdoor hook the kit can use: its signature and the checks that skip without it",
    )


def _add_coverage_arguments(parser: argparse.ArgumentParser) -> None:
    """``--no-coverage`` and ``--cover PACKAGE``: whether, and which, of the tier's own code is measured (KIT-24)."""
    parser.add_argument(
        "--no-coverage",
        action="store_true",
        help="do not measure which of the tier's own code the checks ran (KIT-24)",
    )
    parser.add_argument(
        "--cover",
        action="append",
        metavar="PACKAGE",
        help="measure this package or module as the tier's own code (repeatable; default: the package of "
        "the tier's class, or an engine target's MODULE)",
    )


#: Exit code of a run interrupted by SIGINT (128 + SIGINT), as shells report it.
EXIT_INTERRUPTED = 130
#: Width of the tables when stdout is not a terminal (a CI log), unless $COLUMNS says otherwise.
LOG_WIDTH = 240


def make_console() -> Console:
    """A console for stdout; when stdout is not a terminal, wide enough that check names and
    clauses are never cut (Rich would otherwise assume 80 columns)."""
    from rich.console import Console

    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=LOG_WIDTH)
    return console


def say(console: Console, message: str, *, style: str = "red") -> None:
    """``kvproto conform: MESSAGE`` on one line, whatever the console's width."""
    first = message.strip().splitlines()[0] if message.strip() else message
    console.print(
        f"kvproto conform: {first}", style=style, markup=False, emoji=False, highlight=False, soft_wrap=True
    )


def unwritable(path: Path) -> str | None:
    """Why a report cannot be written to ``path``, tried before any check runs; None if it can."""
    if path.is_dir():
        return f"cannot write a report to {path}: it is a directory"
    existed = path.exists()
    try:
        with path.open("a", encoding="utf-8"):
            pass
    except OSError as exc:
        return f"cannot write a report to {path}: {exc.strerror or exc}"
    if not existed:
        path.unlink(missing_ok=True)
    return None


def _list(console: Console) -> int:
    from rich.table import Table

    from kvproto._cli.targets import installed_tiers, is_reference

    table = Table(title="installed tiers (entry-point group kvproto.tiers)", title_justify="left")
    for column in ("name", "target", "distribution", "reference"):
        table.add_column(column)
    for ep in installed_tiers():
        dist = ep.dist.name if ep.dist is not None else "?"
        table.add_row(ep.name, ep.value, dist, "yes" if is_reference(ep) else "")
    console.print(table)
    return 0


def _typecheck_all(specs: list[TierSpec], into: dict[str, TypecheckResult | None]) -> None:
    """Type-check each spec's class in turn (KIT-12); a tier that cannot be built is a problem."""
    from kvproto._cli.mypy_check import TypecheckResult, start_typecheck

    for spec in specs:
        try:
            cls = spec.resolved_class()
        except Exception as exc:  # reported as the tier's type-check problem, not raised
            failed = TypecheckResult(spec.name, spec.kind)
            failed.problems.append(f"could not build the tier to find its class: {type(exc).__name__}: {exc}")
            into[spec.name] = failed
            continue
        into[spec.name] = start_typecheck(cls, protocol=spec.kind, label=spec.name).wait()


def have_kit(command: str) -> bool:
    """Whether the packages the kit needs are installed; if not, prints why ``kvproto COMMAND`` cannot run."""
    missing = kit_missing(command)
    if missing is not None:
        print(missing)
    return missing is None


def kit_missing(command: str) -> str | None:
    """Why ``kvproto COMMAND`` cannot run: a package the kit needs is not installed; None if all are."""
    import importlib.util

    for name in ("pytest", "hypothesis", "mypy"):
        if importlib.util.find_spec(name) is None:
            return f"kvproto {command} needs {name} (the kit runs on pytest, hypothesis and mypy): pip install 'kvproto[kit]'"
    return None


def _explain(console: Console, args: argparse.Namespace, specs: list[TierSpec]) -> int:
    """``--explain CHECK``: print what the check does and how to run it in the author's pytest."""
    from kvproto._cli.explain import explain, find_check, known_checks
    from kvproto.errors import KvprotoError

    check: str = args.explain
    targets: list[tuple[str | None, TierSpec | None]] = (
        [(t, spec) for t, spec in zip(args.targets, specs, strict=True)] or [(None, None)]
    )
    for _, spec in targets:
        kind = None if spec is None else spec.kind
        if not find_check(check, kind):
            import difflib

            known = known_checks(kind)
            close = difflib.get_close_matches(check if check.startswith("test_") else f"test_{check}", known, n=1)
            where = "" if spec is None else f" for a {spec.kind} tier"
            hint = f"did you mean {close[0]}?" if close else f"known: {', '.join(known)}"
            say(console, f"no such kit check{where}: {check} ({hint})")
            return 2
    for target, spec in targets:
        try:
            text = explain(check, target, spec)
        except KvprotoError as exc:
            say(console, str(exc))
            return 2
        print(text)
    return 0


def run(args: argparse.Namespace) -> int:
    if not have_kit("conform"):
        return 2
    console = make_console()
    try:
        return _run(console, args)
    except KeyboardInterrupt as stop:
        from kvproto._cli.runner import Interrupted

        done = ""
        if isinstance(stop, Interrupted):
            report = stop.report
            ran = sum(1 for o in report.outcomes if o.outcome != "not run")
            done = f" while checking {report.spec.name} ({ran} of {len(report.outcomes)} checks had run)"
        say(console, f"interrupted{done}; no verdict and no report written", style="yellow")
        return EXIT_INTERRUPTED


class _UsageError(Exception):
    """A usage error found before any check runs: one line, exit 2 (KIT-11)."""


def _run(console: Console, args: argparse.Namespace) -> int:
    """The whole of ``kvproto conform`` but the handling of SIGINT (KIT-11)."""
    if args.list:
        return _list(console)
    if args.hooks:
        from kvproto.testing._hooks import hooks_table

        print(hooks_table(), end="")
        return 0
    try:
        _check_report_paths(args)
        specs = _resolve_specs(console, args)
        if args.explain:
            return _explain(console, args, specs)
        _check_run_options(args, specs)
        specs, chosen = _select(args, specs)
    except _UsageError as exc:
        say(console, str(exc))
        return 2
    profile = "thorough" if args.thorough else (args.profile or "default")
    reports, typechecks = _check_tiers(console, args, specs, chosen, profile)
    return _report(console, args, reports, typechecks, profile)


def _check_report_paths(args: argparse.Namespace) -> None:
    """A ``--json``/``--junit`` path that cannot be written is a usage error before any check (KIT-11)."""
    for path in (args.json, args.junit):
        problem = None if path is None else unwritable(path)
        if problem is not None:
            raise _UsageError(problem)


def _resolve_specs(console: Console, args: argparse.Namespace) -> list[TierSpec]:
    """The TierSpec of each TARGET, or of every installed reference tier with no TARGET (one whose
    optional dependency is missing is skipped, said so) (KIT-9)."""
    from kvproto._cli.targets import TierUnavailable, is_engine_target, parse_options, reference_tiers, resolve_target
    from kvproto.errors import KvprotoError

    names: list[str] = list(args.targets) or ([] if args.explain else [ep.name for ep in reference_tiers()])
    if not names and not args.explain:
        raise _UsageError("no tiers to check: no target given and no kvproto.tiers entry points installed")
    specs: list[TierSpec] = []
    for name in names:
        try:
            # An engine's class reads JSON values; a kvproto tier's factory types text by its annotations.
            options = parse_options(args.option, json_values=is_engine_target(name))
            specs.append(resolve_target(name, options))
        except TierUnavailable as exc:
            if args.targets:
                raise _UsageError(str(exc)) from exc
            # Run with no target: a reference tier whose optional dependency is absent is skipped,
            # said so, and the others still run (e.g. the cpu tier needs torch).
            say(console, f"skipping {exc} (install it to check this tier)", style="yellow")
        except KvprotoError as exc:
            raise _UsageError(str(exc)) from exc
    return specs


def _check_run_options(args: argparse.Namespace, specs: list[TierSpec]) -> None:
    """``--repeat`` at least 1, some tier to check, and every spec's ``expected_failures`` naming
    kit checks (KIT-18, KIT-19)."""
    from kvproto._cli.runner import expected_failures_problem

    if args.repeat < 1:
        raise _UsageError(f"--repeat must be at least 1, got {args.repeat}")
    if not specs:
        raise _UsageError("no tiers to check: every installed reference tier lacks a dependency")
    for spec in specs:
        problem = expected_failures_problem(spec)
        if problem is not None:
            raise _UsageError(problem)


def _clauses(args: argparse.Namespace) -> list[str] | None:
    """The clauses ``--clause`` names (repeatable, comma-separated), upper-cased; None without it."""
    if not args.clause:
        return None
    return [c.strip().upper() for text in args.clause for c in text.split(",") if c.strip()]


def _select(
    args: argparse.Namespace, specs: list[TierSpec]
) -> tuple[list[TierSpec], dict[str, list[str]] | None]:
    """The tiers to check and, with ``--check`` or ``--clause``, the checks of each (by spec name;
    None: every check): those ``--check`` names that verify a clause ``--clause`` names. An unknown
    check or clause is a usage error naming the known ones; a tier none of whose checks is selected
    is left out (KIT-11, KIT-18)."""
    from kvproto._cli.explain import known_clauses
    from kvproto._cli.runner import planned_checks

    only: list[str] | None = None
    if args.check:
        only = [c if c.startswith("test_") else f"test_{c}" for c in args.check]
        unknown = sorted(set(only) - {p.check for spec in specs for p in planned_checks(spec)})
        if unknown:
            raise _UsageError(f"no such kit check: {', '.join(unknown)}")
    clauses = _clauses(args)
    if clauses is not None:
        known = known_clauses(None)
        unknown = [c for c in dict.fromkeys(clauses) if c not in known]
        if unknown or not clauses:
            raise _UsageError(f"no kit check verifies clause {', '.join(unknown) or '(none given)'}; known: {', '.join(known)}")
    if only is None and clauses is None:
        return specs, None
    chosen = {
        spec.name: [
            p.check
            for p in planned_checks(spec)
            if (only is None or p.check in only) and (clauses is None or p.clause in clauses)
        ]
        for spec in specs
    }
    kept = [spec for spec in specs if chosen[spec.name]]
    if not kept:
        said = f"clause {', '.join(clauses)}" if clauses is not None else "them"
        raise _UsageError(f"no check selected: no kit check of the tiers given verifies {said}")
    return kept, chosen


def _check_tiers(
    console: Console,
    args: argparse.Namespace,
    specs: list[TierSpec],
    chosen: dict[str, list[str]] | None,
    profile: str,
) -> tuple[list[TierReport], dict[str, TypecheckResult | None]]:
    """Run the kit against each tier in turn, with a progress line each, while strict mypy checks
    them on a thread of its own (KIT-11, KIT-12); ``-x`` stops at the first tier that fails."""
    from kvproto._cli.progress import progress_display

    reports: list[TierReport] = []
    typechecks: dict[str, TypecheckResult | None] = {spec.name: None for spec in specs}
    checker: threading.Thread | None = None
    if not args.no_typecheck:
        # mypy runs in subprocesses, one tier after another, on a thread of its own, so the type
        # checks overlap the kit's runs (a cold mypy cache over a torch-based tier takes a while).
        checker = threading.Thread(target=_typecheck_all, args=(specs, typechecks), daemon=True)
        checker.start()
    with progress_display(console, "[bold]{task.description}", "failed", "last", count=True) as progress:
        for spec in specs:
            report = _check_tier(progress, args, spec, None if chosen is None else chosen[spec.name], profile)
            reports.append(report)
            if args.failfast and not report.passed:
                break  # -x: the first failing check ends the run, later tiers included
        if checker is not None:
            waiting = progress.add_task("typecheck", total=None, last="strict mypy", failed="")
            checker.join()
            progress.update(waiting, total=1, completed=1, last="done")
    return reports, typechecks


def _check_tier(
    progress: Progress, args: argparse.Namespace, spec: TierSpec, checks: list[str] | None, profile: str
) -> TierReport:
    """The kit's run against one tier (only ``checks``, if given), its progress line counting the
    checks done and failed, and its verdict at the end (KIT-11)."""
    from kvproto._cli.runner import planned_checks, run_kit
    from kvproto._cli.targets import is_engine_target
    from kvproto.testing._harness.tier_coverage import engine_code

    planned = len(planned_checks(spec)) if checks is None else len(checks)
    task = progress.add_task(spec.name, total=planned * args.repeat, last="", failed="")
    failed = [0]

    def advance(outcome: CheckOutcome) -> None:
        if not outcome.ok:
            failed[0] += 1
        label = f"{outcome.check.removeprefix('test_')}: {outcome.outcome}"
        shown = f"[red]{failed[0]} failed" if failed[0] else ""
        progress.update(task, advance=1, last=label, failed=shown)

    report = run_kit(
        spec,
        profile=profile,
        on_progress=advance,
        checks=checks,
        seed=args.seed,
        failfast=args.failfast,
        keyword=args.keyword,
        repeat=args.repeat,
        coverage=not args.no_coverage,
        cover=args.cover or (engine_code(spec.name) if is_engine_target(spec.name) else None),
    )
    bad = sum(1 for o in report.outcomes if not o.ok)
    total = len(report.outcomes)
    if report.error:
        verdict = "[red]the kit could not run"
    elif bad:
        verdict = f"[red]{bad} of {total} checks failed"
    else:
        verdict = f"[green]none of {total} checks failed"
    progress.update(task, total=total, completed=total, last=verdict, failed="")
    return report


def _report(
    console: Console,
    args: argparse.Namespace,
    reports: list[TierReport],
    typechecks: dict[str, TypecheckResult | None],
    profile: str,
) -> int:
    """The tables, the summary, the ``--json``/``--junit`` reports, and the exit code (KIT-11)."""
    from kvproto._cli.reports import render_summary, render_tier, to_json, write_json, write_junit

    for report in reports:
        render_tier(console, report, typechecks.get(report.spec.name), verbose=args.verbose)
    render_summary(console, reports, typechecks)
    data = to_json(reports, typechecks, profile=profile)
    if args.json is not None:
        write_json(args.json, data)
    if args.junit is not None:
        write_junit(args.junit, data)
    return 0 if data["passed"] else 1
