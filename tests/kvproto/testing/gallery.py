"""A gallery of deliberately broken tiers, each with exactly one bug (KIT-13).

Each is a :class:`~kvproto.MemoryTier` (or, for the pin leak, a :class:`~kvproto.MemoryPrimaryTier`)
changed in one place. ``GALLERY`` maps each of this module's ``kvproto conform``
targets to the check that must fail and the clause it must fail on;
gallery_index.py gathers it with the other gallery modules' (each of which
imports from here, and can be named alone as a target), and test_gallery.py
asserts exactly that.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Container, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, ClassVar

import kvproto
from kvproto import (
    JobResult,
    LookupResult,
    MemoryPrimaryTier,
    MemoryTier,
    OffloadKey,
    ReqContext,
    TransferJob,
    members as lr,
)
from kvproto.testing import MEMORY_HOOKS, KitLimits, TierSpec
from kvproto.testing.faults import FaultySecondary, LatencySecondary

from tests.kvproto.testing.delegating import MemoryDelegate

# Expected is re-exported for the gallery modules written before gallery_registry.py
from tests.kvproto.testing.gallery_registry import Expected as Expected, Gallery

# Broken tiers that lose jobs or never resolve would otherwise make the kit wait its full bound.
_QUICK = KitLimits(max_job_steps=16, job_timeout_s=0.3)


GALLERY: Gallery = Gallery()
"""This module's targets, each registered by its factory's ``fails`` decorator (gallery_registry.py)."""


def _secondary(cls: type[MemoryTier]) -> TierSpec:
    return TierSpec(cls.__name__, "secondary", cls, hooks=MEMORY_HOOKS, limits=_QUICK, tier_class=cls)


def _spec(name: str, build: Callable[[memoryview], Any], hooks: dict[str, Callable[..., Any]] | None = None) -> TierSpec:
    return TierSpec(name, "secondary", build, hooks=hooks or MEMORY_HOOKS, limits=_QUICK)


def class_spec(cls: type, *, name: str | None = None, hooks: Mapping[str, Callable[..., Any]] | None = None) -> TierSpec:
    """The spec of the secondary tier class ``cls`` (built from the primary buffer alone), named
    ``name`` or the class's name, with ``hooks`` (none by default)."""
    return TierSpec(cls.__name__ if name is None else name, "secondary", cls, hooks=hooks or {}, limits=_QUICK, tier_class=cls)


def memory_primary_spec(cls: type[MemoryPrimaryTier], limits: KitLimits = _QUICK, name: str | None = None) -> TierSpec:
    """The spec of ``cls`` (a MemoryPrimaryTier with one bug; misfits.py uses it too): 16 slots of
    32 bytes, eviction on; named ``name``, or the class's name."""
    return TierSpec(
        cls.__name__ if name is None else name,
        "primary",
        lambda: cls(num_slots=16, block_bytes=32),
        capabilities=kvproto.Capabilities(eviction=True),
        limits=limits,
        tier_class=cls,
    )


class _SeenHits(set[OffloadKey]):
    """The keys a request was told HIT for (its scratch state, TIER-2)."""


class HitsRememberedPerRequest:
    """The bug of gallery_classes' and gallery_sharing's request-scoped HITs, as a mixin put before
    the tier class in the bases: a key the tier once answered HIT for in a request answers HIT for
    the rest of it, whatever a load of the key found since (TIER-4); the memory is the request's
    scratch state, dropped when it finishes (TIER-12 holds)."""

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        seen = req_context.state(_SeenHits)
        if key in seen:
            return lr.HIT  # the bug: the request's verdict outlives what a load found
        answer: LookupResult = super().lookup(key, req_context)  # type: ignore[misc]  # the tier class after this mixin answers
        if answer is lr.HIT:
            seen.add(key)
        return answer

    def on_request_finished(self, req_context: ReqContext) -> None:
        req_context.drop_state(_SeenHits)
        super().on_request_finished(req_context)  # type: ignore[misc]  # the tier class after this mixin forgets the rest


