"""The four-valued lookup result (LR-1..LR-4) and the exhaustive-default helper."""

from __future__ import annotations

import enum
from typing import NoReturn

from kvproto.errors import ContractViolation

__all__ = ["LookupResult", "unreachable"]


class LookupResult(enum.Enum):
    """What a tier knows about one key right now (LR-1).

    A plain :class:`enum.Enum` on purpose: it has no truth value that means
    anything, so ``if tier.lookup(key):`` is a ``truthy-bool`` error under
    kvproto's mypy configuration, and every consumer must ``match`` all four
    members.

    * ``MISS``: not stored, or cannot be brought in.
    * ``HIT``: stored and readable now.
    * ``HIT_PENDING``: present in the primary tier but its write is still in
      flight; it will be readable, not yet. Never answered by a secondary
      tier (LR-3).
    * ``RETRY``: unknown yet (an asynchronous check is pending, or a promotion
      was just started). Never answered by the primary tier (LR-4).
    """

    MISS = "miss"
    HIT = "hit"
    HIT_PENDING = "hit_pending"
    RETRY = "retry"

    def __repr__(self) -> str:
        return f"LookupResult.{self.name}"

    @classmethod
    def from_legacy(cls, value: object, *, pending: LookupResult) -> LookupResult:
        """Translate a legacy ``bool | None`` answer at a tier boundary (LR-5).

        ``True`` is ``HIT`` and ``False`` is ``MISS``. The caller must say what
        ``None`` meant for the tier it wraps: ``HIT_PENDING`` for a primary
        tier, ``RETRY`` for a secondary tier. Anything else (including ints,
        which are not bools) raises :class:`~kvproto.errors.ContractViolation`.
        """
        if pending is not LookupResult.HIT_PENDING and pending is not LookupResult.RETRY:
            raise ContractViolation(
                f"from_legacy(pending={pending!r}): None may only mean "
                "LookupResult.HIT_PENDING (primary tier) or LookupResult.RETRY (secondary tier)"
            )
        if value is True:
            return LookupResult.HIT
        if value is False:
            return LookupResult.MISS
        if value is None:
            return pending
        raise ContractViolation(
            f"legacy lookup answered {value!r} of type {type(value).__name__}; "
            "expected True, False or None"
        )


def unreachable(value: NoReturn, *, where: str) -> NoReturn:
    """The exhaustive default of every ``match`` on a closed type.

    mypy proves the call unreachable (its argument must be ``Never``); at run
    time, a value outside the type (a legacy tier answering ``None``) reaches
    it, and it raises :class:`~kvproto.errors.ContractViolation` naming the
    value and ``where`` it came from, never a bare ``AssertionError``.
    """
    raise ContractViolation(
        f"{where}: got {value!r} of type {type(value).__name__}, "
        "which is not a member of the closed type the contract requires"
    )
