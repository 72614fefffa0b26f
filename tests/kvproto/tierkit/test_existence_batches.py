"""TIERKIT-7 / AP-10: a backend offering existence batches sees each probe batch whole (begin), then
exactly its chunks under the batch's token, then its end: also when a chunk fails, the tier resets or
shuts down, and for the asynchronous flavour through the engine's loop."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from kvproto import OffloadKey, ReqContext, envelope as env, members as lr
from kvproto.tierkit import (
    PROBE_CHUNK_KEYS,
    AsyncExistenceBatches,
    BlobTier,
    BlobTierConfig,
    ExistenceBatches,
    MemoryBackend,
)

from tests.kvproto.tierkit.test_blob_async import AsyncMemory
from tests.kvproto.tierkit.test_blob_cases import BLOCK, SLOTS

Entry = tuple[str, int, tuple[str, ...]]


class BatchedMemory(MemoryBackend):
    """A MemoryBackend that offers existence batches and logs every existence call in order.

    ``fail_chunks``: indexes (0-based, per batch) of chunks whose ``batch_sizes`` raises; ``gate``: the
    first chunk of a batch waits for it (set: never waits).
    """

    def __init__(self) -> None:
        super().__init__()
        self.log: list[Entry] = []
        self.fail_chunks: set[int] = set()
        self.gate = threading.Event()
        self.gate.set()
        self.in_first_chunk = threading.Event()
        self._tokens = 0
        self._chunk_no: dict[int, int] = {}

    def sizes(self, names: Sequence[str]) -> list[int | None]:
        self.log.append(("sizes", 0, tuple(names)))
        return super().sizes(names)

    def begin_sizes(self, names: Sequence[str]) -> object:
        self._tokens += 1
        self._chunk_no[self._tokens] = 0
        self.log.append(("begin", self._tokens, tuple(names)))
        return self._tokens

    def batch_sizes(self, batch: object, names: Sequence[str]) -> list[int | None]:
        assert isinstance(batch, int)
        self.log.append(("chunk", batch, tuple(names)))
        number = self._chunk_no[batch]
        self._chunk_no[batch] = number + 1
        if number == 0:
            self.in_first_chunk.set()
            self.gate.wait()
        if number in self.fail_chunks:
            raise OSError("the batch call failed")
        return MemoryBackend.sizes(self, names)

    def end_sizes(self, batch: object) -> None:
        assert isinstance(batch, int)
        self.log.append(("end", batch, ()))


class AsyncBatchedMemory(AsyncMemory):
    """The asynchronous flavour: AsyncMemory plus existence batches over a BatchedMemory."""

    inner: BatchedMemory

    async def begin_sizes(self, names: Sequence[str]) -> object:
        return self.inner.begin_sizes(names)

    async def batch_sizes(self, batch: object, names: Sequence[str]) -> Sequence[int | None]:
        return self.inner.batch_sizes(batch, names)

    async def end_sizes(self, batch: object) -> None:
        self.inner.end_sizes(batch)


def _typed(sync: BatchedMemory, asynchronous: AsyncBatchedMemory) -> tuple[ExistenceBatches, AsyncExistenceBatches]:
    """Never called: mypy proves here that both offer their flavour of existence batches."""
    return sync, asynchronous


def _key(i: int) -> OffloadKey:
    return OffloadKey(i.to_bytes(8, "big") + b"existence-batches")


@contextmanager
def _tier(backend: BatchedMemory, *, asynchronous: bool = False) -> Iterator[BlobTier]:
    buffer = memoryview(bytearray(SLOTS * BLOCK)).cast("B", (SLOTS, BLOCK))
    config = BlobTierConfig(shared=True, probe_deadline_steps=1_000_000, probe_min_interval_s=0.0)
    tier = BlobTier(AsyncBatchedMemory(backend) if asynchronous else backend, buffer, config, name="batches")
    try:
        assert tier.wait_ready(10)
        yield tier
    finally:
        tier.shutdown()


def _put(tier: BlobTier, backend: MemoryBackend, keys: Sequence[OffloadKey]) -> None:
    """Blobs of one envelope's length for ``keys``, straight into the backend (what another instance stored)."""
    for k in keys:
        backend.blobs[tier.name_of(k)] = bytes(env.HEADER_BYTES + BLOCK)


def _resolve(tier: BlobTier, keys: Sequence[OffloadKey], req: ReqContext) -> dict[OffloadKey, str]:
    """Ask ``keys`` in one step (one batch), then step until none answers RETRY."""
    answers = {k: tier.lookup(k, req) for k in keys}
    deadline = time.monotonic() + 30
    while any(a is lr.RETRY for a in answers.values()):
        assert time.monotonic() < deadline, "still RETRY"
        tier.on_step_end()
        time.sleep(0.001)
        answers = {k: tier.lookup(k, req) for k in keys}
    return {k: a.name for k, a in answers.items()}


def _chunks(names: Sequence[str]) -> list[tuple[str, ...]]:
    return [tuple(names[i : i + PROBE_CHUNK_KEYS]) for i in range(0, len(names), PROBE_CHUNK_KEYS)]


