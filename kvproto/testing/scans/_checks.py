"""The verification checks of the scans, shared by ``kvproto verify`` and the test suite.

Three kinds of check, each returning a :class:`CheckResult`:

* CrossHair (:func:`crosshair_check`, :func:`crosshair_diff`): ``crosshair
  check`` of the PEP 316 contracts of the reference scans, and
  ``crosshair diffbehavior`` of ``kvproto.scan`` against the reference, over
  0..8 keys and windows up to 4 (the entry points of ``_crosshair_targets``). Bounded by
  ``--max_uninteresting_iterations``, never by wall time, so a run explores
  the same paths on every machine.
* Exhaustive (:func:`exhaustive_prefix`, :func:`exhaustive_window`): every
  sequence of the four answers up to length 7, every window 1..4 and
  initial window (none, w, w+1, w+2), decisions and lookup calls compared
  with the reference.
* Properties (:func:`run_property`): the Hypothesis properties of
  ``scan_properties``, derandomized.

:func:`standard_checks` lists them all with the budgets ``kvproto verify``
and CI use; each entry runs only when called.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from hypothesis import settings

from kvproto import scan
from kvproto._results import LookupResult
from kvproto.testing.scans import _reference as ref
from kvproto.testing.scans._properties import Property, scan_properties
from kvproto.testing.scans._inputs import PrefixScan, WindowScan, answers_of, run_prefix, run_window

__all__ = [
    "CROSSHAIR_ITERATIONS",
    "CROSSHAIR_TARGETS",
    "Check",
    "CheckResult",
    "crosshair_check",
    "crosshair_diff",
    "crosshair_diff_check",
    "exhaustive_prefix",
    "exhaustive_window",
    "run_checks",
    "run_property",
    "standard_checks",
]

#: ``--max_uninteresting_iterations`` of every CrossHair run: a bound on work, not time.
CROSSHAIR_ITERATIONS = 100
#: Safety net only: a CrossHair run that takes longer than this has hung.
_CROSSHAIR_HANG_S = 1200

_PLUGIN = Path(__file__).resolve().with_name("_crosshair_stats.py")
_REFERENCE = "kvproto.testing.scans._reference"
#: The module of the CrossHair entry points (``kvproto_prefix``, ``reference_window``...).
CROSSHAIR_TARGETS = "kvproto.testing.scans._crosshair_targets"
_STATS = re.compile(r"kvproto-crosshair-stats paths=(\d+) exhausted=(\d+)")


@dataclass(frozen=True, slots=True)
class CheckResult:
    """The outcome of one check: what it explored, whether it passed, how long it took."""

    check: str
    clauses: str
    explored: int | None
    unit: str
    passed: bool
    seconds: float
    detail: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "check": self.check,
            "clauses": self.clauses,
            "explored": self.explored,
            "unit": self.unit,
            "passed": self.passed,
            "seconds": round(self.seconds, 3),
            "detail": self.detail,
        }


@dataclass(frozen=True, slots=True)
class Check:
    """A named check, run by calling ``run``."""

    name: str
    kind: str  # "crosshair", "exhaustive" or "property"
    run: Callable[[], CheckResult]


# --------------------------------------------------------------------------- CrossHair


def _crosshair(args: Sequence[str], iterations: int) -> tuple[int, str, str, float]:
    command = [
        sys.executable,
        "-m",
        "crosshair",
        *args,
        "--max_uninteresting_iterations",
        str(iterations),
        # A path that runs this long (CPU seconds) is stuck, not slow; without
        # this, CrossHair would time paths out at `iterations` seconds.
        "--per_path_timeout",
        "60",
        "--extra_plugin",
        str(_PLUGIN),
    ]
    # CrossHair imports its targets by name: whatever this process can import, it can too
    # (kvproto from a wheel or a checkout, a third party's scans, the repo's spec/ mutants).
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            command,
            env=env,
            capture_output=True,
            text=True,
            timeout=_CROSSHAIR_HANG_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        return -1, str(exc.stdout or ""), f"hung for {_CROSSHAIR_HANG_S} s", time.perf_counter() - start
    return proc.returncode, proc.stdout, proc.stderr, time.perf_counter() - start


def _paths(stderr: str) -> int | None:
    found = _STATS.findall(stderr)
    return int(found[-1][0]) if found else None


def crosshair_check(
    targets: Sequence[str], *, name: str, clauses: str, iterations: int = CROSSHAIR_ITERATIONS
) -> CheckResult:
    """``crosshair check`` of the PEP 316 contracts of ``targets``; passes if no counterexample."""
    rc, out, err, seconds = _crosshair(["check", "--analysis_kind", "PEP316", *targets], iterations)
    problems = [line for line in out.splitlines() if ": error:" in line]
    passed = rc == 0 and not problems
    detail = "\n".join(problems) or ("" if passed else (err.strip()[-2000:] or f"exit status {rc}"))
    return CheckResult(name, clauses, _paths(err), "paths", passed, seconds, detail)


def crosshair_diff(
    fn1: str, fn2: str, *, name: str, clauses: str, iterations: int = CROSSHAIR_ITERATIONS
) -> CheckResult:
    """``crosshair diffbehavior fn1 fn2``; passes if it finds no difference.

    ``detail`` holds CrossHair's report of the differences it found.
    """
    rc, out, err, seconds = _crosshair(["diffbehavior", fn1, fn2], iterations)
    passed = rc == 0 and "No differences found" in out
    detail = out.strip() if rc == 1 else ("" if passed else (err.strip()[-2000:] or f"exit status {rc}"))
    return CheckResult(name, clauses, _paths(err), "paths", passed, seconds, detail)


# --------------------------------------------------------------------------- exhaustive

MEMBERS: tuple[LookupResult, ...] = tuple(LookupResult)
#: Initial windows of the exhaustive check, as offsets from the window (None: no initial window).
INITIAL_OFFSETS: tuple[int | None, ...] = (None, 0, 1, 2)


def _sequences(max_len: int) -> Iterator[tuple[LookupResult, ...]]:
    for n in range(max_len + 1):
        yield from itertools.product(MEMBERS, repeat=n)


def exhaustive_prefix(
    prefix_scan: PrefixScan = scan.maximal_prefix_lookup, *, max_len: int = 7
) -> CheckResult:
    """Every sequence up to ``max_len``: ``prefix_scan`` equals the reference, calls included."""
    name = f"exhaustive prefix (len <= {max_len})"
    start = time.perf_counter()
    count = 0
    for answers in _sequences(max_len):
        count += 1
        got = run_prefix(prefix_scan, answers_of(answers), len(answers))
        want = run_prefix(ref.maximal_prefix_lookup, answers_of(answers), len(answers))
        if got != want:
            detail = f"{list(answers)}: scan {got}, reference {want}"
            return CheckResult(
                name, "SCAN-1..3", count, "sequences", False, time.perf_counter() - start, detail
            )
    return CheckResult(name, "SCAN-1..3", count, "sequences", True, time.perf_counter() - start)


def exhaustive_window(
    window_scan: WindowScan = scan.sliding_window_lookup,
    *,
    max_len: int = 7,
    windows: Sequence[int] = (1, 2, 3, 4),
) -> CheckResult:
    """Every sequence up to ``max_len``, window and initial window: equal to the reference, calls included."""
    name = f"exhaustive window (len <= {max_len}, w {min(windows)}..{max(windows)})"
    start = time.perf_counter()
    count = 0
    for answers in _sequences(max_len):
        answer_of = answers_of(answers)
        n = len(answers)
        for window in windows:
            for offset in INITIAL_OFFSETS:
                initial = None if offset is None else window + offset
                count += 1
                got = run_window(window_scan, answer_of, n, window, initial)
                want = run_window(ref.sliding_window_lookup, answer_of, n, window, initial)
                if got != want:
                    detail = (
                        f"{list(answers)}, window={window}, initial_window={initial}: "
                        f"scan {got}, reference {want}"
                    )
                    return CheckResult(
                        name, "SCAN-5..8", count, "runs", False, time.perf_counter() - start, detail
                    )
    return CheckResult(name, "SCAN-5..8", count, "runs", True, time.perf_counter() - start)


# --------------------------------------------------------------------------- properties


def run_property(prop: Property, *, max_examples: int | None = None) -> CheckResult:
    """Run one property; with ``max_examples``, derandomized with that many examples.

    Without it, the Hypothesis settings in force apply (the test suite's profile).
    """
    test = prop.test
    if max_examples is not None:
        test = settings(
            max_examples=max_examples, derandomize=True, deadline=None, database=None
        )(test)
    before = len(prop.examples)
    start = time.perf_counter()
    passed, detail = True, ""
    try:
        test()
    except Exception as exc:  # a failed property: report it, with its minimal example
        passed, detail = False, f"{type(exc).__name__}: {exc}"
    return CheckResult(
        f"property: {prop.name}", prop.clauses, len(prop.examples) - before, "examples",
        passed, time.perf_counter() - start, detail,
    )


# --------------------------------------------------------------------------- the standard list


def standard_checks(
    *, iterations: int = CROSSHAIR_ITERATIONS, max_examples: int = 2000, exhaustive_len: int = 7
) -> list[Check]:
    """Every check ``kvproto verify`` runs, CrossHair first; nothing runs until called."""
    targets = CROSSHAIR_TARGETS
    checks = [
        Check(
            "crosshair check: reference contracts",
            "crosshair",
            lambda: crosshair_check(
                [f"{_REFERENCE}.check_prefix", f"{_REFERENCE}.check_window"],
                name="crosshair check: reference contracts",
                clauses="SCAN-1..8",
                iterations=iterations,
            ),
        ),
        crosshair_diff_check(
            "crosshair diffbehavior: prefix",
            f"{targets}.kvproto_prefix",
            f"{targets}.reference_prefix",
            clauses="SCAN-1..4",
            iterations=iterations,
        ),
        crosshair_diff_check(
            "crosshair diffbehavior: window",
            f"{targets}.kvproto_window",
            f"{targets}.reference_window",
            clauses="SCAN-4..8, SCAN-10",
            iterations=iterations,
        ),
        Check("exhaustive prefix", "exhaustive", lambda: exhaustive_prefix(max_len=exhaustive_len)),
        Check("exhaustive window", "exhaustive", lambda: exhaustive_window(max_len=exhaustive_len)),
    ]
    checks.extend(
        _property_check(prop, max_examples)
        for prop in scan_properties(scan.maximal_prefix_lookup, scan.sliding_window_lookup)
    )
    return checks


def crosshair_diff_check(
    name: str, fn1: str, fn2: str, *, clauses: str, iterations: int = CROSSHAIR_ITERATIONS
) -> Check:
    """The :class:`Check` that runs :func:`crosshair_diff` of ``fn1`` and ``fn2`` under ``name``."""
    return Check(
        name,
        "crosshair",
        lambda: crosshair_diff(fn1, fn2, name=name, clauses=clauses, iterations=iterations),
    )


def _property_check(prop: Property, max_examples: int) -> Check:
    return Check(
        f"property: {prop.name}", "property", lambda: run_property(prop, max_examples=max_examples)
    )


def run_checks(
    checks: Sequence[Check],
    *,
    on_start: Callable[[Check], None] = lambda check: None,
    on_done: Callable[[Check, CheckResult], None] = lambda check, result: None,
    crosshair_parallel: int = 1,
) -> list[CheckResult]:
    """Run ``checks``; the CrossHair ones in up to ``crosshair_parallel`` subprocesses at
    once, beside the others (which run in this process, one after another).

    Results come back in the order of ``checks``.
    """
    results: dict[int, CheckResult] = {}
    background = [(i, c) for i, c in enumerate(checks) if c.kind == "crosshair"]
    foreground = [(i, c) for i, c in enumerate(checks) if c.kind != "crosshair"]

    def run_one(index: int, check: Check) -> None:
        on_start(check)
        result = check.run()
        results[index] = result
        on_done(check, result)

    # CrossHair runs in subprocesses, so threads here only wait on them.
    with ThreadPoolExecutor(max_workers=max(1, crosshair_parallel)) as pool:
        futures = [pool.submit(run_one, i, c) for i, c in background]
        for i, c in foreground:
            run_one(i, c)
        for future in futures:
            future.result()
    return [results[i] for i in range(len(checks))]
