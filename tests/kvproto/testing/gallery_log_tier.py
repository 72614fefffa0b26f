"""Gallery (KIT-13): held-out round 6, written from the public docs by someone who had not read the kit
and measured before anyone looked (the kit passed it then); it joined the gallery after.
Bug: a restart's scan stops at a torn record (a writer killed in the middle of an append) and treats it as
the end of the log, but never cuts it off: new records are appended after the torn bytes, so the next
restart's scan stops there again and every block stored since the crash is lost. Only a kill inside a
record's write (TIER-24's storage-write kills: halfway through an ``os.write``) leaves such a record.

LogTier: a secondary KV-cache tier over an append-only log file with an in-memory offset index.

``ROOT/<namespace>/blocks.log`` is a sequence of records ``[magic, key length, payload length,
crc32(key + payload)][key][payload]``; the index maps each live key to its record's offset, in LRU
order. Past ``capacity_blocks`` the least recently used blocks are evicted from the index; their
records become dead, and once dead records exceed half the capacity the log is compacted (live
records copied to a new file renamed over the log). A restart scans the log to rebuild the index.

Instances over one directory take an ``flock`` for every batch; a log replaced under an instance (by
another's compaction or reset: a new inode) is rescanned, and records others appended are read in.
"""

from __future__ import annotations

import fcntl
import logging
import os
import struct
import threading
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
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
    envelope as env,
)
from kvproto.errors import ConfigurationError, InvalidArgumentError

from tests.kvproto.testing.gallery_registry import Gallery

if TYPE_CHECKING:
    from kvproto.testing import TierSpec

__all__ = ["LogTier", "conformance_spec"]

_log = logging.getLogger("logtier")
REC = struct.Struct("<4sIII")  # magic, key length, payload length, crc32(key + payload)
MAGIC = b"KVL1"
MAX_KEY = 4096


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]  # O_APPEND: each write lands at the end of the log


def _read_exact(fd: int, size: int, at: int) -> bytes:
    parts, got = [], 0
    while got < size:
        part = os.pread(fd, size - got, at + got)
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


