"""``expected_failures`` names: a check with or without its ``test_`` prefix; an unknown name is
refused with the closest kit check as a suggestion (KIT-6, KIT-18)."""

from __future__ import annotations

import difflib
from collections.abc import Collection, Mapping

__all__ = ["canonical", "expected_reason", "unknown_names"]


def canonical(name: str, known: Collection[str]) -> str | None:
    """The kit check ``name`` means (``lookup_does_not_block`` or ``test_lookup_does_not_block``);
    None if it names none."""
    for candidate in (name, f"test_{name}"):
        if candidate in known:
            return candidate
    return None


def expected_reason(expected: Mapping[str, str], check: str) -> str | None:
    """The reason ``expected`` gives for ``check`` (listed with or without ``test_``), if any."""
    found = expected.get(check)
    if found is None:
        found = expected.get(check.removeprefix("test_"))
    return found


def unknown_names(expected: Mapping[str, str], known: Collection[str]) -> list[str]:
    """One problem per name of ``expected`` that is no kit check, each with a suggestion:
    ``expected_failures names 'lookup_dos_not_block', which is not a kit check (did you mean
    lookup_does_not_block?)``."""
    problems: list[str] = []
    for name in expected:
        if canonical(name, known) is not None:
            continue
        bare = sorted(k.removeprefix("test_") for k in known)
        close = difflib.get_close_matches(name.removeprefix("test_"), bare, n=1)
        hint = f"did you mean {close[0]}?" if close else "see kvproto conform --explain, or the kit's check names"
        problems.append(f"expected_failures names {name!r}, which is not a kit check ({hint})")
    return problems
