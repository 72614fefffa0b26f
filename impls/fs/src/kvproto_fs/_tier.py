"""``FsTier``: the reference filesystem secondary tier (FS-1..FS-12).

On disk, one file per block, ``<root>/<namespace>/<aa>/<bb>/<digest>.kvb``
(``digest`` = SHA-256 of the key in hex, ``aa``/``bb`` its first two byte
pairs), holding a :mod:`kvproto.envelope` (4 KiB header + payload). Temp files
live in ``<root>/<namespace>/tmp/``; ``<root>/<namespace>/manifest.json`` is
the layout manifest the namespace is the hash of.

Threads: the scheduler's (every protocol method; never does I/O except
``reset_cache``), a write pool and a read pool (jobs), one housekeeping thread
(start-up sweep and scan, deletions of evicted blocks), and in shared mode the
:class:`kvproto.AsyncProbe` worker (existence checks). Index, pins and
verdicts change on the scheduler's thread, when a job is reported.
"""

from __future__ import annotations

import errno
import itertools
import json
import logging
import os
import shutil
import stat
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

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

from kvproto_fs._config import FsTierConfig
from kvproto_fs._io import DirectIO, FileOps, address_of, link_refused, probe_direct, read_full, write_full

__all__ = ["FsTier", "FsTierStats"]

_log = logging.getLogger("kvproto_fs")

_SUFFIX = ".kvb"
_TMP_SUFFIX = ".tmp"
_STRIPES = 64


@dataclass
class FsTierStats:
    """Counters, for operators and tests (read them from the scheduler's thread)."""

    stored_blocks: int = 0
    loaded_blocks: int = 0
    failed_stores: int = 0
    failed_loads: int = 0
    damaged_removed: int = 0
    foreign_left: int = 0
    evicted_blocks: int = 0
    scanned_blocks: int = 0
    swept_temps: int = 0
    link_fallbacks: int = 0


_Verdict = Literal["ok", "gone", "failed"]  # one key of a job: done; (loads) the block is gone; failed


@dataclass(slots=True)
class _Outcome:
    """What a job did, computed on a worker; applied on the scheduler's thread when reported."""

    job: TransferJob
    ok: list[OffloadKey] = field(default_factory=list)
    gone: list[OffloadKey] = field(default_factory=list)  # loads: keys whose file is missing or was removed


