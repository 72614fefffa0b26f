"""``kvproto conform [TARGET ...]``: run the conformance kit (and the type check) against tiers.

With no TARGET it runs against every installed reference tier (the
``kvproto.tiers`` entry points of distributions whose metadata carries the
keyword ``kvproto-reference``: kvproto itself, kvproto-cpu, ...), on embedded
defaults. A TARGET is ``pkg.module:factory`` or the name of an installed
tier (see ``--list``). Exit code 0 only if every check that is not an
expected failure passed and every type check passed (KIT-11).
"""

from __future__ import annotations

import argparse
import threading
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from kvproto.testing._tier_spec import TierSpec
    from kvproto._cli.mypy_check import TypecheckResult

__all__ = ["add_arguments", "kit_missing", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.splitlines()[0] if __doc__ else None
    parser.add_argument(
        "targets",
        nargs="*",
        metavar="TARGET",
        help="pkg.module:factory or an installed tier name (default: every installed reference tier)",
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
    parser.add_argument(
        "--check",
        action="append",
        metavar="NAME",
        help="run only this kit check (repeatable; e.g. lookup_does_not_block)",
    )


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


def kit_missing(command: str) -> str | None:
    """Why ``kvproto COMMAND`` cannot run: a package the kit needs is not installed; None if all are."""
    import importlib.util

    for name in ("pytest", "hypothesis", "mypy"):
        if importlib.util.find_spec(name) is None:
            return f"kvproto {command} needs {name} (the kit runs on pytest, hypothesis and mypy): pip install 'kvproto[kit]'"
    return None


def run(args: argparse.Namespace) -> int:
    missing = kit_missing("conform")
    if missing is not None:
        print(missing)
        return 2
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskID,
        TextColumn,
        TimeElapsedColumn,
    )

    from kvproto.errors import KvprotoError
    from kvproto._cli.reports import render_summary, render_tier, to_json, write_json, write_junit
    from kvproto._cli.runner import CheckOutcome, TierReport, planned_checks, run_kit
    from kvproto._cli.targets import TierUnavailable, reference_tiers, resolve_target
    from kvproto._cli.mypy_check import TypecheckResult

    console = Console()
    if args.list:
        return _list(console)
    profile = "thorough" if args.thorough else (args.profile or "default")
    only: list[str] | None = None
    if args.check:
        only = [c if c.startswith("test_") else f"test_{c}" for c in args.check]
    names: list[str] = list(args.targets) or [ep.name for ep in reference_tiers()]
    if not names:
        console.print("[red]no tiers to check: no target given and no kvproto.tiers entry points installed")
        return 2
    specs: list[TierSpec] = []
    for name in names:
        try:
            specs.append(resolve_target(name))
        except TierUnavailable as exc:
            if args.targets:
                console.print(f"kvproto conform: {exc}", style="red", markup=False, emoji=False, highlight=False)
                return 2
            # Run with no target: a reference tier whose optional dependency is absent is skipped,
            # said so, and the others still run (e.g. the cpu tier needs torch).
            console.print(
                f"kvproto conform: skipping {exc} (install it to check this tier)",
                style="yellow", markup=False, emoji=False, highlight=False,
            )
        except KvprotoError as exc:
            console.print(f"kvproto conform: {exc}", style="red", markup=False, emoji=False, highlight=False)
            return 2
    if not specs:
        console.print("[red]no tiers to check: every installed reference tier lacks a dependency")
        return 2
    if only is not None:
        known = {p.check for spec in specs for p in planned_checks(spec)}
        unknown = sorted(set(only) - known)
        if unknown:
            console.print(
                f"kvproto conform: no such kit check: {', '.join(unknown)}", style="red", markup=False, emoji=False
            )
            return 2
        specs = [spec for spec in specs if any(p.check in only for p in planned_checks(spec))]
    reports: list[TierReport] = []
    typechecks: dict[str, TypecheckResult | None] = {spec.name: None for spec in specs}
    checker: threading.Thread | None = None
    if not args.no_typecheck:
        # mypy runs in subprocesses, one tier after another, on a thread of its own, so the type
        # checks overlap the kit's runs (a cold mypy cache over a torch-based tier takes a while).
        checker = threading.Thread(target=_typecheck_all, args=(specs, typechecks), daemon=True)
        checker.start()
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[last]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        for spec in specs:
            planned = planned_checks(spec)
            if only is not None:
                planned = [p for p in planned if p.check in only]
            task = progress.add_task(spec.name, total=len(planned), last="")

            def advance(outcome: CheckOutcome, task_id: TaskID = task) -> None:
                label = f"{outcome.check.removeprefix('test_')}: {outcome.outcome}"
                progress.update(task_id, advance=1, last=label)

            here = None if only is None else [p.check for p in planned]
            report = run_kit(spec, profile=profile, on_progress=advance, checks=here)
            verdict = "[green]checks pass" if report.passed else "[red]checks fail"
            progress.update(task, completed=len(planned), last=verdict)
            reports.append(report)
        if checker is not None:
            waiting = progress.add_task("typecheck", total=None, last="strict mypy")
            checker.join()
            progress.update(waiting, total=1, completed=1, last="done")
    for report in reports:
        render_tier(console, report, typechecks.get(report.spec.name))
    render_summary(console, reports, typechecks)
    data = to_json(reports, typechecks, profile=profile)
    if args.json is not None:
        write_json(args.json, data)
    if args.junit is not None:
        write_junit(args.junit, data)
    return 0 if data["passed"] else 1