class _TracksStoresInFlight(MemoryTier):
    """Not a bug: a MemoryTier whose store jobs run at the next step (as a tier doing real I/O would),
    remembering the keys of each store job until it is reported, for the bugs below: each names
    itself (``tier_name``) and does its bug in :meth:`lookup_in_flight`."""

    tier_name: ClassVar[str]

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name=self.tier_name)
        self._flying: dict[int, tuple[OffloadKey, ...]] = {}
        self._next_step: list[TransferJob] = []

    def submit_store(self, job: TransferJob) -> None:
        self._flying[job.job_id] = job.keys
        self._next_step.append(job)

    def on_step_end(self) -> None:
        due, self._next_step = self._next_step, []
        for job in due:
            super().submit_store(job)
        super().on_step_end()

    def has_pending_work(self) -> bool:
        return bool(self._next_step) or super().has_pending_work()

    def shutdown(self) -> None:
        self.on_step_end()  # run what is queued, so that every job is reported
        super().shutdown()

    def get_finished_jobs(self) -> Sequence[JobResult]:
        done = super().get_finished_jobs()
        for result in done:
            self._flying.pop(result.job_id, None)
        return done

    def _store_in_flight(self, key: OffloadKey) -> bool:
        return any(key in keys for keys in self._flying.values())

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if self._store_in_flight(key):
            answer = self.lookup_in_flight(key)
            if answer is not None:
                return answer
        return super().lookup(key, req_context)

    def lookup_in_flight(self, key: OffloadKey) -> LookupResult | None:
        """What a lookup of ``key`` does while its store is in flight: an answer, or ``None`` to
        answer as the MemoryTier does."""
        return None


class HitBeforeStoreFinished(_TracksStoresInFlight):
    """Bug: answers HIT for a key as soon as its store is submitted, before the job ran."""

    tier_name = "hit-before-store-finished"

    def lookup_in_flight(self, key: OffloadKey) -> LookupResult | None:
        return lr.HIT  # the bug


@GALLERY.fails("test_no_hit_before_store_finished", "TIER-4", "before the store finished")
def hit_before_store_finished() -> TierSpec:
    return _secondary(HitBeforeStoreFinished)


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


@GALLERY.fails("test_no_hit_after_failed_store", "TIER-4", "after its store job failed")
def hit_after_failed_store() -> TierSpec:
    return _secondary(HitAfterFailedStore)


class LostWrite(MemoryTier):
    """Bug: a store of several blocks silently drops the last one and still reports success."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="lost-write")

    def submit_store(self, job: TransferJob) -> None:
        if len(job.keys) > 1:
            job = TransferJob(job.job_id, job.keys[:-1], job.slots[:-1], job.promotion, job.req_id)
        super().submit_store(job)


@GALLERY.fails("test_hit_after_successful_store", "TIER-10", "the write was lost")
def lost_write() -> TierSpec:
    return _secondary(LostWrite)


class BytesOfAnotherKey(MemoryTier):
    """Bug: a load of several blocks reads each block's neighbour (an off-by-one in the key list)."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="bytes-of-another-key")

    def submit_load(self, job: TransferJob) -> None:
        if len(job.keys) > 1:
            job = TransferJob(job.job_id, job.keys[1:] + job.keys[:1], job.slots, job.promotion, job.req_id)
        super().submit_load(job)


@GALLERY.fails("test_load_copies_stored_bytes_into_requested_slots", "TIER-10", "bytes of another key")
def bytes_of_another_key() -> TierSpec:
    return _secondary(BytesOfAnotherKey)


