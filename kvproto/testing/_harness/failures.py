"""The failure a conformance check raises: which clause broke, and how (KIT-3)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeVar

__all__ = [
    "SEEN_AFTER_SET_UP",
    "ConformanceFailure",
    "HookRaised",
    "HungCall",
    "SearchHalted",
    "SetUpFailed",
    "answer_of",
    "clause_of",
]

_T = TypeVar("_T")

_CLAUSE = re.compile(r"^\[([A-Z]+-\d+)\]")


class ConformanceFailure(AssertionError):
    """A tier broke ``clause`` of spec/CONTRACT.md; ``detail`` says how, in plain words.

    It derives from :class:`AssertionError` so pytest reports it as a test
    failure (not an error in the test itself). The message starts with the
    clause id in brackets, e.g. ``[TIER-10] load of key ... returned the bytes
    of another key``, so the clause survives any report format (KIT-3).
    """

    def __init__(self, clause: str, detail: str) -> None:
        super().__init__(f"[{clause}] {detail}")
        self.clause = clause
        self.detail = detail


class HungCall(ConformanceFailure):
    """A tier call the kit bounds did not return within its bound (KIT-27): the call's thread is left
    to end on its own, a daemon, and the check fails with the call's clause."""


class SearchHalted(BaseException):
    """Carries ``failure`` (a :class:`HungCall`, or the failure of the example it ended) out of a
    Hypothesis search (KIT-27). It is not an :class:`Exception`, so Hypothesis neither shrinks nor
    replays the example: each replay would wait out the bound again, and leave one more hung thread.
    The machine runner turns it back into ``failure`` with the example's steps."""

    def __init__(self, failure: BaseException) -> None:
        super().__init__(str(failure))
        self.failure = failure


def answer_of(call: Callable[[], _T], clause: str, what: str, rule: str) -> _T:
    """``call()``'s answer, where ``clause`` says a tier answers it: any exception the tier raises is
    the finding, a :class:`ConformanceFailure` of ``clause`` reading ``{what} raised {type}: {error};
    {rule}``, chained to the error (KIT-3)."""
    try:
        return call()
    except Exception as error:  # any error the tier raises is the finding
        raise ConformanceFailure(clause, f"{what} raised {type(error).__name__}: {error}; {rule}") from error


def clause_of(message: str) -> str | None:
    """The clause id a failure message starts with, if any."""
    found = _CLAUSE.match(message.strip())
    return found.group(1) if found else None


SEEN_AFTER_SET_UP = "; what it then saw follows from that: "
"""Where a set-up failure's message goes on to what the check then saw (a report groups by what precedes it)."""


class SetUpFailed(ConformanceFailure):
    """A check could not set up: a step it relies on (a store the kit made no fault for) failed, so
    its own clause (``check_clause``) was not judged. ``clause`` is the clause that governs that
    step (TIER-10 for a store or load job); the runner reports the check as an error, never as a
    failure of its own clause (KIT-17)."""

    def __init__(self, clause: str, step: str, check_clause: str, seen: str | None = None) -> None:
        then = "" if seen is None else f"{SEEN_AFTER_SET_UP}{seen}"
        super().__init__(
            clause, f"set-up failed: {step}, so this check of {check_clause} could not judge the tier{then}"
        )
        self.check_clause = check_clause


class HookRaised(ConformanceFailure):
    """A backdoor hook (KIT-5) raised: the hook's fault, not the tier's; the hook's traceback is in
    the failure's notes (KIT-17)."""

    def __init__(self, hook: str, error: BaseException) -> None:
        super().__init__(
            "KIT-5",
            f"the backdoor hook {hook}() raised {type(error).__name__}: {error} (the error came from the "
            "test hook, not from the tier)",
        )
        self.hook = hook
