"""A gallery of deliberately broken tiers, each with exactly one bug (KIT-13).

Each is a :class:`~kvproto.MemoryTier` (or, for the pin leak, a CpuTier)
changed in one place. ``GALLERY`` maps each ``kvproto conform`` target to
the check that must fail and the clause it must fail on; test_gallery.py
asserts exactly that.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvproto import (
    JobResult,
    LookupResult,
    MemoryTier,
    OffloadKey,
    ReqContext,
    TransferJob,
)
from kvproto import members as lr
from kvproto import unreachable
from kvproto.testing import KitLimits, TierSpec
from kvproto.testing import MEMORY_HOOKS

# Broken tiers that lose jobs or never resolve would otherwise make the kit wait its full bound.
_QUICK = KitLimits(max_job_steps=16, job_timeout_s=0.3, lookup_budget_s=0.1)


class _TracksStoresInFlight(MemoryTier):
    """Not a bug: remembers the keys of each store job until it is reported, for the bugs below."""

    def __init__(self, buffer: memoryview, *, name: str) -> None:
        super().__init__(buffer, name=name, job_latency_steps=1)
        self._flying: dict[int, tuple[OffloadKey, ...]] = {}

    def submit_store(self, job: TransferJob) -> None:
        self._flying[job.job_id] = job.keys
        super().submit_store(job)

    def get_finished_jobs(self) -> Sequence[JobResult]:
        done = super().get_finished_jobs()
        for result in done:
            self._flying.pop(result.job_id, None)
        return done

    def _store_in_flight(self, key: OffloadKey) -> bool:
        return any(key in keys for keys in self._flying.values())


class HitBeforeStoreFinished(_TracksStoresInFlight):
    """Bug: answers HIT for a key as soon as its store is submitted, before the job ran."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="hit-before-store-finished")

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if self._store_in_flight(key):
            return lr.HIT  # the bug
        return super().lookup(key, req_context)


class HitAfterFailedStore(MemoryTier):
    """Bug: marks a key present when its store job is reported, whatever the outcome."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="hit-after-failed-store")
        self._jobs: dict[int, tuple[OffloadKey, ...]] = {}
        self._visible: set[OffloadKey] = set()

    def submit_store(self, job: TransferJob) -> None:
        self._jobs[job.job_id] = job.keys
        super().submit_store(job)

    def get_finished_jobs(self) -> Sequence[JobResult]:
        done = super().get_finished_jobs()
        for result in done:
            self._visible.update(self._jobs.pop(result.job_id, ()))  # the bug: ignores result.success
        return done

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if key in self._visible:
            return lr.HIT
        return super().lookup(key, req_context)

    def reset_cache(self) -> bool:
        self._visible.clear()
        return super().reset_cache()


class LostWrite(MemoryTier):
    """Bug: a store of several blocks silently drops the last one and still reports success."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="lost-write")

    def submit_store(self, job: TransferJob) -> None:
        if len(job.keys) > 1:
            job = TransferJob(job.job_id, job.keys[:-1], job.slots[:-1], job.promotion, job.req_id)
        super().submit_store(job)


class BytesOfAnotherKey(MemoryTier):
    """Bug: a load of several blocks reads each block's neighbour (an off-by-one in the key list)."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="bytes-of-another-key")

    def submit_load(self, job: TransferJob) -> None:
        if len(job.keys) > 1:
            job = TransferJob(job.job_id, job.keys[1:] + job.keys[:1], job.slots, job.promotion, job.req_id)
        super().submit_load(job)


class LoadIntoWrongSlot(MemoryTier):
    """Bug: a load writes each block one slot past the slot it was asked for."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="load-into-wrong-slot")
        self._slots = buffer.shape[0] if buffer.shape else 1

    def submit_load(self, job: TransferJob) -> None:
        shifted = tuple((s + 1) % self._slots for s in job.slots)
        super().submit_load(TransferJob(job.job_id, job.keys, shifted, job.promotion, job.req_id))


class RetryNeverResolves(MemoryTier):
    """Bug: declares asynchronous lookups, but a key it does not hold answers RETRY forever."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="retry-never-resolves", lookup_latency_steps=1)

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        answer = super().lookup(key, req_context)
        return lr.RETRY if answer is lr.MISS else answer  # the bug


class JobReportedTwice(MemoryTier):
    """Bug: every result is reported again by the next get_finished_jobs."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="job-reported-twice")
        self._again: list[JobResult] = []

    def get_finished_jobs(self) -> Sequence[JobResult]:
        fresh = list(super().get_finished_jobs())
        out = self._again + fresh
        self._again = fresh
        return out


class JobNeverReported(MemoryTier):
    """Bug: the result of every fifth job submitted is dropped."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="job-never-reported")
        self._count = 0
        self._dropped: set[int] = set()

    def submit_store(self, job: TransferJob) -> None:
        self._note(job)
        super().submit_store(job)

    def submit_load(self, job: TransferJob) -> None:
        self._note(job)
        super().submit_load(job)

    def _note(self, job: TransferJob) -> None:
        self._count += 1
        if self._count % 5 == 0:
            self._dropped.add(job.job_id)

    def get_finished_jobs(self) -> Sequence[JobResult]:
        return [r for r in super().get_finished_jobs() if r.job_id not in self._dropped]


class BlockingLookup(_TracksStoresInFlight):
    """Bug: a lookup of a key whose store is in flight waits (sleeps) instead of answering."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="blocking-lookup")

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if self._store_in_flight(key):
            time.sleep(0.15)  # the bug: blocks the scheduler
        return super().lookup(key, req_context)