class LoadIntoWrongSlot(MemoryTier):
    """Bug: a load writes each block one slot past the slot it was asked for."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="load-into-wrong-slot")
        self._slots = buffer.shape[0] if buffer.shape else 1

    def submit_load(self, job: TransferJob) -> None:
        shifted = tuple((s + 1) % self._slots for s in job.slots)
        super().submit_load(TransferJob(job.job_id, job.keys, shifted, job.promotion, job.req_id))


@GALLERY.fails("test_load_copies_stored_bytes_into_requested_slots", "TIER-10", "written into slot")
def load_into_wrong_slot() -> TierSpec:
    return _secondary(LoadIntoWrongSlot)


class RetryNeverResolves(MemoryTier):
    """Bug: declares asynchronous lookups, but a key it does not hold answers RETRY forever."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="retry-never-resolves")
        reasons = {k: v for k, v in self.capabilities.reasons.items() if k != "async_lookup"}
        self.capabilities = replace(self.capabilities, async_lookup=True, max_retry_steps=1, reasons=reasons)

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        answer = super().lookup(key, req_context)
        return lr.RETRY if answer is lr.MISS else answer  # the bug


@GALLERY.fails("test_retry_resolves_within_declared_steps", "TIER-18", "still answers RETRY")
def retry_never_resolves() -> TierSpec:
    return _secondary(RetryNeverResolves)


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


@GALLERY.fails("test_each_job_reported_exactly_once", "TIER-11", "reported finished twice")
def job_reported_twice() -> TierSpec:
    return _secondary(JobReportedTwice)


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


@GALLERY.fails("test_each_job_reported_exactly_once", "TIER-11", "never reported")
def job_never_reported() -> TierSpec:
    return _secondary(JobNeverReported)


class BlockingLookup(_TracksStoresInFlight):
    """Bug: a lookup of a key whose store is in flight waits (sleeps) instead of answering."""

    tier_name = "blocking-lookup"

    def lookup_in_flight(self, key: OffloadKey) -> LookupResult | None:
        # The bug: blocks the scheduler. 30 ms, nearly four times the kit's 8 ms lookup budget (a
        # sleep never returns early, so every repeat the kit confirms with is over budget too).
        time.sleep(0.03)
        return None


@GALLERY.fails("test_lookup_does_not_block", "TIER-4", "blocked")
def blocking_lookup() -> TierSpec:
    return _secondary(BlockingLookup)


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
                kvproto.unreachable(other, where="LegacyBoolLookup.lookup")


@GALLERY.fails("test_lookup_answers_a_lookup_result", "LR-1", "LookupResult")
def legacy_bool_lookup() -> TierSpec:
    return _secondary(LegacyBoolLookup)


class HitPendingFromSecondary(_TracksStoresInFlight):
    """Bug: answers HIT_PENDING (the primary's answer) while a store is in flight."""

    tier_name = "hit-pending-from-secondary"

    def lookup_in_flight(self, key: OffloadKey) -> LookupResult | None:
        return lr.HIT_PENDING  # the bug


@GALLERY.fails("test_never_answers_hit_pending", "LR-3", "HIT_PENDING")
def hit_pending_from_secondary() -> TierSpec:
    return _secondary(HitPendingFromSecondary)


