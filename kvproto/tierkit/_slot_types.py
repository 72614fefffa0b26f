"""The public types of :class:`~kvproto.tierkit.SlotTable`: block states, counters, host capabilities (CPU-3, KIT-2)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kvproto._capabilities import Capabilities

__all__ = ["HOST_PRIMARY_CAPABILITIES", "BlockState", "SlotStats"]


class BlockState(enum.Enum):
    """Where one key stands in a primary tier built on :class:`SlotTable` (CPU-3)."""

    ABSENT = "absent"
    WRITING = "writing"
    READY = "ready"
    PINNED = "pinned"


@dataclass(slots=True)
class SlotStats:
    """Counters an operator can read (``tier.stats``)."""

    stores_completed: int = 0
    stores_failed: int = 0
    evictions: int = 0
    expired_writes: int = 0
    late_completions: int = 0
    abandoned_stores: int = 0  # ended by quarantine_stores: key free, slot held (MGR-17)
    released_slots: int = 0  # held slots given back by release_slots


#: What a primary tier on a SlotTable over one process's host memory declares (KIT-2): it evicts,
#: never answers RETRY, keeps nothing across restarts and completes each store per call.
HOST_PRIMARY_CAPABILITIES = Capabilities(
    eviction=True,
    reasons={
        "async_lookup": "a primary tier never answers RETRY",
        "persistence": "host memory",
        "sharing": "one process's buffer",
        "partial_jobs": "stores complete per call",
    },
)
