"""kvproto.scan: worked examples, the ContractViolation paths, as_legacy and argument errors.

The exhaustive, property and CrossHair checks live in tests/spec; these are
the cases a reader checks by eye.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from kvproto import Defer, Hits, LookupResult, as_legacy, maximal_prefix_lookup, sliding_window_lookup
from kvproto.errors import ContractViolation, InvalidArgumentError

M, H, P, R = LookupResult.MISS, LookupResult.HIT, LookupResult.HIT_PENDING, LookupResult.RETRY


def _lookup(answers: Sequence[object], calls: list[int]) -> object:
    def lookup(position: int) -> LookupResult:
        calls.append(position)
        return answers[position]  # type: ignore[return-value]  # legacy values on purpose

    return lookup


def prefix(answers: Sequence[object]) -> tuple[object, list[int]]:
    calls: list[int] = []
    return maximal_prefix_lookup(_lookup(answers, calls), range(len(answers))), calls  # type: ignore[arg-type]  # see _lookup


def window(answers: Sequence[object], w: int, initial: int | None = None) -> tuple[object, list[int]]:
    calls: list[int] = []
    lookup = _lookup(answers, calls)
    return sliding_window_lookup(lookup, range(len(answers)), w, initial_window=initial), calls  # type: ignore[arg-type]  # see _lookup


@pytest.mark.parametrize(
    ("answers", "decision", "calls"),
    [
        ([], Hits(0), []),
        ([H, H, M, H], Hits(2), [0, 1, 2]),  # SCAN-1, SCAN-2: stops at the first MISS
        ([H, P, H, M], Defer(P), [0, 1, 2, 3]),  # SCAN-3: HIT_PENDING counts and defers
        ([H, R, H, P, M, H], Defer(R), [0, 1, 2, 3, 4]),  # RETRY does not stop the scan
        ([M, R], Hits(0), [0]),
        ([H, H, H], Hits(3), [0, 1, 2]),
    ],
)
def test_prefix_examples(answers: list[LookupResult], decision: object, calls: list[int]) -> None:
    assert prefix(answers) == (decision, calls)


def test_prefix_takes_any_iterable_and_consumes_only_what_it_looks_up() -> None:
    """SCAN-2: a generator is consumed up to and including the first MISS."""
    produced: list[int] = []

    def keys() -> Iterator[int]:
        for i in range(10):
            produced.append(i)
            yield i

    answers = [H, H, M] + [H] * 7
    assert maximal_prefix_lookup(answers.__getitem__, keys()) == Hits(2)
    assert produced == [0, 1, 2]


@pytest.mark.parametrize(
    ("answers", "w", "initial", "decision", "calls"),
    [
        ([], 2, None, Hits(0), []),
        ([H, H, H, H], 2, None, Hits(4), [3, 2]),  # SCAN-5: rightmost window, stops when it fills
        ([H, H, M, H], 2, None, Hits(2), [3, 2, 1, 0]),
        ([H, P, M, H], 2, None, Defer(P), [3, 2, 1, 0]),  # SCAN-8: pending in the chosen window
        ([H, H, M, P], 2, None, Hits(2), [3, 2, 1, 0]),  # pending outside the window: no deferral
        ([H, H, R, H], 2, None, Defer(R), [3, 2, 1, 0]),  # RETRY sticks
        ([H, M, H], 2, None, Hits(1), [2, 1, 0]),  # no window fills: the run from index 0
        ([P, M, H], 2, None, Defer(P), [2, 1, 0]),
        ([H, H, H], 2, 4, Hits(3), [2, 1, 0]),  # SCAN-7: initial window never fills
        ([H, H, M, H, H], 2, 3, Hits(2), [4, 3, 2, 1, 0]),  # initial until the first MISS
        ([H, H, H, H, H], 2, 3, Hits(5), [4, 3, 2]),
    ],
)
def test_window_examples(
    answers: list[LookupResult], w: int, initial: int | None, decision: object, calls: list[int]
) -> None:
    assert window(answers, w, initial) == (decision, calls)


@pytest.mark.parametrize("bad", [None, True, False, 1, "hit"], ids=repr)
def test_prefix_legacy_answer_is_a_contract_violation(bad: object) -> None:
    """SCAN-4: names the value and the key's position; never an AssertionError."""
    with pytest.raises(ContractViolation) as info:
        prefix([H, R, P, bad, H])
    message = str(info.value)
    assert repr(bad) in message and "key #3" in message and "maximal_prefix_lookup" in message
    assert not isinstance(info.value, AssertionError)


@pytest.mark.parametrize("bad", [None, True, False, 1, "hit"], ids=repr)
def test_window_legacy_answer_is_a_contract_violation(bad: object) -> None:
    """SCAN-4: position counted from the front, although the scan goes back to front."""
    with pytest.raises(ContractViolation) as info:
        window([H, bad, M, H], 2)
    message = str(info.value)
    assert repr(bad) in message and "key #1" in message and "sliding_window_lookup" in message


def test_legacy_answer_beyond_the_scan_is_never_seen() -> None:
    assert prefix([H, M, None]) == (Hits(1), [0, 1])
    assert window([None, H, H], 2) == (Hits(3), [2, 1])


@pytest.mark.parametrize(
    ("w", "initial", "culprit"),
    [(0, None, "window"), (-1, None, "window"), (True, None, "window"), (2.0, None, "window"),
     (2, 1, "initial_window"), (2, True, "initial_window"), (2, 3.0, "initial_window")],
)
def test_window_arguments_are_validated_before_any_lookup(w: object, initial: object, culprit: str) -> None:
    """SCAN-10."""
    calls: list[int] = []
    with pytest.raises(InvalidArgumentError, match=f"^{culprit} must be an int") as info:
        sliding_window_lookup(_lookup([H, H], calls), range(2), w, initial_window=initial)  # type: ignore[arg-type]  # bad on purpose
    assert repr(initial if culprit == "initial_window" else w) in str(info.value)
    assert calls == []


def test_as_legacy() -> None:
    """SCAN-9."""
    assert as_legacy(Hits(0)) == 0
    assert as_legacy(Hits(12)) == 12
    assert as_legacy(Defer(R)) is None
    assert as_legacy(Defer(P)) is None
    with pytest.raises(ContractViolation, match="as_legacy"):
        as_legacy(3)  # type: ignore[arg-type]  # not a Decision


def test_decisions_are_frozen_values() -> None:
    assert Hits(3) == Hits(3) and Defer(R) != Defer(P)
    with pytest.raises(AttributeError):
        Hits(3).count = 4  # type: ignore[misc]  # frozen on purpose
