"""Broken tiers only the explorer reaches (KIT-23, issue 40): each bug needs a story no named check
tells: rows past 64 KiB read and loaded, a restart over blocks past 64 KiB, another instance's blocks
past 64 KiB looked up; a damaged block's delete taking its neighbours, a request's end closing another
live request's held handle, descriptors a delete leaves open past shutdown, a store skipped on a
client's memo after another instance's reset, a storage with a cap of its own that drops the blocks it
took first, an eviction that names only the blocks no load read. (The explorer also found
BlobTier's own shared mode skipping a store on its index's word after another instance's reset,
TIERKIT-10.) Built on BlobTiers over an in-memory backend that the ``reopen`` hook hands to the next
instance (the last, a MemoryTier).

``EXPLORE_GALLERY`` maps each ``kvproto conform`` target to the check and clause it must fail on;
gallery_index.py gathers it into ``GALLERY``.
"""

from __future__ import annotations

import errno
import itertools
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import replace

from kvproto import EventKind, MemoryTier, OffloadingEvent, OffloadKey, TransferJob, envelope as env
from kvproto.testing import MEMORY_HOOKS, FaultyBackend, FaultyJobs, TierSpec
from kvproto.tierkit import BlobBackend, BlobTierConfig, MemoryBackend, Published

from tests.kvproto.testing.gallery import _QUICK
from tests.kvproto.testing.gallery_registry import Gallery

EXPLORE_GALLERY = Gallery()
"""This module's targets, each registered by its factory's ``fails`` decorator (gallery_registry.py)."""

_EXPLORE = "test_explore_instances_sizes_and_interleavings"
_RANGE = 65_536  # the read size past which the next backends go wrong


class _OverOneStorage(FaultyJobs):
    """A BlobTier over ``storage`` (a new backend of ``backend_class`` if None)."""

    tier_name = "over-one-storage"
    shared = True
    hold_hits_steps = 64  # BlobTierConfig's default: held HITs where the backend offers held reads
    backend_class: type[MemoryBackend] = MemoryBackend
    capacity_blobs: int | None = None  # a byte budget (max_bytes) of this many blobs of the buffer's rows
    persistent = True

    def __init__(self, buffer: memoryview, *, storage: BlobBackend | None = None) -> None:
        row = buffer.nbytes // len(buffer)  # a 2-D buffer: one row per slot
        budget = None if self.capacity_blobs is None else self.capacity_blobs * (env.HEADER_BYTES + row)
        config = BlobTierConfig(shared=self.shared, start_in_background=False, hold_hits_steps=self.hold_hits_steps,
                                max_bytes=budget, persistent=self.persistent)
        backend = self.backend_class() if storage is None else storage
        if isinstance(backend, _CappedPool) and backend.cap_bytes is None:
            backend.cap_bytes = budget
        super().__init__(backend, buffer, config, name=self.tier_name, wrap=FaultyBackend)

    def storage(self) -> BlobBackend:
        backend = self.backend
        return backend.inner if isinstance(backend, FaultyBackend) else backend


def _reopen(tier: _OverOneStorage, buffer: memoryview) -> _OverOneStorage:
    return type(tier)(buffer, storage=tier.storage())


def _spec(cls: type[_OverOneStorage]) -> TierSpec:
    # The gallery's quick step bound, with the default 2 s: the explorer's crowds of MiB rows must not
    # read as "never reported" on a loaded machine (a job fails TIER-11 only past both bounds).
    return TierSpec(cls.__name__, "secondary", cls, hooks={"reopen": _reopen}, limits=replace(_QUICK, job_timeout_s=2.0),
                    tier_class=cls)


class _OneRangeReads(MemoryBackend):
    """Reads a blob in one ranged request of ``_RANGE`` bytes: the rest of a larger blob is never read
    (the loop over ranges is missing)."""

    def read_into(self, name: str, buffers: Sequence[memoryview]) -> int:
        with self._lock:
            data = self.blobs.get(name)
        if data is None:
            raise FileNotFoundError(name)
        head = data[:_RANGE]  # the bug: one range only
        self.scatter(head + bytes(len(data) - len(head)), buffers)
        return len(data)


class ReadsOneRange(_OverOneStorage):
    """Bug: its backend reads a blob in a single 64 KiB range: every block past 64 KiB (the envelope
    included) loads damaged, so the tier fails every such load: a HIT that cannot load, a lost block."""

    tier_name = "reads-one-range"
    backend_class = _OneRangeReads


