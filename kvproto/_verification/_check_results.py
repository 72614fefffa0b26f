"""What a scan verification check reports: :class:`CheckResult`, :class:`Check`, and the
:class:`Counterexample` an exhaustive check finds, printed as ``kvproto verify`` prints them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import TypeAlias

from kvproto._results import LookupResult, unreachable
from kvproto._verification._inputs import LEGACY_ANSWER
from kvproto.scan import Decision, Defer, Hits

__all__ = ["Check", "CheckResult", "Counterexample", "Outcome", "show_decision", "show_outcome"]


@dataclass(frozen=True, slots=True)
class CheckResult:
    """The outcome of one check: what it explored, whether it passed, how long it took."""

    check: str
    clauses: str
    explored: int | None
    unit: str
    passed: bool
    seconds: float
    detail: str = ""
    #: The first inputs on which the scan and the reference differ (exhaustive checks).
    counterexamples: tuple[Counterexample, ...] = ()
    #: Reports expected differences and never fails (:func:`legacy_conflation`).
    informational: bool = False

    def to_json(self) -> dict[str, object]:
        """Every field, ``seconds`` rounded to ms and each counterexample as its own JSON."""
        data: dict[str, object] = {f.name: getattr(self, f.name) for f in fields(self)}
        data["seconds"] = round(self.seconds, 3)
        data["counterexamples"] = [c.to_json() for c in self.counterexamples]
        return data


@dataclass(frozen=True, slots=True)
class Check:
    """A named check, run by calling ``run``."""

    name: str
    kind: str  # "crosshair", "exhaustive" or "property"
    run: Callable[[], CheckResult]


#: A run of a scan: its decision (or what it raised) and the positions it looked up.
Outcome: TypeAlias = tuple[Decision | Exception, tuple[int, ...]]


def show_decision(decision: Decision) -> str:
    """``Hits(3)`` or ``Defer(RETRY)``: a decision as counterexamples print it."""
    match decision:
        case Hits(count=count):
            return f"Hits({count})"
        case Defer(cause=cause):
            return f"Defer({cause.name})"
        case _:
            unreachable(decision, where="show_decision(decision)")


def show_outcome(outcome: Decision | Exception, show: Callable[[Decision], str]) -> str:
    if isinstance(outcome, Exception):
        return f"raised {type(outcome).__name__}: {outcome}"
    return show(outcome)


def _show_run(answer: str, calls: Sequence[int]) -> str:
    """``looked up #0 #1, answered Hits(1)``: a run as counterexamples print it."""
    looked_up = "looked up nothing" if not calls else "looked up " + " ".join(f"#{p}" for p in calls)
    verb = "" if answer.startswith("raised ") else "answered "
    return f"{looked_up}, {verb}{answer}"


@dataclass(frozen=True, slots=True)
class Counterexample:
    """One input on which a scan and the reference differ, with both answers and lookup calls.

    ``scan`` and ``reference`` are printed decisions (``Hits(3)``, ``Defer(RETRY)``;
    ``3`` or ``None`` for a scan that returns the legacy ``int | None``) or
    ``raised Error: message``. ``calls`` are the positions looked up, in call order.
    ``window`` is None for the prefix scan. ``legacy_answers``: the scan's lookup
    answered ``bool | None`` (HIT True, MISS False, HIT_PENDING and RETRY None).
    """

    clause: str
    answers: tuple[LookupResult, ...]
    window: int | None
    initial_window: int | None
    scan: str
    scan_calls: tuple[int, ...]
    reference: str
    reference_calls: tuple[int, ...]
    legacy_answers: bool = False

    def describe(self) -> str:
        """One line: the clause, the input, the scan's answer and the reference's."""
        answers = "[" + ", ".join(a.name for a in self.answers) + "]"
        if self.legacy_answers:
            answers += " (lookup said [" + ", ".join(repr(LEGACY_ANSWER[a]) for a in self.answers) + "])"
        where = "" if self.window is None else f", window={self.window}, initial_window={self.initial_window}"
        return (
            f"{self.clause}: answers {answers}{where}: "
            f"scan {_show_run(self.scan, self.scan_calls)}; "
            f"reference {_show_run(self.reference, self.reference_calls)}"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "clause": self.clause,
            "answers": [a.name for a in self.answers],
            "lookup_said": [LEGACY_ANSWER[a] for a in self.answers] if self.legacy_answers else None,
            "window": self.window,
            "initial_window": self.initial_window,
            "scan": self.scan,
            "scan_calls": list(self.scan_calls),
            "reference": self.reference,
            "reference_calls": list(self.reference_calls),
        }
