"""``kvproto verify``: check scans against the specification (SCAN-1..SCAN-12).

With no target it checks ``kvproto.scan``: CrossHair (``check`` of the reference
contracts, ``diffbehavior`` of ``kvproto.scan`` against the reference), the
exhaustive comparison up to length 7 and the Hypothesis properties.

``--prefix pkg.mod:fn`` and/or ``--window pkg.mod:fn`` check an engine's own scans
instead (SCAN-11): the exhaustive comparison, the behaviour properties and CrossHair
``diffbehavior`` of each against kvproto's reference scans; ``--legacy`` feeds them
``bool | None`` lookups (SCAN-12). Shows progress, then a summary table and the first
counterexamples of every failed check. Exit status: 0 if every check that ran passed,
1 if one failed, 2 for a usage error (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvproto._cli.progress import progress_display

if TYPE_CHECKING:
    from kvproto.testing.scans import Check, CheckResult, ScanKind, ScanTarget

__all__ = ["add_arguments", "run", "verify_missing"]

_DESCRIPTION = """\
Check scans against kvproto's reference scans (spec/CONTRACT.md, section SCAN).

Without --prefix/--window: kvproto.scan itself. With them (either or both), your
own scans (SCAN-11), each named pkg.mod:fn (modules in the current directory too):

  prefix: fn(lookup, keys)                                 front to back
  window: fn(lookup, keys, window, *, initial_window=None) back to front

keys is a sequence of opaque bytes keys and the scan calls lookup(key) with one of
them, never with an index. lookup answers a kvproto LookupResult (MISS, HIT,
HIT_PENDING, RETRY). The scan returns kvproto's Hits(n) / Defer(cause), or the
legacy int | None (None defers): detected from its answer to a single HIT key, and
then required of every answer. int | None answers are compared with as_legacy()
of the reference's decision.

Checks: every sequence of answers up to length 7 (--max-len), windows 1..4,
initial windows none, w, w+1, w+2, decisions and lookup calls compared with the
reference; the Hypothesis properties of the scan's behaviour; CrossHair
diffbehavior against the reference over 0..8 keys (skipped, with a note, if
crosshair-tool is not installed, or with --no-crosshair).

--legacy (SCAN-12): lookup answers bool | None, as before LookupResult:
HIT -> True, MISS -> False, HIT_PENDING -> None, RETRY -> None. A None cannot
say which of the two it was, so a correct legacy scan reads it as RETRY (unknown
yet: end the run of hits, defer). It is checked on the answers bool | None can
express (MISS, HIT, RETRY), where it must match the reference exactly. On
inputs holding a HIT_PENDING it necessarily answers like the reference does
with RETRY in its place: those differences (it defers where kvproto's scan
loads, or looks up more keys) are reported as "bool | None conflation", the
expected class of counterexample, and never fail the run.

