"""The public Hypothesis strategies (``kvproto.testing.strategies``), each used as a tier author
would: in an ``@given`` test against :class:`~kvproto.MemoryTier`."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, strategies as st

import kvproto
from kvproto import (
    MemoryTier,
    OffloadKey,
    TransferJob,
    members as lr,
    split_key,
)
from kvproto.testing import block_for, key_pool, make_buffer, strategies as kvst
from kvproto.testing.faults import LatencySecondary

SLOTS = 16
BLOCK = 16
REQ = kvproto.ReqContext("kvproto-strategies")


class Harness:
    """MemoryTier on its own buffer, driven as a scheduler would, with a dict model of what it holds."""

    def __init__(self, *, block_bytes: int = BLOCK, job_latency_steps: int = 0) -> None:
        self.buffer = make_buffer(SLOTS, block_bytes)
        self.flat = self.buffer.cast("B")
        self.block_bytes = block_bytes
        memory = MemoryTier(self.buffer)
        self.tier: kvproto.SecondaryTier = LatencySecondary(memory, job_steps=job_latency_steps) if job_latency_steps else memory
        self.next_id = 1
        self.flying: dict[int, TransferJob] = {}
        self.stored: set[OffloadKey] = set()  # keys some store reported done
        self.blobs: dict[OffloadKey, bytes] = {}  # the bytes last stored under each key

    def row(self, slot: int) -> bytes:
        return bytes(self.flat[slot * self.block_bytes : (slot + 1) * self.block_bytes])

    def free_slots(self, count: int) -> list[int] | None:
        busy = {slot for job in self.flying.values() for slot in job.slots}
        free = [slot for slot in range(SLOTS) if slot not in busy]
        return free[:count] if len(free) >= count else None

    def submit(self, keys: Sequence[OffloadKey], *, load: bool, data: Sequence[bytes] = ()) -> TransferJob | None:
        slots = self.free_slots(len(keys))
        if slots is None:
            return None
        if not load:
            for key, slot, blob in zip(keys, slots, data or [block_for(k, self.block_bytes) for k in keys], strict=True):
                self.flat[slot * self.block_bytes : (slot + 1) * self.block_bytes] = blob
                self.blobs[key] = blob
        job = TransferJob(self.next_id, tuple(keys), tuple(slots), load, REQ.req_id)
        self.next_id += 1
        self.flying[job.job_id] = job
        (self.tier.submit_load if load else self.tier.submit_store)(job)
        return job

    def storing(self, key: OffloadKey) -> bool:
        return any(key in job.keys for job in self.flying.values() if not job.promotion)

    def step(self) -> list[kvproto.JobResult]:
        self.tier.on_step_end()
        done = list(self.tier.get_finished_jobs())
        for result in done:
            job = self.flying.pop(result.job_id)  # a KeyError: reported twice or never submitted
            ok = result.succeeded_keys(job)
            if not job.promotion:
                self.stored |= ok
            for key, slot in zip(job.keys, job.slots, strict=True):
                if job.promotion and key in ok:
                    assert self.row(slot) == self.blobs[key], f"load of {key!r} wrote other bytes"
        return done

    def settle(self) -> None:
        for _ in range(16):
            if not self.flying:
                return
            self.step()
        raise AssertionError(f"jobs {sorted(self.flying)} never reported")


def _store_and_load(harness: Harness, key: OffloadKey, data: bytes) -> bytes:
    """Store ``data`` under ``key``, load it back into another slot, return what the slot holds."""
    harness.submit([key], load=False, data=[data])
    harness.settle()
    assert harness.tier.lookup(key, REQ) is lr.HIT
    job = harness.submit([key], load=True)
    assert job is not None
    harness.settle()
    return harness.row(job.slots[0])


@given(key=kvst.keys(), data=kvst.blocks(BLOCK))
def test_any_key_round_trips_its_bytes_through_memory_tier(key: OffloadKey, data: bytes) -> None:
    block_hash, group = split_key(key)
    assert kvproto.make_key(block_hash, group) == key
    harness = Harness()
    try:
        assert harness.tier.lookup(key, REQ) is lr.MISS
        assert _store_and_load(harness, key, data) == data
    finally:
        harness.tier.shutdown()


@given(pair=kvst.sibling_keys())
def test_sibling_keys_differ_in_one_part_and_stay_apart(pair: tuple[OffloadKey, OffloadKey]) -> None:
    first, second = pair
    (hash_a, group_a), (hash_b, group_b) = split_key(first), split_key(second)
    assert first != second
    assert (hash_a == hash_b) != (group_a == group_b)  # exactly one part differs
    harness = Harness()
    try:
        harness.submit([first], load=False)
        harness.settle()
        assert harness.tier.lookup(first, REQ) is lr.HIT
        assert harness.tier.lookup(second, REQ) is lr.MISS
    finally:
        harness.tier.shutdown()


@given(keys=kvst.key_lists(max_size=SLOTS), pooled=kvst.key_lists(key_pool("strategies", 4), unique=False))
def test_a_key_list_stores_in_one_job(keys: list[OffloadKey], pooled: list[OffloadKey]) -> None:
    assert len(set(keys)) == len(keys) and 1 <= len(keys) <= SLOTS
    assert set(pooled) <= set(key_pool("strategies", 4)) and 1 <= len(pooled) <= 3
    harness = Harness()
    try:
        job = harness.submit(keys, load=False)
        assert job is not None
        (result,) = harness.step()
        assert result.success
        assert all(harness.tier.lookup(k, REQ) is lr.HIT for k in keys)
    finally:
        harness.tier.shutdown()


@given(sized=st.integers(min_value=1, max_value=64).flatmap(lambda n: st.tuples(st.just(n), kvst.blocks(n))))
def test_blocks_have_the_asked_size_and_round_trip(sized: tuple[int, bytes]) -> None:
    size, data = sized
    assert len(data) == size
    harness = Harness(block_bytes=size)
    try:
        assert _store_and_load(harness, key_pool("blocks", 1)[0], data) == data
    finally:
        harness.tier.shutdown()


@given(ops=kvst.job_sequences(), latency=st.integers(min_value=0, max_value=2))
def test_any_job_sequence_agrees_with_a_dict_model(ops: list[kvst.JobOp], latency: int) -> None:
    harness = Harness(job_latency_steps=latency)
    try:
        for op in ops:
            match op:
                case kvst.StoreOp(keys=keys):
                    harness.submit(keys, load=False)
                case kvst.LoadOp(keys=keys):
                    harness.submit(keys, load=True)
                case kvst.LookupOp(key=key):
                    answer = harness.tier.lookup(key, REQ)
                    if answer is lr.HIT:
                        # HIT means stored, or a store of it in flight (MemoryTier runs it at once).
                        assert key in harness.stored or harness.storing(key), f"HIT for never-stored {key!r}"
                    else:
                        assert answer is lr.MISS and key not in harness.stored
                case kvst.StepOp():
                    harness.step()
                case _ as other:
                    kvproto.unreachable(other, where="test_any_job_sequence_agrees_with_a_dict_model")
        harness.settle()
        for key in {k for op in ops if isinstance(op, (kvst.StoreOp, kvst.LoadOp)) for k in op.keys}:
            want = lr.HIT if key in harness.stored else lr.MISS
            assert harness.tier.lookup(key, REQ) is want
    finally:
        harness.tier.shutdown()
