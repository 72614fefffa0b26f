"""Hypothesis properties of the scans, one per invariant of CONTRACT.md section SCAN.

:func:`scan_properties` builds the properties for a given pair of scan
implementations (``kvproto.scan`` normally; a deliberately wrong scan, such as the mutants in the
source tree's ``spec/mutants.py`` to show a property can fail). Each property is a ``@given`` function that
takes no arguments when called; it runs under the Hypothesis settings in
force (the test suite's ``ci`` profile: derandomized, 2,000 examples) unless
:func:`run_property` applies others. A property that fails raises
:class:`PropertyFailure` (or lets the scan's own wrong exception through),
with Hypothesis' minimal example attached.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import given, strategies as st

from kvproto._results import LookupResult
from kvproto._verification import _reference as ref
from kvproto._verification._inputs import PrefixScan, WindowScan, answers_of, recorded, run_prefix, run_window
from kvproto.errors import ContractViolation, InvalidArgumentError
from kvproto.scan import Decision, Defer, Hits, as_legacy

__all__ = ["Property", "PropertyFailure", "answer_lists", "scan_properties"]

MEMBERS = tuple(LookupResult)


class PropertyFailure(AssertionError):
    """A scan broke a property; the message names the clause and what was seen."""


@dataclass(frozen=True, slots=True)
class Property:
    """A named Hypothesis property and the clauses it checks."""

    name: str
    clauses: str
    test: Callable[[], None]
    examples: list[int]  # one entry per example run, so a runner can count them


def _answer_lists(members: Sequence[LookupResult]) -> st.SearchStrategy[list[LookupResult]]:
    """Sequences of ``members``: mostly-HIT ones long enough for windows to fill, and short uniform ones."""
    others = tuple(
        m for m in (LookupResult.HIT_PENDING, LookupResult.RETRY, LookupResult.MISS) if m in members
    )
    return st.one_of(
        st.lists(st.sampled_from((LookupResult.HIT,) * 4 + others), max_size=24),
        st.lists(st.sampled_from(tuple(members)), max_size=10),
    )


#: Answer sequences: mostly-HIT ones long enough for windows to fill, and short uniform ones.
answer_lists: st.SearchStrategy[list[LookupResult]] = _answer_lists(MEMBERS)

#: Legacy answers a ``bool | None`` tier might give; each must end in ContractViolation.
legacy_values: st.SearchStrategy[object] = st.sampled_from((None, True, False, 0, 1, "hit"))

#: Answer sequences where some answers are legacy values.
mixed_lists: st.SearchStrategy[list[object]] = st.lists(
    st.one_of(st.sampled_from((LookupResult.HIT,) * 3 + MEMBERS), legacy_values),
    max_size=24,
)


@st.composite
def window_args(draw: st.DrawFn) -> tuple[int, int | None]:
    """A valid ``(window, initial_window)``."""
    window = draw(st.integers(1, 6))
    extra = draw(st.none() | st.integers(0, 4))
    return window, None if extra is None else window + extra


def _fail(clause: str, what: str, *details: object) -> PropertyFailure:
    return PropertyFailure(f"{clause}: {what}: " + "; ".join(repr(d) for d in details))


_Add = Callable[..., Callable[[Callable[..., None]], Callable[[], None]]]


def scan_properties(
    prefix_scan: PrefixScan,
    window_scan: WindowScan,
    *,
    members: Sequence[LookupResult] = MEMBERS,
) -> list[Property]:
    """The properties of SCAN-1..SCAN-10 for ``prefix_scan`` and ``window_scan``.

    ``members``: the answers the answer sequences are drawn from (all four by
    default; MISS, HIT and RETRY for a scan over ``bool | None`` lookups, SCAN-12).
    """
    props: list[Property] = []
    answer_lists = _answer_lists(members)

    def add(
        name: str, clauses: str, **strategies: st.SearchStrategy[Any]
    ) -> Callable[[Callable[..., None]], Callable[[], None]]:
        """Register ``body`` as a property: ``@given(**strategies)``, counting its examples."""

        def register(body: Callable[..., None]) -> Callable[[], None]:
            examples: list[int] = []

            @functools.wraps(body)
            def counted(**drawn: Any) -> None:
                examples.append(1)
                body(**drawn)

            test: Callable[[], None] = given(**strategies)(counted)
            props.append(Property(name, clauses, test, examples))
            return test

        return register

    _prefix_properties(add, prefix_scan, answer_lists)
    _window_properties(add, window_scan, answer_lists)
    _argument_and_shape_properties(add, window_scan, answer_lists)
    return props


def _prefix_properties(add: _Add, prefix_scan: PrefixScan, answer_lists: st.SearchStrategy[list[LookupResult]]) -> None:
    """SCAN-1..SCAN-4 for the prefix scan: its invariants, the reference, legacy answers."""

    @add("prefix invariants", "SCAN-1, SCAN-2, SCAN-3", answers=answer_lists)
    def prefix_invariants(answers: list[LookupResult]) -> None:
        decision, calls = run_prefix(prefix_scan, answers_of(answers), len(answers))
        if not ref.prefix_invariants_hold(answers, decision, calls):
            raise _fail("SCAN-1..3", "invariant broken", answers, decision, calls)

    @add("prefix = reference", "SCAN-1, SCAN-2, SCAN-3", answers=answer_lists)
    def prefix_reference(answers: list[LookupResult]) -> None:
        got = run_prefix(prefix_scan, answers_of(answers), len(answers))
        want = run_prefix(ref.maximal_prefix_lookup, answers_of(answers), len(answers))
        if got != want:
            raise _fail("SCAN-1..3", "differs from the reference", answers, got, want)

    @add("prefix legacy answers", "SCAN-4", answers=mixed_lists)
    def prefix_legacy(answers: list[object]) -> None:
        _check_legacy(
            "prefix", answers, lambda a: run_prefix(prefix_scan, a, len(answers)),
            lambda a: run_prefix(ref.maximal_prefix_lookup, a, len(answers)),
        )


def _window_properties(add: _Add, window_scan: WindowScan, answer_lists: st.SearchStrategy[list[LookupResult]]) -> None:
    """SCAN-4..SCAN-8 for the window scan: its invariants, the reference, legacy answers."""

    @add(
        "window invariants", "SCAN-5, SCAN-6, SCAN-7, SCAN-8", answers=answer_lists, args=window_args()
    )
    def window_invariants(answers: list[LookupResult], args: tuple[int, int | None]) -> None:
        window, initial = args
        decision, calls = run_window(window_scan, answers_of(answers), len(answers), window, initial)
        if not ref.window_invariants_hold(answers, window, initial, decision, calls):
            raise _fail("SCAN-5..8", "invariant broken", answers, args, decision, calls)

    @add(
        "window = reference", "SCAN-5, SCAN-6, SCAN-7, SCAN-8", answers=answer_lists, args=window_args()
    )
    def window_reference(answers: list[LookupResult], args: tuple[int, int | None]) -> None:
        got = run_window(window_scan, answers_of(answers), len(answers), *args)
        want = run_window(ref.sliding_window_lookup, answers_of(answers), len(answers), *args)
        if got != want:
            raise _fail("SCAN-5..8", "differs from the reference", answers, args, got, want)

    @add("window legacy answers", "SCAN-4", answers=mixed_lists, args=window_args())
    def window_legacy(answers: list[object], args: tuple[int, int | None]) -> None:
        _check_legacy(
            "window", answers, lambda a: run_window(window_scan, a, len(answers), *args),
            lambda a: run_window(ref.sliding_window_lookup, a, len(answers), *args),
        )


def _argument_and_shape_properties(
    add: _Add, window_scan: WindowScan, answer_lists: st.SearchStrategy[list[LookupResult]]
) -> None:
    """SCAN-10 (the window scan refuses bad arguments, naming them) and SCAN-9 (``as_legacy``'s shape)."""

    @add(
        "window argument validation",
        "SCAN-10",
        window=st.one_of(st.integers(-3, 6), st.booleans(), st.floats(-2, 6), st.none()),
        initial=st.one_of(st.none(), st.integers(-3, 9), st.booleans(), st.floats(-2, 9)),
        answers=answer_lists,
    )
    def window_arguments(window: object, initial: object, answers: list[LookupResult]) -> None:
        valid = type(window) is int and window >= 1 and (
            initial is None or (type(initial) is int and initial >= window)
        )
        lookup, calls = recorded(answers.__getitem__)
        try:
            window_scan(lookup, range(len(answers)), window, initial_window=initial)
        except InvalidArgumentError as exc:
            if valid:
                raise _fail("SCAN-10", "rejected valid arguments", window, initial, exc) from exc
            if calls:
                raise _fail("SCAN-10", "looked keys up before rejecting", window, initial, calls) from exc
            culprit = window if "initial_window" not in str(exc) else initial
            if repr(culprit) not in str(exc):
                raise _fail("SCAN-10", "error does not name the value", window, initial, str(exc)) from exc
        else:
            if not valid:
                raise _fail("SCAN-10", "accepted invalid arguments", window, initial)

    @add(
        "as_legacy",
        "SCAN-9",
        decision=st.one_of(
            st.builds(Hits, st.integers(0, 2**20)),
            st.builds(Defer, st.sampled_from((LookupResult.HIT_PENDING, LookupResult.RETRY))),
        ),
    )
    def legacy_shape(decision: Decision) -> None:
        want = decision.count if isinstance(decision, Hits) else None
        if as_legacy(decision) != want:
            raise _fail("SCAN-9", "wrong legacy shape", decision, as_legacy(decision))


def _check_legacy(
    which: str,
    answers: Sequence[object],
    run_scan: Callable[[Callable[[int], object]], object],
    run_reference: Callable[[Callable[[int], object]], object],
) -> None:
    """SCAN-4: the scan raises ContractViolation naming the first legacy answer it looks up and its position."""
    answer_of, calls = recorded(answers.__getitem__)
    try:
        got: object = run_scan(answer_of)
    except ContractViolation as exc:
        got = exc
    try:
        want: object = run_reference(answers.__getitem__)
    except ContractViolation as exc:
        want = exc
    looked_up = [answers[p] for p in calls]
    bad = [a for a in looked_up if not isinstance(a, LookupResult)]
    if isinstance(got, ContractViolation):
        if not isinstance(want, ContractViolation) or str(got) != str(want):
            raise _fail("SCAN-4", f"{which} raised unlike the reference", answers, got, want)
        position = calls[-1]
        value = answers[position]
        if bad != [value] or repr(value) not in str(got) or f"#{position}" not in str(got):
            raise _fail("SCAN-4", f"{which} error does not name the value and position", answers, str(got))
    elif bad:
        raise _fail("SCAN-4", f"{which} did not raise on a legacy answer", answers, got)
    elif got != want:
        raise _fail("SCAN-4", f"{which} differs from the reference", answers, got, want)
