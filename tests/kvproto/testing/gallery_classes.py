"""Broken tiers for section 1 of issue 17: one per class of bugs the kit passed before it had a
check for the class (batch answers in key order, event timing, a declared LRU order, threads).

Each has exactly one bug; ``CLASSES_GALLERY`` maps each ``kvproto conform`` target to the check
and clause it must fail on, and gallery_index.py gathers it into ``GALLERY``.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Sequence

import kvproto
from kvproto import (
    EventKind,
    LookupResult,
    MemoryTier,
    OffloadingEvent,
    OffloadKey,
    ReqContext,
    TransferJob,
    members as lr,
)
from kvproto.testing import MEMORY_HOOKS, FaultyBackend, FaultyJobs, TierSpec
from kvproto.tierkit import BlobTierConfig, MemoryBackend, Published

from tests.kvproto.testing.gallery import (
    HitsRememberedPerRequest,
    _secondary,
    _TracksStoresInFlight,
    class_spec,
    memory_primary_spec,
)
from tests.kvproto.testing.gallery_registry import Gallery

CLASSES_GALLERY = Gallery()
"""This module's targets, each registered by its factory's ``fails`` decorator (gallery_registry.py)."""


class HitsAnsweredFirst(MemoryTier):
    """Bug: ``lookup_many`` counts the hits and answers them as a prefix, as if the stored keys
    always came first (a batched existence call whose answers are matched to keys by position)."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="hits-answered-first")

    def lookup_many(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> list[LookupResult]:
        hits = sum(1 for key in keys if self.lookup(key, req_context) is lr.HIT)
        return [lr.HIT] * hits + [lr.MISS] * (len(keys) - hits)  # the bug: positions, not keys


@CLASSES_GALLERY.fails("test_lookup_many_answers_in_key_order", "TIER-17", "in the order of the keys it is given")
def hits_answered_first() -> TierSpec:
    return _secondary(HitsAnsweredFirst)


class OptimisticStoredEvent(_TracksStoresInFlight):
    """Bug: emits STORED when a store is submitted (before its job ran) and withdraws the keys the
    job then fails for, if the event was not taken yet: right whenever events are taken after the
    job is reported."""

    tier_name = "optimistic-stored-event"

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer)
        self._early: list[OffloadingEvent] = []

    def submit_store(self, job: TransferJob) -> None:
        self._early.append(OffloadingEvent(EventKind.STORED, job.keys, self.name))  # the bug: too early
        super().submit_store(job)

    def get_finished_jobs(self) -> Sequence[kvproto.JobResult]:
        flying = dict(self._flying)
        done = super().get_finished_jobs()
        for result in done:
            keys = flying.get(result.job_id, ())
            failed = set(keys) - result.succeeded_keys(TransferJob(result.job_id, keys, tuple(range(len(keys))), False))
            if failed:
                self._early = [
                    OffloadingEvent(e.kind, tuple(k for k in e.keys if k not in failed), e.tier) for e in self._early
                ]
        return done

    def take_events(self) -> Sequence[OffloadingEvent]:
        early, self._early = [e for e in self._early if e.keys], []
        return [*early, *(e for e in super().take_events() if e.kind is not EventKind.STORED)]


@CLASSES_GALLERY.fails("test_stored_events_only_once_readable", "TIER-21", "only once it is readable")
def optimistic_stored_event() -> TierSpec:
    return _secondary(OptimisticStoredEvent)


