"""BlobTier's jobs on an asynchronous backend's event loop (no ``wrap``): the cases, the kit, and the loop's own promises.

Without ``wrap`` a job over an :class:`~kvproto.tierkit.AsyncBlobBackend` runs
as one task on the engine's loop (its keys gathered there, bounded by
``read_threads`` / ``write_threads``), not on the worker pools. Faults sit
*inside* the asynchronous backend here: ``ThreadedAsync`` awaits a
:class:`~kvproto.testing.FaultyBackend` (over MemoryBackend) in a helper
thread, as an asyncio client awaits its I/O, so an injected delay holds one
operation without blocking the loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Sequence

import pytest

from kvproto import EventKind, OffloadKey, ReqContext, SecondaryTier, envelope as env, members as lr
from kvproto.testing import FaultyBackend, FaultyJobs, ThreadLedger
from kvproto.tierkit import AsyncBlobBackend, BlobTier, BlobTierConfig, MemoryBackend, Published

from tests.kvproto.tierkit import test_blob_async as wrapped
from tests.kvproto.tierkit.test_blob_cases import BLOCK, SLOTS, BlobBackendCases, BlobEnv, _fill, _Jobs, key

_parts = wrapped._memory  # the tier, its FaultyBackend, the MemoryBackend (either arrangement)


class ThreadedAsync:
    """A synchronous backend's methods as coroutines awaiting a helper thread."""

    def __init__(self, inner: FaultyBackend) -> None:
        self.inner = inner

    async def prepare(self, namespace: str) -> None:
        await asyncio.to_thread(self.inner.prepare, namespace)

    async def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        return await asyncio.to_thread(self.inner.publish, name, parts, size)

    async def read_into(self, name: str, buffers: Sequence[memoryview]) -> int:
        return await asyncio.to_thread(self.inner.read_into, name, buffers)

    async def sizes(self, names: Sequence[str]) -> Sequence[int | None]:
        return await asyncio.to_thread(self.inner.sizes, names)

    async def delete(self, name: str) -> None:
        await asyncio.to_thread(self.inner.delete, name)

    async def list_blobs(self, namespace: str) -> AsyncIterator[tuple[str, int]]:
        for item in await asyncio.to_thread(lambda: list(self.inner.list_blobs(namespace))):
            yield item

    async def clear(self, namespace: str) -> None:
        await asyncio.to_thread(self.inner.clear, namespace)

    async def close(self) -> None:
        pass


class Gate(wrapped.AsyncMemory):
    """A MemoryBackend behind coroutines that count operations in flight and can hang until opened."""

    def __init__(self, *, hang: bool = False, delay_s: float = 0.0) -> None:
        super().__init__(MemoryBackend())
        self.memory = self.inner
        self.delay_s = delay_s
        self.open = threading.Event()
        if not hang:
            self.open.set()
        self.in_flight = 0
        self.most_in_flight = 0
        self.threads: set[str] = set()

    async def _op(self) -> None:
        self.threads.add(threading.current_thread().name)
        self.in_flight += 1  # one loop thread: no lock needed
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
            while not self.open.is_set():
                await asyncio.sleep(0.005)
        finally:
            self.in_flight -= 1

    async def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        if name.endswith(".kvb"):
            await self._op()
        return self.memory.publish(name, parts, size)

    async def read_into(self, name: str, buffers: Sequence[memoryview]) -> int:
        await self._op()
        return self.memory.read_into(name, buffers)


def _typed(a: ThreadedAsync, b: Gate) -> tuple[AsyncBlobBackend, AsyncBlobBackend]:
    """Never called: mypy proves here that both are AsyncBlobBackends."""
    return a, b


def _buffer() -> memoryview:
    return memoryview(bytearray(SLOTS * BLOCK)).cast("B", (SLOTS, BLOCK))


def _loop_tier(config: BlobTierConfig, memory: MemoryBackend | None = None, name: str = "loop") -> BlobTier:
    faulty = FaultyBackend(MemoryBackend() if memory is None else memory)
    return FaultyJobs(ThreadedAsync(faulty), _buffer(), config, name=name)


class TestLoopJobsCases(BlobBackendCases):
    """The engine's race, error and event promises with jobs on the loop (TIERKIT-2, TIERKIT-3)."""

    drives_the_event_bound = False  # the same ledger queue as TestMemoryBackend's (see BlobBackendCases)

    @pytest.fixture
    def env(self) -> BlobEnv:
        def build(config: BlobTierConfig) -> tuple[BlobTier, FaultyBackend]:
            return _parts(_loop_tier(config))[:2]

        return BlobEnv.over_memory(build, lambda tier: _parts(tier)[2])


class TestLoopJobsKit(wrapped.TestSharedAsyncMemoryBlobTier):
    """The kit with jobs on the loop, shared mode with a budget (every capability declared)."""

    @pytest.fixture
    def tier_factory(self) -> Callable[[memoryview], SecondaryTier]:
        config = BlobTierConfig(shared=True, max_bytes=48 * (env.HEADER_BYTES + 64))
        return lambda buffer: FaultyJobs(ThreadedAsync(FaultyBackend(MemoryBackend())), buffer, config, name="loop")

    def reopen(self, tier: SecondaryTier, buffer: memoryview) -> SecondaryTier:
        blob, _, memory = _parts(tier)
        return FaultyJobs(ThreadedAsync(FaultyBackend(memory)), buffer, blob.blob_config, name=blob.name)


