"""kvproto: a typed protocol for tiered KV-cache offloading.

The contract lives here: the four-valued :class:`LookupResult`, offload keys,
the request and job values, the structural tier protocols and the scans.
Reference tiers live in ``impls``; the normative text in ``spec/CONTRACT.md``.
"""

from __future__ import annotations

from kvproto import errors
from kvproto._capabilities import Capabilities
from kvproto._jobs import (
    EventKind,
    JobResult,
    OffloadingEvent,
    PrepareStoreOutput,
    ReqContext,
    TransferJob,
)
from kvproto._keys import OffloadKey, make_key, split_key
from kvproto._memory_tier import MemoryTier
from kvproto._protocols import (
    BatchLookup,
    OffloadingManager,
    PrimaryTier,
    ReadyKeys,
    SecondaryTier,
    TierLifecycle,
)
from kvproto._results import LookupResult, unreachable
from kvproto.scan import Decision, Defer, Hits, as_legacy, maximal_prefix_lookup, sliding_window_lookup

__version__ = "0.1.0"

__all__ = [
    "BatchLookup",
    "Capabilities",
    "Decision",
    "Defer",
    "EventKind",
    "Hits",
    "JobResult",
    "LookupResult",
    "MemoryTier",
    "OffloadKey",
    "OffloadingEvent",
    "OffloadingManager",
    "PrepareStoreOutput",
    "PrimaryTier",
    "ReadyKeys",
    "ReqContext",
    "SecondaryTier",
    "TierLifecycle",
    "TransferJob",
    "__version__",
    "as_legacy",
    "errors",
    "make_key",
    "maximal_prefix_lookup",
    "sliding_window_lookup",
    "split_key",
    "unreachable",
]
