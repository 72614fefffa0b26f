"""Building blocks for tiers (composition, not a required base class: the tier protocols stay structural).

Secondary tiers: a :class:`BlobBackend` (or :class:`AsyncBlobBackend`) is a
tier's storage I/O; :class:`BlobTier` turns one into a complete
:class:`kvproto.SecondaryTier` (jobs, envelope, verdicts, events, budget).
:class:`MemoryBackend` keeps blobs in a dict (tests, examples).
:data:`MAX_PENDING_EVENTS`: how many untaken events a tier keeps at most.
"""

from __future__ import annotations

# secondary tiers
from kvproto._events import MAX_PENDING_EVENTS
from kvproto.tierkit._backend import AsyncBlobBackend, BlobBackend, JobAdmission, Published
from kvproto.tierkit._blob_config import BlobTierConfig, BlobTierStats
from kvproto.tierkit._blob_ops import blob_name
from kvproto.tierkit._blob_tier import BlobTier
from kvproto.tierkit._memory_backend import MemoryBackend

__all__ = [
    # secondary tiers
    "MAX_PENDING_EVENTS",
    "AsyncBlobBackend",
    "BlobBackend",
    "BlobTier",
    "BlobTierConfig",
    "BlobTierStats",
    "JobAdmission",
    "MemoryBackend",
    "Published",
    "blob_name",
]
