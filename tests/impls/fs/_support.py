"""Helpers for the filesystem tier's tests: a buffer, keys with known bytes, and blocking job runs."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from kvproto import JobResult, OffloadKey, ReqContext, TransferJob, make_key

from kvproto_fs import FsTier, FsTierConfig

BLOCK = 4096
SLOTS = 32


def make_buffer(slots: int = SLOTS, block: int = BLOCK) -> memoryview:
    return memoryview(bytearray(slots * block)).cast("B", (slots, block))


def key(i: int, tag: bytes = b"k") -> OffloadKey:
    return make_key(hashlib.sha256(tag + i.to_bytes(8, "big")).digest(), i % 3)


def block_of(k: bytes, size: int = BLOCK) -> bytes:
    seed = hashlib.sha256(k).digest()
    return (seed * (size // len(seed) + 1))[:size]


class Runner:
    """Submits jobs to a tier and waits for their results (tests only: it blocks)."""

    def __init__(self, tier: FsTier, buffer: memoryview) -> None:
        self.tier = tier
        self.buffer = buffer
        self.flat = buffer.cast("B")
        self.block = buffer.shape[1] if buffer.shape else 0
        self.next_id = 1
        self.req = ReqContext("test")

    def row(self, slot: int) -> bytes:
        return bytes(self.flat[slot * self.block : (slot + 1) * self.block])

    def _wait(self, job_id: int, timeout: float = 10.0) -> JobResult:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.tier.on_step_end()
            for result in self.tier.get_finished_jobs():
                if result.job_id == job_id:
                    return result
            time.sleep(0.0005)
        raise AssertionError(f"job {job_id} not reported within {timeout} s")

    def store(self, keys: Sequence[OffloadKey], slots: Sequence[int] | None = None) -> JobResult:
        slots = list(range(len(keys))) if slots is None else list(slots)
        for k, s in zip(keys, slots, strict=True):
            self.flat[s * self.block : (s + 1) * self.block] = block_of(k, self.block)
        job = TransferJob(self.next_id, tuple(keys), tuple(slots), False)
        self.next_id += 1
        self.tier.submit_store(job)
        return self._wait(job.job_id)

    def load(
        self, keys: Sequence[OffloadKey], slots: Sequence[int] | None = None
    ) -> tuple[JobResult, set[OffloadKey], set[OffloadKey]]:
        """(result, keys loaded with the right bytes, keys reported done with WRONG bytes)."""
        slots = list(range(len(keys))) if slots is None else list(slots)
        for s in slots:
            self.flat[s * self.block : (s + 1) * self.block] = bytes(self.block)
        job = TransferJob(self.next_id, tuple(keys), tuple(slots), True)
        self.next_id += 1
        self.tier.submit_load(job)
        result = self._wait(job.job_id)
        done = result.succeeded_keys(job)
        right = {k for k, s in zip(keys, slots, strict=True) if k in done and self.row(s) == block_of(k, self.block)}
        wrong = {k for k in done if k not in right}
        return result, right, wrong

    def resolve(self, keys: Sequence[OffloadKey], timeout: float = 5.0) -> dict[OffloadKey, str]:
        from kvproto import members as lr

        answers: dict[OffloadKey, str] = {}
        deadline = time.monotonic() + timeout
        waiting = list(keys)
        while waiting and time.monotonic() < deadline:
            still = []
            for k in waiting:
                answer = self.tier.lookup(k, self.req)
                if answer is lr.RETRY:
                    still.append(k)
                else:
                    answers[k] = answer.name
            waiting = still
            self.tier.on_step_end()
            time.sleep(0.002)
        assert not waiting, f"{len(waiting)} keys still RETRY"
        return answers


def open_tier(root: Path, buffer: memoryview | None = None, **options: object) -> tuple[FsTier, Runner]:
    buf = make_buffer() if buffer is None else buffer
    tier = FsTier(buf, FsTierConfig(root=root, **options))
    assert tier.wait_ready(10)
    return tier, Runner(tier, buf)


@contextmanager
def opened_tier(root: Path, buffer: memoryview | None = None, **options: object) -> Iterator[tuple[FsTier, Runner]]:
    """:func:`open_tier` for a ``with`` block; the tier is shut down when the block ends, whatever happens."""
    tier, run = open_tier(root, buffer, **options)
    try:
        yield tier, run
    finally:
        tier.shutdown()


def temp_files(tier: FsTier) -> list[Path]:
    return sorted(tier.tmp_dir.glob("*.tmp"))