class ReadsSlotAfterReport(MemoryTier):
    """Bug: acknowledges a store at once and copies its slots at the next on_step_end (write-behind
    from the primary's buffer), after the manager may have reused them."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="reads-slot-after-report")
        self._behind: list[TransferJob] = []
        self._acked: list[JobResult] = []
        self._swallow: set[int] = set()

    def submit_store(self, job: TransferJob) -> None:
        self._behind.append(job)
        self._acked.append(JobResult(job.job_id, True))  # the bug: reported before the slots were read

    def _flush(self) -> None:
        behind, self._behind = self._behind, []
        for job in behind:
            self._swallow.add(job.job_id)
            super().submit_store(job)

    def submit_load(self, job: TransferJob) -> None:
        self._flush()
        super().submit_load(job)

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if any(key in job.keys for job in self._behind):
            return lr.HIT
        return super().lookup(key, req_context)

    def on_step_end(self) -> None:
        self._flush()

    def get_finished_jobs(self) -> Sequence[JobResult]:
        acked, self._acked = self._acked, []
        inner = [r for r in super().get_finished_jobs() if r.job_id not in self._swallow]
        self._swallow.clear()
        return [*acked, *inner]

    def has_pending_work(self) -> bool:
        return bool(self._acked) or super().has_pending_work()

    def shutdown(self) -> None:
        self._flush()
        super().shutdown()


@GALLERY.fails("test_store_reads_its_slots_before_it_is_reported", "TIER-10", "after the job was reported")
def reads_slot_after_report() -> TierSpec:
    return _secondary(ReadsSlotAfterReport)


class _OneWorker(MemoryTier):
    """Not a bug: jobs run one at a time, in submission order, on one worker thread that waits a
    millisecond per job (its I/O); shutdown runs what is queued, then joins the worker."""

    def __init__(self, buffer: memoryview, *, name: str) -> None:
        super().__init__(buffer, name=name)
        self._queue: deque[TransferJob] = deque()
        self._queued: set[int] = set()
        self._cv = threading.Condition()
        self._stop = False
        self._worker = threading.Thread(target=self._work, name=f"{name}-worker", daemon=True)
        self._worker.start()

    def submit_store(self, job: TransferJob) -> None:
        self._enqueue(job)

    def submit_load(self, job: TransferJob) -> None:
        self._enqueue(job)

    def _enqueue(self, job: TransferJob) -> None:
        with self._cv:
            self._queue.append(job)
            self._queued.add(job.job_id)
            self._cv.notify()

    def _work(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._stop:
                    self._cv.wait()
                if not self._queue:
                    return
                job = self._queue.popleft()
            time.sleep(0.001)
            if job.promotion:
                MemoryTier.submit_load(self, job)
            else:
                MemoryTier.submit_store(self, job)
            with self._cv:
                self._queued.discard(job.job_id)

    def has_pending_work(self) -> bool:
        with self._cv:
            return bool(self._queued) or super().has_pending_work()

    def reset_cache(self) -> bool:
        with self._cv:
            if self._queued:
                return False
        return super().reset_cache()

    def _stop_worker(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()

    def shutdown(self) -> None:
        self._stop_worker()
        self._worker.join()
        super().shutdown()


class ShutdownDropsQueuedJobs(_OneWorker):
    """Bug: shutdown stops the worker after the job it is running; the jobs queued behind it are
    dropped, never reported."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="shutdown-drops-queued-jobs")

    def _stop_worker(self) -> None:
        with self._cv:
            self._stop = True
            self._queue.clear()  # the bug
            self._queued.clear()
            self._cv.notify()


@GALLERY.fails("test_shutdown_reports_queued_work", "TIER-16", "never reported")
def shutdown_drops_queued_jobs() -> TierSpec:
    return _secondary(ShutdownDropsQueuedJobs)


class LeavesThreadsUnjoined(MemoryTier):
    """Bug: each store also starts a short thread (a metrics flush, say) that shutdown never joins.
    The thread's work ends at once, so a look at the threads after shutdown would almost always
    miss it; the kit holds each thread's end until it is joined, and finds it every run (TIER-16)."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="leaves-threads-unjoined")
        self.flushed = 0

    def submit_store(self, job: TransferJob) -> None:
        super().submit_store(job)
        threading.Thread(target=self._flush, name="metrics-flush", daemon=True).start()  # the bug: never joined

    def _flush(self) -> None:
        self.flushed += 1


@GALLERY.fails("test_shutdown_reports_queued_work", "TIER-16", "shutdown never joined it")
def leaves_threads_unjoined() -> TierSpec:
    return _secondary(LeavesThreadsUnjoined)


class RequestStateLeak(MemoryTier):
    """Bug: counts the blocks moved per request (for metrics) in a dict keyed by req_id that
    on_request_finished never prunes."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="request-state-leak")
        self._moved: dict[str, int] = {}

    def _count(self, job: TransferJob) -> None:
        if job.req_id is not None:
            self._moved[job.req_id] = self._moved.get(job.req_id, 0) + len(job.keys)

    def submit_store(self, job: TransferJob) -> None:
        self._count(job)
        super().submit_store(job)

    def submit_load(self, job: TransferJob) -> None:
        self._count(job)
        super().submit_load(job)