def _gated(gate: Gate, **options: object) -> BlobTier:
    tier = BlobTier(gate, _buffer(), BlobTierConfig(**options), name="gate")  # type: ignore[arg-type]  # options are fields
    assert tier.wait_ready(10)
    return tier


def _stored(tier: BlobTier, n: int) -> tuple[_Jobs, list[OffloadKey]]:
    """Keys 0..n-1 written into slots 0..n-1 and stored by one job that succeeded: the tier's job
    driver and the keys."""
    jobs = _Jobs(tier)
    keys = [key(i) for i in range(n)]
    for slot, k in enumerate(keys):
        _fill(tier, slot, k)
    assert jobs.run(keys, load=False).success
    return jobs, keys


def test_jobs_run_on_the_loop_not_on_worker_threads() -> None:
    """An unwrapped asynchronous backend's operations all run on the tier's loop thread; no pool thread starts."""
    gate = Gate()
    tier = _gated(gate)
    try:
        jobs, keys = _stored(tier, 8)
        assert jobs.run(keys, load=True, slot0=8).success
        assert bytes(tier._flat[8 * BLOCK : 16 * BLOCK]) == bytes(tier._flat[: 8 * BLOCK])
        assert gate.threads == {"kvproto-gate-loop"}
        assert not [t.name for t in threading.enumerate() if t.name.startswith(("kvproto-gate-w", "kvproto-gate-r"))]
    finally:
        tier.shutdown()


@pytest.mark.parametrize("load", [False, True], ids=["store", "load"])
def test_operations_in_flight_are_bounded_per_kind(load: bool) -> None:
    """At most ``write_threads`` publishes / ``read_threads`` reads in flight, over several jobs at once."""
    gate = Gate(delay_s=0.02)
    tier = _gated(gate, read_threads=3, write_threads=2)
    try:
        jobs, keys = _stored(tier, 12)
        gate.most_in_flight = 0
        submitted = [jobs.submit(keys[i : i + 4], load=load, slot0=i) for i in range(0, 12, 4)]
        assert all(jobs.wait(j).success for j in submitted)
        assert gate.most_in_flight == (3 if load else 2)
    finally:
        tier.shutdown()


def test_an_operation_past_op_timeout_fails_its_key_only_and_emits_no_removed() -> None:
    """``op_timeout_s`` ends a hung read as a transient failure (no HIT, no REMOVED); the blob stays (TIERKIT-3)."""
    gate = Gate()
    tier = _gated(gate, op_timeout_s=0.2)
    try:
        jobs = _Jobs(tier)
        k = key(1)
        _fill(tier, 0, k)
        assert jobs.run([k], load=False).success
        tier.take_events()
        gate.open.clear()
        result = jobs.run([k], load=True, slot0=1)
        assert not result.success
        assert tier.stats.transient_load_errors == 1
        assert not [e for e in tier.take_events() if e.kind is EventKind.REMOVED]
        assert tier.name_of(k) in gate.memory.blobs
        assert tier.lookup(k, ReqContext("r")) is not lr.HIT
        _fill(tier, 2, key(2))
        assert not jobs.run([key(2)], load=False, slot0=2).success  # a hung publish fails too
        gate.open.set()
        assert jobs.run([k], load=False).success
        assert jobs.run([k], load=True, slot0=1).success
    finally:
        gate.open.set()
        tier.shutdown()


def test_shutdown_waits_for_jobs_on_the_loop_and_stops_it() -> None:
    """TIER-16: shutdown lets a job in flight on the loop finish (reportable once), then the loop thread ends."""
    gate = Gate(delay_s=0.2)
    with ThreadLedger() as ledger:  # recorded, not sampled: a loop thread left to end alone is found every run
        tier = _gated(gate)
        jobs = _Jobs(tier)
        k = key(1)
        _fill(tier, 0, k)
        job = jobs.submit([k], load=False)
        tier.shutdown()
        assert [r.job_id for r in tier.get_finished_jobs()] == [job.job_id]
        assert tier.name_of(k) in gate.memory.blobs
        assert "kvproto-gate-loop" in [t.name for t in ledger.started()]  # not vacuous
        assert ledger.unjoined() == []
    late = jobs.submit([key(2)], load=False)  # after shutdown: fails without I/O
    assert not jobs.wait(late).success


def test_shutdown_joins_the_threads_a_backend_started_through_the_loop() -> None:
    """A backend awaiting ``asyncio.to_thread`` starts the loop's executor threads: shutdown joins them (TIER-16)."""
    # Recorded, not sampled: only threads started from here count (an ``asyncio_N`` executor thread
    # of another test's loop starting meanwhile is not this tier's), and one left to end on its own
    # is held at its end until joined, so it is found every run.
    with ThreadLedger() as ledger:
        tier = _loop_tier(BlobTierConfig())
        jobs, keys = _stored(tier, 4)
        started = [t for t in ledger.started() if t.name.startswith("asyncio_")]
        assert started  # the backend did use the executor: the check below is not vacuous
        tier.shutdown()
        assert [t.name for t in ledger.unjoined()] == []