@EXPLORE_GALLERY.fails(_EXPLORE, "TIER-4", "the HIT was not readable", profile="default")
def reads_one_range() -> TierSpec:
    return _spec(ReadsOneRange)


class _ScanSkipsLargeBlobs(MemoryBackend):
    """Lists only the blobs up to ``_RANGE`` bytes (a size filter meant for foreign files)."""

    def list_blobs(self, namespace: str) -> Iterator[tuple[str, int]]:
        return ((name, size) for name, size in super().list_blobs(namespace) if size <= _RANGE)


class ScanSkipsLargeBlocks(_OverOneStorage):
    """Bug: a private-mode tier (it declares persistence) whose start-up scan skips every blob past 64
    KiB, taking it for a foreign file: after a restart, its large blocks answer MISS for good."""

    tier_name = "scan-skips-large-blocks"
    shared = False
    backend_class = _ScanSkipsLargeBlobs


@EXPLORE_GALLERY.fails(_EXPLORE, "TIER-18", "answers MISS in a new request", profile="default")
def scan_skips_large_blocks() -> TierSpec:
    return _spec(ScanSkipsLargeBlocks)


class _ExistenceSkipsLargeBlobs(MemoryBackend):
    """Answers an existence check for blobs up to ``_RANGE`` bytes only (a size filter meant for foreign
    files, in the batched check this time)."""

    def sizes(self, names: Sequence[str]) -> list[int | None]:
        return [None if size is not None and size > _RANGE else size for size in super().sizes(names)]


class ExistenceSkipsLargeBlocks(_OverOneStorage):
    """Bug: a sharing tier whose existence check misses every blob past 64 KiB: another instance's large
    blocks answer MISS for good, though they sit in the storage they share."""

    tier_name = "existence-skips-large-blocks"
    backend_class = _ExistenceSkipsLargeBlobs


@EXPLORE_GALLERY.fails(_EXPLORE, "TIER-18", "answers MISS in a new request", profile="default")
def existence_skips_large_blocks() -> TierSpec:
    return _spec(ExistenceSkipsLargeBlocks)


class _DirectoryDeletes(MemoryBackend):
    """Deletes a blob together with every blob of its ``<ns>/<aa>/`` directory (an empty-directory prune
    one level too high)."""

    def delete(self, name: str) -> None:
        directory = name.rsplit("/", 2)[0] + "/"
        with self._lock:
            for other in [n for n in self.blobs if n.startswith(directory)]:
                del self.blobs[other]


class DeleteTakesItsDirectory(_OverOneStorage):
    """Bug: a private tier whose backend's delete of one blob (a damaged block found by a load) removes
    its neighbours too, blocks whose digests share its first byte: stored blocks lost, no eviction declared."""

    tier_name = "delete-takes-its-directory"
    shared = False
    backend_class = _DirectoryDeletes


@EXPLORE_GALLERY.fails(_EXPLORE, "TIER-10", "a lost write", profile="default")
def delete_takes_its_directory() -> TierSpec:
    return _spec(DeleteTakesItsDirectory)


class _DescriptorTable(MemoryBackend):
    """Held reads through numbered handles, given out in increasing order (as a process's descriptors
    are); ``close_held_many`` closes every number from the lowest handle to the highest, as if one
    request's handles were always consecutive."""

    def __init__(self) -> None:
        super().__init__()
        self._handles: dict[int, bytes] = {}
        self._numbers = itertools.count(3)

    @property
    def held_reads(self) -> bool:
        return True

    def open_held(self, name: str) -> object:
        with self._lock:
            data = self.blobs.get(name)
            if data is None:
                raise FileNotFoundError(name)
            handle = next(self._numbers)
            self._handles[handle] = data
        return handle

    def read_held(self, handle: object, buffers: Sequence[memoryview]) -> int:
        with self._lock:
            data = self._handles.get(handle) if isinstance(handle, int) else None
        if data is None:
            raise OSError(errno.EBADF, f"handle {handle!r} is closed")
        return self.scatter(data, buffers)

    def close_held(self, handle: object) -> None:
        with self._lock:
            self._handles.pop(handle, None) if isinstance(handle, int) else None

    def close_held_many(self, handles: Sequence[object]) -> None:
        numbers = sorted(h for h in handles if isinstance(h, int))
        with self._lock:
            for handle in range(numbers[0], numbers[-1] + 1) if numbers else ():  # the bug: the whole range
                self._handles.pop(handle, None)


