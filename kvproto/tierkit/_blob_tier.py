"""``BlobTier``: a complete secondary tier over a :class:`~kvproto.tierkit.BlobBackend` (TIERKIT-1..TIERKIT-4).

The backend stores and reads blobs; everything else is here, once: the
naming and the :mod:`kvproto.envelope` around each block, jobs over bounded
worker pools, existence verdicts (a private index rebuilt by a restart scan,
or :class:`kvproto.AsyncProbe` in shared mode), events (at most
``MAX_PENDING_EVENTS`` untaken), the byte budget with LRU eviction, shutdown
and reset, partial results.

Threads: the scheduler's (every protocol method; no I/O except
``reset_cache``), a write pool and a read pool (jobs), one housekeeping
thread (start-up scan, deletions of evicted blocks), the probe's worker in
shared mode, and for an asynchronous backend its event loop, where its jobs
run (the pools stay idle) unless ``wrap`` put a synchronous layer between.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait as wait_futures
from functools import partial
from typing import ClassVar

from kvproto import envelope as env, members as lr
from kvproto._async_probe import AsyncProbe
from kvproto._events import EventKind, OffloadingEvent
from kvproto._jobs import JobResult, TransferJob
from kvproto._keys import OffloadKey
from kvproto._requests import ReqContext
from kvproto._results import LookupResult
from kvproto._slot_buffer import slot_buffer_shape
from kvproto.errors import ConfigurationError, InvalidArgumentError
from kvproto.tierkit._backend import AsyncBlobBackend, BlobBackend, HeldReads, JobAdmission
from kvproto.tierkit._blob_apply import Outcomes
from kvproto.tierkit._blob_async import LoopBackend, is_async_backend, loop_backend
from kvproto.tierkit._blob_config import BlobTierConfig, BlobTierStats, capabilities_of
from kvproto.tierkit._blob_dispatch import Dispatcher
from kvproto.tierkit._blob_exists import Existence
from kvproto.tierkit._blob_holds import Holds, default_hold_cap
from kvproto.tierkit._blob_jobs import BatchRun, JobOutcome, KeyRun, failed_outcome, run_job, run_job_on_loop, start_job
from kvproto.tierkit._blob_ledger import Ledger
from kvproto.tierkit._blob_ops import BlobOps, KeyVerdict, short_error
from kvproto.tierkit._blob_scan import PROBE_CHUNK_KEYS, restart_scan

__all__ = ["BlobTier"]

_log = logging.getLogger("kvproto.tierkit")

PREPARE_WAIT_S = 30.0
"""How long a job without a deadline waits for the backend's prepare before it starts anyway."""


def _backend_faces(
    backend: BlobBackend | AsyncBlobBackend, wrap: Callable[[BlobBackend], BlobBackend] | None, name: str,
    config: BlobTierConfig,
) -> tuple[BlobBackend, LoopBackend | None]:
    """The backend as :class:`BlobTier` drives it (TIERKIT-1): its synchronous face (``wrap`` applied)
    and the loop backend its jobs run on (an asynchronous backend not wrapped). A backend offering the
    deprecated :class:`JobAdmission` gets a DeprecationWarning: BlobTier never asks it (TIERKIT-4)."""
    sync: BlobBackend
    loop_io: LoopBackend | None = None  # jobs run on its loop (an async backend, not wrapped)
    if is_async_backend(backend):
        sync = loop_backend(backend, name=name, op_timeout_s=config.op_timeout_s)  # type: ignore[arg-type]  # checked just above
        if wrap is None:
            loop_io = sync
    else:
        sync = backend  # type: ignore[assignment]  # publish is no coroutine function: the sync flavour
    if wrap is not None:
        sync = wrap(sync)  # synchronous: jobs run on the pools, each operation waits on the loop
    if isinstance(backend, JobAdmission) or isinstance(sync, JobAdmission):
        warnings.warn(
            f"BlobTier {name!r}: the backend offers JobAdmission.refuse, which BlobTier no longer consults "
            "(deprecated, TIERKIT-4): every job runs; fail jobs in a wrapper of the tier or of the backend",
            DeprecationWarning,
            stacklevel=3,
        )
    return sync, loop_io


