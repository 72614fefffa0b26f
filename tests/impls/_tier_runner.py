"""Test support shared by the blob tiers' tests (fs, obj): a slot buffer, keys with known bytes, and a
runner that submits jobs to a secondary tier and blocks until they are reported (tests only)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Generic, TypeVar

from kvproto import JobResult, OffloadKey, ReqContext, SecondaryTier, TransferJob, make_key, members as lr

__all__ = ["BLOCK", "SLOTS", "Runner", "block_of", "key", "make_buffer", "shut_down_after"]

BLOCK = 4096
SLOTS = 32

_T = TypeVar("_T", bound=SecondaryTier)


def make_buffer(slots: int = SLOTS, block: int = BLOCK) -> memoryview:
    return memoryview(bytearray(slots * block)).cast("B", (slots, block))


def key(i: int, tag: bytes = b"k") -> OffloadKey:
    return make_key(hashlib.sha256(tag + i.to_bytes(8, "big")).digest(), i % 3)


def block_of(k: bytes, size: int = BLOCK) -> bytes:
    seed = hashlib.sha256(k).digest()
    return (seed * (size // len(seed) + 1))[:size]


class Runner(Generic[_T]):
    """Submits jobs to a tier and waits for their results (tests only: it blocks)."""

    def __init__(self, tier: _T, buffer: memoryview) -> None:
        self.tier = tier
        self.buffer = buffer
        self.flat = buffer.cast("B")
        self.block = buffer.shape[1] if buffer.shape else 0
        self.next_id = 1
        self.jobs: dict[int, TransferJob] = {}
        self.results: dict[int, JobResult] = {}
        self.req = ReqContext("test")
        self.steps = 0

    def row(self, slot: int) -> bytes:
        return bytes(self.flat[slot * self.block : (slot + 1) * self.block])

    def wait(self, job_id: int, timeout: float = 20.0) -> JobResult:
        """The result of job ``job_id`` (results of other jobs reported meanwhile are kept for their wait)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if job_id in self.results:
                return self.results.pop(job_id)
            self.tier.on_step_end()
            for result in self.tier.get_finished_jobs():
                self.results[result.job_id] = result
            if job_id not in self.results:
                time.sleep(0.0005)
        raise AssertionError(f"job {job_id} not reported within {timeout} s")

    def submit_job(self, keys: Sequence[OffloadKey], slots: Sequence[int], *, promotion: bool) -> int:
        """Submit a job over rows as they are (no filling, no clearing); its id."""
        job = TransferJob(self.next_id, tuple(keys), tuple(slots), promotion)
        self.next_id += 1
        self.jobs[job.job_id] = job
        (self.tier.submit_load if promotion else self.tier.submit_store)(job)
        return job.job_id

    def submit_load_job(self, keys: Sequence[OffloadKey], slots: Sequence[int]) -> int:
        """Clear rows ``slots`` and submit a load of ``keys`` into them; its id."""
        for s in slots:
            self.flat[s * self.block : (s + 1) * self.block] = bytes(self.block)
        return self.submit_job(keys, slots, promotion=True)

    def submit_store(self, keys: Sequence[OffloadKey], slots: Sequence[int] | None = None) -> int:
        slots = list(range(len(keys))) if slots is None else list(slots)
        for k, s in zip(keys, slots, strict=True):
            self.flat[s * self.block : (s + 1) * self.block] = block_of(k, self.block)
        job = TransferJob(self.next_id, tuple(keys), tuple(slots), False)
        self.next_id += 1
        self.jobs[job.job_id] = job
        self.tier.submit_store(job)
        return job.job_id

    def store(self, keys: Sequence[OffloadKey], slots: Sequence[int] | None = None) -> JobResult:
        return self.wait(self.submit_store(keys, slots))

    def load(self, keys: Sequence[OffloadKey], slots: Sequence[int] | None = None
             ) -> tuple[JobResult, set[OffloadKey], set[OffloadKey]]:
        """(result, keys loaded with the right bytes, keys reported done with WRONG bytes)."""
        slots = list(range(len(keys))) if slots is None else list(slots)
        for s in slots:
            self.flat[s * self.block : (s + 1) * self.block] = bytes(self.block)
        job = TransferJob(self.next_id, tuple(keys), tuple(slots), True)
        self.next_id += 1
        self.jobs[job.job_id] = job
        self.tier.submit_load(job)
        result = self.wait(job.job_id)
        done = result.succeeded_keys(job)
        right = {k for k, s in zip(keys, slots, strict=True) if k in done and self.row(s) == block_of(k, self.block)}
        wrong = {k for k in done if k not in right}
        return result, right, wrong

    def resolve(self, keys: Sequence[OffloadKey], timeout: float = 10.0, req: ReqContext | None = None
                ) -> dict[OffloadKey, str]:
        """Ask until no key answers RETRY; the answers by name, and the steps it took in ``self.steps``."""
        req = self.req if req is None else req
        answers: dict[OffloadKey, str] = {}
        deadline = time.monotonic() + timeout
        waiting = list(keys)
        self.steps = 0
        while waiting and time.monotonic() < deadline:
            still = []
            for k in waiting:
                answer = self.tier.lookup(k, req)
                if answer is lr.RETRY:
                    still.append(k)
                else:
                    answers[k] = answer.name
            waiting = still
            if waiting:
                self.tier.on_step_end()
                self.steps += 1
                time.sleep(0.003)
        assert not waiting, f"{len(waiting)} keys still RETRY"
        return answers

    def finish(self) -> None:
        """End the current request (its verdicts go, AP-4) and start a new one."""
        self.tier.on_request_finished(self.req)
        self.req = ReqContext(f"test-{self.next_id}-{time.monotonic_ns()}")


@contextmanager
def shut_down_after(opened: tuple[_T, Runner[_T]]) -> Iterator[tuple[_T, Runner[_T]]]:
    """A ``(tier, runner)`` pair for a ``with`` block: the tier is shut down when the block ends, whatever happens."""
    try:
        yield opened
    finally:
        opened[0].shutdown()
