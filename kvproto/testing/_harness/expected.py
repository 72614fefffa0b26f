"""``expected_failures`` names: a check with or without its ``test_`` prefix; an unknown name is
refused with the closest kit check as a suggestion (KIT-6, KIT-18)."""

from __future__ import annotations

import difflib
from collections.abc import Collection, Mapping

__all__ = ["canonical", "expected_reason", "not_checked", "required", "unknown_names"]


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


def required(must_check: Collection[str], check: str) -> bool:
    """Whether ``must_check`` (a spec's checks that must reach a verdict, KIT-28) lists ``check``,
    with or without ``test_``."""
    return check in must_check or check.removeprefix("test_") in must_check


def not_checked(check: str, reason: str) -> str:
    """KIT-28's failure: ``check``, which the spec's ``must_check`` lists, would end not checked for ``reason``."""
    return (
        f"{check.removeprefix('test_')} was not checked ({reason}), but the tier's spec lists it in must_check: the "
        "tier no longer takes the path the check needs, or no longer declares what it needs"
    )


def unknown_names(expected: Collection[str], known: Collection[str], *, field: str = "expected_failures") -> list[str]:
    """One problem per name of ``expected`` (the names of the spec's ``field``) that is no kit check,
    each with a suggestion: ``expected_failures names 'lookup_dos_not_block', which is not a kit check
    (did you mean lookup_does_not_block?)``."""
    problems: list[str] = []
    for name in expected:
        if canonical(name, known) is not None:
            continue
        bare = sorted(k.removeprefix("test_") for k in known)
        close = difflib.get_close_matches(name.removeprefix("test_"), bare, n=1)
        hint = f"did you mean {close[0]}?" if close else "see kvproto conform --explain, or the kit's check names"
        problems.append(f"{field} names {name!r}, which is not a kit check ({hint})")
    return problems