class LegacyBoolLookup(MemoryTier):
    """Bug: the old ``bool | None`` answer (True for HIT, False for MISS)."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="legacy-bool-lookup")

    def lookup(  # type: ignore[override]  # the deliberate bug under test
        self, key: OffloadKey, req_context: ReqContext
    ) -> bool | None:
        match super().lookup(key, req_context):
            case lr.HIT:
                return True
            case lr.MISS:
                return False
            case lr.RETRY | lr.HIT_PENDING:
                return None
            case other:
                unreachable(other, where="LegacyBoolLookup.lookup")


class HitPendingFromSecondary(_TracksStoresInFlight):
    """Bug: answers HIT_PENDING (the primary's answer) while a store is in flight."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="hit-pending-from-secondary")

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if self._store_in_flight(key):
            return lr.HIT_PENDING  # the bug
        return super().lookup(key, req_context)


def _secondary(cls: type[MemoryTier]) -> TierSpec:
    return TierSpec(cls.__name__, "secondary", cls, hooks=MEMORY_HOOKS, limits=_QUICK, tier_class=cls)


def hit_before_store_finished() -> TierSpec:
    return _secondary(HitBeforeStoreFinished)


def hit_after_failed_store() -> TierSpec:
    return _secondary(HitAfterFailedStore)


def lost_write() -> TierSpec:
    return _secondary(LostWrite)


def bytes_of_another_key() -> TierSpec:
    return _secondary(BytesOfAnotherKey)


def load_into_wrong_slot() -> TierSpec:
    return _secondary(LoadIntoWrongSlot)


def retry_never_resolves() -> TierSpec:
    return _secondary(RetryNeverResolves)


def job_reported_twice() -> TierSpec:
    return _secondary(JobReportedTwice)


def job_never_reported() -> TierSpec:
    return _secondary(JobNeverReported)


def blocking_lookup() -> TierSpec:
    return _secondary(BlockingLookup)


def legacy_bool_lookup() -> TierSpec:
    return _secondary(LegacyBoolLookup)


def hit_pending_from_secondary() -> TierSpec:
    return _secondary(HitPendingFromSecondary)


def leaked_pin() -> TierSpec:
    """The CPU tier with one bug: complete_load releases nothing."""
    from kvproto_cpu import CpuTier, CpuTierConfig

    from kvproto import Capabilities

    class LeakedPin(CpuTier):
        def complete_load(self, keys: Iterable[OffloadKey]) -> None:
            """Bug: the pins taken by prepare_load are never released."""

    return TierSpec(
        "LeakedPin",
        "primary",
        lambda: LeakedPin(CpuTierConfig(num_slots=16, block_bytes=32, pin_memory="off")),
        capabilities=Capabilities(eviction=True),
        limits=_QUICK,
        tier_class=LeakedPin,
    )


@dataclass(frozen=True)
class Expected:
    """The check a broken tier must fail, the clause it must fail on, and words the reason must hold."""

    check: str
    clause: str
    words: str


_HERE = __name__
GALLERY: dict[str, Expected] = {
    f"{_HERE}:hit_before_store_finished": Expected("test_no_hit_before_store_finished", "TIER-4", "before the store finished"),
    f"{_HERE}:hit_after_failed_store": Expected("test_no_hit_after_failed_store", "TIER-4", "after its store job failed"),
    f"{_HERE}:lost_write": Expected("test_hit_after_successful_store", "TIER-10", "the write was lost"),
    f"{_HERE}:bytes_of_another_key": Expected("test_load_copies_stored_bytes_into_requested_slots", "TIER-10", "bytes of another key"),
    f"{_HERE}:load_into_wrong_slot": Expected("test_load_copies_stored_bytes_into_requested_slots", "TIER-10", "written into slot"),
    f"{_HERE}:retry_never_resolves": Expected("test_retry_resolves_within_declared_steps", "TIER-18", "still answers RETRY"),
    f"{_HERE}:job_reported_twice": Expected("test_each_job_reported_exactly_once", "TIER-11", "reported finished twice"),
    f"{_HERE}:job_never_reported": Expected("test_each_job_reported_exactly_once", "TIER-11", "never reported"),
    f"{_HERE}:blocking_lookup": Expected("test_lookup_does_not_block", "TIER-4", "blocked"),
    f"{_HERE}:legacy_bool_lookup": Expected("test_lookup_answers_a_lookup_result", "LR-1", "LookupResult"),
    f"{_HERE}:hit_pending_from_secondary": Expected("test_never_answers_hit_pending", "LR-3", "HIT_PENDING"),
    f"{_HERE}:leaked_pin": Expected("test_complete_load_releases_pin", "TIER-9", "pins leaked"),
}
