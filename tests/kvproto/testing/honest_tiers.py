"""Correct tiers the kit must pass, though they look unusual (issue #9: no false blame).

* ``small_memory``: a MemoryTier keeping 16 blocks, declaring eviction (the smallest capacity the
  kit supports with eviction declared).
* ``stops_at_first_bad_key``: a tier whose jobs stop at the first key that fails; the keys after
  it fail untried (a partial result naming only the keys before it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvproto import JobResult, MemoryTier, OffloadKey, TransferJob
from kvproto.testing import MEMORY_HOOKS, TierSpec


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
