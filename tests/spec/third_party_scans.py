"""Scans written the way an engine integrator would, outside kvproto, for ``kvproto verify --prefix/--window``.

* ``good_prefix``/``good_window``: independent re-implementations of both scans with
  kvproto's shapes (``LookupResult`` answers, ``Hits``/``Defer`` decisions): they pass;
  so do ``prefix_returning_int``/``window_returning_int``, the same returning ``int | None``.
* ``legacy_prefix``/``legacy_window``: in the style of an engine's scheduler before
  LookupResult: the lookup answers ``bool | None`` and the scan returns ``int | None``.
  None reads as "unknown yet" (RETRY): they pass on the inputs ``bool | None`` can
  express, and show the documented conflation on HIT_PENDING (SCAN-12).
* ``legacy_prefix_stops_at_none``: the pessimistic legacy prefix scan that gives up at
  the first None; ``prefix_looks_up_indices``: calls ``lookup(i)`` instead of
  ``lookup(keys[i])``. Both are caught.
* The rest are not scans at all, for the usage errors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from kvproto import LookupResult, unreachable
from kvproto.errors import InvalidArgumentError
from kvproto.scan import Decision, Defer, Hits, as_legacy

__all__ = [
    "good_prefix",
    "good_window",
    "legacy_prefix",
    "legacy_prefix_stops_at_none",
    "legacy_window",
    "not_a_scan",
    "prefix_looks_up_indices",
    "prefix_returning_int",
    "returns_a_bool",
    "takes_one_argument",
    "window_returning_int",
    "window_without_initial_window",
]

Lookup = Callable[[bytes], LookupResult]
LegacyLookup = Callable[[bytes], "bool | None"]


def good_prefix(lookup: Lookup, keys: Iterable[bytes]) -> Decision:
    """Front to back; the first HIT_PENDING or RETRY is the cause of the deferral; MISS stops."""
    counted = 0
    first_deferral: LookupResult | None = None
    for key in keys:
        answer = lookup(key)
        match answer:
            case LookupResult.MISS:
                break
            case LookupResult.HIT:
                counted += 1
            case LookupResult.HIT_PENDING:
                counted += 1
                if first_deferral is None:
                    first_deferral = answer
            case LookupResult.RETRY:
                if first_deferral is None:
                    first_deferral = answer
            case _ as other:
                unreachable(other, where="good_prefix")
    return Hits(counted) if first_deferral is None else Defer(first_deferral)


def good_window(
    lookup: Lookup, keys: Sequence[bytes], window: int, *, initial_window: int | None = None
) -> Decision:
    """Back to front with a streak; ``initial_window`` until the first MISS or RETRY."""
    if type(window) is not int or window < 1:
        raise InvalidArgumentError(f"window must be an int >= 1, got {window!r}")
    needed = window if initial_window is None else initial_window
    streak = 0
    pending = False
    retried = False
    for idx in reversed(range(len(keys))):
        answer = lookup(keys[idx])
        match answer:
            case LookupResult.HIT:
                streak += 1
            case LookupResult.HIT_PENDING:
                streak += 1
                pending = True
            case LookupResult.RETRY:
                streak, pending, retried, needed = 0, False, True, window
            case LookupResult.MISS:
                streak, pending, needed = 0, False, window
            case _ as other:
                unreachable(other, where="good_window")
        if streak == needed:
            return _decide(idx + streak, retried, pending)
    return _decide(streak, retried, pending)


def _decide(end: int, retried: bool, pending: bool) -> Decision:
    if retried:
        return Defer(LookupResult.RETRY)
    if pending:
        return Defer(LookupResult.HIT_PENDING)
    return Hits(end)


def legacy_prefix(lookup: LegacyLookup, keys: Iterable[bytes]) -> int | None:
    """True counts, False stops, None ("not yet") defers without stopping the scan."""
    hit_count = 0
    defer = False
    for key in keys:
        hit = lookup(key)
        if hit is None:
            defer = True  # keep going, so the tiers start their checks of the keys after it
            continue
        if not hit:
            break
        hit_count += 1
    return None if defer else hit_count


def legacy_window(
    lookup: LegacyLookup, keys: Sequence[bytes], window: int, initial_window: int | None = None
) -> int | None:
    """Back to front; None ends the streak of hits and defers, like a MISS that sticks."""
    needed = window if initial_window is None else initial_window
    consecutive = 0
    defer = False
    for idx in range(len(keys) - 1, -1, -1):
        hit = lookup(keys[idx])
        if hit is None:
            defer, consecutive, needed = True, 0, window
        elif hit:
            consecutive += 1
            if consecutive == needed:
                return None if defer else idx + needed
        else:
            consecutive, needed = 0, window
    return None if defer else consecutive


def legacy_prefix_stops_at_none(lookup: LegacyLookup, keys: Iterable[bytes]) -> int | None:
    """Gives up at the first None: the tiers never hear of the keys after it (breaks SCAN-2)."""
    hit_count = 0
    for key in keys:
        hit = lookup(key)
        if hit is None:
            return None
        if not hit:
            break
        hit_count += 1
    return hit_count


def prefix_looks_up_indices(lookup: Callable[[object], LookupResult], keys: Sequence[bytes]) -> Decision:
    """Calls ``lookup(i)`` with the index, not the key: the contract is ``lookup(keys[i])``."""
    keys = list(keys)
    return good_prefix(lambda key: lookup(keys.index(key)), keys)


not_a_scan = 42


def takes_one_argument(lookup: Lookup) -> Decision:
    """Not a scan: it takes no keys."""
    return Hits(0)


def window_without_initial_window(lookup: Lookup, keys: Sequence[bytes], window: int) -> Decision:
    """A window scan that cannot take ``initial_window``."""
    return good_window(lookup, keys, window)


def returns_a_bool(lookup: Lookup, keys: Iterable[bytes]) -> bool:
    """Answers True/False: neither a Decision nor int | None."""
    return all(lookup(k) is LookupResult.HIT for k in keys)


def prefix_returning_int(lookup: Lookup, keys: Iterable[bytes]) -> int | None:
    """kvproto's lookups, the legacy ``int | None`` result (a scheduler that keeps its old return type)."""
    return as_legacy(good_prefix(lookup, keys))


def window_returning_int(
    lookup: Lookup, keys: Sequence[bytes], window: int, *, initial_window: int | None = None
) -> int | None:
    """kvproto's lookups, the legacy ``int | None`` result."""
    return as_legacy(good_window(lookup, keys, window, initial_window=initial_window))