@GALLERY.fails("test_request_state_does_not_grow", "TIER-12", "finished requests")
def request_state_leak() -> TierSpec:
    return _secondary(RequestStateLeak)


class _RunsJobsAtStepEnd(MemoryTier):
    """Honest base: queues every job and runs it at the next step end (as real I/O would), counts the
    queued jobs as pending work and refuses a reset while any is queued."""

    def __init__(self, buffer: memoryview, name: str) -> None:
        super().__init__(buffer, name=name)
        self._queued: list[TransferJob] = []

    def submit_store(self, job: TransferJob) -> None:
        self._queued.append(job)

    def submit_load(self, job: TransferJob) -> None:
        self._queued.append(job)

    def on_step_end(self) -> None:
        self._run_due()

    def _run_due(self) -> list[TransferJob]:
        """Run the queued jobs; returns them."""
        due, self._queued = self._queued, []
        for job in due:
            if job.promotion:
                super().submit_load(job)
            else:
                super().submit_store(job)
        return due

    def has_pending_work(self) -> bool:
        return bool(self._queued) or super().has_pending_work()

    def reset_cache(self) -> bool:
        return False if self._queued else super().reset_cache()

    def shutdown(self) -> None:
        self.on_step_end()
        super().shutdown()


class PendingWorkIgnoresLoads(_RunsJobsAtStepEnd):
    """Bug: jobs run at the next step (as real I/O would), but has_pending_work counts only the
    queued stores, not the queued loads."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="pending-work-ignores-loads")

    def has_pending_work(self) -> bool:
        return any(not job.promotion for job in self._queued) or MemoryTier.has_pending_work(self)  # the bug


@GALLERY.fails("test_has_pending_work_tracks_loads", "TIER-15", "while a load is in flight")
def pending_work_ignores_loads() -> TierSpec:
    return _secondary(PendingWorkIgnoresLoads)


class BatchLookupBypassesGate(LatencySecondary[MemoryTier]):
    """Bug: an asynchronous tier whose lookup_many reads the store directly, skipping the pending
    check that makes lookup answer RETRY: it answers MISS or HIT where lookup still answers RETRY."""

    def lookup_many(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> list[LookupResult]:
        return [self.inner.lookup(key, req_context) for key in keys]  # the bug


@GALLERY.fails("test_lookup_many_matches_lookup", "TIER-17", "also while unresolved")
def batch_lookup_bypasses_gate() -> TierSpec:
    return _spec(
        "BatchLookupBypassesGate",
        lambda buffer: BatchLookupBypassesGate(MemoryTier(buffer, name="batch-lookup-bypasses-gate"), lookup_steps=2),
    )


class VerifiesFirstBlockOnly(FaultySecondary[MemoryTier]):
    """Bug: a load checks the checksum of the first block of its job only; a damaged block further
    in the job is served."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(MemoryTier(buffer, name="verifies-first-block-only"), buffer=buffer)
        self._damaged: set[OffloadKey] = set()

    def damage(self, keys: Iterable[OffloadKey]) -> None:
        """The kit's corrupt_on_read hook: the next read of each key is damaged."""
        self._damaged.update(keys)

    def submit_load(self, job: TransferJob) -> None:
        for index, key in enumerate(job.keys):
            if key in self._damaged:
                self._damaged.discard(key)
                self.corrupt_on_read([key], detect=index == 0)  # the bug: only block 0 is verified
        super().submit_load(job)


