"""``FileTier``: each block is a file ``<root>/<key hex>``, written and read on a worker thread."""

from __future__ import annotations

import os
import tempfile
import threading
import zlib
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from kvproto import (
    Capabilities,
    EventKind,
    JobResult,
    LookupResult,
    OffloadingEvent,
    OffloadKey,
    ReqContext,
    SecondaryTier,
    TransferJob,
)
from kvproto import members as lr

if TYPE_CHECKING:
    from kvproto.testing import TierSpec

__all__ = ["FileTier", "conformance_spec"]

_CRC = 4  # every file starts with the CRC-32 of the block, so a damaged file never loads


class FileTier:
    """A secondary tier keeping one file per block under ``root``.

    * Lookups never touch the disk: an in-memory index of the keys whose
      files are complete answers HIT or MISS at once (TIER-4).
    * Jobs run on one worker thread; a key enters the index only after its
      file was written and renamed into place, so a HIT is always readable
      and a failed store is never a HIT (TIER-10).
    * Each job is reported once by ``get_finished_jobs`` (TIER-11).
    * The files survive the instance: a new ``FileTier`` over the same
      ``root`` sees them (the ``persistence`` capability).
    """

    capabilities = Capabilities(
        persistence=True,
        reasons={
            "async_lookup": "the index answers at once",
            "eviction": "never deletes on its own",
            "sharing": "one process per directory",
            "partial_jobs": "a job fails as a whole",
        },
    )

    def __init__(self, buffer: memoryview, root: Path, *, name: str = "example-file") -> None:
        self._name = name
        self._root = root
        self._root.mkdir(parents=True, exist_ok=True)
        self._block_bytes = buffer.shape[1] if buffer.shape else 0
        self._flat = buffer.cast("B")
        self._lock = threading.Lock()
        self._index: set[OffloadKey] = {
            OffloadKey(bytes.fromhex(p.name)) for p in self._root.iterdir() if not p.name.endswith(".tmp")
        }
        self._running: dict[int, Future[JobResult]] = {}
        self._events: list[OffloadingEvent] = []
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"kvproto-{name}")
        self._closed = False

    @property
    def name(self) -> str:
        """The tier's name, used in events."""
        return self._name

    # -- lookups ---------------------------------------------------------------------------
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """HIT if the block's file is complete, else MISS; never touches the disk (TIER-4)."""
        with self._lock:
            return lr.HIT if key in self._index else lr.MISS

    def touch(self, keys: Iterable[OffloadKey]) -> None:
        """No recency kept: this tier never evicts (TIER-5)."""

    # -- jobs ------------------------------------------------------------------------------
    def submit_store(self, job: TransferJob) -> None:
        """Copy the job's slots now (the scheduler may reuse them) and write the files later (TIER-10)."""
        size = self._block_bytes
        blocks = [bytes(self._flat[s * size : (s + 1) * size]) for s in job.slots]
        self._start(job, lambda: self._store(job, blocks))

    def submit_load(self, job: TransferJob) -> None:
        """Read the job's files into its slots on the worker thread (TIER-10)."""
        self._start(job, lambda: self._load(job))

    def get_finished_jobs(self) -> Sequence[JobResult]:
        """The results of jobs finished since the last call, each once (TIER-11)."""
        with self._lock:
            done = [job_id for job_id, f in self._running.items() if f.done()]
            futures = [self._running.pop(job_id) for job_id in done]
        return [f.result() for f in futures]

    def _start(self, job: TransferJob, work: Callable[[], JobResult]) -> None:
        with self._lock:
            if self._closed:
                failed: Future[JobResult] = Future()
                failed.set_result(JobResult(job.job_id, False))
                self._running[job.job_id] = failed
                return
            self._running[job.job_id] = self._pool.submit(self._guarded, job, work)

    def _guarded(self, job: TransferJob, work: Callable[[], JobResult]) -> JobResult:
        try:
            return work()
        except OSError:
            return JobResult(job.job_id, False)

    def _path(self, key: OffloadKey) -> Path:
        return self._root / key.hex()

    def _store(self, job: TransferJob, blocks: list[bytes]) -> JobResult:
        for key, block in zip(job.keys, blocks, strict=True):
            final = self._path(key)
            tmp = final.with_name(final.name + ".tmp")
            tmp.write_bytes(zlib.crc32(block).to_bytes(_CRC, "big") + block)
            os.replace(tmp, final)
        with self._lock:
            self._index.update(job.keys)
            self._events.append(OffloadingEvent(EventKind.STORED, job.keys, self._name))
        return JobResult(job.job_id, True)

    def _load(self, job: TransferJob) -> JobResult:
        size = self._block_bytes
        for key, slot in zip(job.keys, job.slots, strict=True):
            with self._lock:
                if key not in self._index:
                    return JobResult(job.job_id, False)
            data = self._path(key).read_bytes()
            block = data[_CRC:]
            if len(block) != size or zlib.crc32(block) != int.from_bytes(data[:_CRC], "big"):
                with self._lock:  # damaged: never HIT again, or every load of it would fail (TIER-4)
                    self._index.discard(key)
                    self._events.append(OffloadingEvent(EventKind.REMOVED, (key,), self._name))
                self._path(key).unlink(missing_ok=True)
                return JobResult(job.job_id, False)
            self._flat[slot * size : (slot + 1) * size] = block
        return JobResult(job.job_id, True)

    # -- lifecycle -------------------------------------------------------------------------
    def on_request_finished(self, req_context: ReqContext) -> None:
        """No per-request state (TIER-12)."""

    def on_step_end(self) -> None:
        """Nothing to batch: jobs start when submitted (TIER-13)."""

    def take_events(self) -> Sequence[OffloadingEvent]:
        """STORED events for written blocks, REMOVED after a reset (TIER-14)."""
        with self._lock:
            events, self._events = self._events, []
        return events

    def has_pending_work(self) -> bool:
        """True while a submitted job is unreported (TIER-15)."""
        with self._lock:
            return bool(self._running)

    def reset_cache(self) -> bool:
        """Delete every block file; False while jobs are in flight (TIER-16)."""
        with self._lock:
            if self._running:
                return False
            keys = tuple(self._index)
            self._index.clear()
            if keys:
                self._events.append(OffloadingEvent(EventKind.REMOVED, keys, self._name))
        for key in keys:
            self._path(key).unlink(missing_ok=True)
        return True

    def shutdown(self) -> None:
        """Finish the jobs in flight (their results stay reportable) and stop the worker (TIER-16)."""
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=True)


