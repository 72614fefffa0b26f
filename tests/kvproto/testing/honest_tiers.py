"""Correct tiers the kit must pass, though they look unusual (issue #9: no false blame).

* ``small_memory``: a MemoryTier keeping 16 blocks, declaring eviction (the smallest capacity the
  kit supports with eviction declared).
* ``stops_at_first_bad_key``: a tier whose jobs stop at the first key that fails; the keys after
  it fail untried (a partial result naming only the keys before it).
* ``clocked_primary``: a MemoryPrimaryTier with a pending deadline on a clock the kit moves (the
  ``advance_clock`` hook): its expired writes keep their slots quarantined (TIER-25).
* ``no_eviction_primary``: a primary that declares no eviction and answers ``None`` when full; the
  pin checks run on it (not skipped) through what it does instead (CAP-5).
* ``late_once_for_others_blocks``: a shared BlobTier whose first check of each block another instance
  stored misses its declared step deadline (RETRY, then MISS, as under load): TIER-18's sharing check
  asks such keys again in a new request instead of blaming it.
"""

from __future__ import annotations

from collections.abc import Collection, Container, Iterable, Sequence

from kvproto import Capabilities, JobResult, MemoryPrimaryTier, MemoryTier, OffloadKey, TransferJob
from kvproto.testing import MEMORY_HOOKS, TierSpec

from tests.kvproto.testing.gallery_sharing import AlwaysLateForOthersBlocks, _spec


def small_memory() -> TierSpec:
    return TierSpec(
        "small-memory", "secondary", lambda buffer: MemoryTier(buffer, name="small-memory", capacity_blocks=16),
        hooks=MEMORY_HOOKS,
    )


class StopsAtFirstBadKey(MemoryTier):
    """Moves a job's blocks in order and stops at the first that fails; the rest fail untried."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="stops-at-first-bad-key")
        self._bad: set[OffloadKey] = set()
        self._jobs: dict[int, TransferJob] = {}

    def fail_keys(self, keys: Iterable[OffloadKey]) -> None:
        keys = list(keys)
        self._bad.update(keys)
        super().fail_keys(keys)

    def _cut(self, job: TransferJob) -> TransferJob:
        stop = next((i for i, k in enumerate(job.keys) if k in self._bad), len(job.keys))
        if stop == len(job.keys):
            return job
        self._jobs[job.job_id] = job
        return TransferJob(job.job_id, job.keys[:stop], job.slots[:stop], job.promotion, job.req_id)

    def submit_store(self, job: TransferJob) -> None:
        super().submit_store(self._cut(job))

    def submit_load(self, job: TransferJob) -> None:
        super().submit_load(self._cut(job))

    def get_finished_jobs(self) -> Sequence[JobResult]:
        out: list[JobResult] = []
        for result in super().get_finished_jobs():
            whole = self._jobs.pop(result.job_id, None)
            if whole is None:
                out.append(result)
                continue
            cut = TransferJob(result.job_id, whole.keys, whole.slots, whole.promotion, whole.req_id)
            done = result.succeeded_keys(cut) & set(whole.keys[: next(i for i, k in enumerate(whole.keys) if k in self._bad)])
            out.append(JobResult(result.job_id, False, frozenset(done) if done else None))
        return out


def stops_at_first_bad_key() -> TierSpec:
    return TierSpec("stops-at-first-bad-key", "secondary", StopsAtFirstBadKey, hooks=MEMORY_HOOKS)


class NoEvictionPrimary(MemoryPrimaryTier):
    """A primary that never drops a block: a full tier answers ``None`` to a store with no free slot
    (declares no eviction; pins shown by has_pending_work and reset_cache refusing, CAP-5)."""

    def __init__(self, *, num_slots: int, block_bytes: int, name: str = "no-eviction-primary") -> None:
        super().__init__(num_slots=num_slots, block_bytes=block_bytes, name=name)
        self.capabilities = Capabilities(
            eviction=False,
            reasons={
                "eviction": "never drops a block: a full tier refuses the store",
                "async_lookup": "a primary tier never answers RETRY",
                "persistence": "host memory",
                "sharing": "one process's buffer",
                "partial_jobs": "stores complete per call",
            },
        )

    def select_victims(
        self, count: int, keep: Container[OffloadKey], incoming: Collection[OffloadKey] = ()
    ) -> list[OffloadKey] | None:
        """No victims, ever: too few free slots means ``None`` (TIER-6 all or nothing, CAP-2)."""
        return [] if count == 0 else None


def no_eviction_primary() -> TierSpec:
    """NoEvictionPrimary, 16 slots of 32 bytes, its declaration read from the tier."""
    build = NoEvictionPrimary
    return TierSpec("no-eviction-primary", "primary", lambda: build(num_slots=16, block_bytes=32), tier_class=build)


class ClockedPrimary(MemoryPrimaryTier):
    """A MemoryPrimaryTier with a 1 s pending deadline on a clock the kit moves (``advance_clock``)."""

    tier_name = "clocked-primary"

    def __init__(self, *, num_slots: int, block_bytes: int) -> None:
        self.now = 0.0
        super().__init__(
            num_slots=num_slots, block_bytes=block_bytes, pending_deadline_s=1.0, name=self.tier_name,
            clock=lambda: self.now,
        )


def _advance_clock(tier: ClockedPrimary, seconds: float) -> None:
    tier.now += seconds


def clocked_spec(cls: type[ClockedPrimary]) -> TierSpec:
    """``cls`` (32 slots of 64 bytes) with the ``advance_clock`` hook."""
    return TierSpec(
        cls.__name__, "primary", lambda: cls(num_slots=32, block_bytes=64), hooks={"advance_clock": _advance_clock},
        tier_class=cls,
    )


def clocked_primary() -> TierSpec:
    return clocked_spec(ClockedPrimary)



class LateOnceForOthersBlocks(AlwaysLateForOthersBlocks):
    """A correct shared BlobTier whose existence check of each block another instance stored misses
    its declared step deadline the first time it is asked (as a loaded machine can make any tier's
    check do): that lookup answers RETRY through ``max_retry_steps`` end-of-step hooks, then MISS,
    which the contract allows (AP-3); every later lookup answers as BlobTier does."""

    tier_name = "late-once-for-others-blocks"
    late_once = True


def late_once_for_others_blocks() -> TierSpec:
    """:class:`LateOnceForOthersBlocks` with the ``reopen`` hook (a second live instance over its storage)."""
    return _spec(LateOnceForOthersBlocks)
