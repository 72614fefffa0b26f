"""BlobTier over an AsyncBlobBackend (run on the engine's loop thread): the BlobBackendCases and the kit.

``AsyncMemory`` is MemoryBackend behind coroutines, as an asyncio client
(obstore) would be; faults are injected with ``wrap=FaultyBackend`` below the
tier, on the backend's synchronous face.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Sequence

import pytest

from kvproto import OffloadKey, SecondaryTier, envelope as env
from kvproto.testing import FaultyBackend, SecondaryTierTests
from kvproto.tierkit import AsyncBlobBackend, BlobTier, BlobTierConfig, MemoryBackend, Published

from tests.kvproto.tierkit.test_blob_cases import BLOCK, SLOTS, BlobBackendCases, BlobEnv


class AsyncMemory:
    """MemoryBackend's methods as coroutines (each yields to the loop once)."""

    def __init__(self, inner: MemoryBackend) -> None:
        self.inner = inner

    async def prepare(self, namespace: str) -> None:
        self.inner.prepare(namespace)

    async def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        await asyncio.sleep(0)
        return self.inner.publish(name, parts, size)

    async def read_into(self, name: str, buffers: Sequence[memoryview]) -> int:
        await asyncio.sleep(0)
        return self.inner.read_into(name, buffers)

    async def sizes(self, names: Sequence[str]) -> Sequence[int | None]:
        return self.inner.sizes(names)

    async def delete(self, name: str) -> None:
        self.inner.delete(name)

    async def list_blobs(self, namespace: str) -> AsyncIterator[tuple[str, int]]:
        for item in self.inner.list_blobs(namespace):
            yield item

    async def clear(self, namespace: str) -> None:
        self.inner.clear(namespace)

    async def close(self) -> None:
        pass


def _typed(backend: AsyncMemory) -> AsyncBlobBackend:
    """Never called: mypy proves here that AsyncMemory is an AsyncBlobBackend."""
    return backend


def _memory(tier: SecondaryTier) -> tuple[BlobTier, FaultyBackend, MemoryBackend]:
    """The tier, its FaultyBackend and the MemoryBackend: wrapped (FaultyBackend -> LoopBackend -> AsyncMemory
    -> MemoryBackend) or, with jobs on the loop, inside (LoopBackend -> ThreadedAsync -> FaultyBackend -> ...)."""
    assert isinstance(tier, BlobTier)
    if isinstance(tier.backend, FaultyBackend):
        faulty = tier.backend
        memory = faulty.inner.inner.inner  # type: ignore[attr-defined]  # LoopBackend -> AsyncMemory -> MemoryBackend
    else:
        faulty = tier.backend.inner.inner  # type: ignore[attr-defined]  # LoopBackend -> ThreadedAsync -> FaultyBackend
        memory = faulty.inner
    assert isinstance(faulty, FaultyBackend)
    assert isinstance(memory, MemoryBackend)
    return tier, faulty, memory


class TestAsyncMemoryBackend(BlobBackendCases):
    """The engine's promises over an asynchronous backend."""

    drives_the_event_bound = False  # the same ledger queue as TestMemoryBackend's (see BlobBackendCases)

    @pytest.fixture
    def env(self) -> BlobEnv:
        def build(config: BlobTierConfig) -> tuple[BlobTier, FaultyBackend]:
            buffer = memoryview(bytearray(SLOTS * BLOCK)).cast("B", (SLOTS, BLOCK))
            tier = BlobTier(AsyncMemory(MemoryBackend()), buffer, config, name="amem", wrap=FaultyBackend)
            return _memory(tier)[:2]

        def damage(tier: BlobTier, k: OffloadKey) -> None:
            blobs = _memory(tier)[2].blobs
            data = bytearray(blobs[tier.name_of(k)])
            data[-1] ^= 0xFF
            blobs[tier.name_of(k)] = bytes(data)

        def stored(tier: BlobTier, k: OffloadKey) -> bool:
            return tier.name_of(k) in _memory(tier)[2].blobs

        return BlobEnv(build, damage, stored)


class TestSharedAsyncMemoryBlobTier(SecondaryTierTests):
    """The kit over the asynchronous flavour, shared mode with a budget (every capability declared)."""

    kit_profile = "fast"

    @pytest.fixture
    def tier_factory(self) -> Callable[[memoryview], SecondaryTier]:
        config = BlobTierConfig(shared=True, max_bytes=48 * (env.HEADER_BYTES + 64))
        return lambda buffer: BlobTier(AsyncMemory(MemoryBackend()), buffer, config, name="amem", wrap=FaultyBackend)

    def reopen(self, tier: SecondaryTier, buffer: memoryview) -> SecondaryTier:
        blob, _, memory = _memory(tier)
        return BlobTier(AsyncMemory(memory), buffer, blob.blob_config, name=blob.name, wrap=FaultyBackend)

    def read_block(self, tier: SecondaryTier, key: OffloadKey) -> bytes | None:
        blob, _, memory = _memory(tier)
        data = memory.blobs.get(blob.name_of(key))
        return None if data is None else data[env.HEADER_BYTES :]

    def seed_block(self, tier: SecondaryTier, key: OffloadKey, data: bytes) -> None:
        blob, _, memory = _memory(tier)
        memory.blobs[blob.name_of(key)] = env.encode(key, data, blob.namespace)
        blob.vouch_for([key])

    def fail_next_jobs(self, tier: SecondaryTier, n: int) -> None:
        _memory(tier)[1].fail_next_jobs(n)

    def fail_keys(self, tier: SecondaryTier, keys: Iterable[OffloadKey]) -> None:
        _memory(tier)[1].fail_keys(keys)
