"""Batched scans through the manager: a whole prefix or window scan in one call (MGR-20).

:func:`kvproto.maximal_prefix_lookup` and :func:`kvproto.sliding_window_lookup`
over ``manager.lookup`` call the manager once per key. Where the primary
offers :class:`~kvproto.ReadyKeys` (MGR-15), every key in its live
``ready_keys`` view answers HIT from the manager with no call to any tier and
no change to any state. So a run of such keys can be tested by one C-level
pass (``all`` over a ``map`` of :func:`operator.contains` on the view, which
stops at the first key it lacks), and every other key goes through
``manager.lookup`` itself, at its turn in scan order. Each membership test
runs at the moment the per-key scan would make it, after every earlier
lookup (the pass is lazy), so a promotion that evicts a later key from the
primary is seen exactly as the per-key scan sees it. A test the per-key scan
would not make (past the window that fills) changes nothing.

Hence the same decision, the same tier calls in the same order, and the same
side effects (asynchronous checks started for RETRY keys, promotions
started, per-request references), as the per-key scans over
``manager.lookup``. Where that cannot be proven (no ReadyKeys view, a view
of a type not known to accept any hashable, ``keys`` not a list or tuple) the
batched scans are the per-key scans.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from functools import partial
from itertools import islice, repeat
from operator import contains, length_hint
from typing import Final

from kvproto import members as lr
from kvproto._decisions import DEFER_PENDING, DEFER_RETRY, Decision, shared_hits  # the values the per-key scans hand out
from kvproto._key_batches import check_not_a_single_key
from kvproto._keys import OffloadKey
from kvproto._requests import ReqContext
from kvproto._results import LookupResult, unreachable
from kvproto.errors import ContractViolation
from kvproto.scan import maximal_prefix_lookup, sliding_window_lookup

__all__ = ["FlagsOf", "batched_prefix", "batched_window", "fast_flags", "unhashable_key"]

# The tiering manager (kvproto._tiering) uses these for scan_prefix and scan_window; kvproto.tierkit
# re-exports them as ReadyFlags, ready_flags, ready_prefix_scan and ready_window_scan: the same
# batched scans for an engine that keeps its own primary with a ready view. Both sit above this module.

Lookup = Callable[[OffloadKey, ReqContext], LookupResult]
FlagsOf = Callable[[Iterator[OffloadKey]], Iterator[bool]]
"""Maps an iterator of keys to a lazy iterator of "is it in the primary's ready view" flags, in C."""

_BUILTIN_METHOD: Final = type({}.__contains__)

# The containers whose membership test accepts any hashable and has no side effect: the view a
# SlotTable gives (dict keys), and sets. Anything else takes the per-key scan.
_FAST_VIEWS: Final[tuple[type, ...]] = (type({}.keys()), set, frozenset, dict)

# The key sequences whose iterators say exactly how many keys are left (a length hint); other
# iterables take the per-key scans.
_SEQUENCES: Final[tuple[type, ...]] = (list, tuple)


def fast_flags(ready: Container[OffloadKey], contains_fn: object = None) -> FlagsOf | None:
    """How the batched scans test ``ready`` in C, or None (they are then the per-key scans).

    ``ready`` must be a container known to accept any hashable without side
    effects (a dict-keys view, a set). ``contains_fn``, a primary's optional
    ``ready_contains``, is used instead when it is the builtin ``__contains__``
    of a dict or set equal to ``ready`` (the SlotTable's own dict: a call with
    no view in between).
    """
    if not isinstance(ready, _FAST_VIEWS):
        return None
    owner = getattr(contains_fn, "__self__", None)
    if (
        type(contains_fn) is _BUILTIN_METHOD
        and getattr(contains_fn, "__name__", None) == "__contains__"
        and isinstance(owner, (dict, set, frozenset))
        and _same_keys(ready, owner)
    ):
        return partial(map, contains_fn)
    view = ready
    return lambda keys: map(contains, repeat(view), keys)


def _same_keys(ready: Container[OffloadKey], owner: dict[object, object] | set[object] | frozenset[object]) -> bool:
    """``ready`` is (a view of) ``owner``: the same keys now (checked once, at the manager's construction)."""
    keys = owner.keys() if isinstance(owner, dict) else owner
    mapping = getattr(ready, "mapping", None)
    if mapping is not None:
        return bool(mapping == owner)
    return ready is owner or ready == keys


def _never(key: OffloadKey) -> LookupResult:
    raise ContractViolation(f"a scan over no keys looked {key!r} up (SCAN-5)")  # pragma: no cover - never called


def _check_keys(method: str, keys: object) -> None:
    check_not_a_single_key("TieringManager", method, keys)


def unhashable_key(keys: Iterable[object]) -> object | None:
    """The first key of ``keys`` that cannot be hashed (the C pass over the ready view raised
    TypeError for it, where ``lookup`` names it in an InvalidKeyError), or None."""
    for key in keys:
        try:
            hash(key)
        except TypeError:
            return key
    return None


def batched_prefix(
    lookup: Lookup, flags_of: FlagsOf | None, keys: Iterable[OffloadKey], req_context: ReqContext
) -> Decision:
    """``maximal_prefix_lookup(lambda k: lookup(k, req_context), keys)``, faster (SCAN-1..SCAN-3, MGR-20).

    ``ready`` is the manager's fast view (:func:`fast_view`) or None. Runs of
    keys in ``ready`` answer HIT in one C pass; every other key is
    ``lookup(key, req_context)``, in order, stopping at the first MISS.
    """
    _check_keys("scan_prefix", keys)
    if flags_of is None or not isinstance(keys, (list, tuple)) or type(keys) not in _SEQUENCES:
        return maximal_prefix_lookup(lambda k: lookup(k, req_context), keys)
    n = len(keys)
    # One lazy pass over the whole prefix: each all() resumes after the key the last one stopped
    # at (a key not in ready), whose index the iterator's length hint gives.
    it = iter(keys)
    flags = flags_of(it)
    start = 0  # the first key of the current run
    count = 0
    cause: LookupResult | None = None
    while True:
        if all(flags):
            count += n - start
            break
        pos = n - length_hint(it) - 1  # keys[start:pos] are HIT; keys[pos] is not in ready
        count += pos - start
        result = lookup(keys[pos], req_context)
        match result:  # the frequent answers first: a key not in ready is seldom a HIT
            case lr.MISS:
                break
            case lr.RETRY:
                if cause is None:
                    cause = result
            case lr.HIT | lr.HIT_PENDING:
                count += 1
                if cause is None and result is lr.HIT_PENDING:  # the first HIT_PENDING or RETRY defers
                    cause = result
            case _:
                unreachable(result, where=f"TieringManager.scan_prefix: lookup of key #{pos}")
        start = pos + 1
    if cause is None:
        return shared_hits(count)
    return DEFER_RETRY if cause is lr.RETRY else DEFER_PENDING


def batched_window(
    lookup: Lookup,
    flags_of: FlagsOf | None,
    keys: Sequence[OffloadKey],
    req_context: ReqContext,
    window: int,
    initial_window: int | None,
) -> Decision:
    """``sliding_window_lookup(lambda k: lookup(k, req_context), keys, window, initial_window=...)``, faster
    (SCAN-5..SCAN-8, SCAN-10, MGR-20).

    Bad window arguments raise :class:`~kvproto.errors.InvalidArgumentError`
    before any lookup, as the per-key scan does.
    """
    _check_keys("scan_window", keys)
    # The per-key scan over no keys checks the window arguments, with its messages, and looks nothing up.
    sliding_window_lookup(_never, (), window, initial_window=initial_window)
    if flags_of is None or type(keys) not in _SEQUENCES:
        return sliding_window_lookup(
            lambda k: lookup(k, req_context), keys, window, initial_window=initial_window
        )
    required = window if initial_window is None else initial_window
    # The streak is keys[top - streak : top]; pos is the key just tested (scanning back to front).
    top = pos = len(keys)
    streak = 0
    pending = False  # the streak holds a HIT_PENDING
    retried = False
    rev = reversed(keys)
    flags = flags_of(rev)
    for flag in flags:  # is keys[pos - 1] in ready?
        pos -= 1
        if flag:
            streak += 1
            # A run of HITs: test at most the rest of the window in one pass; all in ready, it fills
            # (or the keys run out: the streak is then the run from index 0).
            if streak == required or all(islice(flags, required - streak)):
                break
            nxt = length_hint(rev)  # keys[nxt+1:pos] are HIT; keys[nxt] is not in ready
            streak += pos - 1 - nxt
            pos = nxt
        result = lookup(keys[pos], req_context)
        match result:  # the frequent answers first: a key not in ready is seldom a HIT
            case lr.MISS:
                top = pos
                streak = 0
                pending = False
                required = window
            case lr.RETRY:
                top = pos
                streak = 0
                pending = False
                required = window
                retried = True
            case lr.HIT | lr.HIT_PENDING:
                streak += 1
                pending = pending or result is lr.HIT_PENDING  # the streak holds a HIT_PENDING
                if streak == required:
                    break
            case _:
                unreachable(result, where=f"TieringManager.scan_window: lookup of key #{pos}")
    if retried:
        return DEFER_RETRY
    if pending:
        return DEFER_PENDING
    return shared_hits(top)
