"""``kvproto verify [--json PATH] [--quick]``: check the scans against the specification.

Runs the checks of :mod:`kvproto.testing.scans`: CrossHair (``check`` of the reference
contracts, ``diffbehavior`` of ``kvproto.scan`` against the reference), the
exhaustive comparison up to length 7, and the Hypothesis properties. Shows
progress while they run, then a summary table; exits 1 if any check fails.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

__all__ = ["add_arguments", "run", "verify_missing"]

#: What ``kvproto verify`` imports (module name, distribution), checked before anything runs.
_NEEDS = (("hypothesis", "hypothesis"), ("crosshair", "crosshair-tool"))


def verify_missing() -> str | None:
    """Why ``kvproto verify`` cannot run here (a package it needs is absent), or None."""
    import importlib.util

    for module, dist in _NEEDS:
        if importlib.util.find_spec(module) is None:
            return f"kvproto verify needs {dist}, which is not installed: pip install 'kvproto[verify]'"
    return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the summary as JSON")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 10 CrossHair iterations, 200 examples, sequences up to length 5",
    )
    parser.add_argument(
        "--crosshair-iterations",
        type=int,
        metavar="N",
        help="CrossHair --max_uninteresting_iterations (default 100)",
    )
    parser.add_argument(
        "--examples", type=int, metavar="N", help="Hypothesis examples per property (default 2000)"
    )


def run(args: argparse.Namespace) -> int:
    console = Console()
    missing = verify_missing()
    if missing is not None:
        console.print(missing, style="red", markup=False, emoji=False, highlight=False)
        return 2
    from kvproto.testing.scans import CROSSHAIR_ITERATIONS, Check, CheckResult, run_checks, standard_checks

    iterations = args.crosshair_iterations or (10 if args.quick else CROSSHAIR_ITERATIONS)
    examples = args.examples or (200 if args.quick else 2000)
    checks = standard_checks(
        iterations=iterations, max_examples=examples, exhaustive_len=5 if args.quick else 7
    )
    started = time.perf_counter()
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        overall = progress.add_task("kvproto verify", total=len(checks), status="")
        tasks = {c.name: progress.add_task(c.name, total=1, start=False, status="waiting") for c in checks}

        def on_start(check: Check) -> None:
            progress.start_task(tasks[check.name])
            progress.update(tasks[check.name], status="running")

        def on_done(check: Check, result: CheckResult) -> None:
            verdict = "[green]pass" if result.passed else "[red]FAIL"
            progress.update(tasks[check.name], completed=1, status=verdict)
            progress.advance(overall)

        results = run_checks(checks, on_start=on_start, on_done=on_done)
    elapsed = time.perf_counter() - started

    table = Table(title=f"kvproto verify ({elapsed:.0f} s)")
    for column in ("check", "clauses", "explored", "result", "time"):
        table.add_column(column)
    for r in results:
        explored = "?" if r.explored is None else f"{r.explored:,} {r.unit}"
        verdict = "[green]pass" if r.passed else "[red]FAIL"
        table.add_row(r.check, r.clauses, explored, verdict, f"{r.seconds:.1f} s")
    console.print(table)
    for r in results:
        if not r.passed:
            console.print(f"[red]{r.check} failed:[/red]\n{r.detail}", markup=True, highlight=False)
    passed = all(r.passed for r in results)
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "passed": passed,
                    "seconds": round(elapsed, 3),
                    "crosshair_iterations": iterations,
                    "examples_per_property": examples,
                    "checks": [r.to_json() for r in results],
                },
                indent=2,
            )
        )
    return 0 if passed else 1
