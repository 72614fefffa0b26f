"""Building blocks for tiers (composition, not a required base class: the tier protocols stay structural).

Secondary tiers: a :class:`BlobBackend` (or :class:`AsyncBlobBackend`) is a
tier's storage I/O; ``BlobTier`` turns one into a complete
:class:`kvproto.SecondaryTier` (jobs, envelope, verdicts, events, budget).
"""

from __future__ import annotations

# secondary tiers
from kvproto.tierkit._backend import AsyncBlobBackend, BlobBackend, JobAdmission, Published

__all__ = [
    # secondary tiers
    "AsyncBlobBackend",
    "BlobBackend",
    "JobAdmission",
    "Published",
]
