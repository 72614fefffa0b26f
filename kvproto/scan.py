"""The scheduler's scans over lookup results (SCAN-1..SCAN-10).

Both scans take the lookup as a callable, so they work over a manager, a
bare tier or a test double alike, and consume every answer with an
exhaustive ``match``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

from kvproto import members as lr
from kvproto._decisions import DEFER_PENDING, DEFER_RETRY, Decision, Defer, Hits, hits_cache, shared_hits
from kvproto._results import LookupResult, unreachable
from kvproto.errors import InvalidArgumentError

__all__ = [
    "Decision",
    "Defer",
    "Hits",
    "as_legacy",
    "maximal_prefix_lookup",
    "sliding_window_lookup",
]

K = TypeVar("K")


def as_legacy(decision: Decision) -> int | None:
    """The old ``int | None`` shape: ``Hits`` -> its count, ``Defer`` -> None (SCAN-9)."""
    match decision:
        case Hits(count=count):
            return count
        case Defer():
            return None
        case _:
            unreachable(decision, where="as_legacy(decision)")


def maximal_prefix_lookup(lookup: Callable[[K], LookupResult], keys: Iterable[K]) -> Decision:
    """The longest loadable prefix of ``keys`` (SCAN-1..SCAN-4).

    Looks keys up front to back, each exactly once, and stops at the first
    MISS and nowhere else (SCAN-2). HIT counts; HIT_PENDING counts and forces
    a deferral; RETRY forces a deferral without counting and does not stop
    the scan, so the tiers start their asynchronous checks for the keys that
    follow (SCAN-3). Returns ``Defer(cause)`` with the first HIT_PENDING or
    RETRY seen, else ``Hits(n)`` where ``keys[0:n]`` are all HIT and
    ``keys[n]`` (if any) is MISS (SCAN-1). A non-LookupResult answer raises
    :class:`~kvproto.errors.ContractViolation` naming it and its position (SCAN-4).
    """
    count = 0
    retries = 0  # count + retries is the position of the key being looked up
    cause: LookupResult | None = None
    # map() calls lookup lazily, one key at a time, from C: the same calls in
    # the same order as a hand-written loop, without its per-call bytecode.
    for result in map(lookup, keys):
        match result:
            case lr.HIT:
                count += 1
            case lr.MISS:
                break
            case lr.HIT_PENDING:
                count += 1
                if cause is None:
                    cause = result
            case lr.RETRY:
                retries += 1
                if cause is None:
                    cause = result
            case _:
                unreachable(
                    result, where=f"maximal_prefix_lookup: lookup of key #{count + retries}"
                )
    if cause is None:
        try:
            return hits_cache[count]
        except KeyError:
            return shared_hits(count)
    return DEFER_RETRY if cause is lr.RETRY else DEFER_PENDING


def _refuse_windows(window: int, initial_window: int | None) -> None:
    """InvalidArgumentError naming the bad one unless ``window >= 1`` and ``initial_window`` is None or
    ``>= window`` (SCAN-10); called only when one is bad (a good call makes no extra call)."""
    if type(window) is not int or window < 1:
        raise InvalidArgumentError(f"window must be an int >= 1, got {window!r}")
    if initial_window is not None:
        if type(initial_window) is not int or initial_window < window:
            raise InvalidArgumentError(
                f"initial_window must be an int >= {window}, got {initial_window!r}"
            )


def _after_the_first_miss(
    results: Iterator[LookupResult], idx: int, window: int, pending_at: int, retried: bool
) -> tuple[int, int, int, bool]:
    """The second loop of :func:`sliding_window_lookup`, after the first MISS (SCAN-6, SCAN-7): MISS
    first (an uncached tail is a long run of MISSes, and only ``window`` HITs follow).

    ``results`` are the lookups left, back to front, of the keys below ``idx``;
    the required length is ``window`` now. Returns ``(idx, streak, pending_at,
    retried)`` where it stopped: a filled window ``[idx, idx + streak)``, or the
    run from index 0 when the keys ran out.
    """
    streak = 0
    for result in results:
        idx -= 1
        match result:
            case lr.MISS:
                streak = 0
            case lr.HIT:
                streak += 1
                if streak == window:
                    break
            case lr.HIT_PENDING:
                streak += 1
                pending_at = idx
                if streak == window:
                    break
            case lr.RETRY:
                streak = 0
                retried = True
            case _:
                unreachable(result, where=f"sliding_window_lookup: lookup of key #{idx}")
    return idx, streak, pending_at, retried


def sliding_window_lookup(
    lookup: Callable[[K], LookupResult],
    keys: Sequence[K],
    window: int,
    *,
    initial_window: int | None = None,
) -> Decision:
    """The rightmost loadable window of ``keys`` (SCAN-5..SCAN-8, SCAN-10).

    Looks keys up back to front, keeping a streak of consecutive hits, and
    stops as soon as the required window fills (SCAN-5). HIT extends the
    streak; HIT_PENDING extends it and marks it pending; RETRY resets the
    streak, clears the mark and forces a deferral that sticks; MISS resets
    the streak and clears the mark (SCAN-6). ``initial_window`` (``>= window``)
    is the required length until the first MISS or RETRY, then ``window``
    applies (SCAN-7).

    Returns ``Hits(e)`` where the required run ending at ``e`` is all HIT,
    or, when no window fills, ``Hits(n)`` with ``keys[0:n]`` all HIT. Returns
    ``Defer(RETRY)`` if a RETRY was seen, else ``Defer(HIT_PENDING)`` if the
    streak that produced the answer holds a pending block (SCAN-8). Bad
    window arguments raise :class:`~kvproto.errors.InvalidArgumentError`
    before any lookup (SCAN-10).
    """
    if type(window) is not int or window < 1 or (
        initial_window is not None and (type(initial_window) is not int or initial_window < window)
    ):
        _refuse_windows(window, initial_window)
    n = len(keys)
    streak = 0
    # The pending mark is the index of the last HIT_PENDING seen (the leftmost so far): it lies in the
    # streak exactly when it is below the streak's end, so a MISS or RETRY clears it without a store.
    pending_at = n
    retried = False
    # map() calls lookup lazily, one key at a time, from C: the same calls in the same order as
    # indexing keys[idx] by hand, without its bytecode.
    results = map(lookup, reversed(keys))
    # Two loops over the same lookups, each with its cases in the order of their frequency: up to the first
    # MISS, HIT first (initial_window applies until the first MISS or RETRY, SCAN-7); then _after_the_first_miss.
    required = window if initial_window is None else initial_window
    # In the first loop the streak is keys[top - streak : top], so a HIT needs no index bookkeeping.
    top = n
    for result in results:
        match result:
            case lr.HIT:
                streak += 1
                if streak == required:
                    break
            case lr.MISS:
                top -= streak + 1
                streak = 0
                break
            case lr.HIT_PENDING:
                streak += 1
                pending_at = top - streak
                if streak == required:
                    break
            case lr.RETRY:
                top -= streak + 1
                streak = 0
                retried = True
                required = window
            case _:
                unreachable(
                    result, where=f"sliding_window_lookup: lookup of key #{top - streak - 1}"
                )
    idx = top - streak
    if streak == 0:  # a MISS ended the first loop (or the keys ran out)
        idx, streak, pending_at, retried = _after_the_first_miss(results, idx, window, pending_at, retried)
    # After a break the streak is the filled window [idx, idx + streak); after
    # the last key (idx == 0, or no keys) it is the run from index 0.
    if retried:
        return DEFER_RETRY
    end = idx + streak
    if pending_at < end:
        return DEFER_PENDING
    try:
        return hits_cache[end]
    except KeyError:
        return shared_hits(end)

