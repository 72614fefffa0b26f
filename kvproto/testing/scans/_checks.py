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

import itertools
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

from hypothesis import settings

from kvproto import scan
from kvproto._results import LookupResult, unreachable
from kvproto.scan import Decision, Defer, Hits
from kvproto.testing.scans import _reference as ref
from kvproto.testing.scans._inputs import ANSWERS, LEGACY_ANSWER, PrefixScan, WindowScan
from kvproto.testing.scans._properties import Property, scan_properties

__all__ = [
    "COUNTEREXAMPLES",
    "CROSSHAIR_ITERATIONS",
    "CROSSHAIR_TARGETS",
    "Check",
    "CheckResult",
    "Counterexample",
    "crosshair_available",
    "crosshair_check",
    "crosshair_diff",
    "crosshair_diff_check",
    "exhaustive_prefix",
    "exhaustive_window",
    "legacy_conflation",
    "run_checks",
    "run_property",
    "show_decision",
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
    #: The first inputs on which the scan and the reference differ (exhaustive checks).
    counterexamples: tuple[Counterexample, ...] = ()
    #: Reports expected differences and never fails (:func:`legacy_conflation`).
    informational: bool = False

    def to_json(self) -> dict[str, object]:
        return {
            "check": self.check,
            "clauses": self.clauses,
            "explored": self.explored,
            "unit": self.unit,
            "passed": self.passed,
            "informational": self.informational,
            "seconds": round(self.seconds, 3),
            "detail": self.detail,
            "counterexamples": [c.to_json() for c in self.counterexamples],
        }


@dataclass(frozen=True, slots=True)
class Check:
    """A named check, run by calling ``run``."""

    name: str
    kind: str  # "crosshair", "exhaustive" or "property"
    run: Callable[[], CheckResult]


# --------------------------------------------------------------------------- CrossHair


def crosshair_available() -> bool:
    """Whether CrossHair (``crosshair-tool``, the ``kvproto[verify]`` extra) is installed here."""
    import importlib.util

    return importlib.util.find_spec("crosshair") is not None


def _crosshair(
    args: Sequence[str], iterations: int, env: Mapping[str, str] | None = None
) -> tuple[int, str, str, float]:
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
    # ``env`` adds variables for the entry points (the third-party scan under test).
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            command,
            env=full_env,
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
    fn1: str,
    fn2: str,
    *,
    name: str,
    clauses: str,
    iterations: int = CROSSHAIR_ITERATIONS,
    env: Mapping[str, str] | None = None,
) -> CheckResult:
    """``crosshair diffbehavior fn1 fn2``; passes if it finds no difference.

    ``detail`` holds CrossHair's report of the differences it found. ``env``
    adds environment variables to the CrossHair process.
    """
    rc, out, err, seconds = _crosshair(["diffbehavior", fn1, fn2], iterations, env)
    passed = rc == 0 and "No differences found" in out
    detail = out.strip() if rc == 1 else ("" if passed else (err.strip()[-2000:] or f"exit status {rc}"))
    return CheckResult(name, clauses, _paths(err), "paths", passed, seconds, detail)


# --------------------------------------------------------------------------- exhaustive

MEMBERS: tuple[LookupResult, ...] = ANSWERS
#: Initial windows of the exhaustive check, as offsets from the window (None: no initial window).
INITIAL_OFFSETS: tuple[int | None, ...] = (None, 0, 1, 2)
#: How many counterexamples an exhaustive check reports before it stops.
COUNTEREXAMPLES = 5

#: A run of a scan: its decision (or what it raised) and the positions it looked up.
_Outcome: TypeAlias = tuple[Decision | Exception, tuple[int, ...]]


def show_decision(decision: Decision) -> str:
    """``Hits(3)`` or ``Defer(RETRY)``: a decision as counterexamples print it."""
    match decision:
        case Hits(count=count):
            return f"Hits({count})"
        case Defer(cause=cause):
            return f"Defer({cause.name})"
        case _:
            unreachable(decision, where="show_decision(decision)")


