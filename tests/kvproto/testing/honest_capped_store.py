"""A correct tier the kit must pass (no false blame): ``hard_capped_store``, a BlobTier whose storage has
a hard cap of its own, one and a half times the tier's byte budget (TIER-29: "a storage with a hard cap of
its own needs ``max_bytes`` that far below it, or a publish it refuses fails its key").

A store job arriving while the tier holds its whole budget may find the storage full before the budget's
evictions (enforced as jobs report) freed room: the publishes the storage refuses fail their keys, which
were never stored. Held-out round 8's correct spill-over tier (several disks with quotas, a budget of two
thirds of them) was blamed so on TIER-14: keys whose store failed were counted as evicted without a
REMOVED event.
"""

from __future__ import annotations

import errno
from collections.abc import Sequence

from kvproto import envelope as env
from kvproto.testing import TierSpec
from kvproto.tierkit import BlobTier, BlobTierConfig, MemoryBackend, Published

__all__ = ["BUDGET_BLOCKS", "CAP_BLOCKS", "CappedMemory", "HardCappedStore", "hard_capped_store"]

BUDGET_BLOCKS = 24
"""The tier's byte budget, in the kit's blocks (``max_bytes``)."""
CAP_BLOCKS = 36
"""The storage's own cap: it refuses a publish past this many blobs."""


class CappedMemory(MemoryBackend):
    """A MemoryBackend that refuses (ENOSPC) a new blob once it holds ``cap`` blobs."""

    def __init__(self, cap: int) -> None:
        super().__init__()
        self.cap = cap

    def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        with self._lock:
            full = name not in self.blobs and len(self.blobs) >= self.cap
        if full:
            raise OSError(errno.ENOSPC, f"the store holds its cap of {self.cap} blobs", name)
        return super().publish(name, parts, size)


class HardCappedStore(BlobTier):
    """A private BlobTier with a budget of ``BUDGET_BLOCKS`` blocks over storage capped at ``CAP_BLOCKS``."""

    def __init__(self, buffer: memoryview) -> None:
        blob = env.HEADER_BYTES + buffer.shape[1] if buffer.shape is not None else 0
        config = BlobTierConfig(max_bytes=BUDGET_BLOCKS * blob, read_threads=2, write_threads=2,
                                start_in_background=False)
        super().__init__(CappedMemory(CAP_BLOCKS), buffer, config, name="hard-capped-store")


def hard_capped_store() -> TierSpec:
    return TierSpec("hard-capped-store", "secondary", HardCappedStore, tier_class=HardCappedStore)