Exit status: 0 if every check that ran passed, 1 if one failed, 2 for a usage
error (an unimportable or uncallable target, a wrong signature, --legacy without
a target, a missing package)."""

#: What ``kvproto verify`` cannot run without (module name, distribution).
_NEEDS = (("hypothesis", "hypothesis"),)
_CROSSHAIR_MISSING = (
    "crosshair-tool is not installed: the CrossHair checks are skipped, the others run "
    "(pip install 'kvproto[verify]')"
)


#: Why the CrossHair rows of the table were skipped, said in the row (the table is read alone).
_SKIPPED_WITHOUT_CROSSHAIR = "crosshair-tool not installed (pip install 'kvproto[verify]')"


class _UsageError(Exception):
    """A one-line reason ``kvproto verify`` cannot run as asked (exit status 2)."""


def verify_missing() -> str | None:
    """Why ``kvproto verify`` cannot run here (a package it needs is absent), or None.

    CrossHair is optional: without it the CrossHair checks are skipped.
    """
    import importlib.util

    for module, dist in _NEEDS:
        if importlib.util.find_spec(module) is None:
            return f"kvproto verify needs {dist}, which is not installed: pip install 'kvproto[verify]'"
    return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = _DESCRIPTION
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "--prefix", metavar="PKG.MOD:FN", help="verify this prefix scan: fn(lookup, keys)"
    )
    parser.add_argument(
        "--window",
        metavar="PKG.MOD:FN",
        help="verify this window scan: fn(lookup, keys, window, *, initial_window=None)",
    )
    parser.add_argument(
        "--legacy",
        action="store_true",
        help="the scans' lookup answers bool | None (HIT True, MISS False, HIT_PENDING and RETRY None)",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the summary as JSON")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 10 CrossHair iterations, 200 examples, sequences up to length 5",
    )
    parser.add_argument("--no-crosshair", action="store_true", help="skip the CrossHair checks")
    parser.add_argument(
        "--crosshair-iterations",
        type=int,
        metavar="N",
        help="CrossHair --max_uninteresting_iterations (default 100)",
    )
    parser.add_argument(
        "--examples", type=int, metavar="N", help="Hypothesis examples per property (default 2000)"
    )
    parser.add_argument(
        "--max-len", type=int, metavar="N", help="longest sequence of the exhaustive checks (default 7)"
    )
    parser.add_argument(
        "--counterexamples",
        type=int,
        metavar="N",
        help="counterexamples an exhaustive check reports before it stops (default 5)",
    )


def _usage(message: str) -> int:
    Console(stderr=True).print(
        f"kvproto verify: error: {message}", style="red", markup=False, emoji=False,
        highlight=False, soft_wrap=True,
    )
    return 2


def _load(spec: str, kind: ScanKind, legacy: bool) -> ScanTarget:
    """The target ``spec`` names, checked and its shapes detected; a _UsageError says why not."""
    from kvproto._cli.targets import import_target
    from kvproto.errors import ConfigurationError
    from kvproto.testing.scans import scan_target

    module, colon, attr = spec.partition(":")
    if not colon or not module or not attr:
        raise _UsageError(f"--{kind} {spec}: expected pkg.module:function")
    try:
        obj = import_target(spec)
    except ConfigurationError as exc:
        raise _UsageError(str(exc)) from None
    except Exception as exc:  # the module itself fails to import: report it, no traceback
        raise _UsageError(f"{spec}: importing {module!r} raised {type(exc).__name__}: {exc}") from None
    try:
        return scan_target(obj, spec, kind, legacy_answers=legacy)
    except ConfigurationError as exc:
        raise _UsageError(str(exc)) from None


def _positive(value: int | None, flag: str) -> None:
    if value is not None and value < 1:
        raise _UsageError(f"{flag} must be at least 1, got {value}")


def run(args: argparse.Namespace) -> int:
    console = Console()
    missing = verify_missing()
    if missing is not None:
        return _usage(missing)
    try:
        prefix, window = _targets(args)
    except _UsageError as exc:
        return _usage(str(exc))
    plan = _plan(args, prefix, window)
    for note in plan.notes:
        _line(console, note, "yellow")
    for t in (prefix, window):
        if t is not None:
            _line(console, f"{t.kind}: {t.describe()}")
    started = time.perf_counter()
    results = _run_with_progress(console, plan.checks)
    elapsed = time.perf_counter() - started
    _print_table(console, plan, results, elapsed)
    _print_details(console, results)
    passed = all(r.passed for r in results)
    if args.json is not None:
        args.json.write_text(json.dumps(_json_report(plan, results, elapsed, passed, prefix, window), indent=2))
    return 0 if passed else 1


def _targets(args: argparse.Namespace) -> tuple[ScanTarget | None, ScanTarget | None]:
    """The ``--prefix`` and ``--window`` targets, loaded, once the numeric options are checked; a
    _UsageError says what is wrong."""
    if args.legacy and args.prefix is None and args.window is None:
        raise _UsageError("--legacy applies to the scans of --prefix and --window; give one")
    for value, flag in (
        (args.crosshair_iterations, "--crosshair-iterations"),
        (args.examples, "--examples"),
        (args.counterexamples, "--counterexamples"),
    ):
        _positive(value, flag)
    if args.max_len is not None and args.max_len < 0:
        raise _UsageError(f"--max-len must be at least 0, got {args.max_len}")
    prefix = None if args.prefix is None else _load(args.prefix, "prefix", args.legacy)
    window = None if args.window is None else _load(args.window, "window", args.legacy)
    return prefix, window


@dataclass
class _Plan:
    """What a run checks: the checks to run, those left out (``skipped``, ``skip_reason``), the
    settings they run with, the table's title and the notes said first."""

    checks: list[Check]
    skipped: list[str]
    skip_reason: str
    iterations: int
    examples: int
    max_len: int
    title: str
    notes: list[str] = field(default_factory=list)


