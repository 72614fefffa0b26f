"""``ObjTier``: the reference object-store secondary tier, on obstore (OBJ-1..OBJ-10).

Objects: ``<prefix>/<namespace>/<aa>/<bb>/<digest>.kvb``, each a
:mod:`kvproto.envelope` (4 KiB header + payload): the same names and bytes as
the filesystem tier ``kvproto-fs`` writes under its root, so a bucket synced
to a directory is an FsTier root and the other way round.
``<prefix>/<namespace>/manifest.json`` is the layout manifest.

Threads: the scheduler's (every protocol method; no I/O except
``reset_cache``), one background thread running an asyncio event loop that
makes every object request with obstore's async API (GET/PUT bounded by
``max_concurrency``, HEAD by ``probe_concurrency``), and the
:class:`kvproto.AsyncProbe` worker, which posts batches of HEADs to that loop
and waits for them. The index, verdicts and events change on the scheduler's
thread, when a job is reported.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, TypeVar

import obstore
from obstore.exceptions import AlreadyExistsError, PreconditionError

from kvproto import (
    AsyncProbe,
    Capabilities,
    EventKind,
    JobResult,
    LookupResult,
    OffloadingEvent,
    OffloadKey,
    ReqContext,
    TransferJob,
)
from kvproto import envelope as env
from kvproto import members as lr
from kvproto.errors import ConfigurationError, InvalidArgumentError

from kvproto_obj._config import ObjTierConfig
from kvproto_obj._store import make_store

if TYPE_CHECKING:
    from obstore.store import ObjectStore

__all__ = ["MAX_PENDING_EVENTS", "ObjTier", "ObjTierStats"]

_log = logging.getLogger("kvproto_obj")

_SUFFIX = ".kvb"
MAX_PENDING_EVENTS = 65_536
"""Untaken events kept at most (the oldest are dropped)."""

_T = TypeVar("_T")

_Failure = Literal["gone", "transient"]


@dataclass
class ObjTierStats:
    """Counters, for operators and tests (read them from the scheduler's thread)."""

    stored_blocks: int = 0
    uploads: int = 0
    already_present: int = 0
    skipped_uploads: int = 0
    loaded_blocks: int = 0
    failed_stores: int = 0
    failed_loads: int = 0
    damaged_removed: int = 0
    foreign_left: int = 0
    timed_out_jobs: int = 0
    probe_errors: int = 0


@dataclass(slots=True)
class _Outcome:
    """What a job did, computed on the loop thread; applied on the scheduler's thread when reported."""

    job: TransferJob
    ok: list[OffloadKey] = field(default_factory=list)
    gone: list[OffloadKey] = field(default_factory=list)  # loads: missing or damaged (removed) objects
    transient: list[OffloadKey] = field(default_factory=list)  # loads: the store did not answer
    injected: bool = False  # failed on purpose (fail_next_jobs / fail_keys): verdicts untouched


class ObjTier:
    """A secondary tier keeping one verified envelope object per block in an object store (OBJ-1..OBJ-10).

    ``buffer`` is the primary tier's slot buffer (a writable, C-contiguous
    2-D ``memoryview`` of format ``"B"``, one row per slot). ``store``, when
    given, is the obstore store to use instead of the one ``config``
    describes (several tiers sharing one in-process MemoryStore; tests).
    """

    def __init__(
        self,
        buffer: memoryview,
        config: ObjTierConfig,
        *,
        name: str = "obj",
        store: ObjectStore | None = None,
    ) -> None:
        if not isinstance(config, ObjTierConfig):
            raise ConfigurationError(f"ObjTier {name!r}: config must be an ObjTierConfig, got {type(config).__name__}")
        if not isinstance(buffer, memoryview):
            raise ConfigurationError(f"ObjTier {name!r}: buffer must be a memoryview, got {type(buffer).__name__}")
        shape = buffer.shape or ()
        if len(shape) != 2 or buffer.format != "B" or buffer.readonly or not buffer.c_contiguous or shape[1] < 1:
            raise ConfigurationError(
                f"ObjTier {name!r}: buffer must be a writable, C-contiguous 2-D memoryview of format 'B', "
                f"got shape={shape} format={buffer.format!r} readonly={buffer.readonly}"
            )
        self._name = name
        self.config = config
        self.store: ObjectStore = make_store(config) if store is None else store
        self._num_slots: int = shape[0]
        self._block_bytes: int = shape[1]
        self._object_bytes = env.HEADER_BYTES + self._block_bytes
        self._flat = buffer.cast("B")
        self.manifest = env.namespace_manifest(self._block_bytes, config.layout)
        self.namespace = env.namespace_id(self.manifest)
        self.base = f"{config.prefix}/{self.namespace.hex()}" if config.prefix else self.namespace.hex()
        self._mode: Literal["create", "overwrite"] = "create" if config.conditional_put else "overwrite"
        self._lock = threading.Lock()  # running jobs, events, fault knobs, index (with the loop's reads)
        # key -> stamp of the store (or load) that last vouched for it, least recently used first: the keys
        # this instance stored or loaded, at most recent_keys. A failed load drops a key only if nothing
        # vouched for it after the load was submitted.
        self._index: OrderedDict[OffloadKey, int] = OrderedDict()
        self._seq = itertools.count(1)
        self._stamp = 0
        self._load_since: dict[int, int] = {}
        self._running: dict[int, tuple[TransferJob, Future[_Outcome]]] = {}
        self._events: deque[OffloadingEvent] = deque(maxlen=MAX_PENDING_EVENTS)
        self._fail_next = 0
        self._fail_keys: set[OffloadKey] = set()
        self._closed = False
        self.stats = ObjTierStats()
        self._probe_tick = 0.0
        # The event loop every object request runs on.
        self._loop = asyncio.new_event_loop()
        self._io_slots = asyncio.Semaphore(config.max_concurrency)
        self._head_slots = asyncio.Semaphore(config.probe_concurrency)
        self._thread = threading.Thread(target=self._run_loop, name=f"kvproto-{name}-io", daemon=True)
        self._thread.start()
        if config.check_on_start:
            try:
                self._call(self._write_manifest(), config.connect_timeout_s + config.retry_timeout_s + 1.0)
            except Exception as exc:
                self._stop_loop()
                raise ConfigurationError(
                    f"ObjTier {name!r}: cannot write {self.base}/manifest.json to the {config.kind!r} store "
                    f"(bucket={config.bucket!r}, endpoint={config.endpoint!r}): {type(exc).__name__}: {exc}"
                ) from exc
        self._probe = AsyncProbe(self._exists, name=name, deadline_steps=config.probe_deadline_steps)
        self.capabilities = Capabilities(
            async_lookup=True,
            max_retry_steps=config.probe_deadline_steps,
            persistence=config.kind != "memory" or store is not None,
            eviction=False,
            sharing=True,
            partial_jobs=True,
            reasons={
                "async_lookup": "RETRY while a HEAD request checks a key this instance does not know",
                "eviction": "never deletes blocks on its own: use the bucket's lifecycle rules",
                **(
                    {"persistence": "a MemoryStore built by the tier lives and dies with it"}
                    if config.kind == "memory" and store is None
                    else {}
                ),
            },
        )

    # -- SecondaryTier ---------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The name given at construction, used in events and logs."""
        return self._name

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """HIT for a key this instance stored or loaded; otherwise the existence check's verdict (OBJ-5).

        Never does I/O; never HIT_PENDING.
        """
        if key in self._index:
            return lr.HIT
        return self._probe.lookup(key, req_context)

    def lookup_many(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> list[LookupResult]:
        """``[lookup(k, req_context) for k in keys]`` (TIER-17)."""
        return [self.lookup(k, req_context) for k in keys]

    def touch(self, keys: Iterable[OffloadKey]) -> None:
        """Keep known ``keys`` among the ``recent_keys`` remembered (TIER-5)."""
        with self._lock:
            index = self._index
            for key in keys:
                if key in index:
                    index.move_to_end(key)

    def submit_store(self, job: TransferJob) -> None:
        """Start uploading rows ``job.slots`` as envelope objects on the loop thread (OBJ-4, TIER-10)."""
        self._validate(job, promotion=False)
        self._start(job, self._run_store)

    def submit_load(self, job: TransferJob) -> None:
        """Start downloading and verifying objects into rows ``job.slots`` on the loop thread (OBJ-6, TIER-10)."""
        self._validate(job, promotion=True)
        self._load_since[job.job_id] = self._stamp
        self._start(job, self._run_load)

    def get_finished_jobs(self) -> Sequence[JobResult]:
        """Report finished jobs once each, applying their effects to the index and verdicts (TIER-11)."""
        with self._lock:
            done = [job_id for job_id, (_, f) in self._running.items() if f.done()]
            finished = [self._running.pop(job_id) for job_id in done]
        return [self._apply(self._outcome_of(job, f)) for job, f in finished]

    # -- TierLifecycle -------------------------------------------------------------------------

    def on_request_finished(self, req_context: ReqContext) -> None:
        """Drop the request's references to existence verdicts (TIER-12, AP-4)."""
        self._probe.on_request_finished(req_context)

    def on_step_end(self) -> None:
        """Post queued existence checks, apply answers, expire deadlines (TIER-13, OBJ-5)."""
        now = time.monotonic()
        if now - self._probe_tick >= self.config.probe_min_interval_s:
            self._probe_tick = now
            self._probe.on_step_end()

    def take_events(self) -> Sequence[OffloadingEvent]:
        """STORED / REMOVED events since the last call (TIER-14)."""
        with self._lock:
            events = list(self._events)
            self._events.clear()
        return events

    def has_pending_work(self) -> bool:
        """True while a submitted job is unreported (TIER-15)."""
        with self._lock:
            return bool(self._running)

    def reset_cache(self) -> bool:
        """Delete every block object of this namespace and forget them (TIER-16, OBJ-9).

        False while a job is unreported, or when the store did not answer
        (objects already deleted stay deleted; loads of the others still
        verify). Blocks the scheduler for the listing and deletions. In a
        shared bucket it removes the other instances' blocks too (their
        loads fail, then MISS).
        """
        with self._lock:
            if self._running or self._closed:
                return False
        try:
            self._call(self._delete_namespace(), self.config.job_timeout_s)
        except Exception as exc:
            _log.warning("ObjTier %r: reset_cache could not delete %s/: %s", self._name, self.base, exc)
            return False
        with self._lock:
            keys = tuple(self._index)
            self._index.clear()
            if keys:
                self._events.append(OffloadingEvent(EventKind.REMOVED, keys, self._name))
        self._probe.reset()
        return True

    def shutdown(self) -> None:
        """Finish the jobs in flight (results stay reportable once), stop every thread (TIER-16). Idempotent."""
        with self._lock:
            self._closed = True
            running = [f for _, f in self._running.values()]
        deadline = time.monotonic() + self.config.job_timeout_s + 1.0
        for f in running:
            try:
                f.result(max(0.0, deadline - time.monotonic()))
            except Exception:
                f.cancel()
        self._probe.shutdown(timeout=self.config.probe_timeout_s + 1.0)
        self._stop_loop()

    # -- operator surface --------------------------------------------------------------------

    def path_of(self, key: OffloadKey) -> str:
        """The object name that holds ``key``'s block (the filesystem tier's path under its root)."""
        digest = env.key_digest(key)
        return f"{self.base}/{digest[:2]}/{digest[2:4]}/{digest}{_SUFFIX}"

    def known_keys(self) -> frozenset[OffloadKey]:
        """The keys this instance remembers as present right now (stored or loaded by it)."""
        with self._lock:
            return frozenset(self._index)

    @property
    def existence_batches(self) -> int:
        """How many batches of existence checks (HEAD requests) went to the store so far."""
        return self._probe.batches_posted

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Block until every submitted job is finished (tests, tools; never the scheduler)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                running = [f for _, f in self._running.values()]
            if all(f.done() for f in running):
                return True
            time.sleep(0.001)
        return False

    # -- fault injection (the kit's hooks) ---------------------------------------------------

    def fail_next_jobs(self, n: int) -> None:
        """Make the next ``n`` submitted jobs fail entirely (no request is made)."""
        if type(n) is not int or n < 0:
            raise InvalidArgumentError(f"fail_next_jobs: n must be an int >= 0, got {n!r}")
        with self._lock:
            self._fail_next = n

    def fail_keys(self, keys: Iterable[OffloadKey]) -> None:
        """Make every job touching ``keys`` fail for those keys (partial results)."""
        with self._lock:
            self._fail_keys.update(keys)

    # -- internals: the loop thread ------------------------------------------------------------

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def _stop_loop(self) -> None:
        if self._loop.is_closed():
            return
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10.0)
        if not self._thread.is_alive():
            self._loop.close()

    def _call(self, coro: Awaitable[_T], timeout: float) -> _T:
        """Run ``coro`` on the loop and wait for it (not for the scheduler's hot path)."""

        async def bounded() -> _T:
            async with asyncio.timeout(timeout):
                return await coro

        future = asyncio.run_coroutine_threadsafe(bounded(), self._loop)
        try:
            return future.result(timeout + 1.0)
        except FutureTimeout:
            future.cancel()
            raise

    async def _write_manifest(self) -> None:
        body = (json.dumps(self.manifest, sort_keys=True, indent=2) + "\n").encode()
        try:
            await obstore.put_async(self.store, f"{self.base}/manifest.json", body, mode="create", use_multipart=False)
        except AlreadyExistsError:
            pass
        except (PreconditionError, NotImplementedError):
            await obstore.put_async(self.store, f"{self.base}/manifest.json", body, use_multipart=False)

    async def _delete_namespace(self) -> None:
        manifest = f"{self.base}/manifest.json"
        stream = obstore.list(self.store, f"{self.base}/", chunk_size=1000)
        async for chunk in stream:
            paths = [meta["path"] for meta in chunk if meta["path"] != manifest]
            if paths:
                await obstore.delete_async(self.store, paths)

    async def _job(self, job: TransferJob, failing: frozenset[OffloadKey],
                   one: Callable[[OffloadKey, int, _Outcome], Awaitable[None]]) -> _Outcome:
        out = _Outcome(job, injected=bool(failing))
        try:
            async with asyncio.timeout(self.config.job_timeout_s):
                # return_exceptions: every key's request has ended (none writes a slot later) when the job ends.
                ended = await asyncio.gather(
                    *(one(key, slot, out) for key, slot in zip(job.keys, job.slots, strict=True) if key not in failing),
                    return_exceptions=True,
                )
            errors = [e for e in ended if isinstance(e, BaseException)]
            if errors:
                _log.warning("ObjTier %r: job %d: %d keys raised; they fail", self._name, job.job_id, len(errors),
                             exc_info=errors[0])
                self._unfinished(out, failing)
        except TimeoutError:
            _log.warning("ObjTier %r: job %d ran past job_timeout_s=%.1f s; its unfinished keys fail",
                         self._name, job.job_id, self.config.job_timeout_s)
            self.stats.timed_out_jobs += 1
            self._unfinished(out, failing)
        except Exception:
            _log.warning("ObjTier %r: job %d raised; its unfinished keys fail", self._name, job.job_id, exc_info=True)
            self._unfinished(out, failing)
        return out

    @staticmethod
    def _unfinished(out: _Outcome, failing: frozenset[OffloadKey]) -> None:
        """Count a load job's keys that neither finished nor were failed on purpose as transient failures."""
        if not out.job.promotion:
            return
        done = set(out.ok) | set(out.gone) | set(out.transient) | failing
        out.transient.extend(k for k in dict.fromkeys(out.job.keys) if k not in done)

    async def _run_store(self, job: TransferJob, failing: frozenset[OffloadKey]) -> _Outcome:
        return await self._job(job, failing, self._put_one)

    async def _run_load(self, job: TransferJob, failing: frozenset[OffloadKey]) -> _Outcome:
        return await self._job(job, failing, self._get_one)

    async def _put_one(self, key: OffloadKey, slot: int, out: _Outcome) -> None:
        """Upload one block as an envelope; "already exists" is success (content-addressed) (OBJ-4)."""
        if key in self._index:  # this instance stored or loaded it: it is there (a load verifies anyway)
            self.stats.skipped_uploads += 1
            out.ok.append(key)
            return
        path = self.path_of(key)
        async with self._io_slots:
            size = self._block_bytes
            body = bytearray(self._object_bytes)
            view = memoryview(body)
            view[env.HEADER_BYTES:] = self._flat[slot * size : (slot + 1) * size]  # the one copy of the row
            view[: env.HEADER_BYTES] = env.encode_header(key, view[env.HEADER_BYTES:], self.namespace)
            try:
                await obstore.put_async(self.store, path, body, mode=self._mode, use_multipart=False)
                self.stats.uploads += 1
            except AlreadyExistsError:
                self.stats.already_present += 1
            except PreconditionError:
                # Two conditional writes raced (409 on some providers): fine if the object is there now.
                try:
                    meta = await obstore.head_async(self.store, path)
                except Exception as exc:
                    _log.warning("ObjTier %r: store of %s lost a race and HEAD failed: %s", self._name, path, exc)
                    return
                if meta["size"] != self._object_bytes:
                    return
                self.stats.already_present += 1
            except Exception as exc:
                _log.warning("ObjTier %r: store of %s failed: %s: %s", self._name, path, type(exc).__name__,
                             _short(exc))
                return
        out.ok.append(key)

    async def _get_one(self, key: OffloadKey, slot: int, out: _Outcome) -> None:
        """Download one object, verify it, copy its payload into the slot row (OBJ-6)."""
        path = self.path_of(key)
        async with self._io_slots:
            try:
                result = await obstore.get_async(self.store, path)
                data = await result.bytes_async()
            except FileNotFoundError:
                out.gone.append(key)
                return
            except Exception as exc:
                _log.warning("ObjTier %r: load of %s failed: %s: %s", self._name, path, type(exc).__name__,
                             _short(exc))
                out.transient.append(key)
                return
            view = memoryview(data)
            try:
                if view.nbytes != self._object_bytes:
                    raise env.EnvelopeError("length", f"object holds {view.nbytes} bytes, expected {self._object_bytes}")
                header = env.verify_header(view[: env.HEADER_BYTES], key=key, namespace=self.namespace,
                                           payload_len=self._block_bytes)
                payload = view[env.HEADER_BYTES:]
                env.verify_payload(header, payload)
            except env.EnvelopeError as exc:
                if exc.field in ("namespace", "algorithm"):
                    _log.warning("ObjTier %r: %s holds %s; leaving it alone (a configuration mismatch)",
                                 self._name, path, exc)
                    self.stats.foreign_left += 1
                else:
                    _log.warning("ObjTier %r: %s failed verification (%s); deleting it", self._name, path, exc)
                    try:
                        await obstore.delete_async(self.store, path)
                        self.stats.damaged_removed += 1
                    except Exception as del_exc:
                        _log.warning("ObjTier %r: could not delete %s: %s", self._name, path, _short(del_exc))
                out.gone.append(key)
                return
            size = self._block_bytes
            self._flat[slot * size : (slot + 1) * size] = payload  # verified: the one copy into the slot
        out.ok.append(key)

    async def _head_many(self, keys: Sequence[OffloadKey]) -> list[OffloadKey]:
        async def one(key: OffloadKey) -> OffloadKey | BaseException | None:
            async with self._head_slots:
                try:
                    meta = await obstore.head_async(self.store, self.path_of(key))
                except FileNotFoundError:
                    return None
                except Exception as exc:
                    return exc
            return key if meta["size"] == self._object_bytes else None

        answers = await asyncio.gather(*(one(k) for k in keys))
        errors = [a for a in answers if isinstance(a, BaseException)]
        if errors:
            self.stats.probe_errors += len(errors)
            _log.warning("ObjTier %r: %d of %d existence checks failed (answered MISS): %s",
                         self._name, len(errors), len(keys), _short(errors[0]))
        return [a for a in answers if isinstance(a, bytes)]

    def _exists(self, keys: Sequence[OffloadKey]) -> list[OffloadKey]:
        """The probe's check (its worker thread): HEADs of the batch, concurrently on the loop (OBJ-5)."""
        if self._loop.is_closed():
            return []
        return self._call(self._head_many(keys), self.config.probe_timeout_s)

    # -- internals: the scheduler side -------------------------------------------------------

    def _validate(self, job: TransferJob, *, promotion: bool) -> None:
        if not isinstance(job, TransferJob):
            raise InvalidArgumentError(f"ObjTier {self._name!r}: expected a TransferJob, got {type(job).__name__}")
        if job.promotion is not promotion:
            method = "submit_load" if promotion else "submit_store"
            raise InvalidArgumentError(
                f"ObjTier {self._name!r}: {method} got job {job.job_id} with promotion={job.promotion}"
            )
        for slot in job.slots:
            if type(slot) is not int or not 0 <= slot < self._num_slots:
                raise InvalidArgumentError(
                    f"ObjTier {self._name!r}: job {job.job_id} names slot {slot!r}, buffer has {self._num_slots} slots"
                )
        for key in job.keys:
            checked: object = key
            if not isinstance(checked, bytes) or not checked or len(checked) > env.MAX_KEY_BYTES:
                raise InvalidArgumentError(f"ObjTier {self._name!r}: job {job.job_id} has an invalid key {key!r:.40}")
        with self._lock:
            if job.job_id in self._running:
                raise InvalidArgumentError(f"ObjTier {self._name!r}: job id {job.job_id} is already in flight")

    def _start(self, job: TransferJob,
               run: Callable[[TransferJob, frozenset[OffloadKey]], Coroutine[object, object, _Outcome]]) -> None:
        with self._lock:
            fail_all = self._fail_next > 0 or self._closed
            if self._fail_next > 0:
                self._fail_next -= 1
            failing = frozenset(self._fail_keys & set(job.keys))
            if fail_all:
                failed: Future[_Outcome] = Future()
                failed.set_result(_Outcome(job, injected=True))
                self._running[job.job_id] = (job, failed)
                return
            coro = run(job, failing)
            self._running[job.job_id] = (job, asyncio.run_coroutine_threadsafe(coro, self._loop))

    def _outcome_of(self, job: TransferJob, future: Future[_Outcome]) -> _Outcome:
        try:
            return future.result(0)
        except BaseException:  # cancelled at shutdown (or a bug): every key of the job fails
            _log.warning("ObjTier %r: job %d did not finish; it fails", self._name, job.job_id)
            return _Outcome(job, transient=list(job.keys) if job.promotion else [])

    def _apply(self, out: _Outcome) -> JobResult:
        job = out.job
        ok = out.ok
        if job.promotion:
            since = self._load_since.pop(job.job_id, 0)
            self.stats.loaded_blocks += len(ok)
            self.stats.failed_loads += len(job.keys) - len(ok)
            lost = (set(out.gone) | set(out.transient)) - set(ok)
            if lost:
                # A store reported after this load was submitted vouches for its key: keep it.
                gone = set(out.gone)
                removed: list[OffloadKey] = []
                with self._lock:
                    index = self._index
                    lost = {k for k in lost if index.get(k, 0) <= since}
                    for k in lost:
                        if index.pop(k, None) is not None and k in gone:
                            removed.append(k)
                    if removed:
                        self._events.append(OffloadingEvent(EventKind.REMOVED, tuple(removed), self._name))
                self._probe.mark_miss(lost)
            if ok:
                self._remember(ok)
        else:
            self.stats.stored_blocks += len(ok)
            self.stats.failed_stores += len(job.keys) - len(ok)
            if ok:
                self._remember(ok)
                with self._lock:
                    self._events.append(OffloadingEvent(EventKind.STORED, tuple(ok), self._name))
                self._probe.mark_hit(ok)
        if len(ok) == len(job.keys):
            return JobResult(job.job_id, True)
        return JobResult(job.job_id, False, frozenset(ok) if ok else None)

    def _remember(self, keys: Iterable[OffloadKey]) -> None:
        stamp = self._stamp = next(self._seq)
        with self._lock:
            index = self._index
            for key in keys:
                index[key] = stamp
                index.move_to_end(key)
            while len(index) > self.config.recent_keys:
                index.popitem(last=False)


def _short(exc: BaseException) -> str:
    """The first line of an error (obstore's messages carry a long debug dump)."""
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