class LogTier:
    """``LogTier(buffer, root, capacity_blocks=4096)``: blocks in an append-only log under ``root``."""

    def __init__(self, buffer: memoryview, root: str | os.PathLike[str], *, capacity_blocks: int = 4096,
                 layout: dict[str, object] | None = None, name: str = "applog") -> None:
        given: object = buffer  # checked at run time too: an engine's caller may not be type-checked
        if not isinstance(given, memoryview) or buffer.ndim != 2 or buffer.format != "B":
            raise ConfigurationError("LogTier: buffer must be a 2-D memoryview of format 'B'")
        if type(capacity_blocks) is not int or capacity_blocks < 1:
            raise ConfigurationError(f"LogTier: capacity_blocks must be an int >= 1, got {capacity_blocks!r}")
        self._name, self._capacity = name, capacity_blocks
        self._slots, self._bb = buffer.shape  # type: ignore[misc]  # a 2-D view's shape: two ints (checked above)
        self._rows = buffer.cast("B")
        self.root = Path(root)
        self.dir = self.root / env.namespace_id(env.namespace_manifest(self._bb, layout or {})).hex()
        self.dir.mkdir(parents=True, exist_ok=True)
        self._path, self._tmp = str(self.dir / "blocks.log"), str(self.dir / "blocks.log.new")
        self._lock_path = str(self.dir / "blocks.lock")
        self._io_lock = threading.Lock()  # the log file: one batch at a time (and flock across processes)
        self._lock = threading.Lock()     # index, results, events: held briefly, never across I/O
        self._fd, self._ino, self._end = -1, -1, 0  # the open log, its inode, where our scan ended
        self._index: OrderedDict[OffloadKey, int] = OrderedDict()  # key -> record offset, LRU first
        self._dead = 0
        self._finished: list[JobResult] = []
        self._inflight: set[int] = set()
        self._events: list[OffloadingEvent] = []
        self._closed = False
        with self._io():
            pass  # opens and scans the log a previous run left
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"logtier-{name}")
        self.capabilities = Capabilities(
            persistence=True, eviction=True, lru=True, partial_jobs=True,
            reasons={"sharing": "others' blocks are read in at this instance's next batch, not at lookup",
                     "async_lookup": "answers from its index"})

    # -- the log -----------------------------------------------------------------------

    @contextmanager
    def _io(self) -> Iterator[None]:
        with self._io_lock:
            lock_fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX)
                self._refresh()
                yield
            finally:
                os.close(lock_fd)

    def _refresh(self) -> None:
        try:
            st = os.stat(self._path)
        except FileNotFoundError:
            st = None
        if st is None or st.st_ino != self._ino:  # first use, or replaced by a compaction or a reset
            if self._fd >= 0:
                os.close(self._fd)
            self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
            self._ino, self._end = os.fstat(self._fd).st_ino, 0
            with suppress(FileNotFoundError):
                os.unlink(self._tmp)  # a compaction cut short by a crash
            with self._lock:
                before, self._dead = set(self._index), 0
                self._index.clear()
            self._scan()
            with self._lock:
                gone = tuple(k for k in before if k not in self._index)
                if gone:
                    self._events.append(OffloadingEvent(EventKind.REMOVED, gone, self._name))
        elif st.st_size > self._end:
            self._scan()  # records another instance appended

    def _scan(self) -> None:
        """Read records from ``_end`` on; stop at the first that is not whole (a torn tail)."""
        size, at, found = os.fstat(self._fd).st_size, self._end, []
        while at + REC.size <= size:
            magic, klen, plen, crc = REC.unpack(_read_exact(self._fd, REC.size, at))
            if magic != MAGIC or plen != self._bb or not 0 < klen <= MAX_KEY:
                break
            body = _read_exact(self._fd, klen + plen, at + REC.size)
            if len(body) != klen + plen or zlib.crc32(body) != crc:
                break
            found.append((OffloadKey(body[:klen]), at))
            at += REC.size + klen + plen
        with self._lock:
            for key, offset in found:
                if key in self._index:
                    self._dead += 1
                self._index[key] = offset
                self._index.move_to_end(key)
        self._end = at
        if at < size:
            _log.warning("LogTier %s: ignoring a torn record at offset %d of %s", self._name, at, self._path)

    def _append(self, key: OffloadKey, payload: bytes) -> int:
        rec = REC.pack(MAGIC, len(key), len(payload), zlib.crc32(key + payload)) + key + payload
        at = os.fstat(self._fd).st_size
        try:
            _write_all(self._fd, rec)
        except OSError:
            os.ftruncate(self._fd, at)  # no half record in the middle of the log
            raise
        self._end = at + len(rec)
        return at

    def _compact(self) -> None:
        with self._lock:
            live = list(self._index.items())
        moved: dict[OffloadKey, int] = {}
        fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            at = 0
            for key, offset in live:
                rec = _read_exact(self._fd, REC.size + len(key) + self._bb, offset)
                _write_all(fd, rec)
                moved[key], at = at, at + len(rec)
        finally:
            os.close(fd)
        os.rename(self._tmp, self._path)
        os.close(self._fd)
        self._fd = os.open(self._path, os.O_RDWR | os.O_APPEND)
        self._ino, self._end = os.fstat(self._fd).st_ino, at
        with self._lock:
            for key, offset in moved.items():
                if key in self._index:
                    self._index[key] = offset
            self._dead = 0

    # -- SecondaryTier -----------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return LookupResult.HIT if key in self._index else LookupResult.MISS

    def touch(self, keys: Iterable[OffloadKey]) -> None:
        with self._lock:
            for key in keys:
                if key in self._index:
                    self._index.move_to_end(key)

    def submit_store(self, job: TransferJob) -> None:
        self._submit(job, promotion=False)

    def submit_load(self, job: TransferJob) -> None:
        self._submit(job, promotion=True)

    def get_finished_jobs(self) -> Sequence[JobResult]:
        with self._lock:
            done, self._finished = self._finished, []
            for result in done:
                self._inflight.discard(result.job_id)
        return done

    def on_request_finished(self, req_context: ReqContext) -> None:
        pass

    def on_step_end(self) -> None:
        pass

    def take_events(self) -> Sequence[OffloadingEvent]:
        with self._lock:
            events, self._events = self._events, []
        return events

    def has_pending_work(self) -> bool:
        with self._lock:
            return bool(self._inflight)

    def reset_cache(self) -> bool:
        with self._lock:
            if self._inflight:
                return False
        try:
            with self._io():
                os.close(os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
                os.rename(self._tmp, self._path)  # a new, empty log: other instances rescan it
                self._refresh()
        except OSError:
            _log.exception("LogTier %s: reset failed", self._name)
            return False
        return True

    def shutdown(self) -> None:
        self._closed = True
        self._pool.shutdown(wait=True)
        with self._io_lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd, self._ino = -1, -1

    # -- jobs --------------------------------------------------------------------------

    def _submit(self, job: TransferJob, *, promotion: bool) -> None:
        if job.promotion is not promotion or any(not 0 <= s < self._slots for s in job.slots):
            raise InvalidArgumentError(f"LogTier {self._name}: bad job {job!r:.120}")
        with self._lock:
            if job.job_id in self._inflight:
                raise InvalidArgumentError(f"LogTier {self._name}: job id {job.job_id} already in flight")
            self._inflight.add(job.job_id)
            if self._closed:
                self._finished.append(JobResult(job.job_id, False))
                return
        self._pool.submit(self._run, job)

    def _run(self, job: TransferJob) -> None:
        done: list[OffloadKey] = []
        try:
            with self._io():
                (self._load if job.promotion else self._store)(job, done)
        except Exception:
            _log.exception("LogTier %s: job %d failed", self._name, job.job_id)
        with self._lock:
            ok = len(done) == len(job.keys)
            self._finished.append(JobResult(job.job_id, ok, None if ok else frozenset(done)))

    def _row(self, slot: int) -> memoryview:
        return self._rows[slot * self._bb:(slot + 1) * self._bb]

    def _store(self, job: TransferJob, done: list[OffloadKey]) -> None:
        for key, slot in zip(job.keys, job.slots, strict=True):
            with self._lock:
                if key in self._index:
                    self._index.move_to_end(key)
                    done.append(key)
                    continue
            offset = self._append(key, bytes(self._row(slot)))
            with self._lock:
                self._index[key] = offset
                self._events.append(OffloadingEvent(EventKind.STORED, (key,), self._name))
                while len(self._index) > self._capacity:
                    old, _ = self._index.popitem(last=False)
                    self._dead += 1
                    self._events.append(OffloadingEvent(EventKind.REMOVED, (old,), self._name))
            done.append(key)
        if self._dead > self._capacity // 2:
            try:
                self._compact()
            except OSError:
                _log.exception("LogTier %s: compaction failed; the log keeps its dead records", self._name)

    def _load(self, job: TransferJob, done: list[OffloadKey]) -> None:
        bad: list[OffloadKey] = []
        for key, slot in zip(job.keys, job.slots, strict=True):
            with self._lock:
                offset = self._index.get(key)
                if offset is not None:
                    self._index.move_to_end(key)
            if offset is None:
                continue
            rec = _read_exact(self._fd, REC.size + len(key) + self._bb, offset)
            head, body = rec[:REC.size], rec[REC.size:]
            if (len(rec) != REC.size + len(key) + self._bb or REC.unpack(head) != (
                    MAGIC, len(key), self._bb, zlib.crc32(body)) or body[:len(key)] != key):
                bad.append(key)
                continue
            self._row(slot)[:] = body[len(key):]
            done.append(key)
        if bad:
            _log.warning("LogTier %s: dropping %d damaged block(s)", self._name, len(bad))
            with self._lock:
                gone = tuple(key for key in bad if self._index.pop(key, None) is not None)
                self._dead += len(gone)
                if gone:
                    self._events.append(OffloadingEvent(EventKind.REMOVED, gone, self._name))


def _conforms(tier: LogTier) -> SecondaryTier:  # pragma: no cover - read by mypy only
    return tier


def _records(path: Path) -> dict[bytes, tuple[int, bytes]]:
    """Every whole record in a log, read without a tier: key -> (offset, payload), the last one winning."""
    data, at, out = path.read_bytes() if path.exists() else b"", 0, {}
    while at + REC.size <= len(data):
        magic, klen, plen, crc = REC.unpack_from(data, at)
        body = data[at + REC.size:at + REC.size + klen + plen]
        if magic != MAGIC or len(body) != klen + plen or zlib.crc32(body) != crc:
            break
        out[body[:klen]] = (at, body[klen:])
        at += REC.size + klen + plen
    return out


def conformance_spec() -> TierSpec:
    """``kvproto conform t2:conformance_spec``: a LogTier of 64 blocks over a fresh temporary directory."""
    from kvproto.testing import TierSpec, fresh_directory

    def read_block(tier: LogTier, key: OffloadKey) -> bytes | None:
        found = _records(Path(tier._path)).get(key)
        return None if found is None else found[1]

    def corrupt_on_read(tier: LogTier, keys: Iterable[OffloadKey]) -> None:
        records = _records(Path(tier._path))
        with open(tier._path, "r+b") as f:
            for key in keys:
                if key in records:
                    at = records[key][0] + REC.size + len(key) + tier._bb - 1
                    f.seek(at)
                    last = f.read(1)
                    f.seek(at)
                    f.write(bytes([last[0] ^ 0xFF]))

    return TierSpec(
        "applog", "secondary",
        lambda buffer: LogTier(buffer, fresh_directory("logtier-"), capacity_blocks=64),
        hooks={"reopen": lambda tier, buffer: LogTier(buffer, tier.root, capacity_blocks=64),
               "reopen_other_layout": lambda tier, buffer: LogTier(buffer, tier.root, capacity_blocks=64,
                                                                   layout={"other": 1}),
               "read_block": read_block, "corrupt_on_read": corrupt_on_read,
               # dead records of evicted blocks stay until they exceed half the capacity
               "capacity_blocks": lambda tier: tier._capacity + tier._capacity // 2},
        tier_class=LogTier,
        description="t2.LogTier(buffer, <fresh temporary directory>, capacity_blocks=64)",
    )


LOG_GALLERY = Gallery()
"""This module's target (gallery_registry.py); gallery_index.py gathers it into ``GALLERY``."""


@LOG_GALLERY.fails("test_a_killed_writer_leaves_no_false_hit", "TIER-24", "once that instance shut down cleanly")
def leaves_its_torn_tail_in_the_log() -> TierSpec:
    return conformance_spec()