def _plan(args: argparse.Namespace, prefix: ScanTarget | None, window: ScanTarget | None) -> _Plan:
    """The checks of kvproto.scan (no target) or of the targets, with the settings the options give;
    the CrossHair ones left out with ``--no-crosshair`` or without CrossHair installed (SCAN-12)."""
    from kvproto.testing.scans import (
        COUNTEREXAMPLES,
        CROSSHAIR_ITERATIONS,
        crosshair_available,
        standard_checks,
        target_checks,
    )

    iterations = args.crosshair_iterations or (10 if args.quick else CROSSHAIR_ITERATIONS)
    examples = args.examples or (200 if args.quick else 2000)
    max_len = args.max_len if args.max_len is not None else (5 if args.quick else 7)
    limit = args.counterexamples or COUNTEREXAMPLES
    notes: list[str] = []
    crosshair = not args.no_crosshair
    skip_reason = "--no-crosshair"
    if crosshair and not crosshair_available():
        crosshair = False
        notes.append(_CROSSHAIR_MISSING)
        skip_reason = _SKIPPED_WITHOUT_CROSSHAIR
    if prefix is None and window is None:
        checks = standard_checks(iterations=iterations, max_examples=examples, exhaustive_len=max_len)
        title = "kvproto verify: kvproto.scan"
    else:
        checks = target_checks(
            prefix=prefix, window=window, iterations=iterations, max_examples=examples,
            exhaustive_len=max_len, counterexamples=limit, crosshair=True,
        )
        title = "kvproto verify: " + ", ".join(t.name for t in (prefix, window) if t is not None)
        if args.legacy:
            notes.append(
                "--legacy: lookups answer bool | None (HIT True, MISS False, HIT_PENDING and RETRY None); "
                "checked on MISS/HIT/RETRY answers, None read as RETRY (SCAN-12)"
            )
    skipped = [c.name for c in checks if c.kind == "crosshair" and not crosshair]
    checks = [c for c in checks if c.name not in skipped]
    return _Plan(checks, skipped, skip_reason, iterations, examples, max_len, title, notes)


def _print_table(console: Console, plan: _Plan, results: list[CheckResult], elapsed: float) -> None:
    """One row per check: clauses, how much it explored, its verdict and time; then the skipped ones."""
    table = Table(title=f"{escape(plan.title)} ({elapsed:.0f} s)")
    for column in ("check", "clauses", "explored", "result", "time"):
        table.add_column(column)
    for r in results:
        explored = "?" if r.explored is None else f"{r.explored:,} {r.unit}"
        verdict = "[cyan]info" if r.informational else ("[green]pass" if r.passed else "[red]FAIL")
        table.add_row(escape(r.check), r.clauses, explored, verdict, f"{r.seconds:.1f} s")
    for name in plan.skipped:
        table.add_row(escape(name), "", "", f"[yellow]skipped: {escape(plan.skip_reason)}", "")
    console.print(table)


def _json_report(
    plan: _Plan,
    results: list[CheckResult],
    elapsed: float,
    passed: bool,
    prefix: ScanTarget | None,
    window: ScanTarget | None,
) -> dict[str, object]:
    """The ``--json`` report."""
    return {
        "passed": passed,
        "seconds": round(elapsed, 3),
        "targets": {
            t.kind: {
                "target": t.name,
                "legacy_answers": t.legacy_answers,
                "returns": "int | None" if t.legacy_decisions else "Hits | Defer",
            }
            for t in (prefix, window)
            if t is not None
        },
        "crosshair_iterations": plan.iterations,
        "examples_per_property": plan.examples,
        "max_len": plan.max_len,
        "skipped": plan.skipped,
        "skipped_because": plan.skip_reason if plan.skipped else None,
        "notes": plan.notes,
        "checks": [r.to_json() for r in results],
    }


def _run_with_progress(console: Console, checks: list[Check]) -> list[CheckResult]:
    from kvproto.testing.scans import run_checks

    with progress_display(console, "{task.description}", "status", spinner=True) as progress:
        overall = progress.add_task("kvproto verify", total=len(checks), status="")
        tasks = {
            c.name: progress.add_task(escape(c.name), total=1, start=False, status="waiting")
            for c in checks
        }

        def on_start(check: Check) -> None:
            progress.start_task(tasks[check.name])
            progress.update(tasks[check.name], status="running")

        def on_done(check: Check, result: CheckResult) -> None:
            verdict = "[cyan]info" if result.informational else ("[green]pass" if result.passed else "[red]FAIL")
            progress.update(tasks[check.name], completed=1, status=verdict)
            progress.advance(overall)

        return run_checks(checks, on_start=on_start, on_done=on_done)


def _line(console: Console, text: str, style: str | None = None) -> None:
    """``text`` as is: no markup, no highlighting, never wrapped."""
    console.print(text, style=style, markup=False, highlight=False, soft_wrap=True, emoji=False)


def _print_details(console: Console, results: list[CheckResult]) -> None:
    """The first counterexamples of each failed check; the expected differences after them."""
    for r in results:
        if r.passed:
            continue
        _line(console, f"{r.check} failed; first counterexamples:", "red")
        lines = [c.describe() for c in r.counterexamples] or r.detail.splitlines() or ["(no detail)"]
        for line in lines:
            _line(console, f"  {line}")
    for r in results:
        if r.informational:
            _line(console, f"{r.check}: {r.detail}" + ("; the first of them:" if r.counterexamples else ""), "cyan")
            for c in r.counterexamples:
                _line(console, f"  {c.describe()}")