@GALLERY.fails("test_corrupt_block_fails_load", "TIER-10", "never stored")
def verifies_first_block_only() -> TierSpec:
    return _spec("VerifiesFirstBlockOnly", VerifiesFirstBlockOnly, {**MEMORY_HOOKS, "corrupt_on_read": _damage})


class KeepsDamagedBlock(MemoryTier):
    """Bug: a block that fails its checksum fails every load, but stays in the index: it keeps
    answering HIT (and is promoted again and again)."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="keeps-damaged-block")

    def corrupt_on_read(self, keys: Iterable[OffloadKey]) -> None:
        self.fail_keys(keys)  # every read of the block fails its checksum; the index keeps it


@GALLERY.fails("test_corrupt_block_fails_load", "TIER-4", "failed a load as damaged")
def keeps_damaged_block() -> TierSpec:
    return _secondary(KeepsDamagedBlock)


class TouchAdmitsKeys(MemoryTier):
    """Bug: touch of a key it does not hold admits it, as an empty placeholder block."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="touch-admits-keys")
        self._size = buffer.shape[1] if buffer.shape else 1

    def touch(self, keys: Iterable[OffloadKey]) -> None:
        for key in keys:
            if self.read_stored(key) is None:
                self.seed(key, bytes(self._size))  # the bug
        super().touch(keys)


@GALLERY.fails("test_touch_of_unknown_keys_is_a_no_op", "TIER-5", "does not hold")
def touch_admits_keys() -> TierSpec:
    return _secondary(TouchAdmitsKeys)


class SilentlyEvicts(MemoryTier):
    """Bug: keeps at most 48 blocks, evicting the oldest, but does not declare eviction."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="silently-evicts", capacity_blocks=48)
        self.capabilities = replace(self.capabilities, eviction=False)  # the bug


@GALLERY.fails("test_holds_what_it_stored_past_its_capacity", "CAP-2", "does not declare eviction")
def silently_evicts() -> TierSpec:
    return _secondary(SilentlyEvicts)


class NoRemovedOnReset(MemoryTier):
    """Bug: reset_cache forgets every block without a REMOVED event."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="no-removed-on-reset")
        self._held: list[Any] = []

    def reset_cache(self) -> bool:
        self._held.extend(super().take_events())
        done = super().reset_cache()
        if done:
            super().take_events()  # the bug: the reset's REMOVED event is dropped
        return done

    def take_events(self) -> Sequence[Any]:
        out = [*self._held, *super().take_events()]
        self._held = []
        return out


@GALLERY.fails("test_events_report_removals", "TIER-14", "no REMOVED event")
def no_removed_on_reset() -> TierSpec:
    return _secondary(NoRemovedOnReset)


class NeedsOneStepMore(LatencySecondary[MemoryTier]):
    """Bug: declares max_retry_steps=1 but resolves a RETRY at the second step (its steps take a
    millisecond, so a wall-clock bound would never notice)."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(MemoryTier(buffer, name="needs-one-step-more"), lookup_steps=2)
        self.capabilities = replace(self.capabilities, max_retry_steps=1)  # the bug

    def on_step_end(self) -> None:
        time.sleep(0.001)
        super().on_step_end()


@GALLERY.fails("test_retry_resolves_within_declared_steps", "TIER-18", "still answers RETRY")
def needs_one_step_more() -> TierSpec:
    return _spec("NeedsOneStepMore", NeedsOneStepMore)


class SlowStepEnd(_RunsJobsAtStepEnd):
    """Bug: on_step_end runs the step's jobs and waits 15 ms for their I/O (fsync) instead of
    leaving them to a worker."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="slow-step-end")

    def on_step_end(self) -> None:
        if self._run_due():
            time.sleep(0.015)  # the bug: waits for the I/O


@GALLERY.fails("test_step_end_does_not_block", "TIER-13", "on_step_end blocked")
def slow_step_end() -> TierSpec:
    return _secondary(SlowStepEnd)


