"""The in-memory reference secondary tier and test double (MEM-1..MEM-9)."""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvproto import members as lr
from kvproto._capabilities import Capabilities
from kvproto._events import MAX_PENDING_EVENTS, EventKind, OffloadingEvent
from kvproto._job_faults import JobFaultHooks, JobFaults
from kvproto._jobs import JobResult, TransferJob
from kvproto._keys import OffloadKey
from kvproto._requests import ReqContext
from kvproto._results import LookupResult
from kvproto._slot_buffer import slot_buffer_shape
from kvproto.errors import ConfigurationError, InvalidArgumentError

__all__ = ["MemoryTier"]

_log = logging.getLogger("kvproto.memory_tier")


@dataclass(slots=True, eq=False)
class _PendingJob:
    job: TransferJob
    fail_all: bool


class MemoryTier(JobFaultHooks):
    """A secondary tier that keeps blocks as ``bytes`` in a dict (MEM-1).

    It satisfies :class:`~kvproto.SecondaryTier` structurally, moving bytes
    between its dict and rows of ``buffer`` (the primary tier's slot buffer,
    a writable 2-D ``memoryview`` of format ``"B"``). It is the reference
    secondary tier for tier authors:

    * a submitted job runs at once and is reported by the next
      :meth:`get_finished_jobs`; with ``latency_s > 0`` it runs on a worker
      thread after that many seconds instead, so its result arrives between
      steps, as a tier doing real I/O on threads would (MEM-3);
    * lookups answer HIT or MISS at once (MEM-2);
    * ``capacity_blocks``: keep at most this many blocks, evicting the least
      recently used (MEM-5).

    Latency in steps and RETRY-answering lookups are not its business: wrap
    it (or any tier) in :class:`kvproto.testing.faults.LatencySecondary`, as
    the reference tiers ``memory-async`` and ``memory-threaded`` do (MEM-4).

    Every stored block carries a CRC-32 of its bytes, checked on every read:
    a block that fails the check is dropped (it becomes a MISS and a
    ``REMOVED`` event) and its key fails in the load job, so the tier never
    writes wrong bytes into the primary buffer (MEM-6). Fault injection:
    :meth:`fail_next_jobs`, :meth:`fail_keys`, :meth:`corrupt_on_read` (MEM-7).
    """

    def __init__(
        self,
        buffer: memoryview,
        *,
        name: str = "memory",
        latency_s: float = 0.0,
        capacity_blocks: int | None = None,
    ) -> None:
        num_slots, block_bytes = slot_buffer_shape(f"MemoryTier {name!r}", buffer)
        if type(latency_s) not in (int, float) or not 0.0 <= latency_s < float("inf"):
            raise ConfigurationError(
                f"MemoryTier {name!r}: latency_s must be a finite number >= 0, got {latency_s!r}"
            )
        if capacity_blocks is not None and (type(capacity_blocks) is not int or capacity_blocks < 1):
            raise ConfigurationError(
                f"MemoryTier {name!r}: capacity_blocks must be None or an int >= 1, "
                f"got {capacity_blocks!r}"
            )
        self._name = name
        self._buffer = buffer
        self._num_slots = num_slots
        self._block_bytes = block_bytes
        # CPython cannot index rows of a 2-D memoryview; rows are slices of a flat view.
        self._flat = buffer.cast("B")
        self._latency_s = float(latency_s)
        self._capacity = capacity_blocks
        self._lock = threading.RLock()  # guards the store, results, events, fault sets
        self._store: OrderedDict[OffloadKey, tuple[bytes, int]] = OrderedDict()
        self._finished: list[JobResult] = []
        self._unreported: set[int] = set()  # job ids submitted and not yet reported
        # Events nobody takes cannot grow without bound: the oldest are dropped (MGR-18).
        self._events: deque[OffloadingEvent] = deque(maxlen=MAX_PENDING_EVENTS)
        self._job_faults = JobFaults()
        self._corrupt: set[OffloadKey] = set()
        self._closed = False
        self._timers: list[threading.Thread] = []
        self.capabilities = Capabilities(
            async_lookup=False,
            max_retry_steps=0,
            persistence=False,
            eviction=capacity_blocks is not None,
            sharing=False,
            partial_jobs=True,
            lru=capacity_blocks is not None,  # evicts from the least recently used end (MEM-5, CAP-6)
            reasons={
                "persistence": "in-memory by design",
                "sharing": "one process's dict",
                **({} if capacity_blocks is not None else {"eviction": "no capacity_blocks set"}),
                "async_lookup": "answers from its dict at once",
            },
        )

    # -- SecondaryTier ---------------------------------------------------------------

    @property
    def name(self) -> str:
        """The name given at construction, used in events and logs."""
        return self._name

    @property
    def step_driven(self) -> bool:
        """True without ``latency_s``: every job ends by the next ``get_finished_jobs``, whatever time passes,
        so ``kvproto simulate --trace`` may replay over it in virtual time (MGR-22)."""
        return self._latency_s == 0.0

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """HIT if stored, else MISS (MEM-2). Never HIT_PENDING (LR-3), never RETRY. Never blocks."""
        return lr.HIT if key in self._store else lr.MISS

    def touch(self, keys: Iterable[OffloadKey]) -> None:
        """Move stored ``keys`` to the most recently used end of the LRU order (TIER-5, MEM-5)."""
        with self._lock:
            store = self._store
            for key in keys:
                if key in store:
                    store.move_to_end(key)

    def submit_store(self, job: TransferJob) -> None:
        """Accept a primary -> tier copy of rows ``job.slots`` (TIER-10, MEM-3).

        The rows are read when the job runs. Raises
        :class:`~kvproto.errors.InvalidArgumentError` for a promotion job or a
        slot outside the buffer.
        """
        self._submit(job, promotion=False)

    def submit_load(self, job: TransferJob) -> None:
        """Accept a tier -> primary copy into rows ``job.slots`` (TIER-10, MEM-3).

        A key that is not stored, is listed by :meth:`fail_keys`, or fails its
        checksum fails in the job; its row is left untouched (MEM-6).
        """
        self._submit(job, promotion=True)

    def get_finished_jobs(self) -> Sequence[JobResult]:
        """Results of jobs that ran since the last call, each reported exactly once (TIER-11)."""
        with self._lock:
            done = self._finished
            self._finished = []
            for result in done:
                self._unreported.discard(result.job_id)
        return done

    # -- TierLifecycle -----------------------------------------------------------------

    def on_request_finished(self, req_context: ReqContext) -> None:
        """Nothing to drop: the tier keeps no per-request state (TIER-12)."""

    def on_step_end(self) -> None:
        """Nothing to do: jobs run at submission or on their worker (TIER-13, MEM-3)."""

    def take_events(self) -> Sequence[OffloadingEvent]:
        """STORED events for blocks stored by jobs, REMOVED for evicted or dropped ones (TIER-14)."""
        with self._lock:
            events = list(self._events)
            self._events.clear()
        return events

    def has_pending_work(self) -> bool:
        """True while a submitted job has not been reported by :meth:`get_finished_jobs` (TIER-15)."""
        with self._lock:
            return bool(self._unreported)

    def reset_cache(self) -> bool:
        """Forget every block (REMOVED event); False while any job is unreported (TIER-16)."""
        with self._lock:
            if self._unreported:
                return False
            keys = tuple(self._store)
            self._store.clear()
            self._corrupt.clear()
            if keys:
                self._events.append(OffloadingEvent(EventKind.REMOVED, keys, self._name))
        return True

    def shutdown(self) -> None:
        """Wait for the jobs running on workers and join them (TIER-16, MEM-8).

        Their results stay available to one last :meth:`get_finished_jobs`.
        Jobs submitted afterwards fail at once. Idempotent.
        """
        self._closed = True
        for timer in self._timers:
            timer.join()
        self._timers = []

    # -- fault injection (MEM-7): fail_next_jobs and fail_keys come from JobFaultHooks ----

    def corrupt_on_read(self, keys: Iterable[OffloadKey]) -> None:
        """Make the next read of each stored block among ``keys`` see flipped bytes (MEM-6).

        The checksum catches it: the load fails for that key and the block is
        dropped, so it answers MISS from then on. Never wrong bytes.
        """
        with self._lock:
            self._corrupt.update(keys)

    # -- backdoor for tests and the conformance kit ------------------------------------

    def stored_keys(self) -> frozenset[OffloadKey]:
        """The keys stored right now, bypassing lookups and probes."""
        with self._lock:
            return frozenset(self._store)

    def read_stored(self, key: OffloadKey) -> bytes | None:
        """The bytes stored under ``key`` (as written, ignoring injected corruption), or None."""
        with self._lock:
            found = self._store.get(key)
        return None if found is None else found[0]

    def seed(self, key: OffloadKey, data: bytes) -> None:
        """Store ``data`` under ``key`` directly (no job, no event); it must be one block long."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidArgumentError(f"seed: data must be bytes, got {type(data).__name__}")
        blob = bytes(data)
        if len(blob) != self._block_bytes:
            raise InvalidArgumentError(
                f"seed({key!r}): data is {len(blob)} bytes, blocks are {self._block_bytes}"
            )
        with self._lock:
            self._put(key, blob)
            self._corrupt.discard(key)

    # -- internals ---------------------------------------------------------------------

    def _submit(self, job: TransferJob, *, promotion: bool) -> None:
        if not isinstance(job, TransferJob):
            raise InvalidArgumentError(
                f"MemoryTier {self._name!r}: expected a TransferJob, got {type(job).__name__}"
            )
        if job.promotion is not promotion:
            method = "submit_load" if promotion else "submit_store"
            raise InvalidArgumentError(
                f"MemoryTier {self._name!r}: {method} got job {job.job_id} "
                f"with promotion={job.promotion}"
            )
        for slot in job.slots:
            if type(slot) is not int or not 0 <= slot < self._num_slots:
                raise InvalidArgumentError(
                    f"MemoryTier {self._name!r}: job {job.job_id} names slot {slot!r}, "
                    f"buffer has {self._num_slots} slots"
                )
        with self._lock:
            if job.job_id in self._unreported:
                raise InvalidArgumentError(
                    f"MemoryTier {self._name!r}: job id {job.job_id} is already in flight"
                )
            self._unreported.add(job.job_id)
            fail_all = self._job_faults.take_next()
            if self._closed:
                self._finished.append(JobResult(job.job_id, False))
                return
        self._dispatch(_PendingJob(job, fail_all))

    def _dispatch(self, pending: _PendingJob) -> None:
        if self._latency_s <= 0.0:
            self._run(pending)
            return
        timer = threading.Thread(
            target=self._run_later, args=(pending,), name=f"kvproto-mem-{self._name}", daemon=True
        )
        self._timers = [t for t in self._timers if t.is_alive()]
        self._timers.append(timer)
        timer.start()

    def _run_later(self, pending: _PendingJob) -> None:
        time.sleep(self._latency_s)
        self._run(pending)

    def _run(self, pending: _PendingJob) -> None:
        job = pending.job
        with self._lock:
            if pending.fail_all:
                self._finished.append(JobResult(job.job_id, False))
                return
            ok = self._run_load(job) if job.promotion else self._run_store(job)
            if len(ok) == len(job.keys):
                result = JobResult(job.job_id, True)
            else:
                result = JobResult(job.job_id, False, frozenset(ok))
            self._finished.append(result)

    def _run_store(self, job: TransferJob) -> list[OffloadKey]:
        ok: list[OffloadKey] = []
        # The STORED event goes before the REMOVED events of blocks the job's puts evict:
        # collect those aside while the puts run.
        events, self._events = self._events, deque()
        flat = self._flat
        size = self._block_bytes
        for key, slot in zip(job.keys, job.slots, strict=True):
            if key in self._job_faults.keys:
                continue
            self._put(key, bytes(flat[slot * size : (slot + 1) * size]))
            self._corrupt.discard(key)
            ok.append(key)
        evictions, self._events = self._events, events
        if ok:
            events.append(OffloadingEvent(EventKind.STORED, tuple(ok), self._name))
        events.extend(evictions)
        return ok

    def _run_load(self, job: TransferJob) -> list[OffloadKey]:
        ok: list[OffloadKey] = []
        bad: list[OffloadKey] = []
        flat = self._flat
        size = self._block_bytes
        for key, slot in zip(job.keys, job.slots, strict=True):
            found = self._store.get(key)
            if found is None or key in self._job_faults.keys:
                continue
            data, crc = found
            if key in self._corrupt:
                self._corrupt.discard(key)
                data = bytes(b ^ 0xFF for b in data[:1]) + data[1:]
            if zlib.crc32(data) != crc:
                _log.warning(
                    "MemoryTier %r: block %r failed its checksum; dropping it", self._name, key
                )
                del self._store[key]
                bad.append(key)
                continue
            flat[slot * size : (slot + 1) * size] = data
            self._store.move_to_end(key)
            ok.append(key)
        if bad:
            self._events.append(OffloadingEvent(EventKind.REMOVED, tuple(bad), self._name))
        return ok

    def _put(self, key: OffloadKey, blob: bytes) -> None:
        store = self._store
        store[key] = (blob, zlib.crc32(blob))
        store.move_to_end(key)
        if self._capacity is not None and len(store) > self._capacity:
            evicted: list[OffloadKey] = []
            while len(store) > self._capacity:
                old, _ = store.popitem(last=False)
                evicted.append(old)
            self._events.append(OffloadingEvent(EventKind.REMOVED, tuple(evicted), self._name))
