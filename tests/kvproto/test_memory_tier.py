"""MemoryTier: the in-memory reference secondary tier (MEM-1..MEM-9)."""

from __future__ import annotations

import pytest

import kvproto
from kvproto import (
    EventKind,
    JobResult,
    LookupResult,
    MemoryTier,
    SecondaryTier,
    TransferJob,
)
from kvproto.errors import ConfigurationError, InvalidArgumentError
from kvproto.testing import ThreadLedger
from kvproto.testing.faults import LatencySecondary

SLOTS = 8
BLOCK = 16
REQ = kvproto.ReqContext("r1")

pytestmark = pytest.mark.usefixtures("no_thread_leak")


def new_buffer(slots: int = SLOTS, block: int = BLOCK) -> memoryview:
    return memoryview(bytearray(slots * block)).cast("B", (slots, block))


def key(i: int) -> kvproto.OffloadKey:
    return kvproto.make_key(i.to_bytes(4, "big"), 0)


def row(buf: memoryview, slot: int) -> bytes:
    return bytes(buf.cast("B")[slot * BLOCK : (slot + 1) * BLOCK])


def fill(buf: memoryview, slot: int, value: int) -> bytes:
    data = bytes([value]) * BLOCK
    buf.cast("B")[slot * BLOCK : (slot + 1) * BLOCK] = data
    return data


@pytest.fixture
def buf() -> memoryview:
    return new_buffer()


def test_satisfies_secondary_tier_protocol(buf: memoryview) -> None:
    """MEM-1: MemoryTier is a SecondaryTier (statically through this annotation, and at run time)."""
    tier: SecondaryTier = MemoryTier(buf)
    assert isinstance(tier, SecondaryTier)
    assert tier.name == "memory"


def test_store_then_lookup_then_load_round_trip(buf: memoryview) -> None:
    """MEM-2, MEM-3: a stored block is HIT and loads back the same bytes; others are MISS."""
    tier = MemoryTier(buf, name="m")
    data = fill(buf, 0, 7)
    assert tier.lookup(key(1), REQ) is LookupResult.MISS
    tier.submit_store(TransferJob(1, (key(1),), (0,), promotion=False))
    assert tier.has_pending_work()
    assert tier.get_finished_jobs() == [JobResult(1, True)]
    assert not tier.has_pending_work()
    assert tier.get_finished_jobs() == []  # reported exactly once
    assert tier.lookup(key(1), REQ) is LookupResult.HIT
    assert tier.read_stored(key(1)) == data
    tier.submit_load(TransferJob(2, (key(1),), (3,), promotion=True))
    assert tier.get_finished_jobs() == [JobResult(2, True)]
    assert row(buf, 3) == data
    events = tier.take_events()
    assert [(e.kind, e.keys, e.tier) for e in events] == [(EventKind.STORED, (key(1),), "m")]
    assert tier.take_events() == []


def test_jobs_run_at_submission_and_report_at_the_next_poll(buf: memoryview) -> None:
    """MEM-3: without latency_s a job runs when submitted; the next get_finished_jobs reports it once."""
    tier = MemoryTier(buf)
    fill(buf, 0, 1)
    tier.submit_store(TransferJob(1, (key(1),), (0,), promotion=False))
    assert tier.stored_keys() == {key(1)}
    assert tier.has_pending_work()
    tier.on_step_end()
    assert tier.get_finished_jobs() == [JobResult(1, True)]
    assert tier.get_finished_jobs() == []
    assert not tier.has_pending_work()


def test_lookups_never_retry_latency_comes_from_the_wrapper(buf: memoryview) -> None:
    """MEM-4: MemoryTier answers at once and declares no async_lookup; LatencySecondary adds the RETRYs."""
    tier = MemoryTier(buf)
    tier.seed(key(1), b"x" * BLOCK)
    assert not tier.capabilities.async_lookup
    assert tier.lookup(key(1), REQ) is LookupResult.HIT
    assert tier.lookup(key(2), REQ) is LookupResult.MISS
    slow = LatencySecondary(tier, lookup_steps=2)
    assert slow.capabilities.async_lookup and slow.capabilities.max_retry_steps == 2
    assert slow.lookup(key(1), REQ) is LookupResult.RETRY
    slow.on_step_end()
    slow.on_step_end()
    assert slow.lookup(key(1), REQ) is LookupResult.HIT
    slow.shutdown()