def _show_outcome(outcome: Decision | Exception, show: Callable[[Decision], str]) -> str:
    if isinstance(outcome, Exception):
        return f"raised {type(outcome).__name__}: {outcome}"
    return show(outcome)


def _show_run(answer: str, calls: Sequence[int]) -> str:
    """``looked up #0 #1, answered Hits(1)``: a run as counterexamples print it."""
    looked_up = "looked up nothing" if not calls else "looked up " + " ".join(f"#{p}" for p in calls)
    verb = "" if answer.startswith("raised ") else "answered "
    return f"{looked_up}, {verb}{answer}"


@dataclass(frozen=True, slots=True)
class Counterexample:
    """One input on which a scan and the reference differ, with both answers and lookup calls.

    ``scan`` and ``reference`` are printed decisions (``Hits(3)``, ``Defer(RETRY)``;
    ``3`` or ``None`` for a scan that returns the legacy ``int | None``) or
    ``raised Error: message``. ``calls`` are the positions looked up, in call order.
    ``window`` is None for the prefix scan. ``legacy_answers``: the scan's lookup
    answered ``bool | None`` (HIT True, MISS False, HIT_PENDING and RETRY None).
    """

    clause: str
    answers: tuple[LookupResult, ...]
    window: int | None
    initial_window: int | None
    scan: str
    scan_calls: tuple[int, ...]
    reference: str
    reference_calls: tuple[int, ...]
    legacy_answers: bool = False

    def describe(self) -> str:
        """One line: the clause, the input, the scan's answer and the reference's."""
        answers = "[" + ", ".join(a.name for a in self.answers) + "]"
        if self.legacy_answers:
            answers += " (lookup said [" + ", ".join(repr(LEGACY_ANSWER[a]) for a in self.answers) + "])"
        where = "" if self.window is None else f", window={self.window}, initial_window={self.initial_window}"
        return (
            f"{self.clause}: answers {answers}{where}: "
            f"scan {_show_run(self.scan, self.scan_calls)}; "
            f"reference {_show_run(self.reference, self.reference_calls)}"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "clause": self.clause,
            "answers": [a.name for a in self.answers],
            "lookup_said": [LEGACY_ANSWER[a] for a in self.answers] if self.legacy_answers else None,
            "window": self.window,
            "initial_window": self.initial_window,
            "scan": self.scan,
            "scan_calls": list(self.scan_calls),
            "reference": self.reference,
            "reference_calls": list(self.reference_calls),
        }


def _sequences(max_len: int, members: Sequence[LookupResult] = MEMBERS) -> Iterator[tuple[LookupResult, ...]]:
    for n in range(max_len + 1):
        yield from itertools.product(members, repeat=n)


def _caught_prefix(prefix_scan: PrefixScan, answers: Sequence[LookupResult]) -> _Outcome:
    calls: list[int] = []

    def lookup(position: int) -> LookupResult:
        calls.append(position)
        return answers[position]

    try:
        return prefix_scan(lookup, range(len(answers))), tuple(calls)
    except Exception as exc:  # a scan under test that raises: a counterexample, not a crash
        return exc, tuple(calls)


def _caught_window(
    window_scan: WindowScan, answers: Sequence[LookupResult], window: int, initial: int | None
) -> _Outcome:
    calls: list[int] = []

    def lookup(position: int) -> LookupResult:
        calls.append(position)
        return answers[position]

    try:
        return window_scan(lookup, range(len(answers)), window, initial_window=initial), tuple(calls)
    except Exception as exc:  # a scan under test that raises: a counterexample, not a crash
        return exc, tuple(calls)


def _prefix_clause(got: _Outcome, want: _Outcome) -> str:
    """The clause a differing prefix run breaks: calls (SCAN-2), deferral (SCAN-3), count (SCAN-1)."""
    decision, _ = got
    if isinstance(decision, Exception):
        return "SCAN-1..3"
    if got[1] != want[1]:
        return "SCAN-2"
    if isinstance(decision, Defer) or isinstance(want[0], Defer):
        return "SCAN-3"
    return "SCAN-1"


