"""The manager's one rule for a tier that raises or breaks the contract (MGR-8, MGR-10, MGR-11).

Every tier call the manager makes goes through :meth:`TierGuard.call` (the
lookup path excepted: it is hot, so it catches inline and hands the
exception to :meth:`TierGuard.error` / :meth:`TierGuard.violation`, the same
rule). A tier method that raises is logged with the tier's name (also as the
record's ``kvproto_tier`` attribute, for a handler to count by) and counted
in :attr:`TieringStats.tier_errors`; the caller gets :data:`FAILED` and turns
it into MISS, a failed job, or nothing, as its clause says. A
:class:`~kvproto.errors.KvprotoError` raised by the primary for the
scheduler's own misuse passes through where the caller asks for it (MGR-11).
A contract violation raises in strict mode and is counted otherwise (MGR-8).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from typing import Final, TypeVar, TypeVarTuple

from kvproto._tiering._config import TieringStats
from kvproto.errors import ContractViolation, KvprotoError

__all__ = ["FAILED", "Failed", "TierGuard"]

_log = logging.getLogger("kvproto.tiering")

_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")


class Failed(enum.Enum):
    """The type of :data:`FAILED`: what :meth:`TierGuard.call` returns when the tier raised."""

    FAILED = "failed"


#: The tier call raised (and was logged and counted unless it was expected).
FAILED: Final = Failed.FAILED


class TierGuard:
    """Calls tier methods under the manager's failure rules (MGR-8, MGR-10, MGR-11)."""

    __slots__ = ("_stats", "_strict")

    def __init__(self, stats: TieringStats, *, strict: bool) -> None:
        self._stats = stats
        self._strict = strict

    def call(
        self,
        tier: str,
        method: str | None,
        fn: Callable[[*_Ts], _T],
        *args: *_Ts,
        misuse_raises: bool = False,
    ) -> _T | Failed:
        """``fn(*args)``, or :data:`FAILED` if it raised (MGR-10).

        ``method`` names the call in the log line; ``None`` marks a refusal the
        caller expects and handles (a batch it retries key by key, a key that
        is not READY): not logged, not counted. With ``misuse_raises`` a
        :class:`~kvproto.errors.KvprotoError` passes through: the primary
        refusing the scheduler's own misuse (MGR-11).
        """
        try:
            return fn(*args)
        except Exception as exc:  # the one place a tier's failure is absorbed (MGR-10)
            if misuse_raises and isinstance(exc, KvprotoError):
                raise
            if method is not None:
                self.error(tier, method, exc)
            return FAILED

    def error(self, tier: str, method: str, exc: BaseException) -> None:
        """Log and count a tier method that raised (MGR-10)."""
        self._stats.tier_errors += 1
        _log.warning("tier %r raised in %s: %r", tier, method, exc, exc_info=exc, extra={"kvproto_tier": tier})

    def violation(self, exc: ContractViolation) -> None:
        """Raise ``exc`` in strict mode; else count it and log that it is handled as MISS (MGR-8)."""
        if self._strict:
            raise exc
        self._stats.contract_violations += 1
        _log.warning("contract violation handled as MISS: %s", exc)