class FsTier:
    """A secondary tier keeping one verified file per block under a root directory (FS-1..FS-12).

    ``buffer`` is the primary tier's slot buffer (a writable, C-contiguous
    2-D ``memoryview`` of format ``"B"``, one row per slot); its row length
    is the block size. ``ops`` replaces the system calls (fault injection).
    """

    def __init__(
        self,
        buffer: memoryview,
        config: FsTierConfig,
        *,
        name: str = "fs",
        ops: FileOps | None = None,
    ) -> None:
        if not isinstance(config, FsTierConfig):
            raise ConfigurationError(f"FsTier {name!r}: config must be an FsTierConfig, got {type(config).__name__}")
        if not isinstance(buffer, memoryview):
            raise ConfigurationError(f"FsTier {name!r}: buffer must be a memoryview, got {type(buffer).__name__}")
        shape = buffer.shape or ()
        if len(shape) != 2 or buffer.format != "B" or buffer.readonly or not buffer.c_contiguous or shape[1] < 1:
            raise ConfigurationError(
                f"FsTier {name!r}: buffer must be a writable, C-contiguous 2-D memoryview of format 'B', "
                f"got shape={shape} format={buffer.format!r} readonly={buffer.readonly}"
            )
        self._name = name
        self.config = config
        self._ops = ops if ops is not None else FileOps()
        self._num_slots: int = shape[0]
        self._block_bytes: int = shape[1]
        self._file_bytes = env.HEADER_BYTES + self._block_bytes
        self._flat = buffer.cast("B")
        self._base_address = address_of(self._flat)
        self.manifest = env.namespace_manifest(self._block_bytes, config.layout)
        self.namespace = env.namespace_id(self.manifest)
        self.root = config.root
        self.ns_dir = config.root / self.namespace.hex()
        self.tmp_dir = self.ns_dir / "tmp"
        try:
            self.tmp_dir.mkdir(parents=True, exist_ok=True)
            self._write_manifest()
        except OSError as exc:
            raise ConfigurationError(f"FsTier {name!r}: cannot write under root {str(config.root)!r}: {exc}") from exc
        self._dev = os.stat(self.ns_dir).st_dev
        self._direct = DirectIO(config.o_direct)
        if config.o_direct == "on":
            refused = probe_direct(str(self.tmp_dir))
            if refused is not None:
                raise ConfigurationError(
                    f"FsTier {name!r}: o_direct='on' but the filesystem of root {str(config.root)!r} "
                    f"refuses O_DIRECT: {refused}"
                )
        self._shared = config.shared
        self._lock = threading.Lock()  # index, doomed, events, fault knobs
        self._stripes = [threading.Lock() for _ in range(_STRIPES)]
        # key -> file bytes, least recently used first. Private mode: every block on disk (once the
        # scan is done). Shared mode: the keys this instance stored or loaded, at most recent_keys.
        # The value is the stamp of the store (or load) that last vouched for the key; a load that
        # fails drops a key only if nothing vouched for it after the load was submitted.
        self._index: OrderedDict[OffloadKey, int] = OrderedDict()
        self._seq = itertools.count(1)
        self._stamp = 0  # the last stamp handed out (scheduler thread)
        self._load_since: dict[int, int] = {}  # load job id -> stamp at submission
        self._bytes = 0
        self._pins: dict[OffloadKey, int] = {}  # keys of loads in flight (never evicted)
        self._storing: dict[OffloadKey, int] = {}  # keys of stores in flight (never evicted)
        self._doomed: dict[OffloadKey, int] = {}  # evicted, file not deleted yet -> ticket
        self._ticket = 0
        self._running: dict[int, Future[_Outcome]] = {}
        self._events: list[OffloadingEvent] = []
        self._fail_next = 0
        self._fail_keys: set[OffloadKey] = set()
        self._closed = False
        self._generation = 0  # bumped by reset_cache: a scan of an older generation adds nothing
        self._pid_tag = f"{os.getpid()}"
        self._counter = itertools.count(1)
        self.stats = FsTierStats()
        self._scan_done = threading.Event()
        self._stop = threading.Event()
        self._writers = ThreadPoolExecutor(config.write_threads, thread_name_prefix=f"kvproto-{name}-w")
        self._readers = ThreadPoolExecutor(config.read_threads, thread_name_prefix=f"kvproto-{name}-r")
        self._house = ThreadPoolExecutor(1, thread_name_prefix=f"kvproto-{name}-house")
        self._probe_tick = 0.0
        self._probe = AsyncProbe(self._exists, name=name, deadline_steps=config.probe_deadline_steps)
        self.capabilities = Capabilities(
            async_lookup=True,
            max_retry_steps=config.probe_deadline_steps,
            persistence=True,
            eviction=config.max_bytes is not None,
            sharing=config.shared,
            partial_jobs=True,
            reasons={
                "async_lookup": "RETRY while an existence check runs (shared mode, or during the start-up scan)",
                **({} if config.max_bytes is not None else {"eviction": "no max_bytes set"}),
                **({} if config.shared else {"sharing": "private mode (shared=False): one instance per root"}),
            },
        )
        self._house.submit(self._start_up, self._generation)

    # -- SecondaryTier ---------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The name given at construction, used in events and logs."""
        return self._name

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """HIT for a key in the index; otherwise MISS (private, after the scan) or the probe's verdict (FS-5).

        Never does I/O; never HIT_PENDING.
        """
        complete = not self._shared and self._scan_done.is_set()  # read first: the scan may add the key now
        if key in self._index:
            return lr.HIT
        if complete:
            return lr.MISS
        return self._probe.lookup(key, req_context)

    def lookup_many(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> list[LookupResult]:
        """``[lookup(k, req_context) for k in keys]`` (TIER-17)."""
        return [self.lookup(k, req_context) for k in keys]

    def touch(self, keys: Iterable[OffloadKey]) -> None:
        """Mark indexed ``keys`` recently used (TIER-5)."""
        with self._lock:
            index = self._index
            for key in keys:
                if key in index:
                    index.move_to_end(key)

    def submit_store(self, job: TransferJob) -> None:
        """Start writing rows ``job.slots`` to files on the write pool; the rows are read there (FS-4, TIER-10)."""
        self._validate(job, promotion=False)
        for key in job.keys:
            self._storing[key] = self._storing.get(key, 0) + 1
        with self._lock:
            for key in job.keys:
                self._doomed.pop(key, None)
        self._start(job, self._writers, self._store_key)

    def submit_load(self, job: TransferJob) -> None:
        """Start reading and verifying files into rows ``job.slots`` on the read pool (FS-6, TIER-10)."""
        self._validate(job, promotion=True)
        for key in job.keys:
            self._pins[key] = self._pins.get(key, 0) + 1
        self._load_since[job.job_id] = self._stamp
        self._start(job, self._readers, self._load_key)

    def get_finished_jobs(self) -> Sequence[JobResult]:
        """Report finished jobs once each, applying their effects to the index and verdicts (TIER-11)."""
        with self._lock:
            done = [job_id for job_id, f in self._running.items() if f.done()]
            futures = [self._running.pop(job_id) for job_id in done]
        results = [self._apply(f.result()) for f in futures]
        if results:
            self._enforce_budget()
        return results

    # -- TierLifecycle -------------------------------------------------------------------------

    def on_request_finished(self, req_context: ReqContext) -> None:
        """Drop the request's references to existence verdicts (TIER-12, AP-4)."""
        self._probe.on_request_finished(req_context)

    def on_step_end(self) -> None:
        """Post queued existence checks, apply answers, expire deadlines, keep the byte budget (TIER-13).

        Hooks closer together than ``probe_min_interval_s`` count as one for
        the existence checks, so their step deadline is never shorter than
        ``probe_deadline_steps * probe_min_interval_s`` of wall time (FS-5).
        """
        now = time.monotonic()
        if now - self._probe_tick >= self.config.probe_min_interval_s:
            self._probe_tick = now
            self._probe.on_step_end()
        self._enforce_budget()

    def take_events(self) -> Sequence[OffloadingEvent]:
        """STORED / REMOVED events since the last call (TIER-14)."""
        with self._lock:
            events, self._events = self._events, []
        return events

    def has_pending_work(self) -> bool:
        """True while a submitted job is unreported (TIER-15)."""
        with self._lock:
            return bool(self._running)

    def reset_cache(self) -> bool:
        """Forget and delete every block of this namespace; False while a job is unreported (TIER-16, FS-10).

        The namespace directory is renamed aside and deleted in the
        background. In shared mode this removes the other instances' blocks
        too (their loads fail, then MISS).
        """
        with self._lock:
            if self._running:
                return False
            keys = tuple(self._index)
            self._index.clear()
            self._bytes = 0
            self._doomed.clear()
            self._generation += 1
            if keys:
                self._events.append(OffloadingEvent(EventKind.REMOVED, keys, self._name))
        self._probe.reset()
        trash = self.root / f".trash-{self.namespace.hex()}-{uuid.uuid4().hex[:12]}"
        try:
            os.rename(self.ns_dir, trash)
        except FileNotFoundError:
            pass
        except OSError:
            _log.warning("FsTier %r: could not move %s aside; deleting in place", self._name, self.ns_dir)
            trash = self.ns_dir
        if trash != self.ns_dir:
            self.tmp_dir.mkdir(parents=True, exist_ok=True)
            self._write_manifest()
        try:
            self._house.submit(shutil.rmtree, trash, True)
        except RuntimeError:
            shutil.rmtree(trash, ignore_errors=True)  # after shutdown: no housekeeping thread left
        if not self._shared:
            self._scan_done.set()  # nothing left to find
        return True

    def shutdown(self) -> None:
        """Finish the jobs in flight (results stay reportable once), stop every thread (TIER-16). Idempotent."""
        with self._lock:
            self._closed = True
        self._stop.set()
        self._writers.shutdown(wait=True)
        self._readers.shutdown(wait=True)
        self._house.shutdown(wait=True)
        self._probe.shutdown()

    # -- operator surface --------------------------------------------------------------------

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until the start-up sweep and scan are done (tests, tools; never the scheduler)."""
        return self._scan_done.wait(timeout)

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Block until every job is finished and every queued deletion ran (tests, tools)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                running = list(self._running.values())
            if all(f.done() for f in running):
                barrier = self._house.submit(lambda: None)
                try:
                    barrier.result(max(0.0, deadline - time.monotonic()))
                except Exception:
                    return False
                return True
            time.sleep(0.001)
        return False

    def path_of(self, key: OffloadKey) -> Path:
        """The file that holds ``key``'s block."""
        digest = env.key_digest(key)
        return self.ns_dir / digest[:2] / digest[2:4] / f"{digest}{_SUFFIX}"

    def indexed_keys(self) -> frozenset[OffloadKey]:
        """The keys the index holds right now."""
        with self._lock:
            return frozenset(self._index)

    @property
    def used_bytes(self) -> int:
        """Bytes of the indexed files (what ``max_bytes`` limits)."""
        return self._bytes

    @property
    def direct_io_counts(self) -> tuple[int, int]:
        """(I/Os done with O_DIRECT, I/Os done buffered), files opened for blocks."""
        return self._direct.direct_ios, self._direct.buffered_ios

    # -- fault injection (the kit's hooks) ---------------------------------------------------

    def fail_next_jobs(self, n: int) -> None:
        """Make the next ``n`` submitted jobs fail entirely (nothing is written or read)."""
        if type(n) is not int or n < 0:
            raise InvalidArgumentError(f"fail_next_jobs: n must be an int >= 0, got {n!r}")
        with self._lock:
            self._fail_next = n

    def fail_keys(self, keys: Iterable[OffloadKey]) -> None:
        """Make every job touching ``keys`` fail for those keys (partial results)."""
        with self._lock:
            self._fail_keys.update(keys)

    # -- internals: jobs ---------------------------------------------------------------------

    def _validate(self, job: TransferJob, *, promotion: bool) -> None:
        if not isinstance(job, TransferJob):
            raise InvalidArgumentError(f"FsTier {self._name!r}: expected a TransferJob, got {type(job).__name__}")
        if job.promotion is not promotion:
            method = "submit_load" if promotion else "submit_store"
            raise InvalidArgumentError(
                f"FsTier {self._name!r}: {method} got job {job.job_id} with promotion={job.promotion}"
            )
        for slot in job.slots:
            if type(slot) is not int or not 0 <= slot < self._num_slots:
                raise InvalidArgumentError(
                    f"FsTier {self._name!r}: job {job.job_id} names slot {slot!r}, buffer has {self._num_slots} slots"
                )
        for key in job.keys:
            checked: object = key
            if not isinstance(checked, bytes) or not checked or len(checked) > env.MAX_KEY_BYTES:
                raise InvalidArgumentError(f"FsTier {self._name!r}: job {job.job_id} has an invalid key {key!r:.40}")
        with self._lock:
            if job.job_id in self._running:
                raise InvalidArgumentError(f"FsTier {self._name!r}: job id {job.job_id} is already in flight")

    def _start(self, job: TransferJob, pool: ThreadPoolExecutor, run_key: Callable[[OffloadKey, int], _Verdict]) -> None:
        """Run ``job`` key by key on ``pool``: a job of many blocks uses every thread of the pool
        (the manager sends one job per request and step). The job ends when its last key does."""
        with self._lock:
            fail_all = self._fail_next > 0 or self._closed
            if self._fail_next > 0:
                self._fail_next -= 1
            failing = frozenset(self._fail_keys & set(job.keys))
            done: Future[_Outcome] = Future()
            self._running[job.job_id] = done
            if fail_all:
                done.set_result(_Outcome(job))
                return
        todo = [i for i, key in enumerate(job.keys) if key not in failing]
        if not todo:
            done.set_result(_Outcome(job))
            return
        verdicts: list[_Verdict] = ["failed"] * len(job.keys)
        remaining = [len(todo)]
        guard = threading.Lock()

        def finish(i: int, verdict: _Verdict) -> None:
            with guard:
                verdicts[i] = verdict
                remaining[0] -= 1
                last = remaining[0] == 0
            if last:
                out = _Outcome(job)
                for key, seen in zip(job.keys, verdicts, strict=True):
                    if seen == "ok":
                        out.ok.append(key)
                    elif seen == "gone":
                        out.gone.append(key)
                done.set_result(out)

        for i in todo:
            pool.submit(self._guarded, run_key, job, i, finish)

    def _guarded(self, run_key: Callable[[OffloadKey, int], _Verdict], job: TransferJob, i: int,
                 finish: Callable[[int, _Verdict], None]) -> None:
        try:
            verdict = run_key(job.keys[i], job.slots[i])
        except Exception:
            _log.warning("FsTier %r: job %d raised on key %d; it fails", self._name, job.job_id, i, exc_info=True)
            verdict = "gone" if job.promotion else "failed"
        finish(i, verdict)

    def _row(self, slot: int) -> memoryview:
        size = self._block_bytes
        return self._flat[slot * size : (slot + 1) * size]

    def _temp_name(self) -> str:
        n = next(self._counter)
        return str(self.tmp_dir / f"{self._pid_tag}-{threading.get_ident()}-{n}-{uuid.uuid4().hex[:8]}{_TMP_SUFFIX}")

    def _store_key(self, key: OffloadKey, slot: int) -> _Verdict:
        try:
            self._publish(key, slot)
        except OSError as exc:
            _log.warning("FsTier %r: store of %s failed: %s", self._name, key.hex()[:16], exc)
            return "failed"
        return "ok"

    def _publish(self, key: OffloadKey, slot: int) -> None:
        """Write the block to a unique temp file, then link it to its final name (first writer wins) (FS-3)."""
        final = str(self.path_of(key))
        with self._stripes[hash(key) % _STRIPES]:
            try:
                if os.stat(final).st_size == self._file_bytes:
                    return  # content-addressed: a complete block is never rewritten (loads verify anyway)
            except FileNotFoundError:
                pass
        ops = self._ops
        row = self._row(slot)
        digest = env.checksum(row)
        header = env.encode_header(key, row, self.namespace, payload_checksum=digest)
        tmp = self._temp_name()
        direct = self._direct.usable(self._dev, self._base_address + slot * self._block_bytes, self._block_bytes)
        fd = -1
        try:
            if direct:
                try:
                    fd = ops.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_DIRECT)
                    head = self._direct.header_buffer()
                    head[:] = header
                    write_full(ops, fd, [head, row], 0)
                except OSError as exc:
                    if exc.errno != errno.EINVAL:
                        raise
                    self._direct.refuse(self._dev, exc)
                    direct = False
                    if fd >= 0:
                        ops.close(fd)
                        fd = -1
                    os.unlink(tmp)
            if not direct:
                fd = ops.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
                write_full(ops, fd, [memoryview(header), row], 0)
            self._direct.count(direct)
            if self.config.durability != "none":
                ops.fsync(fd)
            ops.close(fd)
            fd = -1
            self._link(tmp, final)
        except BaseException:
            if fd >= 0:
                try:
                    ops.close(fd)
                except OSError:
                    pass
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        if self.config.durability == "full":
            dfd = os.open(os.path.dirname(final), os.O_RDONLY)
            try:
                ops.fsync(dfd)
            finally:
                os.close(dfd)

    def _link(self, tmp: str, final: str) -> None:
        ops = self._ops
        parent = os.path.dirname(final)
        for attempt in (0, 1):
            try:
                ops.link(tmp, final)
                break
            except FileExistsError:
                break  # first writer won: same key, same bytes (content-addressed)
            except FileNotFoundError:
                if attempt:
                    raise
                try:
                    os.mkdir(parent)  # the leaf <bb> only: start-up made every <aa> (FS-2)
                except FileExistsError:
                    pass
                except FileNotFoundError:
                    os.makedirs(parent, exist_ok=True)
            except OSError as exc:
                if not link_refused(exc):
                    raise
                self.stats.link_fallbacks += 1
                ops.replace(tmp, final)
                return
        ops.unlink(tmp)

    def _load_key(self, key: OffloadKey, slot: int) -> _Verdict:
        return "ok" if self._read_block(key, slot) else "gone"

    def _read_block(self, key: OffloadKey, slot: int) -> bool:
        """Read and verify ``key``'s file into ``slot``; True if done, False if the block is gone or damaged (FS-6)."""
        path = str(self.path_of(key))
        ops = self._ops
        row = self._row(slot)
        direct = self._direct.usable(self._dev, self._base_address + slot * self._block_bytes, self._block_bytes)
        try:
            fd = ops.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
        except FileNotFoundError:
            return False
        except OSError as exc:
            if not direct or exc.errno != errno.EINVAL:
                _log.warning("FsTier %r: cannot open %s: %s", self._name, path, exc)
                return False
            self._direct.refuse(self._dev, exc)
            direct = False
            try:
                fd = ops.open(path, os.O_RDONLY)
            except OSError:
                return False
        try:
            head = self._direct.header_buffer() if direct else memoryview(bytearray(env.HEADER_BYTES))
            try:
                got = read_full(ops, fd, [head, row], 0)
            except OSError as exc:
                if not direct or exc.errno != errno.EINVAL:
                    raise
                self._direct.refuse(self._dev, exc)
                direct = False
                head = memoryview(bytearray(env.HEADER_BYTES))
                got = read_full(ops, fd, [head, row], 0)
            self._direct.count(direct)
            header = env.verify_header(head, key=key, namespace=self.namespace, payload_len=self._block_bytes)
            if got != self._file_bytes:
                raise env.EnvelopeError("length", f"file holds {got} bytes, expected {self._file_bytes}")
            if ops.fstat(fd).st_size != self._file_bytes:
                raise env.EnvelopeError("length", "the file is longer than one envelope")
            env.verify_payload(header, row)
            return True
        except env.EnvelopeError as exc:
            if exc.field in ("namespace", "algorithm"):
                _log.warning("FsTier %r: %s holds %s; leaving it alone (a configuration mismatch)", self._name, path, exc)
                with self._lock:
                    self.stats.foreign_left += 1
            else:
                _log.warning("FsTier %r: %s failed verification (%s); removing it", self._name, path, exc)
                self._remove_damaged(path)
            return False
        except OSError as exc:
            _log.warning("FsTier %r: reading %s failed: %s", self._name, path, exc)
            return False
        finally:
            ops.close(fd)

    def _remove_damaged(self, path: str) -> None:
        try:
            os.unlink(path)
        except OSError:
            return
        with self._lock:
            self.stats.damaged_removed += 1

    # -- internals: the scheduler side -------------------------------------------------------

    def _apply(self, out: _Outcome) -> JobResult:
        job = out.job
        ok = out.ok
        probe = self._probe
        if job.promotion:
            for key in job.keys:
                left = self._pins[key] - 1
                if left:
                    self._pins[key] = left
                else:
                    del self._pins[key]
            done = set(ok)
            failed = [k for k in job.keys if k not in done]
            self.stats.loaded_blocks += len(ok)
            self.stats.failed_loads += len(job.keys) - len(ok)
            since = self._load_since.pop(job.job_id, 0)
            if failed:
                # A store reported after this load was submitted vouches for its key: keep it.
                with self._lock:
                    index = self._index
                    failed = [k for k in failed if index.get(k, 0) <= since]
                removed = self._drop([k for k in out.gone if k in set(failed)])
                if removed:
                    with self._lock:
                        self._events.append(OffloadingEvent(EventKind.REMOVED, tuple(removed), self._name))
                probe.mark_miss(failed)
            if ok:
                self._remember(ok, loaded=True)
        else:
            for key in job.keys:
                left = self._storing[key] - 1
                if left:
                    self._storing[key] = left
                else:
                    del self._storing[key]
            self.stats.stored_blocks += len(ok)
            self.stats.failed_stores += len(job.keys) - len(ok)
            if ok:
                self._remember(ok, loaded=False)
                with self._lock:
                    self._events.append(OffloadingEvent(EventKind.STORED, tuple(ok), self._name))
                probe.mark_hit(ok)
        if len(ok) == len(job.keys):
            return JobResult(job.job_id, True)
        return JobResult(job.job_id, False, frozenset(ok) if ok else None)

    def _remember(self, keys: Iterable[OffloadKey], *, loaded: bool) -> None:
        size = self._file_bytes
        stamp = self._stamp = next(self._seq)
        with self._lock:
            index = self._index
            for key in keys:
                if key in index:
                    index[key] = stamp
                    index.move_to_end(key)
                    continue
                index[key] = stamp
                self._bytes += size
            if self._shared:
                while len(index) > self.config.recent_keys:
                    index.popitem(last=False)
                    self._bytes -= size

    def _drop(self, keys: Iterable[OffloadKey]) -> list[OffloadKey]:
        removed: list[OffloadKey] = []
        with self._lock:
            for key in keys:
                if self._index.pop(key, None) is not None:
                    self._bytes -= self._file_bytes
                    removed.append(key)
        return removed

    def _enforce_budget(self) -> None:
        """Evict least recently used blocks beyond ``max_bytes``; never one being loaded or stored (FS-9)."""
        budget = self.config.max_bytes
        if budget is None or self._bytes <= budget:
            return
        victims: list[tuple[OffloadKey, int]] = []
        with self._lock:
            for key in self._index:
                if self._bytes <= budget:
                    break
                if key in self._pins or key in self._storing:
                    continue
                victims.append((key, 0))
                self._bytes -= self._file_bytes
            for i, (key, _) in enumerate(victims):
                del self._index[key]
                self._ticket += 1
                self._doomed[key] = self._ticket
                victims[i] = (key, self._ticket)
            if victims:
                self._events.append(OffloadingEvent(EventKind.REMOVED, tuple(k for k, _ in victims), self._name))
        if not victims:
            return
        self.stats.evicted_blocks += len(victims)
        self._probe.mark_miss([k for k, _ in victims])
        try:
            self._house.submit(self._delete_doomed, victims)
        except RuntimeError:
            pass  # shut down: the files stay (a later instance may use or evict them)

    def _delete_doomed(self, victims: list[tuple[OffloadKey, int]]) -> None:
        for key, ticket in victims:
            with self._stripes[hash(key) % _STRIPES]:
                with self._lock:
                    if self._doomed.get(key) != ticket:
                        continue  # stored again since: keep the file
                    del self._doomed[key]
                try:
                    self._ops.unlink(str(self.path_of(key)))
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    _log.warning("FsTier %r: could not delete evicted %s: %s", self._name, key.hex()[:16], exc)

    # -- internals: existence checks, start-up ------------------------------------------------

    def _exists(self, keys: Sequence[OffloadKey]) -> list[OffloadKey]:
        """The keys whose file exists with the size of one envelope (the probe's check; a worker thread)."""
        found: list[OffloadKey] = []
        size = self._file_bytes
        for key in keys:
            try:
                st = os.stat(self.path_of(key))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_size == size:
                found.append(key)
        return found

    def _write_manifest(self) -> None:
        path = self.ns_dir / "manifest.json"
        if path.exists():
            return
        tmp = self.tmp_dir / f"manifest-{os.getpid()}-{uuid.uuid4().hex[:8]}{_TMP_SUFFIX}"
        tmp.write_text(json.dumps(self.manifest, sort_keys=True, indent=2) + "\n")
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        except OSError as exc:
            if not link_refused(exc):
                raise
            os.replace(tmp, path)
            return
        tmp.unlink()

    def _start_up(self, generation: int) -> None:
        """Housekeeping thread: sweep orphan temp files and trash, then (private mode) scan the index (FS-3, FS-5)."""
        try:
            self._make_first_level()
            self._sweep()
            if not self._shared:
                self._scan(generation)
        except Exception:
            _log.warning("FsTier %r: start-up scan failed; unknown keys answer MISS", self._name, exc_info=True)
        finally:
            self._scan_done.set()

    def _make_first_level(self) -> None:
        """Create the 256 ``<aa>`` directories up front, so a first store into a leaf makes one directory, not two."""
        for high in range(256):
            try:
                os.mkdir(self.ns_dir / f"{high:02x}")
            except FileExistsError:
                continue

    def _sweep(self) -> None:
        now = time.time()
        grace = self.config.temp_grace_s
        swept = 0
        try:
            entries = list(os.scandir(self.tmp_dir))
        except FileNotFoundError:
            entries = []
        for entry in entries:
            if not entry.name.endswith(_TMP_SUFFIX):
                continue
            try:
                if now - entry.stat(follow_symlinks=False).st_mtime >= grace:
                    os.unlink(entry.path)
                    swept += 1
            except OSError:
                continue
        for entry in os.scandir(self.root):
            if entry.name.startswith(f".trash-{self.namespace.hex()}-"):
                shutil.rmtree(entry.path, ignore_errors=True)
        with self._lock:
            self.stats.swept_temps += swept

    def _scan(self, generation: int) -> None:
        head = bytearray(env.HEADER_BYTES)
        view = memoryview(head)
        batch: list[OffloadKey] = []
        for top in _subdirs(self.ns_dir):
            for sub in _subdirs(top):
                for entry in os.scandir(sub):
                    if self._stop.is_set():
                        return
                    if not entry.name.endswith(_SUFFIX):
                        continue
                    key = self._scan_one(entry, view)
                    if key is not None:
                        batch.append(key)
                if batch:
                    self._add_scanned(batch, generation)
                    batch = []

    def _scan_one(self, entry: os.DirEntry[str], view: memoryview) -> OffloadKey | None:
        try:
            fd = os.open(entry.path, os.O_RDONLY)
        except OSError:
            return None
        try:
            size = os.fstat(fd).st_size
            got = read_full(self._ops, fd, [view], 0)
            header = env.decode_header(view[:got])
            if header.namespace != self.namespace:
                _log.warning("FsTier %r: %s belongs to namespace %s; leaving it", self._name, entry.path,
                             header.namespace.hex())
                return None
            if (env.key_digest(header.key) + _SUFFIX != entry.name or header.payload_len != self._block_bytes
                    or size != self._file_bytes):
                raise env.EnvelopeError("length", "misplaced or wrongly sized file")
            return OffloadKey(header.key)
        except env.EnvelopeError as exc:
            _log.warning("FsTier %r: %s is damaged (%s); removing it", self._name, entry.path, exc)
            self._remove_damaged(entry.path)
            return None
        except OSError:
            return None
        finally:
            os.close(fd)

    def _add_scanned(self, keys: list[OffloadKey], generation: int) -> None:
        size = self._file_bytes
        with self._lock:
            if generation != self._generation:
                return
            index = self._index
            for key in keys:
                if key in index or key in self._doomed:
                    continue
                index[key] = 0  # vouched for by nothing newer than any load
                index.move_to_end(key, last=False)  # found on disk: older than anything stored since
                self._bytes += size
            self.stats.scanned_blocks += len(keys)


def _subdirs(path: Path | str) -> list[str]:
    try:
        return sorted(e.path for e in os.scandir(path) if len(e.name) == 2 and e.is_dir(follow_symlinks=False))
    except OSError:
        return []