class SlowRemoteLookup(MemoryTier):
    """Bug: a key not held locally is looked up in a remote index synchronously (20 ms)."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="slow-remote-lookup")

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        answer = super().lookup(key, req_context)
        if answer is lr.MISS:
            time.sleep(0.02)  # the bug
        return answer


@GALLERY.fails("test_lookup_does_not_block", "TIER-4", "blocked")
def slow_remote_lookup() -> TierSpec:
    return _secondary(SlowRemoteLookup)


class PartialReportedAsSuccess(MemoryTier):
    """Bug: a job that stored some keys and failed others is reported as a success."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="partial-reported-as-success")

    def get_finished_jobs(self) -> Sequence[JobResult]:
        return [
            JobResult(r.job_id, True) if r.succeeded else r  # the bug
            for r in super().get_finished_jobs()
        ]


@GALLERY.fails("test_partial_job_reports_succeeded_keys", "TIER-11", "only keys that were stored")
def partial_reported_as_success() -> TierSpec:
    return _secondary(PartialReportedAsSuccess)


class OldGenerationTier(MemoryDelegate):
    """Bug: written against an older generation of the protocol: everything delegates to a
    MemoryTier, but it has no ``touch``."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="old-generation-tier")

    def submit_load(self, job: TransferJob) -> None:
        self.inner.submit_load(job)


@GALLERY.fails("test_satisfies_secondary_protocol", "TIER-1", "lacks SecondaryTier member(s): touch")
def old_generation_tier() -> TierSpec:
    return _spec("OldGenerationTier", OldGenerationTier)


@GALLERY.fails("test_complete_load_releases_pin", "TIER-9", "pins leaked")
def leaked_pin() -> TierSpec:
    """The reference primary tier with one bug: complete_load releases nothing."""
    class LeakedPin(MemoryPrimaryTier):
        def complete_load(self, keys: Iterable[OffloadKey]) -> None:
            """Bug: the pins taken by prepare_load are never released."""

    return memory_primary_spec(LeakedPin)


def _damage(tier: object, keys: Iterable[OffloadKey]) -> None:
    assert isinstance(tier, VerifiesFirstBlockOnly)
    tier.damage(keys)


class EvictsOwnInput(MemoryPrimaryTier):
    """Bug: chooses eviction victims among all unpinned READY blocks, its own input keys included."""

    def select_victims(
        self, count: int, keep: Container[OffloadKey], incoming: Collection[OffloadKey] = ()
    ) -> list[OffloadKey] | None:
        return super().select_victims(count, (), incoming)  # the bug: input keys not protected


@GALLERY.fails("test_prepare_store_never_evicts_its_own_input", "TIER-6", "its own input keys")
def evicts_own_input() -> TierSpec:
    return memory_primary_spec(EvictsOwnInput)


class EvictsBeforeGivingUp(MemoryPrimaryTier):
    """Bug: when it cannot make enough room, it still evicts what it could before returning None."""

    def prepare_store(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> kvproto.PrepareStoreOutput | None:
        out = super().prepare_store(keys, req_context)
        if out is None:  # the bug: makes what room it can, then gives up
            self.evict([k for k in self.ready_slots if k not in keys])
        return out


@GALLERY.fails("test_prepare_store_short_of_room_changes_nothing", "TIER-6", "evict nothing")
def evicts_before_giving_up() -> TierSpec:
    return memory_primary_spec(EvictsBeforeGivingUp)


class FailedStoreDropsReady(MemoryPrimaryTier):
    """Bug: complete_store(False) drops every key of the batch, READY ones included."""

    def complete_store(self, keys: Iterable[OffloadKey], success: bool) -> None:
        batch = list(keys)
        super().complete_store(batch, success)
        if not success:
            self.evict(batch)  # the bug: the READY, unpinned keys of the batch go too


@GALLERY.fails("test_failed_store_leaves_ready_keys", "TIER-7", "it was READY in")
def failed_store_drops_ready() -> TierSpec:
    return memory_primary_spec(FailedStoreDropsReady)


class PinsNotCounted(MemoryPrimaryTier):
    """Bug: complete_load releases every pin of a key, not one."""

    def complete_load(self, keys: Iterable[OffloadKey]) -> None:
        for key in keys:
            while self.pin_count(key):  # the bug
                super().complete_load([key])


@GALLERY.fails("test_two_pins_released_once_stay_protected", "TIER-8", "pins must be counted")
def pins_not_counted() -> TierSpec:
    return memory_primary_spec(PinsNotCounted)


class ResetIgnoresPins(MemoryPrimaryTier):
    """Bug: reset_cache refuses only while a store is in flight; pinned blocks are dropped under their loads."""

    def reset_cache(self) -> bool:
        for key, count in list(self.pins.items()):  # the bug: releases the pins of loads in flight
            self.complete_load([key] * count)
        return super().reset_cache()


@GALLERY.fails("test_reset_cache_with_pins_held", "TIER-16", "with a pin held")
def reset_ignores_pins() -> TierSpec:
    return memory_primary_spec(ResetIgnoresPins)


class StaleReadyKeys(MemoryPrimaryTier):
    """Bug: ready_keys is a snapshot taken when asked, not a live view."""

    @property
    def ready_keys(self) -> frozenset[OffloadKey]:
        return frozenset(self.ready_slots)  # the bug


@GALLERY.fails("test_ready_keys_agrees_with_lookup", "TIER-17", "live view")
def stale_ready_keys() -> TierSpec:
    return memory_primary_spec(StaleReadyKeys)


class BufferCopy(MemoryPrimaryTier):
    """Bug: ``buffer`` hands out a fresh copy of the slots on every access, not the shared memory."""

    @property
    def buffer(self) -> memoryview:
        return memoryview(bytearray(super().buffer.tobytes())).cast("B", (self.num_slots, self.block_bytes))


@GALLERY.fails("test_buffer_is_a_shared_writable_2d_byte_view", "TIER-3", "returns a copy")
def buffer_copy() -> TierSpec:
    return memory_primary_spec(BufferCopy)


class PrimaryAnswersRetry(MemoryPrimaryTier):
    """Bug: a store in flight answers RETRY (a legacy ``None`` translated with the secondary's meaning)."""

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        answer = super().lookup(key, req_context)
        return lr.RETRY if answer is lr.HIT_PENDING else answer  # the bug


@GALLERY.fails("test_never_answers_retry", "LR-4", "answered RETRY")
def primary_answers_retry() -> TierSpec:
    return memory_primary_spec(PrimaryAnswersRetry)


class ShutdownDeadlocksAfterReset(MemoryTier):
    """Bug: ``reset_cache`` starts a background scan that never ends, and ``shutdown`` waits for it (as
    a tier whose restart scan deadlocks does): the kit must fail it on TIER-16 within
    ``shutdown_timeout_s``, not hang with no verdict."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="shutdown-deadlocks-after-reset")
        self._scan_done: threading.Event | None = None

    def reset_cache(self) -> bool:
        self._scan_done = threading.Event()  # the bug: the scan it stands for never ends
        return super().reset_cache()

    def shutdown(self) -> None:
        if self._scan_done is not None:
            self._scan_done.wait()  # waits for a scan that cannot end
        super().shutdown()


@GALLERY.fails("test_reset_cache_forgets_blocks", "TIER-16", "did not return within 1 s")
def shutdown_deadlocks_after_reset() -> TierSpec:
    return TierSpec("shutdown-deadlocks-after-reset", "secondary", ShutdownDeadlocksAfterReset, hooks=MEMORY_HOOKS,
                    limits=replace(_QUICK, shutdown_timeout_s=1.0))
