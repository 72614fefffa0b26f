"""Broken tiers for faults and request plans below an object-store tier's backend (issue 17, sections 1
and 5; TIER-10, TIER-23, TIER-31, TIER-33, TIER-34, KIT-20, KIT-21): ObjTiers over an in-memory store whose
requests go through kvproto-obj's :class:`~kvproto_obj._conformance.KitStoreOps` (OBJ-13), so the kit
counts their requests, fails them, and answers their conditional writes as some S3 providers do.
Each has one bug a mutant of kvproto-obj showed the kit passed (docs/mutation/obj.json).

Each factory's ``fails`` decorator registers its ``kvproto conform`` target in ``STORE_GALLERY`` with the
check and clause it must fail on (gallery_registry.py); gallery_index.py gathers it into ``GALLERY``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from obstore.exceptions import AlreadyExistsError, PreconditionError
from obstore.store import MemoryStore

from kvproto.errors import ConfigurationError
from kvproto.testing import FaultyBackend, FaultyJobs, TierSpec
from kvproto.tierkit import BlobTier, Published

from kvproto_obj import OBJ_HOOKS, ObjTier, ObjTierConfig
from kvproto_obj._backend import ObstoreBackend
from kvproto_obj._conformance import KitStoreOps, kit_ops
from kvproto_obj._listing import ListPlanner
from tests.kvproto.testing.gallery import _QUICK
from tests.kvproto.testing.gallery_registry import Gallery

STORE_GALLERY = Gallery()
"""This module's targets, each registered by its factory's ``fails`` decorator (gallery_registry.py)."""

_CONFIG = ObjTierConfig(max_concurrency=8, probe_concurrency=16)


class _HeadsOnly(ListPlanner):
    """Bug: the planner ignores the configured page cost: every batch is sent as HEADs, one request per
    key, though OBJ-11's plan lists a namespace that fits in the batch's pages."""

    def pages_for(self, namespace: str, n: int) -> int:
        return 0


class NeverLists(FaultyJobs, ObjTier):
    """An ObjTier whose listing planner is :class:`_HeadsOnly`: the same answers, 16 times the requests."""

    def __init__(self, buffer: memoryview, config: ObjTierConfig, **kwargs: Any) -> None:
        super().__init__(buffer, config, **kwargs)
        self._io.planner = _HeadsOnly(config.list_page_cost, ordered=False)


class _ConflictIsFailure(ObstoreBackend):
    """Bug: a conditional PUT answered 412 (PreconditionError: some S3 providers answer a conflicting
    create-if-absent so) is taken for a failure, though the object is there; 'already exists' is handled."""

    async def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        try:
            await self.ops.put(self.store, self.path(name), list(parts), mode="create")
        except AlreadyExistsError:
            return Published.EXISTED
        except PreconditionError:
            raise  # the bug: the object is there (a HEAD would show it), the store is reported failed
        return Published.CREATED


class FailsOnConflict(FaultyJobs, ObjTier):
    """An ObjTier whose backend is :class:`_ConflictIsFailure`."""

    def __init__(self, buffer: memoryview, config: ObjTierConfig, **kwargs: Any) -> None:
        super().__init__(buffer, config, **kwargs)
        self._io.__class__ = _ConflictIsFailure  # the same backend object (the engine holds it), the buggy publish


class _ConflictIsExisting(ObstoreBackend):
    """Bug: any refused conditional PUT, 409 or 412, is taken for "already there" without the HEAD that
    shows the object is: a 409 from a concurrent upload that then failed leaves nothing, yet the store is
    reported done (held-out round 6, a regression of kvproto-obj)."""

    async def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        try:
            await self.ops.put(self.store, self.path(name), list(parts), mode="create")
        except (AlreadyExistsError, PreconditionError):
            return Published.EXISTED  # the bug: a 409 proves nothing is there
        return Published.CREATED


class ConflictTakenForExisting(FaultyJobs, ObjTier):
    """An ObjTier whose backend is :class:`_ConflictIsExisting`."""

    def __init__(self, buffer: memoryview, config: ObjTierConfig, **kwargs: Any) -> None:
        super().__init__(buffer, config, **kwargs)
        self._io.__class__ = _ConflictIsExisting  # the same backend object (the engine holds it), the buggy publish


class _ForgetsEtags(ObstoreBackend):
    """Bug: the ETag a HEAD saw is never kept, so every load is an unconditional GET (OBJ-12)."""

    def _saw(self, name: str, etag: str | None) -> None:
        return None


class UnconditionalGet(FaultyJobs, ObjTier):
    """An ObjTier whose backend is :class:`_ForgetsEtags`: a block replaced by another writer after the
    HIT loads the new bytes."""

    def __init__(self, buffer: memoryview, config: ObjTierConfig, **kwargs: Any) -> None:
        super().__init__(buffer, config, **kwargs)
        self._io.__class__ = _ForgetsEtags  # the same backend object (the engine holds it), the buggy HEAD


class SkipsItsStartUpCheck(FaultyJobs, ObjTier):
    """Bug: the start-up check (the layout manifest's PUT, OBJ-1) swallows its error: a tier over a
    store that is down builds, and fails later, job by job."""

    def _check_store(self, buffer: memoryview, name: str) -> None:
        try:
            super()._check_store(buffer, name)
        except ConfigurationError:
            pass  # the bug


class ResetRaises(FaultyJobs, ObjTier):
    """Bug: ``reset_cache`` lets the store's error escape (TIER-16: it answers False when it cannot now)."""

    def reset_cache(self) -> bool:
        if self.has_pending_work():
            return False
        self.backend.clear(self.namespace.hex())  # the bug: a failing store raises out of reset_cache
        return BlobTier.reset_cache(self)


class DropsPersistence(FaultyJobs, ObjTier):
    """Bug: a tier over a store it was given stops declaring persistence (its blocks do persist): the
    kit then skips every persistence check and names it unchecked, a promise quietly dropped (OBJ-10)."""

    def __init__(self, buffer: memoryview, config: ObjTierConfig, **kwargs: Any) -> None:
        super().__init__(buffer, config, **kwargs)
        self.capabilities = dataclasses.replace(self.capabilities, persistence=False)


def _spec(cls: type[ObjTier]) -> TierSpec:
    """The kit's obj spec (OBJ_HOOKS) over ``cls``: a fresh in-memory store per tier, requests through
    KitStoreOps; the second instance's store answers conflicting conditional PUTs 412 (OBJ-13)."""

    def build(buffer: memoryview) -> ObjTier:
        return cls(buffer, _CONFIG, name=cls.__name__, store=MemoryStore(), wrap=FaultyBackend, ops=kit_ops(_CONFIG))

    def reopen(tier: ObjTier, buffer: memoryview) -> ObjTier:
        ops = kit_ops(tier.config, conflicts_as_precondition=True)
        return cls(buffer, tier.config, name=tier.name, store=tier.store, wrap=FaultyBackend, ops=ops)

    def start_down(tier: ObjTier, buffer: memoryview) -> ObjTier:
        return cls(buffer, tier.config, name=tier.name, store=tier.store, wrap=FaultyBackend, ops=KitStoreOps(down=True))

    hooks = {**OBJ_HOOKS, "reopen": reopen, "start_down": start_down}
    return TierSpec(cls.__name__, "secondary", build, hooks=hooks, limits=_QUICK, tier_class=cls)


@STORE_GALLERY.fails("test_existence_batches_keep_the_declared_request_plan", "TIER-33", "declared plan (request_plan) makes 1")
def never_lists() -> TierSpec:
    return _spec(NeverLists)


@STORE_GALLERY.fails("test_a_stored_block_is_never_overwritten", "TIER-23", "from a second instance over the same storage")
def fails_on_conflict() -> TierSpec:
    return _spec(FailsOnConflict)


@STORE_GALLERY.fails("test_a_write_lost_to_a_failed_writer_is_no_store", "TIER-10", "refused as a conflict")
def conflict_taken_for_existing() -> TierSpec:
    return _spec(ConflictTakenForExisting)


@STORE_GALLERY.fails("test_a_block_replaced_after_its_hit_never_loads_the_new_bytes", "TIER-34", "replaced by other bytes")
def unconditional_get() -> TierSpec:
    return _spec(UnconditionalGet)


@STORE_GALLERY.fails("test_a_constructor_refuses_storage_that_is_down", "KIT-20", "returned a tier")
def skips_its_start_up_check() -> TierSpec:
    return _spec(SkipsItsStartUpCheck)


@STORE_GALLERY.fails("test_io_errors_inside_transfers_fail_cleanly", "TIER-31", "it answers False when it cannot now")
def reset_raises() -> TierSpec:
    return _spec(ResetRaises)


@STORE_GALLERY.fails("test_the_tier_declares_what_its_spec_expects", "KIT-21", "does not declare persistence")
def drops_persistence() -> TierSpec:
    return _spec(DropsPersistence)
