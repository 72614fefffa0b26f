"""Deliberately wrong scans, each breaking one clause, to show that the checks can fail.

The test suite runs every check of :mod:`kvproto.testing.scans` against these
(and ``kvproto verify --prefix/--window`` on each, SCAN-11) and asserts that it
reports a failure: a check that passes a wrong scan proves nothing. Each mutant is one plausible mistake, the first one a bug that
shipped in a real engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from kvproto import LookupResult, members as lr, unreachable
from kvproto.scan import Decision, Defer, Hits, sliding_window_lookup

__all__ = ["prefix_stops_at_retry", "window_defers_on_any_pending"]

K = TypeVar("K")


def window_defers_on_any_pending(
    lookup: Callable[[K], LookupResult],
    keys: Sequence[K],
    window: int,
    *,
    initial_window: int | None = None,
) -> Decision:
    """Breaks SCAN-8: a MISS does not clear the pending mark, so a HIT_PENDING
    outside the chosen window still defers it."""
    sliding_window_lookup(lookup, (), window, initial_window=initial_window)  # validates (SCAN-10)
    required = window if initial_window is None else initial_window
    streak = 0
    pending = False
    retried = False
    for idx in range(len(keys) - 1, -1, -1):
        result = lookup(keys[idx])
        match result:
            case lr.HIT | lr.HIT_PENDING:
                streak += 1
                pending = pending or result is lr.HIT_PENDING
                if streak == required:
                    return _decide(idx + streak, retried, pending)
            case lr.MISS:
                streak = 0
                required = window
            case lr.RETRY:
                streak = 0
                pending = False
                retried = True
                required = window
            case _:
                unreachable(result, where=f"sliding_window_lookup: lookup of key #{idx}")
    return _decide(streak, retried, pending)


def prefix_stops_at_retry(lookup: Callable[[K], LookupResult], keys: Iterable[K]) -> Decision:
    """Breaks SCAN-2: stops at the first RETRY, so the tiers never start
    their asynchronous checks for the keys after it."""
    count = 0
    cause: LookupResult | None = None
    for position, key in enumerate(keys):
        result = lookup(key)
        match result:
            case lr.HIT:
                count += 1
            case lr.MISS:
                break
            case lr.HIT_PENDING:
                count += 1
                cause = cause or result
            case lr.RETRY:
                cause = cause or result
                break
            case _:
                unreachable(result, where=f"maximal_prefix_lookup: lookup of key #{position}")
    return Hits(count) if cause is None else Defer(cause)


def _decide(end: int, retried: bool, pending: bool) -> Decision:
    if retried:
        return Defer(lr.RETRY)
    if pending:
        return Defer(lr.HIT_PENDING)
    return Hits(end)
