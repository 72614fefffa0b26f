"""Reference definitions of the two scans, written the obviously-correct way (SCAN-1..SCAN-10).

These are the executable side of ``spec/CONTRACT.md`` section SCAN. They
favour clarity over speed: the answers looked up so far are kept in a list,
and every candidate window is enumerated instead of keeping a streak.
``kvproto.scan`` must behave exactly like them (same decisions, same lookup
calls in the same order, same errors with the same messages); CrossHair's
``diffbehavior`` and the exhaustive and property tests check that.

The invariants the contract states are written once, as predicates over a
sequence of answers (:func:`prefix_invariants_hold`,
:func:`window_invariants_hold`). They are independent of both
implementations: they describe the *outcome* (what a numeric answer means,
when a deferral happens, which keys were looked up), not an algorithm. The
``check_*`` entry points at the bottom carry them as PEP 316 contracts
(``pre:``/``post:`` docstring lines) for ``crosshair check``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from kvproto._results import LookupResult, unreachable
from kvproto._verification._inputs import (
    CheckedRun,
    LazyAnswers,
    decode,
    explored_length,
    pick,
    run_prefix,
    run_window,
)
from kvproto.errors import ContractViolation, InvalidArgumentError  # noqa: F401 - ContractViolation is named by the raises: contracts
from kvproto.scan import Decision, Defer, Hits

# ContractViolation is named by the ``raises:`` contracts below.

__all__ = [
    "check_prefix",
    "check_window",
    "maximal_prefix_lookup",
    "prefix_invariants_hold",
    "required_length",
    "sliding_window_lookup",
    "window_fills",
    "window_invariants_hold",
]

K = TypeVar("K")

MISS = LookupResult.MISS
HIT = LookupResult.HIT
HIT_PENDING = LookupResult.HIT_PENDING
RETRY = LookupResult.RETRY

#: Answers that extend a run of hits (the block is or will be in the primary tier).
HIT_LIKE: frozenset[LookupResult | None] = frozenset({HIT, HIT_PENDING})
#: Answers that end a run of hits in the window scan.
RUN_BREAKERS: frozenset[LookupResult | None] = frozenset({MISS, RETRY})


def _checked(answer: LookupResult, scan: str, position: int) -> LookupResult:
    """``answer``; a value outside LookupResult reaches the exhaustive default (SCAN-4)."""
    match answer:
        case LookupResult.MISS | LookupResult.HIT | LookupResult.HIT_PENDING | LookupResult.RETRY:
            return answer
        case _:
            unreachable(answer, where=f"{scan}: lookup of key #{position}")


# --------------------------------------------------------------------------- prefix scan


def maximal_prefix_lookup(lookup: Callable[[K], LookupResult], keys: Iterable[K]) -> Decision:
    """Reference prefix scan (SCAN-1..SCAN-4).

    Look keys up front to back until the first MISS (SCAN-2). The prefix is
    what came before that MISS. If the prefix holds a HIT_PENDING or RETRY,
    defer with the first of them (SCAN-3); otherwise every prefix answer is
    HIT and the answer is the prefix length (SCAN-1).
    """
    answers: list[LookupResult] = []
    for position, key in enumerate(keys):
        answers.append(_checked(lookup(key), "maximal_prefix_lookup", position))
        if answers[-1] is MISS:
            break
    prefix = answers[:-1] if answers and answers[-1] is MISS else answers
    deferring = [a for a in prefix if a is HIT_PENDING or a is RETRY]
    if deferring:
        return Defer(deferring[0])
    return Hits(len(prefix))


# --------------------------------------------------------------------------- window scan


def _window_args(window: object, initial_window: object) -> tuple[int, int | None]:
    """Validate the window arguments (SCAN-10), in this order: ``window``, then ``initial_window``."""
    if type(window) is not int or window < 1:
        raise InvalidArgumentError(f"window must be an int >= 1, got {window!r}")
    if initial_window is None:
        return window, None
    if type(initial_window) is not int or initial_window < window:
        raise InvalidArgumentError(
            f"initial_window must be an int >= {window}, got {initial_window!r}"
        )
    return window, initial_window


def required_length(
    answers: Sequence[LookupResult | None], end: int, window: int, initial_window: int | None
) -> int:
    """The run length a window ending at ``end`` (exclusive) must have (SCAN-7).

    ``initial_window`` applies while no MISS or RETRY lies at or right of
    ``end``; ``window`` applies after. ``None`` entries are answers not
    looked up, which never matter here: they all lie left of the scan's
    position.
    """
    rest = answers[end:]
    if initial_window is not None and MISS not in rest and RETRY not in rest:
        return initial_window
    return window


def window_fills(
    answers: Sequence[LookupResult | None], end: int, window: int, initial_window: int | None
) -> bool:
    """Whether the required run ending at ``end`` is all HIT or HIT_PENDING (SCAN-5)."""
    start = end - required_length(answers, end, window, initial_window)
    run = answers[start:end]
    return start >= 0 and MISS not in run and RETRY not in run and None not in run


def sliding_window_lookup(
    lookup: Callable[[K], LookupResult],
    keys: Sequence[K],
    window: int,
    *,
    initial_window: int | None = None,
) -> Decision:
    """Reference window scan (SCAN-5..SCAN-8, SCAN-10).

    Look keys up back to front, one at a time, until some candidate window
    among the keys looked up so far fills (SCAN-5). The answer is the end of
    the rightmost filled window, or, if none fills, the length of the run
    of HIT/HIT_PENDING that starts at index 0. Defer with RETRY if any key
    looked up answered RETRY; else with HIT_PENDING if the answer's run holds
    a HIT_PENDING (SCAN-8).
    """
    window, initial_window = _window_args(window, initial_window)
    n = len(keys)
    answers: list[LookupResult | None] = [None] * n
    filled: list[int] = []
    next_key = n - 1
    while next_key >= 0 and not filled:
        answers[next_key] = _checked(lookup(keys[next_key]), "sliding_window_lookup", next_key)
        # Only a window starting at the key just looked up can have filled
        # now; it is ``window`` or ``initial_window`` long.
        lengths = {window} if initial_window is None else {window, initial_window}
        filled = [
            next_key + length
            for length in lengths
            if next_key + length <= n
            and required_length(answers, next_key + length, window, initial_window) == length
            and window_fills(answers, next_key + length, window, initial_window)
        ]
        next_key -= 1
    looked_up = answers[next_key + 1 :]
    if filled:
        end = max(filled)
        run = answers[end - required_length(answers, end, window, initial_window) : end]
    else:
        end = 0
        while end < n and answers[end] in HIT_LIKE:
            end += 1
        run = answers[:end]
    if RETRY in looked_up:
        return Defer(RETRY)
    if HIT_PENDING in run:
        return Defer(HIT_PENDING)
    return Hits(end)


# --------------------------------------------------------------------------- invariants


def prefix_invariants_hold(
    answers: Sequence[LookupResult | None], decision: Decision, calls: Sequence[int]
) -> bool:
    """SCAN-1..SCAN-4 for a prefix scan over ``answers`` that returned ``decision``.

    ``calls`` lists the positions looked up, in call order; ``None`` stands
    for a legacy answer.

    * SCAN-4: a scan that returns looked up no legacy answer.

    * SCAN-2: exactly ``min(len, first MISS + 1)`` lookups, positions 0, 1, ... in order.
    * SCAN-3: a deferral exactly when a HIT_PENDING or RETRY lies before the
      first MISS, with the first of them as its cause.
    * SCAN-1: a numeric answer ``n`` means ``answers[0:n]`` are all HIT and
      ``n == len(answers)`` or ``answers[n]`` is MISS.
    """
    first_miss = next((i for i, a in enumerate(answers) if a is MISS), len(answers))
    if list(calls) != list(range(min(len(answers), first_miss + 1))):
        return False
    if None in answers[: len(calls)]:
        return False
    deferring = [a for a in answers[:first_miss] if a is HIT_PENDING or a is RETRY]
    if isinstance(decision, Defer):
        return bool(deferring) and decision.cause is deferring[0]
    if deferring:
        return False
    n = decision.count
    return all(a is HIT for a in answers[:n]) and (n == len(answers) or answers[n] is MISS)


def window_invariants_hold(
    answers: Sequence[LookupResult | None],
    window: int,
    initial_window: int | None,
    decision: Decision,
    calls: Sequence[int],
) -> bool:
    """SCAN-4..SCAN-8 for a window scan over ``answers`` that returned ``decision``.

    * SCAN-4: a scan that returns looked up no legacy answer (``None``).

    * SCAN-5: the lookups go back to front and stop where the rightmost
      filled window starts (all keys if no window fills).
    * SCAN-7: a window ending at ``e`` must be ``initial_window`` long if no
      MISS or RETRY lies in ``answers[e:]``, else ``window`` long.
    * SCAN-8: ``Defer(RETRY)`` exactly when a key looked up answered RETRY;
      otherwise ``Defer(HIT_PENDING)`` exactly when the run that produced the
      answer holds a HIT_PENDING.
    * Numeric answers: ``Hits(e)`` with a window filled means the required
      run ending at ``e`` is all HIT and no required run further right is
      all HIT/HIT_PENDING; with no window filled, ``answers[0:e]`` are all
      HIT and ``e == len`` or ``answers[e]`` is MISS.
    """
    n = len(answers)
    # The rightmost filled window, searched from the right so that only the
    # answers a correct scan looked up are read.
    chosen = next(
        (e for e in range(n, 0, -1) if window_fills(answers, e, window, initial_window)), None
    )
    if chosen is not None:
        start = chosen - required_length(answers, chosen, window, initial_window)
        run = answers[start:chosen]
    else:
        start = 0
        lead = next((i for i, a in enumerate(answers) if a in RUN_BREAKERS), n)
        run = answers[:lead]
    if list(calls) != list(range(n - 1, start - 1, -1)):
        return False
    if None in answers[start:]:
        return False
    retried = RETRY in answers[start:]
    match decision:
        case Defer(cause=cause):
            if retried:
                return cause is RETRY
            return cause is HIT_PENDING and HIT_PENDING in run
        case Hits(count=e):
            if retried or HIT_PENDING in run:
                return False
            if chosen is not None:
                required = required_length(answers, e, window, initial_window)
                return (
                    e == chosen
                    and e - required >= 0
                    and all(a is HIT for a in answers[e - required : e])
                    and not any(window_fills(answers, f, window, initial_window) for f in range(e + 1, n + 1))
                )
            return all(a is HIT for a in answers[:e]) and (e == n or answers[e] is MISS)
        case _:
            unreachable(decision, where="window_invariants_hold(decision)")




# --------------------------------------------------------------------------- contracts

def check_prefix(
    length: int, c0: int, c1: int, c2: int, c3: int, c4: int, c5: int, c6: int, c7: int
) -> CheckedRun:
    """The reference prefix scan over ``decode(c0..c7)[:length]`` (SCAN-1..SCAN-4).

    For ``crosshair check``: 0..8 keys of any answers, legacy ``None``
    answers included (these must end in ContractViolation).

    pre: 0 <= length <= 8
    raises: ContractViolation
    post: prefix_invariants_hold(__return__.answers, __return__.decision, __return__.calls)
    """
    codes = (c0, c1, c2, c3, c4, c5, c6, c7)
    answers = LazyAnswers(lambda p: decode(codes[p]), explored_length(length))
    decision, calls = run_prefix(maximal_prefix_lookup, answers.__getitem__, len(answers))
    return CheckedRun(decision, calls, answers)


def check_window(
    length: int,
    window: int,
    extra: int,
    c0: int,
    c1: int,
    c2: int,
    c3: int,
    c4: int,
    c5: int,
    c6: int,
    c7: int,
) -> CheckedRun:
    """The reference window scan over ``decode(c0..c7)[:length]`` (SCAN-4..SCAN-8).

    ``extra`` is -1 for no initial window, else ``initial_window - window``.

    pre: 0 <= length <= 8
    pre: 1 <= window <= 4
    pre: -1 <= extra <= 2
    raises: ContractViolation
    post: window_invariants_hold(__return__.answers, window, None if extra < 0 else window + extra, __return__.decision, __return__.calls)
    """  # noqa: E501 - a CrossHair condition is one line (an indented next line would be another condition)
    codes = (c0, c1, c2, c3, c4, c5, c6, c7)
    answers = LazyAnswers(lambda p: decode(codes[p]), explored_length(length))
    w = pick(window, (2, 1, 3), 4)
    e = pick(extra, (0, 1, 2), None)
    assert w is not None  # pick() with an int default
    initial = None if e is None else w + e
    decision, calls = run_window(sliding_window_lookup, answers.__getitem__, len(answers), w, initial)
    return CheckedRun(decision, calls, answers)
