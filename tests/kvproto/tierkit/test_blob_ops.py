"""BlobOps.load_async picks the read path per backend object (TIERKIT-3): the whole body through
``read_bytes`` (copied and checked in one pass) where the backend is an AsyncBlobBytes, ``read_into`` otherwise."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import pytest

from kvproto import envelope as env, make_key
from kvproto.tierkit import MemoryBackend
from kvproto.tierkit._blob_async import LoopBackend
from kvproto.tierkit._blob_ops import BlobOps, KeyVerdict

BLOCK = 4096
NAMESPACE = bytes(range(16))


class IntoOnly:
    """An async backend over MemoryBackend that reads into buffers only; counts its reads."""

    def __init__(self, memory: MemoryBackend) -> None:
        self.memory = memory
        self.reads: list[str] = []

    async def read_into(self, name: str, buffers: Sequence[memoryview]) -> int:
        self.reads.append("read_into")
        return self.memory.read_into(name, buffers)

    async def delete(self, name: str) -> None:
        self.memory.delete(name)

    async def close(self) -> None:
        pass


class WholeBody(IntoOnly):
    """As IntoOnly, plus ``read_bytes`` (an AsyncBlobBytes): the blob's bytes as stored."""

    async def read_bytes(self, name: str) -> memoryview:
        self.reads.append("read_bytes")
        head = memoryview(bytearray(env.HEADER_BYTES))
        body = memoryview(bytearray(BLOCK))
        self.memory.read_into(name, (head, body))
        return memoryview(bytes(head) + bytes(body))


@pytest.fixture
def loops() -> Iterator[list[LoopBackend]]:
    made: list[LoopBackend] = []
    yield made
    for io in made:
        io.close()


def test_each_backend_object_gets_its_own_read_path(loops: list[LoopBackend]) -> None:
    memory = MemoryBackend()
    key = make_key(b"k" * 8, 0)
    payload = bytes(i % 251 for i in range(BLOCK))
    buffer = memoryview(bytearray(2 * BLOCK))
    rows = [buffer[slot * BLOCK : (slot + 1) * BLOCK] for slot in range(2)]
    ops = BlobOps(memory, tier_name="t", namespace=NAMESPACE, block_bytes=BLOCK, row=lambda slot: rows[slot],
                  ticks=itertools.count(1), deleted=lambda key, tick: None, count=lambda what: None)
    blob = env.encode(key, payload, NAMESPACE)
    memory.publish(ops.name_of(key), [memoryview(blob)], len(blob))
    whole, into = WholeBody(memory), IntoOnly(memory)
    # Only read_into / read_bytes / delete / close are called here: the rest of AsyncBlobBackend is not needed.
    loops += [LoopBackend(whole, name="whole", op_timeout_s=None),  # type: ignore[arg-type]  # partial backend
              LoopBackend(into, name="into", op_timeout_s=None)]  # type: ignore[arg-type]  # partial backend
    for _turn in range(2):  # alternating backends: each keeps its own path, not the first one asked
        for slot, io in enumerate(loops):
            rows[slot][:] = bytes(BLOCK)
            verdict, _ = io.submit(ops.load_async(io, key, slot)).result(timeout=10)
            assert verdict is KeyVerdict.LOADED and bytes(rows[slot]) == payload
    assert whole.reads == ["read_bytes"] * 2 and into.reads == ["read_into"] * 2
