"""Broken tiers only the explorer reaches (KIT-23, issue 40): each bug needs a story no named check
tells: rows past 64 KiB read and loaded, a restart over blocks past 64 KiB, another instance's blocks
past 64 KiB looked up. (The explorer also found
BlobTier's own shared mode skipping a store on its index's word after another instance's reset,
TIERKIT-10.) Built on BlobTiers over an in-memory backend that the ``reopen`` hook hands to the next
instance.

``EXPLORE_GALLERY`` maps each ``kvproto conform`` target to the check and clause it must fail on;
gallery_index.py gathers it into ``GALLERY``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from kvproto.testing import FaultyBackend, FaultyJobs, TierSpec
from kvproto.tierkit import BlobBackend, BlobTierConfig, MemoryBackend

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
    backend_class: type[MemoryBackend] = MemoryBackend

    def __init__(self, buffer: memoryview, *, storage: BlobBackend | None = None) -> None:
        config = BlobTierConfig(shared=self.shared, start_in_background=False)
        backend = self.backend_class() if storage is None else storage
        super().__init__(backend, buffer, config, name=self.tier_name, wrap=FaultyBackend)

    def storage(self) -> BlobBackend:
        backend = self.backend
        return backend.inner if isinstance(backend, FaultyBackend) else backend


def _reopen(tier: _OverOneStorage, buffer: memoryview) -> _OverOneStorage:
    return type(tier)(buffer, storage=tier.storage())


def _spec(cls: type[_OverOneStorage]) -> TierSpec:
    return TierSpec(cls.__name__, "secondary", cls, hooks={"reopen": _reopen}, limits=_QUICK, tier_class=cls)


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