class EvictsWithoutRemoved(kvproto.MemoryPrimaryTier):
    """Bug: lists the blocks a store evicts, but emits no REMOVED event for them (a reset's REMOVED
    event is kept)."""

    def __init__(self, *, num_slots: int, block_bytes: int) -> None:
        super().__init__(num_slots=num_slots, block_bytes=block_bytes, name="evicts-without-removed")
        self._kept: list[OffloadingEvent] = []

    def prepare_store(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> kvproto.PrepareStoreOutput | None:
        self._kept.extend(super().take_events())
        out = super().prepare_store(keys, req_context)
        if out is not None and out.evicted:
            gone = set(out.evicted)
            # the bug: the eviction's REMOVED event is dropped
            self._kept.extend(e for e in super().take_events() if not (e.kind is EventKind.REMOVED and set(e.keys) <= gone))
        return out

    def take_events(self) -> list[OffloadingEvent]:
        kept, self._kept = self._kept, []
        return [*kept, *super().take_events()]


@CLASSES_GALLERY.fails("test_events_follow_complete_store_and_eviction", "TIER-21", "no REMOVED event names")
def evicts_without_removed() -> TierSpec:
    return memory_primary_spec(EvictsWithoutRemoved)


class FifoDeclaredLru(MemoryTier):
    """Bug: declares ``lru`` (and eviction, 16 blocks), but ``touch`` changes nothing: it evicts in
    the order blocks were stored."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="fifo-declared-lru", capacity_blocks=16)

    def touch(self, keys: Iterable[OffloadKey]) -> None:
        return None  # the bug: recency is never refreshed


@CLASSES_GALLERY.fails("test_touch_keeps_a_block_under_lru", "CAP-6", "touch must make a block recently used")
def fifo_declared_lru() -> TierSpec:
    return class_spec(FifoDeclaredLru, hooks=MEMORY_HOOKS)


class SqliteIndexFromInit(MemoryTier):
    """Bug: keeps a count of its stores in an sqlite3 connection opened in ``__init__``: bound to
    the thread that built the tier, so a call from any other thread raises."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="sqlite-index-from-init")
        self._db = sqlite3.connect(":memory:")  # the bug: check_same_thread=True, the default
        self._db.execute("CREATE TABLE stores (n INTEGER)")

    def submit_store(self, job: TransferJob) -> None:
        self._db.execute("INSERT INTO stores VALUES (?)", (len(job.keys),))
        super().submit_store(job)


@CLASSES_GALLERY.fails("test_driven_from_alternating_threads", "TIER-19", "on thread")
def sqlite_index_from_init() -> TierSpec:
    return _secondary(SqliteIndexFromInit)


class RecentKeysPerThread(MemoryTier):
    """Bug: answers HIT only for keys stored from the calling thread: its index of stored keys is a
    ``threading.local`` (right while one thread makes every call)."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="recent-keys-per-thread")
        self._local = threading.local()

    def _recent(self) -> set[OffloadKey]:
        recent: set[OffloadKey] | None = getattr(self._local, "keys", None)
        if recent is None:
            recent = self._local.keys = set()
        return recent

    def submit_store(self, job: TransferJob) -> None:
        self._recent().update(job.keys)  # the bug: an index per thread
        super().submit_store(job)

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        answer = super().lookup(key, req_context)
        return answer if key in self._recent() else lr.MISS


@CLASSES_GALLERY.fails("test_jobs_and_lookups_on_two_threads", "TIER-20", "changing threads")
def recent_keys_per_thread() -> TierSpec:
    return _secondary(RecentKeysPerThread)


class LayoutBlind(MemoryTier):
    """Bug: keys its storage by the block key alone, ignoring the model layout it was built for, so
    an instance for another layout over the same storage serves the first one's blocks."""

    def __init__(self, buffer: memoryview, *, layout: str = "default", over: LayoutBlind | None = None) -> None:
        super().__init__(buffer, name="layout-blind")
        self.layout = layout
        if over is not None:
            self._store = over._store  # one storage (as one bucket); the bug: its keys leave out the layout


@CLASSES_GALLERY.fails("test_another_layouts_blocks_never_load", "TIER-22", "must not load")
def layout_blind() -> TierSpec:
    return class_spec(LayoutBlind, hooks={**MEMORY_HOOKS, "reopen_other_layout": _other_layout})


def _other_layout(tier: LayoutBlind, buffer: memoryview) -> LayoutBlind:
    return LayoutBlind(buffer, layout="another layout", over=tier)


class _ClearsEveryNamespace(MemoryBackend):
    def clear(self, namespace: str) -> None:
        with self._lock:
            self.blobs.clear()  # the bug: one layout's reset empties the whole store (every namespace)


class ResetClearsEveryLayout(FaultyJobs):
    """Bug: a private BlobTier over one store that models share (an append-only log, one bucket), whose
    backend's ``clear`` empties the store rather than the namespace: one layout's ``reset_cache`` takes
    every other layout's blocks with it, and their HITs fail to load."""

    storage: MemoryBackend  # the store every layout's instance shares

    def __init__(self, buffer: memoryview, *, layout: str = "default", over: ResetClearsEveryLayout | None = None) -> None:
        config = BlobTierConfig(start_in_background=False, layout={"kvproto-gallery": layout})
        backend = _ClearsEveryNamespace() if over is None else over.storage
        self.storage = backend
        super().__init__(backend, buffer, config, name="reset-clears-every-layout", wrap=FaultyBackend)


@CLASSES_GALLERY.fails("test_another_layouts_blocks_never_load", "TIER-22", "reset its cache, but its load failed")
def reset_clears_every_layout() -> TierSpec:
    def other_layout(tier: ResetClearsEveryLayout, buffer: memoryview) -> ResetClearsEveryLayout:
        return ResetClearsEveryLayout(buffer, layout="another layout", over=tier)

    return class_spec(ResetClearsEveryLayout, hooks={"reopen_other_layout": other_layout})


class ExistsCallInLookup(FaultyJobs):
    """Bug: a shared BlobTier whose lookup of a key it has no verdict for asks the backend at once
    (a synchronous existence call, as a Redis tier's EXISTS in ``lookup``), instead of answering
    RETRY: quick on a local backend, blocking behind a slow one."""

    def __init__(self, buffer: memoryview) -> None:
        config = BlobTierConfig(shared=True, start_in_background=False)
        super().__init__(MemoryBackend(), buffer, config, name="exists-call-in-lookup", wrap=FaultyBackend)

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        answer = super().lookup(key, req_context)
        if answer is not lr.RETRY:
            return answer
        size = self.backend.sizes([self.name_of(key)])[0]  # the bug: waits for the backend
        return lr.MISS if size is None else answer

    def lookup_many(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> list[LookupResult]:
        return [self.lookup(key, req_context) for key in keys]


@CLASSES_GALLERY.fails("test_first_lookups_never_wait_for_a_slow_backend", "TIER-4", "it waited for backend I/O")
def exists_call_in_lookup() -> TierSpec:
    return class_spec(ExistsCallInLookup)


class HitCachedForTheRequest(HitsRememberedPerRequest, MemoryTier):
    """Bug (the mixin's): remembers, per request, the keys it answered HIT for, and answers HIT from
    that memory for the rest of the request, also after a load found the block damaged (and dropped it)."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="hit-cached-for-the-request")


@CLASSES_GALLERY.fails("test_no_cached_hit_after_a_damaged_load", "TIER-4", "fail a load as damaged")
def hit_cached_for_the_request() -> TierSpec:
    return _secondary(HitCachedForTheRequest)


class LastWriterWins(MemoryBackend):
    """Bug (a backend): ``publish`` writes whether or not the blob is there (a PUT without
    ``If-None-Match``, a SET without NX), and says it created it."""

    def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        self.blobs[name] = b"".join(parts)  # the bug: overwrites
        return Published.CREATED


class OverwritesBlocks(FaultyJobs):
    """A shared BlobTier over the :class:`LastWriterWins` backend."""

    def __init__(self, buffer: memoryview) -> None:
        config = BlobTierConfig(shared=True, start_in_background=False)
        super().__init__(LastWriterWins(), buffer, config, name="overwrites-blocks", wrap=FaultyBackend)


@CLASSES_GALLERY.fails("test_a_stored_block_is_never_overwritten", "TIER-23", "must never be overwritten")
def overwrites_blocks() -> TierSpec:
    return class_spec(OverwritesBlocks)
