"""The scans' decisions and the shared instances they hand out (SCAN-1, SCAN-3, SCAN-8, SCAN-9).

:class:`Hits`, :class:`Defer` and ``Decision`` are public as :mod:`kvproto.scan`'s; they live here,
below both the per-key scans (:mod:`kvproto.scan`) and the batched scans over a ready view
(:mod:`kvproto._ready_scans`, MGR-20), so that both hand out the same shared values and neither
imports the other's private names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, TypeAlias

from kvproto import members as lr
from kvproto._results import LookupResult

__all__ = ["DEFER_PENDING", "DEFER_RETRY", "HITS_CACHED", "Decision", "Defer", "Hits", "hits_cache", "shared_hits"]


@dataclass(frozen=True, slots=True)
class Hits:
    """Load now: ``count`` leading blocks (prefix scan) or the window's end index (window scan)."""

    count: int


@dataclass(frozen=True, slots=True)
class Defer:
    """Ask again next step; ``cause`` is HIT_PENDING or RETRY (SCAN-3, SCAN-8)."""

    cause: LookupResult


Decision: TypeAlias = Hits | Defer

# Decisions are immutable values, so the scans hand out shared instances:
# building a frozen dataclass costs far more than a whole short scan.
DEFER_RETRY: Final = Defer(lr.RETRY)
DEFER_PENDING: Final = Defer(lr.HIT_PENDING)
HITS_CACHED = 1 << 16  # counts below this are cached (a 1M-token prompt at 16 tokens/block)
hits_cache: dict[int, Hits] = {}


def shared_hits(count: int) -> Hits:
    """``Hits(count)``, shared for counts below ``HITS_CACHED``."""
    found = hits_cache.get(count)
    if found is None:
        found = Hits(count)
        if count < HITS_CACHED:
            hits_cache[count] = found
    return found
