"""BlobTier over an AsyncBlobBackend (run on the engine's loop thread): the BlobBackendCases and the kit.

``AsyncMemory`` is MemoryBackend behind coroutines, as an asyncio client
(obstore) would be; faults are injected with ``wrap=FaultyBackend`` below the
tier, on the backend's synchronous face.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence

import pytest

from kvproto import SecondaryTier, envelope as env
from kvproto.testing import FaultyBackend, FaultyJobs
from kvproto.tierkit import AsyncBlobBackend, BlobTier, BlobTierConfig, MemoryBackend, Published

from tests.kvproto.tierkit.test_blob_cases import BLOCK, SLOTS, BlobBackendCases, BlobEnv
from tests.kvproto.tierkit.test_blob_kit import MemoryBlobHooks


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
            tier = FaultyJobs(AsyncMemory(MemoryBackend()), buffer, config, name="amem", wrap=FaultyBackend)
            return _memory(tier)[:2]

        return BlobEnv.over_memory(build, lambda tier: _memory(tier)[2])


class TestSharedAsyncMemoryBlobTier(MemoryBlobHooks):
    """The kit over the asynchronous flavour, shared mode with a budget (every capability declared)."""

    kit_profile = "fast"

    @pytest.fixture
    def tier_factory(self) -> Callable[[memoryview], SecondaryTier]:
        config = BlobTierConfig(shared=True, max_bytes=48 * (env.HEADER_BYTES + 64))
        return lambda buffer: FaultyJobs(AsyncMemory(MemoryBackend()), buffer, config, name="amem", wrap=FaultyBackend)

    def reopen(self, tier: SecondaryTier, buffer: memoryview) -> SecondaryTier:
        blob, _, memory = _memory(tier)
        return FaultyJobs(AsyncMemory(memory), buffer, blob.blob_config, name=blob.name, wrap=FaultyBackend)

    def parts(self, tier: SecondaryTier) -> tuple[BlobTier, FaultyBackend, MemoryBackend]:
        return _memory(tier)
