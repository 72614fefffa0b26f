"""Broken tiers whose own threads can deadlock (TIER-11): each takes two of its locks in one order on one
path and in the other order on another, a hang that needs the two paths to interleave within
microseconds. The kit's :class:`~kvproto.testing.LockOrder` finds the inversion from the orders alone, every
run (a check waiting for the hang caught held-out round 4's two-level tier in 3 runs of 5).

``LOCKS_GALLERY`` maps each ``kvproto conform`` target to the check and clause it must fail on;
gallery_index.py gathers it into ``GALLERY``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from kvproto.testing import FaultyBackend, FaultyJobs, TierSpec
from kvproto.tierkit import BlobTier, BlobTierConfig, MemoryBackend, Published

from tests.kvproto.testing.gallery import _QUICK
from tests.kvproto.testing.gallery_registry import Gallery

LOCKS_GALLERY = Gallery()
"""This module's targets, each registered by its factory's ``fails`` decorator (gallery_registry.py)."""


class _CacheInFront(MemoryBackend):
    """A cache in front of a store, each with its own lock: a publish writes through under the cache's lock
    (so the cache never holds a block the store lacks), then the store's."""

    def __init__(self) -> None:
        super().__init__()
        self.cache_lock = threading.Lock()
        self.store_lock = threading.Lock()

    def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        with self.cache_lock, self.store_lock:
            return super().publish(name, parts, size)

    def read_into(self, name: str, buffers: Sequence[memoryview]) -> int:
        with self.store_lock:
            with self.cache_lock:  # the bug: promoted into the cache under the store's lock (store, then cache)
                return super().read_into(name, buffers)


class PromotesUnderTheStoreLock(FaultyJobs, BlobTier):
    """Bug: a load reads the store under its lock and promotes the block into the cache before letting it go
    ("so a delete cannot leave the cache holding a block no longer stored"): store, then cache, the reverse
    of a publish's cache, then store. A load racing a store deadlocks both workers: neither job is ever
    reported and shutdown never returns."""

    def __init__(self, buffer: memoryview) -> None:
        config = BlobTierConfig(shared=False, start_in_background=False)
        super().__init__(_CacheInFront(), buffer, config, name="promotes-under-the-store-lock", wrap=FaultyBackend)


@LOCKS_GALLERY.fails("test_load_copies_stored_bytes_into_requested_slots", "TIER-11", "lock-order inversion")
def promotes_under_the_store_lock() -> TierSpec:
    return TierSpec("PromotesUnderTheStoreLock", "secondary", PromotesUnderTheStoreLock, limits=_QUICK,
                    tier_class=PromotesUnderTheStoreLock)
