"""Events a tier reports about its blocks (TIER-14)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kvproto._keys import OffloadKey

__all__ = ["MAX_PENDING_EVENTS", "EventKind", "OffloadingEvent"]

#: The most events kvproto's reference tiers keep for ``take_events``; beyond, the oldest are dropped.
MAX_PENDING_EVENTS = 65_536


class EventKind(enum.Enum):
    """What happened to the blocks of an :class:`OffloadingEvent`."""

    STORED = "stored"
    REMOVED = "removed"


@dataclass(frozen=True, slots=True)
class OffloadingEvent:
    """Blocks that became readable in (``STORED``) or left (``REMOVED``) a tier (TIER-14)."""

    kind: EventKind
    keys: tuple[OffloadKey, ...]
    tier: str
