"""Broken tiers for where a tier writes and what its fault paths raise (issue 17, sections 1 and 5;
TIER-37, TIER-38, TIER-39), and one that holds only its own HITs (TIER-26). Two are ObjTiers over an
in-memory store whose requests go through kvproto-obj's :class:`~kvproto_obj._conformance.KitStoreOps`
(OBJ-13), built as gallery_store.py builds them; two are BlobTiers over a FaultyBackend with the
mutation specs' hooks (mutation_specs.py). Each has one bug a mutant showed the kit passed
(docs/mutation/obj.json, blobtier.json): every answer stays right, so only the new checks see them.

Each factory's ``fails`` decorator registers its ``kvproto conform`` target in ``NAMESPACE_GALLERY``
with the check and clause it must fail on (gallery_registry.py); gallery_index.py gathers it into
``GALLERY``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kvproto import LookupResult, OffloadKey, ReqContext, envelope as env
from kvproto.testing import FaultyBackend, FaultyJobs, TierSpec, fresh_directory
from kvproto.tierkit import BlobTier, BlobTierConfig, MemoryBackend, Published

from kvproto_obj import ObjTier, ObjTierConfig
from kvproto_obj._backend import ObstoreBackend
from tests.kvproto.testing.gallery import _QUICK
from tests.kvproto.testing.gallery_io import _Files
from tests.kvproto.testing.gallery_registry import Gallery
from tests.kvproto.testing.gallery_store import _spec
from tests.kvproto.testing.mutation_specs import _HOOKS as _BLOB_HOOKS, HeldMemory

NAMESPACE_GALLERY = Gallery()
"""This module's targets, each registered by its factory's ``fails`` decorator (gallery_registry.py)."""

_log = logging.getLogger("kvproto_obj")


class ManifestOfAnotherLayout(FaultyJobs, ObjTier):
    """Bug: the start-up check (OBJ-1) computes the layout manifest from the buffer's row COUNT in
    place of its row length, so it writes the manifest of another namespace (the engine still writes
    the right one in the background: every answer stays right)."""

    def _check_store(self, buffer: memoryview, name: str) -> None:
        rows, row_bytes = buffer.shape or (0, 0)
        swapped = buffer.cast("B").cast("B", (row_bytes, rows))  # the bug: shape[0] read as the row length
        super()._check_store(swapped, name)


@NAMESPACE_GALLERY.fails("test_a_tier_writes_only_under_its_own_namespace", "TIER-37", "outside its own namespace")
def manifest_of_another_layout() -> TierSpec:
    return _spec(ManifestOfAnotherLayout)


class _WarnsOffByOne(ObstoreBackend):
    """Bug: after a failed listing, the warning names the failure by an index one too far
    (``errors[count]``): one failed listing raises IndexError, which the engine's per-key fallback
    (TIERKIT-5) hides behind HEADs that answer the same."""

    async def _listed(self, namespace: str, names: list[str], pages: int) -> dict[str, int | None]:
        before = self._stats.list_errors
        listed = await super()._listed(namespace, names, pages)
        failed = self._stats.list_errors - before
        if failed:
            errors = [f"listing {i + 1} of {namespace}" for i in range(failed)]
            _log.info("ObjTier: last failed listing: %s", errors[failed])  # the bug: errors[failed - 1]
        return listed


class ListingWarningRaises(FaultyJobs, ObjTier):
    """An ObjTier whose backend is :class:`_WarnsOffByOne`."""

    def __init__(self, buffer: memoryview, config: ObjTierConfig, **kwargs: Any) -> None:
        super().__init__(buffer, config, **kwargs)
        self._io.__class__ = _WarnsOffByOne  # the same backend object (the engine holds it), the buggy warning


@NAMESPACE_GALLERY.fails("test_storage_faults_never_surface_as_programming_errors", "TIER-38", "logged IndexError")
def listing_warning_raises() -> TierSpec:
    return _spec(ListingWarningRaises)


class ClosesTwiceUnguarded(FaultyJobs):
    """Bug: after the engine's shutdown (which closes the backend and logs a failure), shutdown closes the
    backend once more without catching its error: a storage failing to close raises out of shutdown."""

    def shutdown(self) -> None:
        try:
            super().shutdown()
        finally:
            self.backend.close()  # the bug: a second close, unguarded


@NAMESPACE_GALLERY.fails("test_shutdown_returns_while_storage_requests_fail", "TIER-39", "raised OSError")
def closes_twice_unguarded() -> TierSpec:
    def build(buffer: memoryview) -> BlobTier:
        return ClosesTwiceUnguarded(FaultyBackend(MemoryBackend()), buffer, BlobTierConfig(), name="closes-twice")

    return TierSpec("closes_twice_unguarded", "secondary", build, hooks=_BLOB_HOOKS, limits=_QUICK,
                    tier_class=ClosesTwiceUnguarded)


class HoldsOnlyItsOwnHits(FaultyJobs):
    """Bug: a HIT is held (TIERKIT-6) only for a block this instance vouches for (its index); a HIT the
    probe found, a block another instance stored, is answered without a handle, so that instance's
    deletion makes the load fail."""

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if key in self._index or self._complete or key in self._unusable:
            return super().lookup(key, req_context)
        return self._probe.lookup(key, req_context)  # the bug: the probe's HIT, no handle taken


@NAMESPACE_GALLERY.fails(
    "test_a_hit_loads_after_another_instance_deleted_the_block", "TIER-26", "failed after a second instance deleted"
)
def holds_only_its_own_hits() -> TierSpec:
    config = BlobTierConfig(shared=True)

    def build(buffer: memoryview) -> BlobTier:
        return HoldsOnlyItsOwnHits(FaultyBackend(HeldMemory()), buffer, config, name="holds-own")

    return TierSpec("holds_only_its_own_hits", "secondary", build, hooks=_BLOB_HOOKS, limits=_QUICK,
                    tier_class=HoldsOnlyItsOwnHits)


class ScanStopsAfterItsFirstBatch(FaultyJobs):
    """Bug: a private tier's restart scan stops after the first batch it indexes (256 blobs), so a new
    instance over a storage of more blocks answers MISS for the rest: every block a check of a few
    finds is still found."""

    def _add_scanned(self, keys: list[tuple[OffloadKey, int]], generation: int) -> bool:
        super()._add_scanned(keys, generation)
        return False  # the bug: "stop" after every batch


def _reopen_scan_stops(tier: object, buffer: memoryview) -> BlobTier:
    assert isinstance(tier, BlobTier) and isinstance(tier.backend, FaultyBackend)
    return ScanStopsAfterItsFirstBatch(FaultyBackend(tier.backend.inner), buffer, tier.blob_config, name=tier.name)


@NAMESPACE_GALLERY.fails("test_persistence_of_many_blocks", "TIER-18", "one of")
def scan_stops_after_its_first_batch() -> TierSpec:
    def build(buffer: memoryview) -> BlobTier:
        return ScanStopsAfterItsFirstBatch(FaultyBackend(MemoryBackend()), buffer, BlobTierConfig(), name="scan-stops")

    return TierSpec("scan_stops_after_its_first_batch", "secondary", build,
                    hooks={**_BLOB_HOOKS, "reopen": _reopen_scan_stops}, limits=_QUICK,
                    tier_class=ScanStopsAfterItsFirstBatch)


class _SidecarBlobs(MemoryBackend):
    """Blobs in memory, each with a sidecar record (``<name>.meta``: its size, as a store that keeps an
    index beside its blobs) written at publish; a delete forgets the sidecar, ``clear`` removes both."""

    def __init__(self) -> None:
        super().__init__()
        self.sidecars: dict[str, int] = {}

    def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        published = super().publish(name, parts, size)
        with self._lock:
            self.sidecars.setdefault(f"{name}.meta", size)
        return published

    def delete(self, name: str) -> None:
        super().delete(name)  # the bug: the sidecar stays (del self.sidecars[f"{name}.meta"] is missing)

    def clear(self, namespace: str) -> None:
        super().clear(namespace)
        with self._lock:
            for name in [n for n in self.sidecars if n.startswith(namespace + "/")]:
                del self.sidecars[name]


class EvictionLeavesSidecars(FaultyJobs):
    """Bug: a private tier with a byte budget whose backend keeps a sidecar record per blob and deletes
    only the blob: every eviction is reported and the blocks left keep the budget, yet the storage grows
    by one record per eviction, without bound (a held-out Redis tier left a chunk per evicted blob)."""

    def __init__(self, buffer: memoryview) -> None:
        row = buffer.nbytes // len(buffer)
        self.blobs = _SidecarBlobs()
        config = BlobTierConfig(shared=False, start_in_background=False, max_bytes=16 * (env.HEADER_BYTES + row))
        super().__init__(self.blobs, buffer, config, name="eviction-leaves-sidecars", wrap=FaultyBackend)


def _sidecar_names(tier: EvictionLeavesSidecars) -> list[str]:
    with tier.blobs._lock:
        return [*tier.blobs.blobs, *tier.blobs.sidecars]


@NAMESPACE_GALLERY.fails("test_evictions_leave_nothing_behind", "TIER-29", "its evictions leave something behind")
def eviction_leaves_sidecars() -> TierSpec:
    return TierSpec(
        "EvictionLeavesSidecars", "secondary", EvictionLeavesSidecars, limits=_QUICK, tier_class=EvictionLeavesSidecars,
        hooks={"storage_names": _sidecar_names},
    )


class LabelledLayouts(BlobTier):
    """Bug: the namespace is made from a readable label, ``basename(model)__dtype`` (one path part, so that
    operators can tell the caches apart), not from the whole layout: two owners' models of one name, or a
    layout differing in a field the label leaves out, share blocks (held-out round 9's quota directory served
    a base model's KV to its fine-tune)."""

    def __init__(self, buffer: memoryview, *, root: Path | None = None, layout: Mapping[str, str] | None = None) -> None:
        self.root = fresh_directory("kvproto-gallery-labelled-") if root is None else root
        self.layout = dict(layout or {"model": "kit/labelled"})
        label = f"{os.path.basename(self.layout.get('model', ''))}__{self.layout.get('dtype', 'auto')}"
        files = _Files(self.root, one_call=False, close_on_error=True)
        config = BlobTierConfig(shared=True, start_in_background=False, layout={"label": label})  # the bug
        super().__init__(files, buffer, config, name="labelled-layouts")


def _reopen_labelled(tier: LabelledLayouts, buffer: memoryview) -> LabelledLayouts:
    return LabelledLayouts(buffer, root=tier.root, layout=tier.layout)


def _labelled_with_layout(tier: LabelledLayouts, buffer: memoryview, layout: Mapping[str, str]) -> LabelledLayouts:
    return LabelledLayouts(buffer, root=tier.root, layout={**tier.layout, **layout})


@NAMESPACE_GALLERY.fails("test_layouts_that_differ_slightly_keep_apart", "TIER-22", "share a namespace")
def labelled_layouts() -> TierSpec:
    return TierSpec("labelled-layouts", "secondary", LabelledLayouts, limits=_QUICK, tier_class=LabelledLayouts,
                    hooks={"reopen": _reopen_labelled, "reopen_with_layout": _labelled_with_layout})
