"""The scheduler's scans over lookup results (SCAN-1..SCAN-9).

Both scans take the lookup as a callable, so they work over a manager, a
bare tier or a test double alike, and consume every answer with an
exhaustive ``match``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeAlias, TypeVar

from kvproto import members as lr
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


@dataclass(frozen=True, slots=True)
class Hits:
    """Load now: ``count`` leading blocks (prefix scan) or the window's end index (window scan)."""

    count: int


@dataclass(frozen=True, slots=True)
class Defer:
    """Ask again next step; ``cause`` is HIT_PENDING or RETRY (SCAN-3, SCAN-8)."""

    cause: LookupResult


Decision: TypeAlias = Hits | Defer


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
    for key in keys:
        result = lookup(key)
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
    if cause is not None:
        return Defer(cause)
    return Hits(count)


def sliding_window_lookup(
    lookup: Callable[[K], LookupResult],
    keys: Sequence[K],
    window: int,
    *,
    initial_window: int | None = None,
) -> Decision:
    """The rightmost loadable window of ``keys`` (SCAN-5..SCAN-8).

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
    streak that produced the answer holds a pending block (SCAN-8).
    """
    required = _window_arg("window", window, 1)
    if initial_window is not None:
        required = _window_arg("initial_window", initial_window, window)
    streak = 0
    pending = False
    retried = False
    for idx in range(len(keys) - 1, -1, -1):
        result = lookup(keys[idx])
        match result:
            case lr.HIT:
                streak += 1
                if streak == required:
                    return _window_decision(idx + streak, retried=retried, pending=pending)
            case lr.MISS:
                streak = 0
                pending = False
                required = window
            case lr.HIT_PENDING:
                streak += 1
                pending = True
                if streak == required:
                    return _window_decision(idx + streak, retried=retried, pending=pending)
            case lr.RETRY:
                streak = 0
                pending = False
                retried = True
                required = window
            case _:
                unreachable(result, where=f"sliding_window_lookup: lookup of key #{idx}")
    return _window_decision(streak, retried=retried, pending=pending)


def _window_arg(name: str, value: object, minimum: int) -> int:
    if type(value) is not int or value < minimum:
        raise InvalidArgumentError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def _window_decision(end: int, *, retried: bool, pending: bool) -> Decision:
    if retried:
        return Defer(lr.RETRY)
    if pending:
        return Defer(lr.HIT_PENDING)
    return Hits(end)
