"""A BlobTier over an asynchronous backend picks its read path per backend (TIERKIT-3): the whole body
through ``read_bytes`` (copied and checked in one pass) where the backend is an AsyncBlobBytes,
``read_into`` otherwise; tiers over either kind, loading in turn, each keep their own path."""

from __future__ import annotations

from collections.abc import Sequence

from kvproto import envelope as env
from kvproto.tierkit import BlobTier, BlobTierConfig, MemoryBackend

from tests.impls._tier_runner import BLOCK, Runner, key, make_buffer, shut_down_after
from tests.kvproto.tierkit.test_blob_async import AsyncMemory


class IntoOnly(AsyncMemory):
    """AsyncMemory that records each read: it reads into buffers only."""

    def __init__(self, inner: MemoryBackend) -> None:
        super().__init__(inner)
        self.reads: list[str] = []

    async def read_into(self, name: str, buffers: Sequence[memoryview]) -> int:
        self.reads.append("read_into")
        return await super().read_into(name, buffers)


class WholeBody(IntoOnly):
    """As IntoOnly, plus ``read_bytes`` (an AsyncBlobBytes): the blob's bytes as stored."""

    async def read_bytes(self, name: str) -> memoryview:
        self.reads.append("read_bytes")
        head, body = memoryview(bytearray(env.HEADER_BYTES)), memoryview(bytearray(BLOCK))
        self.inner.read_into(name, (head, body))
        return memoryview(bytes(head) + bytes(body))


def test_each_backend_keeps_its_own_read_path() -> None:
    backends = [WholeBody(MemoryBackend()), IntoOnly(MemoryBackend())]
    opened = []
    for i, backend in enumerate(backends):
        buffer = make_buffer()
        tier = BlobTier(backend, buffer, BlobTierConfig(start_in_background=False), name=f"t{i}")  # scanned: no read after
        opened.append((tier, Runner(tier, buffer)))
    ks = [key(i, b"path") for i in range(2)]
    with shut_down_after(opened[0]), shut_down_after(opened[1]):
        for _, run in opened:
            assert run.store(ks).success
        for _turn in range(2):  # in turn: each tier keeps its backend's path, not the first one asked
            for _, run in opened:
                result, right, wrong = run.load(ks)
                assert result.success and right == set(ks) and not wrong
    assert backends[0].reads == ["read_bytes"] * 4
    assert backends[1].reads == ["read_into"] * 4