def _check_one_batch(asynchronous: bool) -> None:
    backend = BatchedMemory()
    with _tier(backend, asynchronous=asynchronous) as tier:
        keys = [_key(i) for i in range(150)]
        _put(tier, backend, keys[::3])
        backend.log.clear()  # start-up wrote the manifest
        answers = _resolve(tier, keys, ReqContext("one"))
        assert answers == {k: "HIT" if i % 3 == 0 else "MISS" for i, k in enumerate(keys)}
        assert tier.wait_idle()
        names = tuple(tier.name_of(k) for k in keys)
        assert backend.log == [("begin", 1, names), *(("chunk", 1, c) for c in _chunks(names)), ("end", 1, ())]


def test_a_batch_is_begun_whole_its_chunks_go_under_its_token_and_it_ends() -> None:
    """TIERKIT-7: 150 keys asked in one step: begin with all 150 names, chunks of 64, 64, 22 under that
    token, then end; no plain ``sizes`` call; the verdicts are the blobs'."""
    _check_one_batch(asynchronous=False)


def test_the_asynchronous_flavour_sees_the_same_batch() -> None:
    """TIERKIT-7: the same sequence through the engine's loop (an AsyncExistenceBatches backend)."""
    _check_one_batch(asynchronous=True)


def test_each_batch_has_its_own_token_and_a_later_batch_sees_new_blobs() -> None:
    """TIERKIT-7: a second request's batch begins anew (token 2) after the first ended, and sees a blob
    stored after the first batch answered MISS."""
    backend = BatchedMemory()
    with _tier(backend) as tier:
        k = _key(1)
        assert _resolve(tier, [k], ReqContext("first")) == {k: "MISS"}
        tier.on_request_finished(ReqContext("first"))
        _put(tier, backend, [k])
        assert _resolve(tier, [k], ReqContext("second")) == {k: "HIT"}
        assert tier.wait_idle()
        assert [(e[0], e[1]) for e in backend.log if e[0] != "sizes"] == [
            ("begin", 1), ("chunk", 1), ("end", 1), ("begin", 2), ("chunk", 2), ("end", 2)]


def test_a_failing_chunk_degrades_per_key_and_the_batch_still_ends() -> None:
    """TIERKIT-5, TIERKIT-7: the second chunk's batch call raises: its keys are asked one by one through
    plain ``sizes`` (right verdicts), the third chunk goes under the token again, and end comes once, last."""
    backend = BatchedMemory()
    backend.fail_chunks = {1}
    with _tier(backend) as tier:
        keys = [_key(i) for i in range(150)]
        _put(tier, backend, keys[::2])
        backend.log.clear()
        answers = _resolve(tier, keys, ReqContext("one"))
        assert answers == {k: "HIT" if i % 2 == 0 else "MISS" for i, k in enumerate(keys)}
        assert tier.wait_idle()
        names = tuple(tier.name_of(k) for k in keys)
        first, second, third = _chunks(names)
        assert backend.log == [("begin", 1, names), ("chunk", 1, first), ("chunk", 1, second),
                               *(("sizes", 0, (n,)) for n in second), ("chunk", 1, third), ("end", 1, ())]
        assert tier.stats.probe_errors == 1


def _first_chunk_held(tier: BlobTier, backend: BatchedMemory) -> list[OffloadKey]:
    """150 keys looked up (RETRY) and their batch started, its first chunk held in ``backend`` (its
    ``gate`` cleared) until the caller sets the gate: the keys."""
    backend.gate.clear()
    keys = [_key(i) for i in range(150)]
    for k in keys:
        assert tier.lookup(k, ReqContext("one")) is lr.RETRY
    tier.on_step_end()
    assert backend.in_first_chunk.wait(10)
    return keys


def test_a_reset_during_a_batch_skips_its_other_chunks_and_ends_it() -> None:
    """AP-10, TIERKIT-7: ``reset_cache`` while the first chunk is being checked: the chunks not started
    are not asked (their answers would be ignored, AP-3) and the batch ends."""
    backend = BatchedMemory()
    with _tier(backend) as tier:
        _first_chunk_held(tier, backend)
        assert tier.reset_cache()
        backend.gate.set()
        assert tier.wait_idle()
        events = [(e[0], e[1]) for e in backend.log if e[0] in ("begin", "chunk", "end")]
        assert events == [("begin", 1), ("chunk", 1), ("end", 1)]


def test_a_shutdown_during_a_batch_skips_its_other_chunks_and_ends_it() -> None:
    """AP-8, AP-10, TIERKIT-7: shutdown while the first chunk is being checked: once it is back, the
    chunks not started are MISS without a call and the batch ends before shutdown returns."""
    backend = BatchedMemory()
    with _tier(backend) as tier:
        keys = _first_chunk_held(tier, backend)
        closing = threading.Thread(target=tier.shutdown)
        closing.start()
        probe = tier._probe  # the condition to wait for: the probe is stopping (no public view of it)
        deadline = time.monotonic() + 10
        while not probe._stopping:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        backend.gate.set()
        closing.join(20)
        assert not closing.is_alive()
        events = [(e[0], e[1]) for e in backend.log if e[0] in ("begin", "chunk", "end")]
        assert events == [("begin", 1), ("chunk", 1), ("end", 1)]
        assert all(tier.lookup(k, ReqContext("one")) is lr.MISS for k in keys)