class FinishClosesOthersHandles(_OverOneStorage):
    """Bug: a tier holding a read handle per HIT (holds_hits) whose backend closes a finished request's
    handles as one range: another live request's handle numbered in between is closed too, and its HIT
    fails to load."""

    tier_name = "finish-closes-others-handles"
    shared = False
    backend_class = _DescriptorTable


@EXPLORE_GALLERY.fails(_EXPLORE, "TIER-26", "the HIT was not readable", profile="default")
def finish_closes_others_handles() -> TierSpec:
    return _spec(FinishClosesOthersHandles)


class _LeakyReadCache(MemoryBackend):
    """Keeps a real file descriptor per blob it read (a read cache of open files); ``close`` closes
    those still cached, but ``delete`` drops a blob's entry without closing its descriptor."""

    def __init__(self) -> None:
        super().__init__()
        self._cached: dict[str, int] = {}

    def read_into(self, name: str, buffers: Sequence[memoryview]) -> int:
        size = super().read_into(name, buffers)
        with self._lock:
            if name not in self._cached:
                self._cached[name] = os.open(__file__, os.O_RDONLY)
        return size

    def delete(self, name: str) -> None:
        with self._lock:
            self._cached.pop(name, None)  # the bug: its descriptor is never closed
        super().delete(name)

    def close(self) -> None:
        with self._lock:
            cached, self._cached = list(self._cached.values()), {}
        for fd in cached:
            os.close(fd)


class DeleteLeaksDescriptors(_OverOneStorage):
    """Bug: every deleted block that had been read leaks one open file, past shutdown."""

    tier_name = "delete-leaks-descriptors"
    shared = False
    backend_class = _LeakyReadCache


@EXPLORE_GALLERY.fails(_EXPLORE, "TIER-16", "still open after every instance was shut down", profile="default")
def delete_leaks_descriptors() -> TierSpec:
    return _spec(DeleteLeaksDescriptors)


class _PublishMemo(MemoryBackend):
    """A client of shared storage (``blobs``, one dict for every client over it) that remembers what it
    published and answers EXISTED for it without asking; only its own deletes and clears forget."""

    def __init__(self, blobs: dict[str, bytes] | None = None, lock: threading.Lock | None = None) -> None:
        super().__init__()
        self.blobs = {} if blobs is None else blobs
        self._lock = threading.Lock() if lock is None else lock
        self._published: set[str] = set()

    def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        if name in self._published:
            return Published.EXISTED  # the bug: another client's clear is never seen
        self._published.add(name)
        return super().publish(name, parts, size)

    def delete(self, name: str) -> None:
        self._published.discard(name)
        super().delete(name)

    def clear(self, namespace: str) -> None:
        self._published = {n for n in self._published if not n.startswith(namespace + "/")}
        super().clear(namespace)

    def client(self) -> _PublishMemo:
        """Another client over the same storage, with a memo of its own."""
        return _PublishMemo(self.blobs, self._lock)


class StoreSkippedOnAStaleMemo(_OverOneStorage):
    """Bug: a sharing tier (which does not trust its index on stores) over clients that each remember
    what they published: after another instance's reset_cache, a store of the same blocks is reported
    done with nothing stored, and the other instances answer MISS for them."""

    tier_name = "store-skipped-on-a-stale-memo"
    backend_class = _PublishMemo

    def storage(self) -> BlobBackend:
        inner = super().storage()
        return inner.client() if isinstance(inner, _PublishMemo) else inner


@EXPLORE_GALLERY.fails(_EXPLORE, "TIER-18", "answers MISS in a new request", profile="default")
def store_skipped_on_a_stale_memo() -> TierSpec:
    return _spec(StoreSkippedOnAStaleMemo)


class _CappedPool(MemoryBackend):
    """An arena with a hard byte cap of its own that never refuses a write: past the cap it drops the
    blobs it took first (FIFO), telling no one."""

    def __init__(self) -> None:
        super().__init__()
        self.cap_bytes: int | None = None  # set by the tier over it: its max_bytes

    def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        with self._lock:
            while self.cap_bytes is not None and self.blobs and sum(map(len, self.blobs.values())) + size > self.cap_bytes:
                del self.blobs[next(iter(self.blobs))]  # the bug: the oldest goes, though the tier's LRU kept it in use
        return super().publish(name, parts, size)