def _conforms(tier: FileTier) -> SecondaryTier:
    """Never called: strict mypy proves here that FileTier satisfies SecondaryTier."""
    return tier


def conformance_spec() -> TierSpec:
    """How ``kvproto conform example-file`` builds this tier: a fresh directory per tier."""
    from kvproto.testing import TierSpec

    def build(buffer: memoryview) -> FileTier:
        return FileTier(buffer, Path(tempfile.mkdtemp(prefix="kvproto-example-")))

    def reopen(tier: FileTier, buffer: memoryview) -> FileTier:
        return FileTier(buffer, tier._root)

    def read_block(tier: FileTier, key: OffloadKey) -> bytes | None:
        path = tier._path(key)
        return path.read_bytes()[_CRC:] if path.exists() else None

    def seed_block(tier: FileTier, key: OffloadKey, data: bytes) -> None:
        tier._path(key).write_bytes(zlib.crc32(data).to_bytes(_CRC, "big") + data)
        with tier._lock:
            tier._index.add(key)

    def corrupt_on_read(tier: FileTier, keys: Iterable[OffloadKey]) -> None:
        for key in keys:
            path = tier._path(key)
            data = bytearray(path.read_bytes())
            data[-1] ^= 0xFF
            path.write_bytes(bytes(data))

    return TierSpec(
        "example-file",
        "secondary",
        build,
        hooks={
            "reopen": reopen,
            "read_block": read_block,
            "seed_block": seed_block,
            "corrupt_on_read": corrupt_on_read,
        },
        tier_class=FileTier,
        description="kvproto_example_tier.FileTier(buffer, <fresh temporary directory>)",
    )