def test_capacity_evicts_least_recently_used(buf: memoryview) -> None:
    """MEM-5: beyond capacity_blocks the least recently used block goes, with a REMOVED event."""
    tier = MemoryTier(buf, capacity_blocks=2)
    assert tier.capabilities.eviction
    for i in range(2):
        tier.seed(key(i), bytes([i]) * BLOCK)
    tier.touch([key(0)])
    tier.seed(key(2), b"\x02" * BLOCK)
    assert tier.stored_keys() == {key(0), key(2)}
    assert tier.lookup(key(1), REQ) is LookupResult.MISS
    assert [(e.kind, e.keys) for e in tier.take_events()] == [(EventKind.REMOVED, (key(1),))]


def test_block_evicted_by_its_own_store_job_answers_miss(buf: memoryview) -> None:
    """MEM-5: a key its own store job evicts again answers MISS, and its REMOVED comes after the STORED."""
    tier = MemoryTier(buf, capacity_blocks=1)
    assert tier.lookup(key(1), REQ) is LookupResult.MISS
    tier.submit_store(TransferJob(1, (key(1), key(2)), (0, 1), promotion=False))
    tier.get_finished_jobs()
    assert tier.stored_keys() == {key(2)}
    assert tier.lookup(key(1), REQ) is LookupResult.MISS
    assert tier.lookup(key(2), REQ) is LookupResult.HIT
    assert [(e.kind, e.keys) for e in tier.take_events()] == [
        (EventKind.STORED, (key(1), key(2))),
        (EventKind.REMOVED, (key(1),)),
    ]
    tier.shutdown()


def test_corrupt_block_fails_its_load_and_becomes_miss(buf: memoryview) -> None:
    """MEM-6: corruption is caught by the checksum; the row keeps its old bytes, the key MISSes."""
    tier = MemoryTier(buf)
    tier.seed(key(1), b"\x11" * BLOCK)
    tier.seed(key(2), b"\x22" * BLOCK)
    before = fill(buf, 5, 0xAA)
    tier.corrupt_on_read([key(1)])
    tier.submit_load(TransferJob(9, (key(1), key(2)), (5, 6), promotion=True))
    assert tier.get_finished_jobs() == [JobResult(9, False, frozenset({key(2)}))]
    assert row(buf, 5) == before  # never wrong bytes
    assert row(buf, 6) == b"\x22" * BLOCK
    assert tier.lookup(key(1), REQ) is LookupResult.MISS
    assert [(e.kind, e.keys) for e in tier.take_events()] == [(EventKind.REMOVED, (key(1),))]


def test_fail_next_jobs_and_fail_keys(buf: memoryview) -> None:
    """MEM-7: injected job failures (whole jobs, then per key as a partial result)."""
    tier = MemoryTier(buf)
    fill(buf, 0, 1)
    fill(buf, 1, 2)
    tier.fail_next_jobs(1)
    tier.submit_store(TransferJob(1, (key(1), key(2)), (0, 1), promotion=False))
    assert tier.get_finished_jobs() == [JobResult(1, False)]
    assert tier.stored_keys() == frozenset()
    tier.fail_keys([key(2)])
    tier.submit_store(TransferJob(2, (key(1), key(2)), (0, 1), promotion=False))
    assert tier.get_finished_jobs() == [JobResult(2, False, frozenset({key(1)}))]
    assert tier.stored_keys() == {key(1)}
    tier.submit_load(TransferJob(3, (key(1), key(3)), (4, 5), promotion=True))
    (result,) = tier.get_finished_jobs()
    assert result.succeeded_keys(TransferJob(3, (key(1), key(3)), (4, 5), True)) == {key(1)}