def _window_clause(
    got: _Outcome, want: _Outcome, without_initial: Callable[[], _Outcome], initial: int | None
) -> str:
    """The clause a differing window run breaks: the initial window ignored (SCAN-7), the
    deferral (SCAN-8), the calls or the numeric answer (SCAN-5)."""
    decision, _ = got
    if isinstance(decision, Exception):
        return "SCAN-5..8"
    if initial is not None and got == without_initial():
        return "SCAN-7"
    if got[1] == want[1] and (isinstance(decision, Defer) or isinstance(want[0], Defer)):
        return "SCAN-8"
    return "SCAN-5"


def exhaustive_prefix(
    prefix_scan: PrefixScan = scan.maximal_prefix_lookup,
    *,
    max_len: int = 7,
    members: Sequence[LookupResult] = MEMBERS,
    counterexamples: int = COUNTEREXAMPLES,
    show: Callable[[Decision], str] = show_decision,
    legacy_answers: bool = False,
) -> CheckResult:
    """Every sequence of ``members`` up to ``max_len``: ``prefix_scan`` equals the reference,
    calls included. Stops at the ``counterexamples``-th difference; each one names its clause.

    ``show`` prints decisions in counterexamples; ``legacy_answers`` marks that the scan's
    lookup answered ``bool | None`` (for the printout only).
    """
    name = f"exhaustive prefix (len <= {max_len})"
    start = time.perf_counter()
    count = 0
    found: list[Counterexample] = []
    for answers in _sequences(max_len, members):
        count += 1
        got = _caught_prefix(prefix_scan, answers)
        want = _caught_prefix(ref.maximal_prefix_lookup, answers)
        if got != want:
            found.append(_counterexample(_prefix_clause(got, want), answers, None, None, got, want, show, legacy_answers))
            if len(found) >= counterexamples:
                break
    return _exhaustive_result(name, "SCAN-1..3", count, "sequences", found, start)


def exhaustive_window(
    window_scan: WindowScan = scan.sliding_window_lookup,
    *,
    max_len: int = 7,
    windows: Sequence[int] = (1, 2, 3, 4),
    members: Sequence[LookupResult] = MEMBERS,
    counterexamples: int = COUNTEREXAMPLES,
    show: Callable[[Decision], str] = show_decision,
    legacy_answers: bool = False,
) -> CheckResult:
    """Every sequence of ``members`` up to ``max_len``, window and initial window: equal to the
    reference, calls included. Stops at the ``counterexamples``-th difference; each one names its clause."""
    name = f"exhaustive window (len <= {max_len}, w {min(windows)}..{max(windows)})"
    start = time.perf_counter()
    count = 0
    found: list[Counterexample] = []
    for answers in _sequences(max_len, members):
        for window in windows:
            for offset in INITIAL_OFFSETS:
                initial = None if offset is None else window + offset
                count += 1
                got = _caught_window(window_scan, answers, window, initial)
                want = _caught_window(ref.sliding_window_lookup, answers, window, initial)
                if got != want:

                    def without_initial(a: tuple[LookupResult, ...] = answers, w: int = window) -> _Outcome:
                        return _caught_window(ref.sliding_window_lookup, a, w, None)

                    clause = _window_clause(got, want, without_initial, initial)
                    found.append(_counterexample(clause, answers, window, initial, got, want, show, legacy_answers))
                    if len(found) >= counterexamples:
                        return _exhaustive_result(name, "SCAN-5..8", count, "runs", found, start)
    return _exhaustive_result(name, "SCAN-5..8", count, "runs", found, start)


def _counterexample(
    clause: str,
    answers: tuple[LookupResult, ...],
    window: int | None,
    initial: int | None,
    got: _Outcome,
    want: _Outcome,
    show: Callable[[Decision], str],
    legacy_answers: bool,
) -> Counterexample:
    return Counterexample(
        clause, answers, window, initial,
        _show_outcome(got[0], show), got[1], _show_outcome(want[0], show), want[1], legacy_answers,
    )


