"""The failure a conformance check raises: which clause broke, and how (KIT-3)."""

from __future__ import annotations

import re

__all__ = ["ConformanceFailure", "clause_of"]

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


def clause_of(message: str) -> str | None:
    """The clause id a failure message starts with, if any."""
    found = _CLAUSE.match(message.strip())
    return found.group(1) if found else None
