"""Tier building blocks: what every tier needs, so that a tier is its storage I/O plus configuration.

Composition, not a required base class: the tier protocols (:class:`kvproto.PrimaryTier`,
:class:`kvproto.SecondaryTier`) stay structural, and a tier built from scratch is as valid as one
built from these pieces.

Primary tiers:

* :class:`SlotTable`: the primary tier's state machine (slots, :class:`BlockState`, counted pins,
  all-or-nothing ``prepare_store``, pending deadline and quarantine, bounded events, the live
  ``ready_keys`` view); a subclass adds a buffer and is a primary tier (TIER-3..TIER-17, CPU-3..CPU-10).
* :class:`EvictionPolicy` with :class:`LruPolicy` and :class:`ArcPolicy` (CPU-6).
* ``HOST_PRIMARY_CAPABILITIES``: what such a primary over one process's host memory declares.

Secondary tiers:

* :class:`BlobTier` over a :class:`BlobBackend` (or :class:`AsyncBlobBackend`): the backend is a
  tier's storage I/O (publish create-if-absent, read into the slot row, sizes, delete, list); the
  engine owns names, the envelope, jobs, verdicts, events (at most :data:`MAX_PENDING_EVENTS`),
  budget, reset (TIERKIT-1..TIERKIT-4). :class:`MemoryBackend` keeps blobs in a dict. A backend
  offering :class:`ExistenceBatches` sees each existence batch whole before its chunks (TIERKIT-7);
  one offering :class:`PublishBatches` (:class:`ReadBatches`) stores (loads) a job's blocks in batches
  (TIERKIT-11).

A tier's own settings and constructor (what ``kvproto-fs``, ``kvproto-obj``, ``kvproto-redis`` and
``kvproto-mooncake`` share; none needs pydantic, all suit a pydantic settings model):

* :class:`TierSettings`: the pydantic base of a tier's settings class (frozen, strict, no unknown field,
  ``from_mapping``, ``text_fields`` given as text made typed), :class:`SharedStoreTierSettings`, with the
  fields every tier over shared storage has, and :class:`RemoteStoreTierSettings`, adding a network store's
  connect timeout and retry backoffs (all loaded at their first use, so ``import kvproto.tierkit`` needs
  no pydantic).
* :func:`config_errors` turns a settings model's refusal into one :class:`~kvproto.errors.ConfigurationError`
  naming every offending field; :func:`config_from_mapping` builds settings from a mapping (TOML);
  :func:`tier_config` refuses a constructor's config of the wrong class; ``LayoutValue`` types the
  integrator's layout fingerprint.
* :func:`layout_manifest`: the layout manifest's blob name and bytes, for a tier that writes it at
  construction so that unusable storage fails there; :func:`storage_check` turns that check's error
  into a ConfigurationError naming the tier and what it could not do.
* :func:`shared_store_config` and :func:`shared_store_capabilities`: the engine settings and the
  declaration of a tier over storage other instances share (a bucket, a server, a cluster), from its
  :class:`SharedStoreSettings`; :class:`SharedStoreTier`, the BlobTier built from them (the start-up check
  when ``check_on_start``, its backend released if construction fails, ``key_of``, ``namespace_prefix``,
  ``known_keys``).

Scans over a ready view (MGR-20):

* :func:`ready_prefix_scan` / :func:`ready_window_scan` with :func:`ready_flags`: the tiering
  manager's batched scans, for any lookup over a primary's ``ready_keys`` view: runs of keys in the
  view are tested in one C pass, every other key is looked up at its turn.

Wrappers:

* :class:`ForwardingSecondary` and :class:`ForwardingPrimary`: forward every call to ``inner``;
  a wrapper (latency, faults, metrics) overrides only what it changes (KIT-15).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from kvproto._events import MAX_PENDING_EVENTS
from kvproto._ready_scans import (
    FlagsOf as ReadyFlags,
    batched_prefix as ready_prefix_scan,
    batched_window as ready_window_scan,
    fast_flags as ready_flags,
)
from kvproto._slot_buffer import slot_buffer_shape
from kvproto.tierkit._backend import (
    AsyncBlobBackend,
    AsyncBlobBytes,
    AsyncExistenceBatches,
    BlobBackend,
    ExistenceBatches,
    HeldExistence,
    HeldReads,
    JobAdmission,
    PublishBatches,
    Published,
    ReadBatches,
)
from kvproto.tierkit._blob_config import BlobTierConfig, BlobTierStats
from kvproto.tierkit._blob_ops import blob_name
from kvproto.tierkit._blob_scan import PROBE_CHUNK_KEYS
from kvproto.tierkit._blob_tier import BlobTier
from kvproto.tierkit._eviction import ArcPolicy, EvictionPolicy, LruPolicy, PolicyName, make_policy
from kvproto.tierkit._forwarding import ForwardingPrimary, ForwardingSecondary, declared_capabilities
from kvproto.tierkit._memory_backend import MemoryBackend
from kvproto.tierkit._shared_store_tier import SharedStoreStartup, SharedStoreTier
from kvproto.tierkit._slots import HOST_PRIMARY_CAPABILITIES, BlockState, SlotStats, SlotTable
from kvproto.tierkit._tier_settings import (
    LayoutValue,
    SharedStoreSettings,
    config_errors,
    config_from_mapping,
    layout_manifest,
    shared_store_capabilities,
    shared_store_config,
    storage_check,
    tier_config,
)

if TYPE_CHECKING:
    from kvproto.tierkit._settings_model import RemoteStoreTierSettings, SharedStoreTierSettings, TierSettings

__all__ = [
    # primary tiers
    "HOST_PRIMARY_CAPABILITIES",
    "ArcPolicy",
    "BlockState",
    "EvictionPolicy",
    "LruPolicy",
    "PolicyName",
    "SlotStats",
    "SlotTable",
    "make_policy",
    # secondary tiers
    "MAX_PENDING_EVENTS",
    "PROBE_CHUNK_KEYS",
    "AsyncBlobBackend",
    "AsyncBlobBytes",
    "AsyncExistenceBatches",
    "BlobBackend",
    "BlobTier",
    "BlobTierConfig",
    "BlobTierStats",
    "ExistenceBatches",
    "HeldExistence",
    "HeldReads",
    "JobAdmission",
    "MemoryBackend",
    "PublishBatches",
    "Published",
    "ReadBatches",
    "blob_name",
    "slot_buffer_shape",
    # a tier's own settings and constructor
    "LayoutValue",
    "RemoteStoreTierSettings",
    "SharedStoreSettings",
    "SharedStoreStartup",
    "SharedStoreTier",
    "SharedStoreTierSettings",
    "TierSettings",
    "config_errors",
    "config_from_mapping",
    "layout_manifest",
    "shared_store_capabilities",
    "shared_store_config",
    "storage_check",
    "tier_config",
    # scans over a ready view
    "ReadyFlags",
    "ready_flags",
    "ready_prefix_scan",
    "ready_window_scan",
    # wrappers
    "ForwardingPrimary",
    "ForwardingSecondary",
    "declared_capabilities",
]


def __getattr__(name: str) -> object:
    """The pydantic bases on first use: their module imports pydantic, which ``import kvproto.tierkit`` does not."""
    if name not in ("TierSettings", "SharedStoreTierSettings", "RemoteStoreTierSettings"):
        raise AttributeError(f"module 'kvproto.tierkit' has no attribute {name!r}")
    value: object = getattr(importlib.import_module("kvproto.tierkit._settings_model"), name)
    globals()[name] = value
    return value