class BlobTier:
    """A :class:`kvproto.SecondaryTier` over ``backend``, reading and writing rows of ``buffer``.

    ``buffer`` is the primary tier's slot buffer (a writable, C-contiguous
    2-D ``memoryview`` of format ``"B"``, one row per slot); its row length
    is the block size. ``backend`` is a :class:`BlobBackend` or an
    :class:`AsyncBlobBackend`; every job it is given runs (no admission
    seam: a backend offering the deprecated :class:`JobAdmission` gets a
    ``DeprecationWarning`` and is never asked, TIERKIT-4). ``stats``: a
    counters object to fill (a subclass with the backend's own counters),
    else a new one. ``wrap`` wraps the (synchronous face of the) backend
    below the tier, for either flavour: tracing, metrics, or
    :class:`kvproto.testing.FaultyBackend` for fault injection
    (TIERKIT-8); :attr:`backend` is the wrapped one. An asynchronous
    backend's jobs run on its event loop (no worker thread per operation)
    unless ``wrap`` is given: then on the worker pools, through the wrapper.
    """

    reset_needs_storage: ClassVar[bool] = False
    """True: :meth:`reset_cache` deletes first and answers False when the storage did not answer (a remote
    store: OBJ-9, REDIS-10, MC-7); False: it forgets the blocks whatever the deletion did (logged)."""

    def __init__(
        self,
        backend: BlobBackend | AsyncBlobBackend,
        buffer: memoryview,
        config: BlobTierConfig | None = None,
        *,
        name: str = "blob",
        stats: BlobTierStats | None = None,
        wrap: Callable[[BlobBackend], BlobBackend] | None = None,
    ) -> None:
        config = BlobTierConfig() if config is None else config
        if not isinstance(config, BlobTierConfig):
            raise ConfigurationError(f"BlobTier {name!r}: config must be a BlobTierConfig, got {type(config).__name__}")
        self._num_slots, self._block_bytes = slot_buffer_shape(f"BlobTier {name!r}", buffer)
        self._name = name
        self.blob_config = config
        self._flat = buffer.cast("B")
        self.manifest = env.namespace_manifest(self._block_bytes, config.layout)
        self.namespace = env.namespace_id(self.manifest)
        sync, self._loop_io = _backend_faces(backend, wrap, name, config)
        self.backend = sync
        self.stats = BlobTierStats() if stats is None else stats
        self._stats_lock = threading.Lock()
        self._shared = config.shared
        self._ledger = Ledger(name, env.HEADER_BYTES + self._block_bytes,
                              recent_keys=config.recent_keys if config.shared else None)
        self._index = self._ledger.index  # the hot path reads it directly
        self._unusable = self._ledger.unusable
        self._ops = BlobOps(
            sync, tier_name=name, namespace=self.namespace, block_bytes=self._block_bytes, row=self._row,
            ticks=itertools.count(1), deleted=self._ledger.note_deleted, count=self._count,
        )
        self._lock = threading.Lock()  # adding running jobs, closed, generation (get_finished_jobs pops without it)
        self._running: dict[int, Future[JobOutcome]] = {}
        # Ids of running jobs whose futures completed, appended by the futures' callbacks (any thread; a
        # deque's append and popleft are atomic): a poll with nothing finished reads one length, no lock.
        # Each id enters once, after its job entered _running, and only get_finished_jobs pops either:
        # every id here names a job in _running (so the deque is bounded by it).
        self._finished: deque[int] = deque()
        self._closed = False
        self._generation = 0  # bumped by reset_cache: a scan of an older generation adds nothing
        self._scan_done = threading.Event()
        self._prepared = threading.Condition()  # notified when a generation's prepare ended
        self._prepared_to = -1  # the newest generation whose prepare ended (done or failed): jobs start after it
        self._complete = False  # private mode and the scan is over: the index is the whole answer (hot path)
        self._stop = threading.Event()
        self._write_bound = asyncio.Semaphore(config.write_threads)  # used on the loop only
        self._read_bound = asyncio.Semaphore(config.read_threads)
        self._writers = ThreadPoolExecutor(config.write_threads, thread_name_prefix=f"kvproto-{name}-w")
        self._readers = ThreadPoolExecutor(config.read_threads, thread_name_prefix=f"kvproto-{name}-r")
        self._house: ThreadPoolExecutor | None = None  # deletions, re-preparation: made at first use
        self._probe_tick = 0.0
        self._trusting = True  # no distrust yet: every indexed key answers HIT on its own (TIERKIT-10)
        self._dispatcher = Dispatcher(name=name)  # hands jobs to the pools or the loop off the scheduler (TIERKIT-9)
        self._holds: Holds | None = None  # TIERKIT-6: read handles taken at HITs, over a HeldReads backend
        if config.hold_hits_steps and isinstance(sync, HeldReads) and sync.held_reads and self._loop_io is None:
            cap = config.hold_hits_max if config.hold_hits_max is not None else default_hold_cap()
            self._holds = Holds(sync, name_of=self._ops.name_of, max_steps=config.hold_hits_steps, cap=cap,
                                count=self._count, tier_name=name)
        self._existence = Existence(self._ops, self._holds, tier_name=name, count=self._count)  # TIERKIT-5..7
        batches = self._existence.batches
        self._probe = AsyncProbe(self._existence.check, name=name, deadline_steps=config.probe_deadline_steps,
                                 chunk_keys=PROBE_CHUNK_KEYS,
                                 batch_scope=None if batches is None else partial(self._existence.batch, batches))
        if config.shared:
            self._probe.start()  # now, not in the scheduler's first on_step_end (TIERKIT-9)
        self._load_stamps: dict[int, int] = {}  # loads in flight: the probe's stamp at their submit (scheduler's thread)
        self._outcomes = Outcomes(self._ledger, self._probe, self._holds, self.stats,
                                  partial_jobs=config.partial_jobs, tier_name=name,
                                  distrust=self._distrust if config.shared else None)
        self.capabilities = capabilities_of(config, holds_hits=self._holds is not None)
        self._starter = threading.Thread(
            target=self._start_up, args=(self._generation,), name=f"kvproto-{name}-start", daemon=True
        )
        if config.start_in_background:
            self._starter.start()
        else:
            self._start_up(self._generation)

    # -- SecondaryTier ---------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The name given at construction, used in events and logs."""
        return self._name

    @property
    def job_time_bound_s(self) -> float | None:
        """Seconds within which every job is reported (:class:`kvproto.JobTimeBound`, MGR-17); see
        ``BlobTierConfig.job_timeout_s``. None without a job timeout, or on the worker pools without an
        operation bound."""
        config = self.blob_config
        if config.job_timeout_s is None:
            return None
        if self._loop_io is not None:
            return config.job_timeout_s + 1.0
        if config.op_timeout_s is None:
            return None
        return config.job_timeout_s + 2 * config.op_timeout_s + 1.0  # a damaged load reads, then deletes

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """HIT for an indexed key; otherwise MISS (private, after the scan) or the probe's verdict (TIER-4).

        Never does I/O, except that with ``holds_hits`` a HIT opens a read
        handle (one system call, unless the existence check that found the
        blob opened it; TIERKIT-6); never HIT_PENDING. A key stays indexed
        only while a store or load vouched for it after the last deletion
        seen (TIERKIT-2); in shared mode, an indexed key vouched for before a
        load found a vouched-for blob missing is asked through the probe
        (TIERKIT-10).
        """
        holds = self._holds  # TIERKIT-6: a HIT takes a read handle (take: False if the blob is gone now)
        if key in self._index and (self._trusting or self._ledger.vouches(key)):  # TIERKIT-10
            return lr.HIT if holds is None or holds.take(key, req_context.req_id) else self._gone_at_hit(key)
        if self._complete:  # private mode, scan over; look again: the scan may have added the key meanwhile
            if key not in self._index:
                return lr.MISS
            return lr.HIT if holds is None or holds.take(key, req_context.req_id) else self._gone_at_hit(key)
        if key in self._unusable:
            return lr.MISS  # a load found its blob unusable: not asked again until stored anew (TIER-4)
        answer = self._probe.lookup(key, req_context)
        if answer is lr.HIT and holds is not None and not holds.take(key, req_context.req_id):
            return self._gone_at_hit(key)
        return answer

    def lookup_many(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> list[LookupResult]:
        """``[lookup(k, req_context) for k in keys]`` (TIER-17)."""
        return [self.lookup(k, req_context) for k in keys]

    def touch(self, keys: Iterable[OffloadKey]) -> None:
        """Mark indexed ``keys`` recently used (TIER-5)."""
        with self._ledger.lock:
            index = self._index
            for key in keys:
                if key in index:
                    index.move_to_end(key)

    def submit_store(self, job: TransferJob) -> None:
        """Start publishing rows ``job.slots`` on the write pool or the loop; the rows are read there (TIER-10)."""
        self._validate(job, promotion=False)
        self._ledger.begin_store(job.keys)
        self._start(job, store=True)

    def submit_load(self, job: TransferJob) -> None:
        """Start reading and verifying blobs into rows ``job.slots`` on the read pool or the loop (TIER-10)."""
        self._validate(job, promotion=True)
        self._ledger.begin_load(job.keys)
        if self._holds is not None:
            self._holds.claim(job.job_id, job.keys)
        self._load_stamps[job.job_id] = self._probe.stamp()  # what its failure may mark MISS (AP-7); popped at its report
        self._start(job, store=False)

    def get_finished_jobs(self) -> Sequence[JobResult]:
        """Report finished jobs once each, in the order they finished, applying their effects to the index
        and verdicts (TIER-11). No lock (TIERKIT-9): each pop is atomic, only this thread pops, and ``_finished``
        holds each id once, of a job in ``_running`` whose outcome is set: reported once, after its effect."""
        finished = self._finished
        if not finished:
            return []
        futures = [self._running.pop(finished.popleft()) for _ in range(len(finished))]
        stamps = self._load_stamps
        results = [self._outcomes.apply(out, asked_by=stamps.pop(out.job.job_id, None))
                   for out in (f.result() for f in futures)]
        if results:
            self._enforce_budget()
        return results

    # -- TierLifecycle -------------------------------------------------------------------------

    def on_request_finished(self, req_context: ReqContext) -> None:
        """Drop the request's references to existence verdicts and held HITs (TIER-12, AP-4, TIERKIT-6)."""
        self._probe.on_request_finished(req_context)
        if self._holds is not None:
            self._holds.request_finished(req_context.req_id)

    def on_step_end(self) -> None:
        """Post queued existence checks, apply answers, expire deadlines, keep the byte budget (TIER-13).

        Hooks closer together than ``probe_min_interval_s`` count as one for
        the existence checks.
        """
        now = time.monotonic()
        if now - self._probe_tick >= self.blob_config.probe_min_interval_s:
            self._probe_tick = now
            self._probe.on_step_end()
        if self._holds is not None:
            self._holds.step()
        self._enforce_budget()

    def take_events(self) -> Sequence[OffloadingEvent]:
        """STORED / REMOVED events since the last call; at most MAX_PENDING_EVENTS are kept (TIER-14, TIERKIT-3)."""
        return self._ledger.take_events()

    def has_pending_work(self) -> bool:
        """True while a submitted job is unreported (TIER-15)."""
        with self._lock:
            return bool(self._running)

    def reset_cache(self) -> bool:
        """Forget and delete every block of this namespace; False while a job is unreported (TIER-16).

        In shared mode this removes the other instances' blocks too (their
        loads fail, then MISS). A tier with :attr:`reset_needs_storage`
        deletes first and answers False, forgetting nothing, when the storage
        did not answer (blobs already deleted stay deleted; loads of the
        others still verify).
        """
        if self.reset_needs_storage and not self.has_pending_work() and not self._cleared():
            return False
        with self._lock:
            if self._running:
                return False
            self._generation += 1
            generation = self._generation
        self._ledger.clear()
        self._probe.reset()
        if self._holds is not None:
            self._holds.close_all()
        self._cleared()
        try:
            self._housekeeping().submit(self._prepare, generation)
        except RuntimeError:
            self._note_prepared(generation)  # shut down: nothing more will be stored, nothing waits
        if not self._shared:
            self._scan_done.set()  # nothing left to find
            self._complete = True
        return True

    def _cleared(self) -> bool:
        """Delete the namespace's blobs (the backend's ``clear``); False, logged, if the storage did not answer."""
        try:
            self.backend.clear(self._ops.namespace_hex)  # raises if the storage did not answer (or after shutdown)
        except Exception as exc:
            _log.warning("%s %r: reset_cache could not delete %s/: %s: %s", type(self).__name__, self._name,
                         self._ops.namespace_hex, type(exc).__name__, short_error(exc))
            return False
        return True

    def shutdown(self) -> None:
        """Finish the jobs in flight (results stay reportable once), stop every thread (TIER-16). Idempotent."""
        with self._lock:
            already = self._closed
            self._closed = True
            self._dispatcher.close_soon()  # under the lock: after every job posted, before any refused
        self._stop.set()
        with self._prepared:
            self._prepared.notify_all()  # a job waiting for a prepare starts now (and is refused)
        self._dispatcher.close()  # every job handed over is started
        self._writers.shutdown(wait=True)
        self._readers.shutdown(wait=True)
        with self._lock:
            unreported = list(self._running.values())
        wait_futures(unreported)  # the jobs on the loop (no job starts any more: _start sees _closed)
        if self._starter.is_alive():
            self._starter.join()
        with self._lock:
            house = self._house
        if house is not None:
            house.shutdown(wait=True)
        self._probe.shutdown()
        if self._holds is not None:
            self._holds.close_all(claimed=True)  # no load runs any more; their results stay reportable
        if not already:
            try:
                self.backend.close()
            except Exception as exc:
                _log.warning("BlobTier %r: closing the backend failed: %s", self._name, exc)

    # -- operator surface --------------------------------------------------------------------

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until the start-up preparation and scan are done (tests, tools; never the scheduler)."""
        return self._scan_done.wait(timeout)

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Block until every job is finished, every posted existence batch is back (its end included,
        TIERKIT-7) and every queued deletion ran (tests, tools)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                running = list(self._running.values())
            if all(f.done() for f in running):
                if not self._probe.wait_idle(max(0.0, deadline - time.monotonic())):
                    return False
                if self._starter.is_alive():
                    self._starter.join(max(0.0, deadline - time.monotonic()))
                if not self._dispatcher.flush(max(0.0, deadline - time.monotonic())):  # deletions it forwards
                    return False
                try:
                    self._housekeeping().submit(lambda: None).result(max(0.0, deadline - time.monotonic()))
                except RuntimeError:
                    return True  # shut down: nothing queued any more
                except Exception:
                    return False
                return True
            time.sleep(0.001)
        return False

    def name_of(self, key: OffloadKey) -> str:
        """The backend name of ``key``'s blob (``<namespace>/<aa>/<bb>/<digest>.kvb``)."""
        return self._ops.name_of(key)

    def indexed_keys(self) -> frozenset[OffloadKey]:
        """The keys the index holds right now."""
        with self._ledger.lock:
            return frozenset(self._index)

    def vouched_keys(self) -> frozenset[OffloadKey]:
        """The indexed keys a lookup answers HIT for without asking the storage (TIERKIT-10)."""
        with self._ledger.lock:
            return frozenset(k for k in self._index if self._ledger.vouches(k))

    def vouch_for(self, keys: Iterable[OffloadKey]) -> None:
        """Index ``keys`` as present now, as a restart scan would (tests and tools seeding blobs)."""
        tick = self._ops.tick()
        self._ledger.vouch([(k, tick) for k in keys])

    @property
    def held_hits(self) -> int:
        """Read handles held now, taken at HITs (TIERKIT-6; ``stats.held_handles``)."""
        return self.stats.held_handles

    @property
    def used_bytes(self) -> int:
        """Bytes of the indexed blobs (what ``max_bytes`` limits)."""
        return self._ledger.used_bytes

    # -- internals -----------------------------------------------------------------------------

    def _housekeeping(self) -> ThreadPoolExecutor:
        """The one housekeeping thread (made at first use); RuntimeError after shutdown."""
        with self._lock:
            if self._closed:
                raise RuntimeError("shut down")
            if self._house is None:
                self._house = ThreadPoolExecutor(1, thread_name_prefix=f"kvproto-{self._name}-house")
            return self._house

    def _row(self, slot: int) -> memoryview:
        size = self._block_bytes
        return self._flat[slot * size : (slot + 1) * size]

    def _count(self, counter: str, n: int = 1) -> None:
        with self._stats_lock:
            setattr(self.stats, counter, getattr(self.stats, counter) + n)

    def _validate(self, job: TransferJob, *, promotion: bool) -> None:
        if not isinstance(job, TransferJob):
            raise InvalidArgumentError(f"BlobTier {self._name!r}: expected a TransferJob, got {type(job).__name__}")
        if job.promotion is not promotion:
            method = "submit_load" if promotion else "submit_store"
            raise InvalidArgumentError(
                f"BlobTier {self._name!r}: {method} got job {job.job_id} with promotion={job.promotion}"
            )
        for slot in job.slots:
            if type(slot) is not int or not 0 <= slot < self._num_slots:
                raise InvalidArgumentError(
                    f"BlobTier {self._name!r}: job {job.job_id} names slot {slot!r}, buffer has {self._num_slots} slots"
                )
        for key in job.keys:
            checked: object = key
            if not isinstance(checked, bytes) or not checked or len(checked) > env.MAX_KEY_BYTES:
                raise InvalidArgumentError(f"BlobTier {self._name!r}: job {job.job_id} has an invalid key {key!r:.40}")
        with self._lock:
            if job.job_id in self._running:
                raise InvalidArgumentError(f"BlobTier {self._name!r}: job id {job.job_id} is already in flight")

    def _start(self, job: TransferJob, *, store: bool) -> None:
        """Register ``job`` and hand it to the dispatcher, which starts it on the pools or the loop: nothing
        here gives up the GIL or waits (TIERKIT-9). Its deadline counts from now (MGR-17)."""
        since = self._ops.tick()
        timeout = self.blob_config.job_timeout_s
        deadline = None if timeout is None else time.monotonic() + timeout
        future: Future[JobOutcome] = Future()
        job_id = job.job_id
        future.add_done_callback(lambda _: self._finished.append(job_id))  # on the thread that completes it
        launch: Callable[[], object]
        if self._loop_io is not None:
            launch = partial(run_job_on_loop, job, since, self._loop_io,
                             self._store_key_async if store else self._ops.load_async,
                             self._write_bound if store else self._read_bound, tier_name=self._name,
                             deadline=deadline, done=future)
        else:
            run_key: KeyRun = self._store_key
            batches: tuple[BatchRun, int] | None = (self._store_batch, self._ops.store_run)  # TIERKIT-11
            if not store:
                held = None if self._holds is None else self._holds.load_run(job.job_id, self._ops.load)
                run_key = self._ops.load if held is None else held
                batches = (self._ops.load_many, self._ops.load_run) if held is None else None
            launch = partial(run_job, job, since, self._writers if store else self._readers, run_key,
                             tier_name=self._name, deadline=deadline, done=future, batches=batches)
        with self._lock:
            self._running[job_id] = future
            if self._closed:
                failed_outcome(job, since, KeyVerdict.REFUSED, future)
            else:  # its I/O starts once the backend's prepare of this generation ended (TIERKIT-1)
                self._dispatcher.post(partial(self._once_prepared, self._generation, deadline,
                                              partial(start_job, launch, job, since, future)))  # closed under this lock

    def _once_prepared(self, generation: int, deadline: float | None, start: Callable[[], object]) -> None:
        """Dispatcher's thread: ``start`` a job once the backend's prepare of ``generation`` (at start-up, or
        after the reset before it) has ended, as :meth:`BlobBackend.prepare` promises: no job's I/O races
        it (a sweep of a crashed writer's temporary files would take a live writer's). Waits at most until
        the job's deadline (or :data:`PREPARE_WAIT_S`); after that, or at shutdown, it starts anyway (its
        I/O then fails or is refused as it would have)."""
        if self._prepared_to < generation:
            bound = PREPARE_WAIT_S if deadline is None else max(0.0, deadline - time.monotonic())
            with self._prepared:
                self._prepared.wait_for(lambda: self._prepared_to >= generation or self._stop.is_set(), bound)
        start()

    def _note_prepared(self, generation: int) -> None:
        """The prepare of ``generation`` ended (done, failed or skipped as stale): jobs of it may start."""
        with self._prepared:
            self._prepared_to = max(self._prepared_to, generation)
            self._prepared.notify_all()

    def _distrust(self) -> None:
        """Scheduler's thread (a load's report): every index stamp until now stops vouching (TIERKIT-10)."""
        self._ledger.distrust(self._ops.tick())
        self._trusting = False
        self.stats.index_distrusted += 1  # written on this thread only: not the workers' stats lock (TIERKIT-9)

    def _gone_at_hit(self, key: OffloadKey) -> LookupResult:
        """MISS: a HIT found ``key``'s blob gone when it opened the read handle (TIERKIT-6); forgotten."""
        self._probe.mark_miss((key,))
        self._ledger.emit(EventKind.REMOVED, self._ledger.lose([(key, self._ops.tick())], gone=True))
        return lr.MISS

    def _store_key(self, key: OffloadKey, slot: int) -> tuple[KeyVerdict, int]:
        trusted = self._trusted(key)
        return self._counted(trusted if trusted is not None else self._ops.store(key, slot))

    def _store_batch(self, keys: Sequence[OffloadKey], slots: Sequence[int]) -> list[tuple[KeyVerdict, int]]:
        """:meth:`_store_key` of each key; those the index does not vouch for in one ``publish_many`` (TIERKIT-11)."""
        trusted = [self._trusted(key) for key in keys]
        todo = [i for i, verdict in enumerate(trusted) if verdict is None]
        sent = iter(self._ops.store_many([keys[i] for i in todo], [slots[i] for i in todo]) if todo else ())
        return [self._counted(next(sent) if verdict is None else verdict) for verdict in trusted]

    async def _store_key_async(self, io: LoopBackend, key: OffloadKey, slot: int) -> tuple[KeyVerdict, int]:
        trusted = self._trusted(key)
        return self._counted(trusted if trusted is not None else await self._ops.store_async(io, key, slot))

    def _trusted(self, key: OffloadKey) -> tuple[KeyVerdict, int] | None:
        """EXISTED as of the index's stamp, if ``trust_index_on_store`` and the index vouches for ``key``."""
        if self.blob_config.trust_index_on_store and key not in self._ledger.pins:
            # Trust what vouched for the key, as of when it did: a deletion seen since then wins (TIERKIT-2).
            # Never while a load of it runs: that load may be deleting the blob (damaged) right now.
            stamp = self._index.get(key)
            if stamp is not None and stamp > self._ledger.distrusted_to:  # not a distrusted one (TIERKIT-10)
                return KeyVerdict.EXISTED, stamp
        return None

    def _counted(self, verdict: tuple[KeyVerdict, int]) -> tuple[KeyVerdict, int]:
        if verdict[0] is KeyVerdict.EXISTED:
            self._count("skipped_stores")
        return verdict

    def _enforce_budget(self) -> None:
        """Evict least recently used blocks beyond ``max_bytes``; never one being loaded or stored."""
        budget = self.blob_config.max_bytes
        if budget is None:
            return
        holds = self._holds
        victims: list[tuple[OffloadKey, int]] = []
        while True:  # evicted blocks a handle keeps on storage still count until it closes (TIERKIT-6)
            left = budget if holds is None else max(0, budget - holds.evicted_held * self._ledger.blob_bytes)
            if self._ledger.used_bytes <= left:
                break
            more = self._ledger.evict(left)
            victims += more
            if not more or holds is None or not holds.note_evicted(k for k, _ in more):
                break
        if not victims:
            return
        self.stats.evicted_blocks += len(victims)  # written on this thread only: not the workers' stats lock (TIERKIT-9)
        self._probe.mark_miss([k for k, _ in victims])
        with self._lock:
            if not self._closed:  # shut down: the blobs stay (a later instance may use or evict them)
                self._dispatcher.post(partial(self._queue_deletions, victims))  # a pool's submit waits (TIERKIT-9)

    def _queue_deletions(self, victims: list[tuple[OffloadKey, int]]) -> None:
        """Dispatcher thread: hand evicted blobs to the housekeeping thread for deletion."""
        try:
            self._housekeeping().submit(self._delete_doomed, victims)
        except RuntimeError:
            pass  # shut down meanwhile: the blobs stay

    def _delete_doomed(self, victims: list[tuple[OffloadKey, int]]) -> None:
        for key, ticket in victims:
            if self._ledger.still_doomed(key, ticket):
                self._ops.delete(key, damaged=False)

    def _prepare(self, generation: int) -> None:
        """Housekeeping thread: let the backend prepare the namespace; write its manifest. The jobs of
        ``generation`` start once this ended, however it ended (:meth:`_once_prepared`)."""
        try:
            with self._lock:
                if generation != self._generation:
                    return
            ns = self._ops.namespace_hex
            self.backend.prepare(ns)
            body = (json.dumps(self.manifest, sort_keys=True, indent=2) + "\n").encode()
            self.backend.publish(f"{ns}/manifest.json", (memoryview(body),), len(body))
        finally:
            self._note_prepared(generation)

    def _start_up(self, generation: int) -> None:
        """Housekeeping thread: prepare, then (private mode) the restart scan (TIERKIT-1)."""
        try:
            self._prepare(generation)
            if not self._shared:
                self._ledger.scan(True)
                restart_scan(self._ops, lambda keys: self._add_scanned(keys, generation), self._stop,
                             tier_name=self._name, count=self._count)
        except Exception:
            _log.warning("BlobTier %r: start-up failed; unknown keys answer MISS", self._name, exc_info=True)
        finally:
            self._ledger.scan(False)
            self._scan_done.set()
            self._complete = not self._shared

    def _add_scanned(self, keys: list[tuple[OffloadKey, int]], generation: int) -> bool:
        with self._lock:
            if generation != self._generation:
                return False
            added = self._ledger.add_scanned(keys)
        self._count("scanned_blocks", added)
        return True