def _exhaustive_result(
    name: str, clauses: str, count: int, unit: str, found: Sequence[Counterexample], start: float
) -> CheckResult:
    detail = "\n".join(c.describe() for c in found)
    if found:
        detail += f"\n(stopped after {len(found)} counterexample{'s' if len(found) > 1 else ''})"
    return CheckResult(
        name, clauses, count, unit, not found, time.perf_counter() - start, detail, tuple(found)
    )


def legacy_conflation(
    kind: str,
    legacy_scan: PrefixScan | WindowScan,
    *,
    max_len: int = 7,
    windows: Sequence[int] = (1, 2, 3, 4),
    counterexamples: int = COUNTEREXAMPLES,
    show: Callable[[Decision], str] = show_decision,
) -> CheckResult:
    """The expected differences of a scan over ``bool | None`` lookups (SCAN-12), for information.

    Runs ``legacy_scan`` (``kind`` "prefix" or "window") on every sequence up to
    ``max_len`` that holds a HIT_PENDING (its lookup says None there, as for
    RETRY) and counts the runs where it answers unlike the reference, which sees
    HIT_PENDING. Never fails: a legacy scan cannot tell HIT_PENDING from RETRY,
    so these differences are the price of the old shape, not a bug. Answers are
    compared as ``show`` prints them (``as_legacy`` for a scan that returns
    ``int | None``), calls included. The result keeps the first ``counterexamples``.
    """
    name = f"bool | None conflation: {kind} (len <= {max_len})"
    start = time.perf_counter()
    runs = 0
    # Examples of the differences that matter most first: the reference loads blocks where the
    # scan does not; then other differences in the decision; then in the lookups only.
    buckets: tuple[list[Counterexample], ...] = ([], [], [])
    counts = [0, 0]
    for answers in _sequences(max_len):
        if LookupResult.HIT_PENDING not in answers:
            continue
        configs: Sequence[tuple[int | None, int | None]] = (
            [(None, None)] if kind == "prefix"
            else [(w, None if o is None else w + o) for w in windows for o in INITIAL_OFFSETS]
        )
        for window, initial in configs:
            runs += 1
            if window is None:
                got = _caught_prefix(legacy_scan, answers)
                want = _caught_prefix(ref.maximal_prefix_lookup, answers)
            else:
                got = _caught_window(legacy_scan, answers, window, initial)
                want = _caught_window(ref.sliding_window_lookup, answers, window, initial)
            # Compared as printed: a scan that returns int | None cannot name a cause.
            decision_differs = _show_outcome(got[0], show) != _show_outcome(want[0], show)
            if not decision_differs and got[1] == want[1]:
                continue
            counts[0 if decision_differs else 1] += 1
            loads = isinstance(want[0], Hits) and want[0].count > 0
            bucket = buckets[0 if decision_differs and loads else 1 if decision_differs else 2]
            if len(bucket) < counterexamples:
                bucket.append(_counterexample("SCAN-12", answers, window, initial, got, want, show, True))
    found = (buckets[0] + buckets[1] + buckets[2])[:counterexamples]
    detail = (
        f"{sum(counts):,} of the {runs:,} runs with a HIT_PENDING among the answers differ from "
        f"kvproto's scan ({counts[0]:,} in the decision, {counts[1]:,} in the lookups only): "
        "expected, the lookup said None for HIT_PENDING as for RETRY (SCAN-12)"
    )
    return CheckResult(
        name, "SCAN-12", runs, "runs", True, time.perf_counter() - start, detail, tuple(found),
        informational=True,
    )


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
        # Hypothesis attaches the falsifying example as a note; its explanation (the lines only failing cases ran) follows it: left out.
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
    name: str,
    fn1: str,
    fn2: str,
    *,
    clauses: str,
    iterations: int = CROSSHAIR_ITERATIONS,
    env: Mapping[str, str] | None = None,
) -> Check:
    """The :class:`Check` that runs :func:`crosshair_diff` of ``fn1`` and ``fn2`` under ``name``."""
    return Check(
        name,
        "crosshair",
        lambda: crosshair_diff(fn1, fn2, name=name, clauses=clauses, iterations=iterations, env=env),
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