def test_latency_s_completes_in_background_and_shutdown_joins(
    buf: memoryview, tiers: list[MemoryTier]
) -> None:
    """MEM-3, MEM-8: with latency_s the job runs on a worker; submission does not wait for it."""
    tier = MemoryTier(buf, latency_s=0.05)
    tiers.append(tier)
    fill(buf, 0, 3)
    # Recorded, not counted: the process's thread count also moves with threads other tests left
    # ending in the background; the ledger sees only the threads started from here, and holds each
    # at its end until a join, so a worker shutdown forgot is found every run.
    with ThreadLedger() as ledger:
        tier.submit_store(TransferJob(1, (key(1),), (0,), promotion=False))
        assert tier.has_pending_work()
        tier.shutdown()  # waits for the running job
        assert tier.get_finished_jobs() == [JobResult(1, True)]
        assert len(ledger.started()) == 1  # the job ran on a worker
        assert ledger.unjoined() == []
    tier.submit_store(TransferJob(2, (key(2),), (0,), promotion=False))
    assert tier.get_finished_jobs() == [JobResult(2, False)]  # after shutdown: fails at once


def test_reset_is_refused_until_every_job_is_reported(buf: memoryview) -> None:
    """MEM-8: reset_cache answers False while a job runs on its worker or waits to be reported."""
    tier = MemoryTier(buf, latency_s=0.05)
    tier.submit_store(TransferJob(1, (key(1),), (0,), promotion=False))
    assert not tier.reset_cache()  # work in flight
    tier.shutdown()  # waits for the worker
    assert not tier.reset_cache()  # done, but not yet reported
    assert tier.get_finished_jobs() == [JobResult(1, True)]
    assert not tier.has_pending_work()
    assert tier.reset_cache()


def test_reset_cache_forgets_blocks(buf: memoryview) -> None:
    """TIER-16: reset forgets every block with a REMOVED event."""
    tier = MemoryTier(buf)
    tier.seed(key(1), b"\x01" * BLOCK)
    assert tier.reset_cache()
    assert tier.lookup(key(1), REQ) is LookupResult.MISS
    assert [(e.kind, e.keys) for e in tier.take_events()] == [(EventKind.REMOVED, (key(1),))]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"latency_s": float("nan")},
        {"latency_s": True},
        {"capacity_blocks": 0},
    ],
)
def test_bad_configuration_is_a_typed_error(buf: memoryview, kwargs: dict[str, object]) -> None:
    """MEM-9: bad configuration raises ConfigurationError naming the argument."""
    with pytest.raises(ConfigurationError, match=next(iter(kwargs))):
        MemoryTier(buf, **kwargs)  # type: ignore[arg-type]  # deliberately wrong types


def test_bad_buffer_is_a_typed_error() -> None:
    """MEM-9: a buffer that is not a writable 2-D byte view is refused."""
    with pytest.raises(ConfigurationError, match="buffer"):
        MemoryTier(memoryview(bytes(16)).cast("B", (2, 8)))
    with pytest.raises(ConfigurationError, match="buffer"):
        MemoryTier(memoryview(bytearray(16)))


def test_bad_jobs_are_typed_errors(buf: memoryview) -> None:
    """MEM-9: a wrong job direction, slot out of range or duplicate id names the culprit."""
    tier = MemoryTier(buf)
    with pytest.raises(InvalidArgumentError, match="promotion"):
        tier.submit_load(TransferJob(1, (key(1),), (0,), promotion=False))
    with pytest.raises(InvalidArgumentError, match="slot 99"):
        tier.submit_store(TransferJob(2, (key(1),), (99,), promotion=False))
    tier.submit_store(TransferJob(3, (key(1),), (0,), promotion=False))
    with pytest.raises(InvalidArgumentError, match="already in flight"):  # not yet reported
        tier.submit_store(TransferJob(3, (key(2),), (1,), promotion=False))
    tier.get_finished_jobs()
    with pytest.raises(InvalidArgumentError, match="bytes"):
        tier.seed(key(1), b"short")
    assert not tier.has_pending_work()
