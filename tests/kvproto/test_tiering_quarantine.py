"""After a job deadline, a late report or a report that never comes, the key can be stored and promoted
again, and the primary slots the job used come back once its transfer is provably over; the quarantine is
bounded and visible in stats; a tier's declared job time bound sets the deadline (issue 21 items 2 and 3;
MGR-17)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvproto import (
    LookupResult,
    MemoryPrimaryTier,
    MemoryTier,
    OffloadKey,
    ReqContext,
    SecondaryTier,
    SlotQuarantine,
    TieringConfig,
    TieringManager,
)
from kvproto.errors import ConfigurationError
from kvproto.testing.faults import FaultySecondary
from kvproto.tierkit import ForwardingSecondary, SlotTable

from tests.kvproto.tiering_stack import BLOCK, R1, FakeClock, block, key

pytestmark = pytest.mark.usefixtures("no_thread_leak")


class _Primary(SlotTable):
    """What these tests read of a primary on a SlotTable: the table and its buffer."""

    @property
    def buffer(self) -> memoryview:
        raise NotImplementedError


def _memory_primary(slots: int, clock: FakeClock) -> _Primary:
    return MemoryPrimaryTier(num_slots=slots, block_bytes=BLOCK, pending_deadline_s=2.0, clock=clock)  # type: ignore[return-value]  # structurally a _Primary


def _cpu_primary(slots: int, clock: FakeClock) -> _Primary:
    cpu = pytest.importorskip("kvproto_cpu", reason="kvproto-cpu (torch) is not installed: pip install -e impls/cpu")
    return cpu.CpuTier(  # type: ignore[no-any-return]  # an importorskip module is Any
        cpu.CpuTierConfig(num_slots=slots, block_bytes=BLOCK, pending_deadline_s=2.0, pin_memory="off"), clock=clock
    )


PRIMARIES: dict[str, Callable[[int, FakeClock], _Primary]] = {"memory": _memory_primary, "cpu": _cpu_primary}


def _row(primary: _Primary, k: OffloadKey) -> bytes:
    slot = primary.slot_of(k)
    assert slot is not None
    return bytes(primary.buffer.cast("B")[slot * BLOCK : (slot + 1) * BLOCK])


def _promote_until_hit(manager: TieringManager, k: OffloadKey, clock: FakeClock, steps: int = 10) -> LookupResult:
    answer = manager.lookup(k, R1)
    for _ in range(steps):
        if answer is LookupResult.HIT:
            break
        clock.now += 1.0
        manager.on_step_end()
        answer = manager.lookup(k, R1)
    return answer


@pytest.mark.parametrize("late_steps", [20, 10**6], ids=["reported-late", "never-reported"])
@pytest.mark.parametrize("flavour", list(PRIMARIES))
def test_the_key_of_an_abandoned_promotion_can_be_stored_and_promoted_again(flavour: str, late_steps: int) -> None:
    """Issue 21 item 2: a promotion reported after job_deadline_steps (or never) used to leave its key MISS for
    ever, prepare_store([key]) storing nothing, and the late report left the slot quarantined."""
    clock = FakeClock()
    primary = PRIMARIES[flavour](8, clock)  # the quarantine limit: 8 * 0.25 = 2 slots
    assert isinstance(primary, SlotQuarantine)
    lossy = FaultySecondary(MemoryTier(primary.buffer, name="m"))
    lossy.inner.seed(key(1), block(1))
    lossy.report_late(1, steps=late_steps)
    manager = TieringManager(primary, [lossy], config=TieringConfig(job_deadline_steps=5, negative_verdict_steps=2))
    try:
        assert manager.lookup(key(1), R1) is LookupResult.RETRY
        for _ in range(8):  # past the deadline (5 steps) and the primary's own (2 s)
            clock.now += 1.0
            manager.on_step_end()
        assert manager.stats.promotions_timed_out == 1
        assert manager.stats.quarantined_slots == 1 == primary.quarantined_slots
        assert manager.tracked_sizes()["quarantined_slots"] == 1
        # The key is free: the scheduler can store it ...
        out = manager.prepare_store([key(1)], R1)
        assert out is not None and out.keys_to_store == (key(1),)
        manager.complete_store(out.keys_to_store, False)
        # ... and the manager promotes it again (the next job reports in time), with the right bytes.
        assert _promote_until_hit(manager, key(1), clock) is LookupResult.HIT
        assert _row(primary, key(1)) == block(1)
        assert primary.free_slots == 6  # one READY block, one slot still held for the lost load
        for _ in range(25):
            clock.now += 1.0
            manager.on_step_end()
        if late_steps == 20:
            assert manager.stats.late_reports == 1
            assert manager.stats.quarantined_slots == 0 == primary.quarantined_slots
            assert manager.stats.quarantine_released == 1
            assert primary.free_slots == 7
        else:
            assert manager.stats.quarantined_slots == 1 == primary.quarantined_slots  # its load may still land
    finally:
        manager.shutdown()
    assert primary.quarantined_slots == 0  # the tier shut down: its transfer is over
    assert manager.tracked_sizes()["abandoned_jobs"] == 0


def test_a_write_through_past_its_deadline_keeps_its_pin_until_it_reports() -> None:
    """MGR-17: the tier may still read the rows of a write-through it has not reported, so its pin stays
    (the slot is never reused under it) until the late report, which counts as a store."""
    primary = MemoryPrimaryTier(num_slots=4, block_bytes=BLOCK)
    slow = FaultySecondary(MemoryTier(primary.buffer, name="m"))
    slow.report_late(1, steps=10)
    manager = TieringManager(primary, [slow], config=TieringConfig(job_deadline_steps=3))
    try:
        out = manager.prepare_store([key(1)], R1)
        assert out is not None
        primary.slot_view(out.slots[0])[:] = block(1)
        manager.complete_store(out.keys_to_store, True)
        for _ in range(5):
            manager.on_step_end()
        assert manager.stats.write_throughs_timed_out == 1
        assert primary.pin_count(key(1)) == 1 and manager.stats.quarantined_slots == 1
        for _ in range(10):
            manager.on_step_end()
        assert manager.stats.late_reports == 1
        assert primary.pin_count(key(1)) == 0 and manager.stats.quarantined_slots == 0
        assert slow.inner.lookup(key(1), R1) is LookupResult.HIT
        assert manager.stats.write_throughs_failed == 0
    finally:
        manager.shutdown()


def test_a_lost_job_gives_its_slots_back_when_the_tier_has_no_pending_work() -> None:
    """MGR-17, TIER-15: a tier that dropped a job and has no pending work runs no transfer: the slots of the
    abandoned job come back at once, without waiting for a report that will never come."""
    primary = MemoryPrimaryTier(num_slots=4, block_bytes=BLOCK)
    lossy = FaultySecondary(MemoryTier(primary.buffer, name="m"))
    lossy.inner.seed(key(1), block(1))
    lossy.drop_reports(1)
    manager = TieringManager(primary, [lossy], config=TieringConfig(job_deadline_steps=3, negative_verdict_steps=1))
    try:
        assert manager.lookup(key(1), R1) is LookupResult.RETRY
        for _ in range(5):
            manager.on_step_end()
        assert manager.stats.promotions_timed_out == 1
        assert manager.stats.quarantine_released == 1 and primary.free_slots == 4
        assert not manager.has_pending_work()
    finally:
        manager.shutdown()


def test_the_quarantine_is_bounded_a_silent_tier_is_paused() -> None:
    """MGR-17: the abandoned jobs of one tier hold at most quarantine_share of the primary's slots; at the
    limit the tier gets no more promotions (MISS) nor write-throughs, so it cannot hold the primary."""
    primary = MemoryPrimaryTier(num_slots=8, block_bytes=BLOCK)
    silent = FaultySecondary(MemoryTier(primary.buffer, name="m"))
    for i in range(8):
        silent.inner.seed(key(i), block(i))
    silent.report_late(10**6, steps=10**6)
    manager = TieringManager(primary, [silent], config=TieringConfig(job_deadline_steps=2, quarantine_share=0.25))
    try:
        for i in range(8):
            manager.lookup(key(i), ReqContext(f"r{i}"))  # one job per request
            for _ in range(3):
                manager.on_step_end()
        assert manager.stats.quarantined_slots == 2 == primary.quarantined_slots  # the limit: 8 * 0.25
        assert manager.stats.quarantine_skips > 0
        assert primary.free_slots == 6
        assert manager.lookup(key(7), R1) is LookupResult.MISS  # paused: nothing reserved
        out = manager.prepare_store([key(20)], R1)
        assert out is not None
        manager.complete_store(out.keys_to_store, True)
        manager.on_step_end()
        assert primary.pin_count(key(20)) == 0  # no write-through went to the paused tier
    finally:
        manager.shutdown()
    assert primary.quarantined_slots == 0


class Bounded(ForwardingSecondary[SecondaryTier]):
    """A tier that declares its job time bound (kvproto.JobTimeBound)."""

    def __init__(self, inner: SecondaryTier, bound: object) -> None:
        super().__init__(inner)
        self._bound = bound

    @property
    def job_time_bound_s(self) -> float | None:
        return self._bound  # type: ignore[return-value]  # the tests pass bad values too


def test_a_tier_declaring_its_job_time_bound_is_never_ended_before_it() -> None:
    """Issue 21 item 3: the manager ends a job of a tier that declares job_time_bound_s only after the later
    of job_deadline_steps and the bound plus job_bound_grace_s, so a brown-out shorter than the tier's own
    timeout (its report late in steps, in time by its bound) loses nothing."""
    clock = FakeClock()
    primary = MemoryPrimaryTier(num_slots=4, block_bytes=BLOCK)
    slow = FaultySecondary(MemoryTier(primary.buffer, name="m"))
    slow.inner.seed(key(1), block(1))
    slow.report_late(1, steps=50)
    tier = Bounded(slow, 30.0)
    config = TieringConfig(job_deadline_steps=5, job_bound_grace_s=1.0)
    manager = TieringManager(primary, [tier], config=config, clock=clock)
    try:
        assert manager.lookup(key(1), R1) is LookupResult.RETRY
        for _ in range(49):  # 49 steps (far past 5), 24.5 s (within the bound)
            clock.now += 0.5
            manager.on_step_end()
        assert manager.stats.promotions_timed_out == 0
        for _ in range(3):  # the tier reports 50 steps after the job went out
            manager.on_step_end()
        assert manager.lookup(key(1), R1) is LookupResult.HIT
        assert manager.stats.late_reports == 0 and manager.stats.quarantined_slots == 0
        # A job past both bounds is still ended.
        slow.inner.seed(key(2), block(2))
        slow.report_late(1, steps=10**6)
        assert manager.lookup(key(2), R1) is LookupResult.RETRY
        for _ in range(8):
            clock.now += 10.0
            manager.on_step_end()
        assert manager.stats.promotions_timed_out == 1
    finally:
        manager.shutdown()


@pytest.mark.parametrize("bound", [0, -1.0, float("inf"), float("nan"), "30", True])
def test_a_bad_job_time_bound_is_a_configuration_error(bound: object) -> None:
    primary = MemoryPrimaryTier(num_slots=2, block_bytes=BLOCK)
    with pytest.raises(ConfigurationError, match="job_time_bound_s"):
        TieringManager(primary, [Bounded(MemoryTier(primary.buffer, name="m"), bound)])


@pytest.mark.parametrize(
    ("field", "value"), [("job_bound_grace_s", -1.0), ("job_bound_grace_s", float("inf")), ("quarantine_share", 0),
                         ("quarantine_share", 1.5)]
)
def test_bad_quarantine_settings_are_configuration_errors(field: str, value: float) -> None:
    with pytest.raises(ConfigurationError, match=field):
        TieringConfig(**{field: value})  # type: ignore[arg-type]  # field names from the parameters
