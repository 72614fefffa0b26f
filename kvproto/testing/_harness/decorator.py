"""How a kit check is declared: the clause it verifies and what it needs (KIT-1, KIT-2)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import pytest

from kvproto.testing._harness.attribution import attributed
from kvproto.testing._harness.expected import not_checked, required
from kvproto.testing._harness.failures import ConformanceFailure
from kvproto.testing._harness.lock_order import LockOrder

__all__ = ["NEEDS", "VACUOUS", "CheckInfo", "check", "checks_of", "info_of"]

NEEDS = "needs capability '{ability}', which the tier does not declare"
"""How a check needing an undeclared capability skips (KIT-4); the runner reads the capability
from the quoted name, so the verdict names the clause left unchecked (CAP-1)."""

VACUOUS = "vacuous: the tier declares capability '{ability}'"
"""How a check that means something only without a capability skips where the tier declares it
(CAP-1: the check of the declared behaviour runs instead)."""

_F = TypeVar("_F", bound=Callable[..., Any])

_ATTR = "__kvproto_check__"


@dataclass(frozen=True, slots=True)
class CheckInfo:
    """One conformance check.

    ``clause``: the spec/CONTRACT.md clause it verifies. ``needs``: capability
    names (fields of :class:`~kvproto.Capabilities`) without which it skips
    (KIT-4). ``hooks``: backdoor hooks of the test class it needs (KIT-5).
    ``hypothesis``: True when Hypothesis drives it, so an expected failure is
    a non-strict xfail (KIT-6). ``unless``: capability names with which it is
    vacuous (it checks the promise of their absence), so it skips where the
    tier declares one, naming it (CAP-1).
    """

    name: str
    clause: str
    summary: str
    needs: tuple[str, ...] = ()
    hooks: tuple[str, ...] = ()
    hypothesis: bool = False
    unless: tuple[str, ...] = ()


def check(
    clause: str,
    *,
    needs: tuple[str, ...] = (),
    hooks: tuple[str, ...] = (),
    hypothesis: bool = False,
    unless: tuple[str, ...] = (),
) -> Callable[[_F], _F]:
    """Mark a test method of a kit base class as the check of ``clause``."""

    def mark(fn: _F) -> _F:
        doc = (fn.__doc__ or fn.__name__).strip().splitlines()[0]
        info = CheckInfo(fn.__name__, clause, doc, needs, hooks, hypothesis, unless)
        # What the check raises is reported against whom it belongs to: the tier, a hook, a set-up step.
        run = _required(fn.__name__, _locks_in_order(attributed(clause, fn)))
        setattr(run, _ATTR, info)
        marked: _F = pytest.mark.kvproto(run)
        if hypothesis:
            marked = pytest.mark.kvproto_hypothesis(marked)
        return marked

    return mark


def _required(name: str, run: Callable[..., Any]) -> Callable[..., Any]:
    """``run`` (a check's body), whose skip fails on KIT-28 where the test class's ``must_check`` lists
    the check: the tier never took the path it needs (a hook that refused nothing, rows it never
    reads with direct I/O)."""

    @functools.wraps(run)
    def check_run(*args: Any, **kwargs: Any) -> Any:
        gated: object = getattr(args[0], "_not_checked", None) if args else None
        if isinstance(gated, str):  # the gate would have skipped it (a capability or a hook missing)
            raise ConformanceFailure("KIT-28", gated)
        try:
            return run(*args, **kwargs)
        except pytest.skip.Exception as skipped:
            must: object = getattr(args[0], "must_check", ()) if args else ()
            if isinstance(must, frozenset) and required(must, name):
                raise ConformanceFailure("KIT-28", not_checked(name, skipped.msg or "skipped")) from None
            raise

    return check_run


def _locks_in_order(run: Callable[..., Any]) -> Callable[..., Any]:
    """``run`` (a check's body), failing on TIER-11 once it returned if the tier's threads took two classes of
    their locks in opposite orders meanwhile (the ``tier`` fixture's :class:`LockOrder`)."""

    @functools.wraps(run)
    def check_run(*args: Any, **kwargs: Any) -> Any:
        ran = run(*args, **kwargs)
        order: object = getattr(args[0], "_lock_order", None) if args else None
        if isinstance(order, LockOrder) and order.inversion is not None:
            raise ConformanceFailure("TIER-11", order.inversion.describe())
        return ran

    return check_run


def info_of(obj: object) -> CheckInfo | None:
    """The :class:`CheckInfo` attached to ``obj`` by :func:`check`, if any."""
    found = getattr(obj, _ATTR, None)
    return found if isinstance(found, CheckInfo) else None


def checks_of(cls: type) -> dict[str, CheckInfo]:
    """Every check ``cls`` or its bases define, in definition order, by the name pytest collects
    it under: a ``test*`` attribute holding a function marked by :func:`check`. One marked body
    may serve under several names (each kind of tier names a shared check for itself); a marked
    function under another name is a body, not a check."""
    found: dict[str, CheckInfo] = {}
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            info = info_of(value)
            if info is not None and name.startswith("test"):
                found[name] = info if info.name == name else replace(info, name=name)
    return found
