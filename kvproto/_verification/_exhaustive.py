"""The exhaustive checks of the scans: every sequence of the four answers up to a length, every
window and initial window, compared with the reference scans (SCAN-1..SCAN-12)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Sequence

from kvproto import scan
from kvproto._results import LookupResult
from kvproto._verification import _reference as ref
from kvproto._verification._check_results import CheckResult, Counterexample, Outcome, show_decision, show_outcome
from kvproto._verification._inputs import ANSWERS, PrefixScan, WindowScan, recorded
from kvproto.scan import Decision, Defer, Hits

__all__ = [
    "COUNTEREXAMPLES",
    "INITIAL_OFFSETS",
    "MEMBERS",
    "exhaustive_prefix",
    "exhaustive_window",
    "legacy_conflation",
]

# --------------------------------------------------------------------------- exhaustive

MEMBERS: tuple[LookupResult, ...] = ANSWERS
#: Initial windows of the exhaustive check, as offsets from the window (None: no initial window).
INITIAL_OFFSETS: tuple[int | None, ...] = (None, 0, 1, 2)
#: How many counterexamples an exhaustive check reports before it stops.
COUNTEREXAMPLES = 5


def _sequences(max_len: int, members: Sequence[LookupResult] = MEMBERS) -> Iterator[tuple[LookupResult, ...]]:
    for n in range(max_len + 1):
        yield from itertools.product(members, repeat=n)


def _caught_prefix(prefix_scan: PrefixScan, answers: Sequence[LookupResult]) -> Outcome:
    lookup, calls = recorded(answers.__getitem__)
    try:
        return prefix_scan(lookup, range(len(answers))), tuple(calls)
    except Exception as exc:  # a scan under test that raises: a counterexample, not a crash
        return exc, tuple(calls)


def _caught_window(
    window_scan: WindowScan, answers: Sequence[LookupResult], window: int, initial: int | None
) -> Outcome:
    lookup, calls = recorded(answers.__getitem__)
    try:
        return window_scan(lookup, range(len(answers)), window, initial_window=initial), tuple(calls)
    except Exception as exc:  # a scan under test that raises: a counterexample, not a crash
        return exc, tuple(calls)


def _prefix_clause(got: Outcome, want: Outcome) -> str:
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
    got: Outcome, want: Outcome, without_initial: Callable[[], Outcome], initial: int | None
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

                    def without_initial(a: tuple[LookupResult, ...] = answers, w: int = window) -> Outcome:
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
    got: Outcome,
    want: Outcome,
    show: Callable[[Decision], str],
    legacy_answers: bool,
) -> Counterexample:
    return Counterexample(
        clause, answers, window, initial,
        show_outcome(got[0], show), got[1], show_outcome(want[0], show), want[1], legacy_answers,
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
            decision_differs = show_outcome(got[0], show) != show_outcome(want[0], show)
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
