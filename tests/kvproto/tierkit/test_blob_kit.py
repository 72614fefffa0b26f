"""BlobTier over MemoryBackend passes the conformance kit, private and shared, hooks through FaultyBackend."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pytest

from kvproto import OffloadKey, SecondaryTier, envelope as env
from kvproto.testing import FaultyBackend, FaultyJobs, SecondaryTierTests
from kvproto.tierkit import BlobTier, BlobTierConfig, MemoryBackend


def _parts(tier: SecondaryTier) -> tuple[BlobTier, FaultyBackend, MemoryBackend]:
    assert isinstance(tier, BlobTier)
    faulty = tier.backend
    assert isinstance(faulty, FaultyBackend)
    memory = faulty.inner
    assert isinstance(memory, MemoryBackend)
    return tier, faulty, memory


class MemoryBlobHooks(SecondaryTierTests):
    """The kit's storage hooks for a BlobTier whose blobs a MemoryBackend holds, its faults injected by
    a FaultyBackend; :meth:`parts` finds the three in a tier (test_blob_async.py's flavour too)."""

    def parts(self, tier: SecondaryTier) -> tuple[BlobTier, FaultyBackend, MemoryBackend]:
        return _parts(tier)

    def read_block(self, tier: SecondaryTier, key: OffloadKey) -> bytes | None:
        blob, _, memory = self.parts(tier)
        data = memory.blobs.get(blob.name_of(key))
        return None if data is None else data[env.HEADER_BYTES :]

    def seed_block(self, tier: SecondaryTier, key: OffloadKey, data: bytes) -> None:
        blob, _, memory = self.parts(tier)
        memory.blobs[blob.name_of(key)] = env.encode(key, data, blob.namespace)
        blob.vouch_for([key])

    def fail_next_jobs(self, tier: SecondaryTier, n: int) -> None:
        self.parts(tier)[1].fail_next_jobs(n)

    def fail_keys(self, tier: SecondaryTier, keys: Iterable[OffloadKey]) -> None:
        self.parts(tier)[1].fail_keys(keys)


class _MemoryBlobKit(MemoryBlobHooks):
    kit_profile = "fast"
    config = BlobTierConfig()

    @pytest.fixture
    def tier_factory(self) -> Callable[[memoryview], SecondaryTier]:
        return lambda buffer: FaultyJobs(FaultyBackend(MemoryBackend()), buffer, self.config, name="mem")

    def reopen(self, tier: SecondaryTier, buffer: memoryview) -> SecondaryTier:
        blob, _, memory = _parts(tier)
        return FaultyJobs(FaultyBackend(memory), buffer, blob.blob_config, name=blob.name)

    def corrupt_on_read(self, tier: SecondaryTier, keys: Iterable[OffloadKey]) -> None:
        blob, _, memory = _parts(tier)
        for key in keys:
            name = blob.name_of(key)
            data = memory.blobs.get(name)
            if data is not None:
                memory.blobs[name] = data[:-1] + bytes([data[-1] ^ 0xFF])


class TestPrivateMemoryBlobTier(_MemoryBlobKit):
    """Private mode: the index answers, no eviction."""


class TestSharedMemoryBlobTierWithBudget(_MemoryBlobKit):
    """Shared mode with a 48-block byte budget: every capability declared."""

    config = BlobTierConfig(shared=True, max_bytes=48 * (env.HEADER_BYTES + 64))
