"""Gallery (KIT-13): held-out round 10, written from the public docs by someone who had not read the kit
and measured before anyone looked (the kit passed it then); it joined the gallery after.
Bug: a store appends the index record naming a block's slot *before* it copies the block into the mapped
slot ("so the slot is claimed"): a writer killed between the two leaves a valid record vouching for an
unwritten slot, and every later instance answers HIT for the key and fails its load. A copy into a mapping
is no call, so no kill before a storage write lands between the two: the crash check now also kills right
after a storage write returned (TIER-24).

MmapSlabTier: blocks in mmap'ed fixed-size slab files, with an append-only side index.

Each instance writes slabs of its own under ``root/<namespace>/``: ``<id>.slab`` is sized
once to ``slab_slots`` blocks and mapped shared, ``<id>.idx`` is a log of records
``magic | slot | key length | crc32(block)`` + key + crc32(record) telling which key lives
in which slot. Stores copy the block into the next free slot through the mapping; loads
copy it out of the mapping and check its crc32. At start-up every slab's index log is
replayed (a torn last record fails its own crc and ends the replay) and the slabs are
mapped read-only, so blocks survive restarts. Slots are never reused: no eviction.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import threading
import uuid
import zlib
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
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
from kvproto.envelope import namespace_id, namespace_manifest
from kvproto.errors import InvalidArgumentError

from tests.kvproto.testing.gallery_registry import Gallery

if TYPE_CHECKING:
    from kvproto.testing import TierSpec

_log = logging.getLogger("mmapslab")
_REC = struct.Struct("<4sIII")  # magic, slot, key length, crc32(block); then key, then crc32(record)
_MAGIC = b"SLB1"


class _Slab:
    def __init__(self, path: Path, slots: int, block_bytes: int, *, create: bool) -> None:
        self.id = path.stem
        self.slots = slots
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL if create else os.O_RDONLY, 0o644)
        if create:
            os.ftruncate(self.fd, slots * block_bytes)
            self.idx_fd = os.open(path.with_suffix(".idx"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        else:
            self.idx_fd = -1
        self.mm = mmap.mmap(self.fd, slots * block_bytes, access=mmap.ACCESS_WRITE if create else mmap.ACCESS_READ)
        self.next_slot = 0
        self.idx_tail = 0

    def close(self) -> None:
        self.mm.close()
        os.close(self.fd)
        if self.idx_fd >= 0:
            os.close(self.idx_fd)


class MmapSlabTier:
    def __init__(self, buffer: memoryview, root: Path, *, layout: Mapping[str, object] | None = None,
                 name: str = "mmapslab", slab_slots: int = 64, read_threads: int = 2) -> None:
        num_slots, block_bytes = buffer.shape or (0, 0)
        self._name = name
        self._flat = buffer.cast("B")
        self._num_slots = num_slots
        self._bb = block_bytes
        self.root = Path(root)
        self.layout = dict(layout or {"model": "demo"})
        self._dir = self.root / namespace_id(namespace_manifest(block_bytes, self.layout)).hex()
        self._dir.mkdir(parents=True, exist_ok=True)
        self._slab_slots = slab_slots
        self._lock = threading.Lock()
        self._slabs: dict[str, _Slab] = {}
        self._own: _Slab | None = None
        self._index: dict[OffloadKey, tuple[str, int, int]] = {}  # key -> (slab, slot, crc32)
        self._finished: list[JobResult] = []
        self._unreported: set[int] = set()
        self._events: deque[OffloadingEvent] = deque(maxlen=65_536)
        self._closed = False
        self._replay()
        self._writer = ThreadPoolExecutor(1, thread_name_prefix=f"{name}-write")
        self._readers = ThreadPoolExecutor(read_threads, thread_name_prefix=f"{name}-read")
        self.capabilities = Capabilities(
            persistence=True, partial_jobs=True,
            reasons={"eviction": "slots are never reused", "sharing": "each instance writes its own slabs",
                     "async_lookup": "answers from its in-memory index"},
        )

    def _replay(self) -> None:
        for idx in sorted(self._dir.glob("*.idx")):
            slab_path = idx.with_suffix(".slab")
            try:
                data = idx.read_bytes()
                size = os.stat(slab_path).st_size
            except FileNotFoundError:
                continue
            if size < self._bb:
                continue
            slab = _Slab(slab_path, size // self._bb, self._bb, create=False)
            self._slabs[slab.id] = slab
            off = 0
            while off + _REC.size <= len(data):
                magic, slot, klen, crc = _REC.unpack_from(data, off)
                end = off + _REC.size + klen
                if magic != _MAGIC or end + 4 > len(data) or slot >= slab.slots:
                    break
                if struct.unpack_from("<I", data, end)[0] != zlib.crc32(data[off:end]):
                    break  # a torn record: its writer died while appending it
                self._index[OffloadKey(data[off + _REC.size:end])] = (slab.id, slot, crc)
                off = end + 4

    @property
    def name(self) -> str:
        return self._name

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return LookupResult.HIT if key in self._index else LookupResult.MISS

    def touch(self, keys: Iterable[OffloadKey]) -> None:
        pass

    def submit_store(self, job: TransferJob) -> None:
        self._submit(job, False)

    def submit_load(self, job: TransferJob) -> None:
        self._submit(job, True)

    def _submit(self, job: TransferJob, promotion: bool) -> None:
        if job.promotion is not promotion or any(not 0 <= s < self._num_slots for s in job.slots):
            raise InvalidArgumentError(f"{self._name}: bad job {job!r}")
        with self._lock:
            if job.job_id in self._unreported:
                raise InvalidArgumentError(f"{self._name}: job {job.job_id} already in flight")
            self._unreported.add(job.job_id)
            if self._closed:
                self._finished.append(JobResult(job.job_id, False))
                return
        pool, body = (self._readers, self._load_job) if promotion else (self._writer, self._store_job)
        pool.submit(self._run, job, body)

    def _run(self, job: TransferJob, body: object) -> None:
        ok: list[OffloadKey] = []
        try:
            ok = body(job)  # type: ignore[operator]
        except Exception:
            _log.exception("%s: job %d failed", self._name, job.job_id)
        done = set(ok)
        result = JobResult(job.job_id, True) if all(k in done for k in job.keys) else \
            JobResult(job.job_id, False, frozenset(done))
        with self._lock:
            self._finished.append(result)

    def _row(self, slot: int) -> memoryview:
        return self._flat[slot * self._bb:(slot + 1) * self._bb]

    def _own_slab(self) -> _Slab:
        slab = self._own
        if slab is None or slab.next_slot >= slab.slots:
            slab = _Slab(self._dir / f"{uuid.uuid4().hex}.slab", self._slab_slots, self._bb, create=True)
            with self._lock:
                self._slabs[slab.id] = slab
                self._own = slab
        return slab

    def _append_record(self, slab: _Slab, slot: int, key: OffloadKey, crc: int) -> None:
        rec = _REC.pack(_MAGIC, slot, len(key), crc) + key
        rec += struct.pack("<I", zlib.crc32(rec))
        done = 0
        while done < len(rec):
            done += os.pwrite(slab.idx_fd, rec[done:], slab.idx_tail + done)
        slab.idx_tail += len(rec)

    def _copy_into_slab(self, slab: _Slab, slot: int, data: bytes) -> None:
        slab.mm[slot * self._bb:(slot + 1) * self._bb] = data

    def _store_job(self, job: TransferJob) -> list[OffloadKey]:
        ok: list[OffloadKey] = []
        for key, row_slot in zip(job.keys, job.slots, strict=True):
            data = bytes(self._row(row_slot))
            crc = zlib.crc32(data)
            try:
                slab = self._own_slab()
                slot = slab.next_slot
                slab.next_slot += 1
                self._append_record(slab, slot, key, crc)
                self._copy_into_slab(slab, slot, data)
            except OSError:
                _log.exception("%s: store of %r failed", self._name, key)
                continue
            with self._lock:
                self._index[key] = (slab.id, slot, crc)
                self._events.append(OffloadingEvent(EventKind.STORED, (key,), self._name))
            ok.append(key)
        return ok

    def _load_job(self, job: TransferJob) -> list[OffloadKey]:
        ok: list[OffloadKey] = []
        for key, row_slot in zip(job.keys, job.slots, strict=True):
            with self._lock:
                where = self._index.get(key)
                slab = None if where is None else self._slabs.get(where[0])
            if where is None or slab is None:
                continue
            _, slot, crc = where
            data = slab.mm[slot * self._bb:(slot + 1) * self._bb]
            if zlib.crc32(data) == crc:
                self._row(row_slot)[:] = data
                ok.append(key)
                continue
            _log.warning("%s: slot %s:%d of %r fails its crc; dropping it", self._name, slab.id, slot, key)
            with self._lock:
                if self._index.get(key) == where:
                    del self._index[key]
                    self._events.append(OffloadingEvent(EventKind.REMOVED, (key,), self._name))
        return ok

    def get_finished_jobs(self) -> Sequence[JobResult]:
        with self._lock:
            done, self._finished = self._finished, []
            for r in done:
                self._unreported.discard(r.job_id)
        return done

    def on_request_finished(self, req_context: ReqContext) -> None:
        pass

    def on_step_end(self) -> None:
        pass

    def take_events(self) -> Sequence[OffloadingEvent]:
        with self._lock:
            events = list(self._events)
            self._events.clear()
        return events

    def has_pending_work(self) -> bool:
        with self._lock:
            return bool(self._unreported)

    def reset_cache(self) -> bool:
        with self._lock:
            if self._unreported or self._closed:
                return False
            keys = tuple(self._index)
            self._index.clear()
            for slab in self._slabs.values():
                slab.close()
            self._slabs.clear()
            self._own = None
            if keys:
                self._events.append(OffloadingEvent(EventKind.REMOVED, keys, self._name))
        for path in list(self._dir.glob("*.idx")) + list(self._dir.glob("*.slab")):
            path.unlink(missing_ok=True)
        return True

    def shutdown(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._writer.shutdown(wait=True)
        self._readers.shutdown(wait=True)
        with self._lock:
            for slab in self._slabs.values():
                slab.close()
            self._slabs.clear()
            self._own = None


def _conforms(tier: MmapSlabTier) -> SecondaryTier:  # pragma: no cover
    return tier


def conformance_spec() -> TierSpec:
    from kvproto.testing import TierSpec, fresh_directory

    def read_block(tier: MmapSlabTier, key: OffloadKey) -> bytes | None:
        where = tier._index.get(key)
        if where is None:
            return None
        with open(tier._dir / f"{where[0]}.slab", "rb") as f:
            f.seek(where[1] * tier._bb)
            return f.read(tier._bb)

    return TierSpec(
        "mmapslab",
        "secondary",
        lambda buffer: MmapSlabTier(buffer, fresh_directory("mmapslab-")),
        hooks={
            "reopen": lambda tier, buffer: MmapSlabTier(buffer, tier.root, layout=tier.layout),
            "reopen_other_layout": lambda tier, buffer: MmapSlabTier(buffer, tier.root, layout={"model": "other"}),
            "read_block": read_block,
        },
        tier_class=MmapSlabTier,
    )


MMAP_SLAB_GALLERY = Gallery()
"""This module's target (gallery_registry.py); gallery_index.py gathers it into ``GALLERY``."""


@MMAP_SLAB_GALLERY.fails("test_a_killed_writer_leaves_no_false_hit", "TIER-24", "right after its storage write")
def names_the_slot_before_its_bytes() -> TierSpec:
    return conformance_spec()
