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
  with the reference. Each difference is a :class:`Counterexample` naming
  the clause it breaks; a check stops at the fifth. For a scan over
  ``bool | None`` lookups, :func:`legacy_conflation` reports (and never
  fails on) the differences that shape cannot avoid (SCAN-12).
* Properties (:func:`run_property`): the Hypothesis properties of
  ``scan_properties``, derandomized.

:func:`standard_checks` lists them all with the budgets ``kvproto verify``
and CI use; each entry runs only when called.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from hypothesis import settings

from kvproto import scan
from kvproto._verification._check_results import Check, CheckResult
from kvproto._verification._crosshair_checks import (
    CROSSHAIR_ITERATIONS,
    CROSSHAIR_TARGETS,
    REFERENCE,
    crosshair_check,
    crosshair_diff_check,
)
from kvproto._verification._exhaustive import exhaustive_prefix, exhaustive_window
from kvproto._verification._properties import Property, scan_properties

__all__ = ["run_checks", "run_property", "standard_checks"]


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
        # Hypothesis attaches the falsifying example as a note; its explanation (the lines only failing
        # cases ran) follows it: left out.
        notes: list[str] = []
        for note in map(str, getattr(exc, "__notes__", ())):
            if note.startswith("Explanation:"):
                break
            notes.append(note)
        passed, detail = False, "\n".join([f"{type(exc).__name__}: {exc}", *notes])
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
                [f"{REFERENCE}.check_prefix", f"{REFERENCE}.check_window"],
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
