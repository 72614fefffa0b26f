"""kvproto: a typed protocol for tiered KV-cache offloading.

Every name a user writes is exported here: the four-valued
:class:`LookupResult`, offload keys, the request, job and event values, the
structural tier protocols, the scans, the tiering manager, :class:`AsyncProbe`
and the in-memory reference tiers. The public submodules are
:mod:`kvproto.errors`, :mod:`kvproto.members`, :mod:`kvproto.scan`,
:mod:`kvproto.testing` (the conformance kit) and :mod:`kvproto.tierkit` (tier
building blocks); every other module is private.
The normative text is ``spec/CONTRACT.md``.
"""

from __future__ import annotations

from kvproto import errors
from kvproto._async_probe import AsyncProbe, BatchCheck
from kvproto._capabilities import Capabilities
from kvproto._events import EventKind, OffloadingEvent
from kvproto._jobs import JobResult, PrepareStoreOutput, TransferJob
from kvproto._keys import MAX_GROUP, OffloadKey, make_key, split_key
from kvproto._memory_primary_tier import BlockState, MemoryPrimaryTier
from kvproto._memory_tier import MemoryTier
from kvproto._protocols import (
    BatchLookup,
    JobTimeBound,
    OffloadingManager,
    PrimaryTier,
    ReadyKeys,
    SecondaryTier,
    SlotQuarantine,
    TierLifecycle,
)
from kvproto._requests import ReqContext
from kvproto._results import LookupResult, unreachable
from kvproto._tiering import TieringConfig, TieringManager, TieringStats
from kvproto._version import __version__
from kvproto.scan import Decision, Defer, Hits, as_legacy, maximal_prefix_lookup, sliding_window_lookup

__all__ = [
    "MAX_GROUP",
    "AsyncProbe",
    "BatchCheck",
    "BatchLookup",
    "BlockState",
    "Capabilities",
    "Decision",
    "Defer",
    "EventKind",
    "Hits",
    "JobResult",
    "JobTimeBound",
    "LookupResult",
    "MemoryPrimaryTier",
    "MemoryTier",
    "OffloadKey",
    "OffloadingEvent",
    "OffloadingManager",
    "PrepareStoreOutput",
    "PrimaryTier",
    "ReadyKeys",
    "ReqContext",
    "SecondaryTier",
    "SlotQuarantine",
    "TierLifecycle",
    "TieringConfig",
    "TieringManager",
    "TieringStats",
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