class DropsBlocksAtItsCap(_OverOneStorage):
    """Bug: a private tier whose byte budget (max_bytes) is its storage's own hard cap, over a storage that
    makes room by dropping the blobs it took first: BlobTier enforces the budget once a job reports, so the
    blobs of a job past it go in first and the storage drops a block the tier's LRU kept (in use since),
    which answers HIT and fails its load (the correct setting keeps max_bytes below the cap by the jobs in
    flight, or a storage that refuses past its cap, TIER-29)."""

    tier_name = "drops-blocks-at-its-cap"
    shared = False
    persistent = False  # an arena in the process's memory
    backend_class = _CappedPool
    capacity_blobs = 256  # past what the named checks store (at 24, two of them catch it)


@EXPLORE_GALLERY.fails(_EXPLORE, "TIER-4", "the HIT was not readable", profile="default")
def drops_blocks_at_its_cap() -> TierSpec:
    return _spec(DropsBlocksAtItsCap)


_BATCH_BYTES = 4 << 20  # the reply size one multi-key read of the next backend asks for at most


class _MisalignedBatchReads(MemoryBackend):
    """Reads a load's blobs in multi-key requests of at most 4 MiB of replies each (an MGET-style batch
    read); the replies of every request after the first are filed from the start of the load's list."""

    def __init__(self) -> None:
        super().__init__()
        self.per_request = 1

    def read_batch_keys(self, blob_bytes: int) -> int:
        self.per_request = max(1, _BATCH_BYTES // max(1, blob_bytes))
        return 64

    def read_many(self, reads: Sequence[tuple[str, Sequence[memoryview]]]) -> list[int | Exception]:
        values: list[bytes | None] = [None] * len(reads)
        for start in range(0, len(reads), self.per_request):
            with self._lock:
                replies = [self.blobs.get(name) for name, _ in reads[start : start + self.per_request]]
            for i, value in enumerate(replies):  # the bug: enumerate(replies, start)
                values[i] = value
        return [FileNotFoundError(name) if value is None else self.scatter(value, buffers)
                for value, (name, buffers) in zip(values, reads, strict=True)]


class MisalignsBatchesPast4MiB(_OverOneStorage):
    """Bug: its backend reads a load in multi-key requests of at most 4 MiB each, and files each later
    request's replies over the first ones: a load of more than 4 MiB (four blocks of a MiB with their
    envelopes) puts one block's bytes under another's name, so the tier takes intact blobs for damaged,
    fails the load of blocks it answered HIT for and deletes them for every instance. Rows of 64 KiB never
    need a second request (a held-out Redis tier)."""

    tier_name = "misaligns-batches-past-4mib"
    hold_hits_steps = 0  # no held reads: loads go through read_many
    backend_class = _MisalignedBatchReads


@EXPLORE_GALLERY.fails(_EXPLORE, "TIER-4", "the HIT was not readable", profile="default")
def misaligns_batches_past_4mib() -> TierSpec:
    return _spec(MisalignsBatchesPast4MiB)


class _ReadBlocksEvictedSilently(MemoryTier):
    """Bug: an LRU tier (it declares eviction) that marks every block a load read as hot, and whose eviction
    names in its REMOVED event only the blocks never read: a block a load read, evicted later, is gone with
    no event (TIER-14), so a consumer of the events (a KV-aware router) still routes requests to it."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="read-blocks-evicted-silently", capacity_blocks=64)
        self._hot: set[OffloadKey] = set()

    def _run_load(self, job: TransferJob) -> list[OffloadKey]:
        ok = super()._run_load(job)
        self._hot.update(ok)
        return ok

    def _put(self, key: OffloadKey, blob: bytes) -> None:
        queued = len(self._events)
        super()._put(key, blob)
        if len(self._events) > queued:  # the REMOVED event of the blocks this put evicted
            evicted = self._events.pop().keys
            named = tuple(k for k in evicted if k not in self._hot)  # the bug: hot blocks leave unnamed
            self._hot.difference_update(evicted)
            if named:
                self._events.append(OffloadingEvent(EventKind.REMOVED, named, self.name))


@EXPLORE_GALLERY.fails(_EXPLORE, "TIER-14", "no instance's REMOVED event named it", profile="default")
def read_blocks_evicted_silently() -> TierSpec:
    return TierSpec("ReadBlocksEvictedSilently", "secondary", _ReadBlocksEvictedSilently, hooks=MEMORY_HOOKS,
                    limits=_QUICK, tier_class=_ReadBlocksEvictedSilently)
