"""Running a scan over a sequence of answers, and the small-int inputs CrossHair explores.

A scan under test looks up positions ``0..n-1``; position ``i`` answers
``answer_of(i)``. :func:`run_prefix` and :func:`run_window` return the
decision together with the positions looked up, in call order, so call
counts and order are part of every comparison.

For CrossHair, answers and window arguments come from plain symbolic ints.
:func:`decode` and :func:`pick` turn them into concrete values by branching
on equality, so the scans run on concrete values and CrossHair's paths
differ only in which answers and arguments were chosen. Both map *every*
int to something, so no iteration is wasted on inputs out of bounds; the
order of the tests sets how often CrossHair picks each value (it takes the
true side of a new branch about one time in four).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import NamedTuple, TypeAlias, overload

from kvproto._results import LookupResult
from kvproto.scan import Decision

__all__ = [
    "ANSWERS",
    "EXPRESSIBLE",
    "LEGACY_ANSWER",
    "MAX_KEYS",
    "AnswerOf",
    "CheckedRun",
    "LazyAnswers",
    "ScanRun",
    "answers_of",
    "decode",
    "decode_answer",
    "explored_length",
    "explored_window_args",
    "pick",
    "run_prefix",
    "run_window",
]

#: Longest key sequence CrossHair explores.
MAX_KEYS = 8

#: The four answers, in declaration order (the order every exhaustive enumeration uses).
ANSWERS: tuple[LookupResult, ...] = tuple(LookupResult)

#: What a legacy ``bool | None`` lookup says for each answer (SCAN-12): HIT is True, MISS is
#: False, and HIT_PENDING and RETRY are both None: the conflation kvproto exists to remove.
LEGACY_ANSWER: Mapping[LookupResult, bool | None] = MappingProxyType(
    {
        LookupResult.MISS: False,
        LookupResult.HIT: True,
        LookupResult.HIT_PENDING: None,
        LookupResult.RETRY: None,
    }
)

#: The answers a ``bool | None`` lookup can tell apart (SCAN-12): its None reads as RETRY.
EXPRESSIBLE: tuple[LookupResult, ...] = (LookupResult.MISS, LookupResult.HIT, LookupResult.RETRY)

AnswerOf: TypeAlias = Callable[[int], object]
"""What position ``i`` of a scanned sequence answers; anything but a LookupResult plays a legacy tier."""

ScanRun: TypeAlias = tuple[Decision, tuple[int, ...]]
"""A decision and the positions looked up, in call order."""

PrefixScan: TypeAlias = Callable[[Callable[[int], LookupResult], Iterable[int]], Decision]
WindowScan: TypeAlias = Callable[..., Decision]


def recorded(answer_of: AnswerOf) -> tuple[Callable[[int], LookupResult], list[int]]:
    """A lookup of positions answering ``answer_of(position)``, and the list it appends each position
    it is asked to, in call order (a scan's calls)."""
    calls: list[int] = []

    def lookup(position: int) -> LookupResult:
        calls.append(position)
        return answer_of(position)  # type: ignore[return-value]  # None plays a legacy tier

    return lookup, calls


def run_prefix(scan: PrefixScan, answer_of: AnswerOf, n: int) -> ScanRun:
    """Run a prefix scan over positions ``0..n-1``; record the positions looked up."""
    lookup, calls = recorded(answer_of)
    return scan(lookup, range(n)), tuple(calls)


def run_window(
    scan: WindowScan, answer_of: AnswerOf, n: int, window: int, initial_window: int | None
) -> ScanRun:
    """Run a window scan over positions ``0..n-1``; record the positions looked up."""
    lookup, calls = recorded(answer_of)
    return scan(lookup, range(n), window, initial_window=initial_window), tuple(calls)


class LazyAnswers(Sequence[LookupResult | None]):
    """The answers of positions ``0..n-1``, each computed on first access and kept.

    Under CrossHair, computing an answer branches on its code; a predicate
    that reads only the answers a scan looked up then adds no paths.
    """

    def __init__(self, answer_of: Callable[[int], LookupResult | None], n: int) -> None:
        self._answer_of = answer_of
        self._n = n
        self._known: dict[int, LookupResult | None] = {}

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, index: int) -> LookupResult | None: ...

    @overload
    def __getitem__(self, index: slice) -> list[LookupResult | None]: ...

    def __getitem__(self, index: int | slice) -> LookupResult | None | list[LookupResult | None]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._n))]
        if not 0 <= index < self._n:
            raise IndexError(index)
        if index not in self._known:
            self._known[index] = self._answer_of(index)
        return self._known[index]


class CheckedRun(NamedTuple):
    """A scan's decision, the positions it looked up, and the answers it ran over."""

    decision: Decision
    calls: tuple[int, ...]
    answers: LazyAnswers


def answers_of(answers: Sequence[object]) -> AnswerOf:
    """``answer_of`` for a concrete sequence of answers (or legacy values)."""
    return answers.__getitem__


def decode(code: int) -> LookupResult | None:
    """The answer a code stands for.

    2: HIT_PENDING; 3: RETRY; 0 or less: MISS; 99: a legacy ``None``
    answer (the scans must raise ContractViolation); any other int: HIT.
    """
    if code == 2:
        return LookupResult.HIT_PENDING
    if code == 3:
        return LookupResult.RETRY
    if code <= 0:
        return LookupResult.MISS
    # Two tests, so that CrossHair (1-in-4 odds for the true side of a new
    # branch) explores legacy answers rarely: each one ends the scan.
    if code >= 99 and code == 99:
        return None
    return LookupResult.HIT


def decode_answer(code: int, expressible_only: bool) -> LookupResult:
    """The answer a code stands for, legacy values excluded (the inputs a third-party scan gets).

    3: RETRY; 2: HIT_PENDING (RETRY when ``expressible_only``: a ``bool | None``
    lookup cannot say HIT_PENDING, SCAN-12); 0 or less: MISS; any other int: HIT.
    """
    if code == 3:
        return LookupResult.RETRY
    if code == 2:
        return LookupResult.RETRY if expressible_only else LookupResult.HIT_PENDING
    if code <= 0:
        return LookupResult.MISS
    return LookupResult.HIT


def pick(value: int, candidates: Sequence[int], otherwise: int | None) -> int | None:
    """The first of ``candidates`` equal to ``value``, else ``otherwise``."""
    for candidate in candidates:
        if value == candidate:
            return candidate
    return otherwise


def explored_length(length: int) -> int:
    """A sequence length in ``0..MAX_KEYS``, long ones most often."""
    n = pick(length, range(MAX_KEYS, 0, -1), 0)
    assert n is not None  # pick() with an int default
    return n


def explored_window_args(window: int, extra: int) -> tuple[int, int | None]:
    """``(window, initial_window)``: window 0..4 (0 is invalid), initial ``window - 1 .. window + 2`` or None."""
    w = pick(window, (2, 1, 3, 0), 4)
    assert w is not None  # pick() with an int default
    e = pick(extra, (0, 1, 2, -1), None)
    return w, (None if e is None else w + e)
