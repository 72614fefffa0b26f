"""The manager under hostile tiers and a hostile engine: nothing lost, nothing leaked, nothing
unbounded, no exception into the scheduler (MGR-4, MGR-10, MGR-11, MGR-17..MGR-19)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

import kvproto
from kvproto import (
    JobResult,
    LookupResult,
    MemoryPrimaryTier,
    MemoryTier,
    ReqContext,
    TieringConfig,
    TieringManager,
    TransferJob,
    make_key,
)
from kvproto.errors import ConfigurationError, ContractViolation, InvalidArgumentError, TierError
from kvproto.testing.faults import FaultyPrimary, FaultySecondary

from tests.kvproto.tiering_stack import BLOCK, R1, ClaimsEverythingFailsLoads, ForwardingTier, block, key

pytestmark = pytest.mark.usefixtures("no_thread_leak")


def _store(manager: TieringManager, primary: MemoryPrimaryTier, k: kvproto.OffloadKey, data: bytes, req: ReqContext = R1) -> None:
    out = manager.prepare_store([k], req)
    assert out is not None and out.keys_to_store == (k,)
    primary.slot_view(out.slots[0])[:] = data
    manager.complete_store(out.keys_to_store, True)


# ------------------------------------------------------------------------------- values (MGR-11)


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: JobResult(1, False, [key(1)]), "succeeded"),  # type: ignore[arg-type]  # a list, not a frozenset
        (lambda: JobResult(["x"], True), "job_id"),  # type: ignore[arg-type]  # unhashable
        (lambda: JobResult(1, "yes"), "success"),  # type: ignore[arg-type]  # not a bool
        (lambda: TransferJob(1, [key(1)], (0,), True), "keys"),  # type: ignore[arg-type]  # a list
        (lambda: TransferJob(1, (key(1),), (-1,), True), "slots"),
        (lambda: TransferJob(1, (key(1),), (0,), 1), "promotion"),  # type: ignore[arg-type]  # not a bool
        (lambda: TransferJob(1, (key(1),), (0,), True, req_id=7), "req_id"),  # type: ignore[arg-type]  # not a str
    ],
)
def test_job_values_check_their_fields(build: object, field: str) -> None:
    assert callable(build)
    with pytest.raises(InvalidArgumentError, match=field):
        build()


class PartialThenRaising(ForwardingTier):
    """Yields its first finished result, then raises: a get_finished_jobs generator that breaks midway."""

    def get_finished_jobs(self) -> Iterator[JobResult]:  # type: ignore[override]  # an iterator is a fine Sequence stand-in here
        results = list(self.inner.get_finished_jobs())
        yield from results[:1]
        if len(results) > 1:
            raise RuntimeError("connection reset")


def test_results_yielded_before_a_tier_raises_are_kept() -> None:
    """MGR-4: a get_finished_jobs that fails midway loses nothing it yielded; the rest end by deadline."""
    primary = MemoryPrimaryTier(num_slots=8, block_bytes=BLOCK)
    memory = MemoryTier(primary.buffer, name="m")
    tier = PartialThenRaising(memory)
    # A generator is what a broken third-party tier might return (the protocol says Sequence).
    manager = TieringManager(primary, [tier], config=TieringConfig(job_deadline_steps=4))  # type: ignore[list-item]  # deliberately a generator-returning tier
    try:
        for i in (1, 2):
            memory.seed(key(i), block(i))
        req_a, req_b = ReqContext("a"), ReqContext("b")
        assert manager.lookup(key(1), req_a) is LookupResult.RETRY
        assert manager.lookup(key(2), req_b) is LookupResult.RETRY  # two requests: two jobs
        manager.on_step_end()  # submits both; both run at once in MemoryTier
        manager.on_step_end()  # collects: the first result is yielded, then the tier raises
        assert manager.lookup(key(1), req_a) is LookupResult.HIT
        assert manager.stats.tier_errors == 1
        for _ in range(6):
            manager.on_step_end()
        assert manager.tracked_sizes()["jobs_in_flight"] == 0  # the lost report ended by its deadline
        assert manager.stats.promotions_timed_out == 1
    finally:
        manager.shutdown()


class ReportsGarbageFirst(ForwardingTier):
    def get_finished_jobs(self) -> Sequence[JobResult]:
        return ["not a result", *self.inner.get_finished_jobs()]  # type: ignore[list-item]  # the broken tier


def test_strict_mode_settles_every_result_before_raising() -> None:
    """MGR-4: in strict mode a violation is raised only after the good results of the batch were settled."""
    primary = MemoryPrimaryTier(num_slots=8, block_bytes=BLOCK)
    memory = MemoryTier(primary.buffer, name="m")
    manager = TieringManager(primary, [ReportsGarbageFirst(memory)], config=TieringConfig(strict=True))
    try:
        memory.seed(key(1), block(1))
        assert manager.lookup(key(1), R1) is LookupResult.RETRY
        manager.on_step_end()
        with pytest.raises(ContractViolation, match="not a JobResult"):
            manager.on_step_end()
        assert manager.tracked_sizes()["jobs_in_flight"] == 0
        assert manager.lookup(key(1), R1) is LookupResult.HIT
        assert manager.reset_cache() is True
    finally:
        manager.shutdown()


# ------------------------------------------------------------------------------- deadlines (MGR-17)


def test_write_throughs_never_reported_release_their_pins_by_the_deadline() -> None:
    """MGR-17: a secondary that never reports its write-throughs cannot pin the primary full for good."""
    primary = MemoryPrimaryTier(num_slots=4, block_bytes=BLOCK)
    silent = FaultySecondary(MemoryTier(primary.buffer, name="m"))
    silent.drop_reports(10**6)
    manager = TieringManager(primary, [silent], config=TieringConfig(job_deadline_steps=3))
    try:
        for i in range(4):
            _store(manager, primary, key(i), block(i))
        manager.on_step_end()  # the write-throughs go out, each pinning its block
        assert manager.prepare_store([key(9)], R1) is None  # every slot pinned
        for _ in range(4):
            manager.on_step_end()
        assert manager.stats.write_throughs_timed_out == 4
        assert all(primary.pin_count(key(i)) == 0 for i in range(4))
        out = manager.prepare_store([key(9)], R1)
        assert out is not None and out.keys_to_store == (key(9),)  # eviction works again
        manager.complete_store(out.keys_to_store, False)
        # The tier may have read a reused slot: the key is never promoted from it.
        silent.inner.seed(key(0), b"?" * BLOCK)
        manager.reset_cache()
        assert manager.lookup(key(0), R1) is LookupResult.MISS
    finally:
        manager.shutdown()


def test_a_promotion_never_reported_is_abandoned_and_the_key_comes_back() -> None:
    """MGR-17: the key of a lost promotion is not MISS for the manager's life; a late report is counted."""
    clock = [0.0]
    primary = MemoryPrimaryTier(num_slots=4, block_bytes=BLOCK, pending_deadline_s=2.0, clock=lambda: clock[0])
    lossy = FaultySecondary(MemoryTier(primary.buffer, name="m"))
    lossy.inner.seed(key(1), block(1))
    lossy.report_late(1, steps=20)
    manager = TieringManager(primary, [lossy], config=TieringConfig(job_deadline_steps=5, negative_verdict_steps=2))
    try:
        assert manager.lookup(key(1), R1) is LookupResult.RETRY
        answers = []
        for _ in range(10):
            clock[0] += 1.0
            manager.on_step_end()
            answers.append(manager.lookup(key(1), R1))
        assert manager.stats.promotions_timed_out == 1
        assert manager.promotions_in_flight() == {}
        # Its old slot stays quarantined in the primary (the late load may land), so the key is
        # stored elsewhere: first MISS (primary deadline, negative verdict), then promotable again.
        assert LookupResult.MISS in answers
        for _ in range(20):
            clock[0] += 1.0
            manager.on_step_end()
        assert manager.stats.late_reports == 1
        assert manager.tracked_sizes()["abandoned_jobs"] == 0
    finally:
        manager.shutdown()


# ------------------------------------------------------------------------------- bounded state (MGR-18)


def test_a_million_failed_promotions_leave_bounded_state() -> None:
    """MGR-18: 1,000,000 one-off failed promotions; every map of the manager stays within its bound."""
    per_step = 10_000
    primary = MemoryPrimaryTier(num_slots=per_step, block_bytes=1)
    manager = TieringManager(
        primary, [ClaimsEverythingFailsLoads(stores_succeed=False)],
        config=TieringConfig(negative_verdict_steps=8, max_tracked_keys=50_000),
    )
    peak: dict[str, int] = {}
    try:
        for step in range(100):
            base = step * per_step
            for i in range(base, base + per_step):
                manager.lookup(make_key(i.to_bytes(8, "big"), 0), R1)
            manager.on_step_end()
            manager.on_step_end()
            for name, size in manager.tracked_sizes().items():
                peak[name] = max(peak.get(name, 0), size)
        assert manager.stats.promotions_failed == 1_000_000
        assert peak["negative_verdicts"] <= 50_000
        assert peak["promotions"] <= per_step and peak["jobs_in_flight"] <= 1
        assert manager.tracked_sizes()["negative_verdicts"] <= 8 * per_step
    finally:
        manager.shutdown()


# ------------------------------------------------------------------------------- bad input (MGR-11)


def test_bad_construction_is_a_configuration_error() -> None:
    primary = MemoryPrimaryTier(num_slots=2, block_bytes=BLOCK)
    with pytest.raises(ConfigurationError, match="secondaries"):
        TieringManager(primary, None)  # type: ignore[arg-type]  # deliberately wrong
    with pytest.raises(ConfigurationError, match="config"):
        TieringManager(primary, [], config={"strict": True})  # type: ignore[arg-type]  # deliberately wrong
    with pytest.raises(ConfigurationError, match="job_deadline_steps"):
        TieringConfig(job_deadline_steps=0)


def test_a_bad_context_reserves_nothing() -> None:
    primary = MemoryPrimaryTier(num_slots=2, block_bytes=BLOCK)
    manager = TieringManager(primary, [MemoryTier(primary.buffer, name="m")])
    try:
        with pytest.raises(InvalidArgumentError, match="req_context"):
            manager.prepare_store([key(1)], "r1")  # type: ignore[arg-type]  # deliberately wrong
        assert primary.free_slots == 2 and not manager.has_pending_work()
    finally:
        manager.shutdown()


def test_a_failing_primary_in_prepare_load_is_a_typed_error_and_complete_load_never_raises() -> None:
    primary = FaultyPrimary(MemoryPrimaryTier(num_slots=2, block_bytes=BLOCK))
    manager = TieringManager(primary, [])
    try:
        _store(manager, primary.inner, key(1), block(1))
        primary.raise_in("prepare_load", OSError("bus error"))
        primary.raise_in("complete_load", OSError("bus error"))
        with pytest.raises(TierError, match="prepare_load"):
            manager.prepare_load([key(1)], R1)
        manager.complete_load([key(1)])  # logged and counted, not raised
        assert manager.stats.tier_errors == 2
    finally:
        manager.shutdown()


# ------------------------------------------------------------------------------- behaviour (MGR-19)


class Recording(ForwardingTier):
    def __init__(self, inner: MemoryTier) -> None:
        super().__init__(inner)
        self.calls: list[tuple[str, object]] = []

    def touch(self, keys: object) -> None:
        self.calls.append(("touch", tuple(keys)))  # type: ignore[arg-type]  # an iterable of keys
        super().touch(keys)  # type: ignore[arg-type]  # as given

    def submit_store(self, job: TransferJob) -> None:
        self.calls.append(("submit_store", job.req_id))
        super().submit_store(job)

    def on_request_finished(self, req_context: ReqContext) -> None:
        self.calls.append(("on_request_finished", req_context.req_id))
        super().on_request_finished(req_context)


def test_touch_reaches_every_secondary() -> None:
    primary = MemoryPrimaryTier(num_slots=2, block_bytes=BLOCK)
    recording = Recording(MemoryTier(primary.buffer, name="m"))
    manager = TieringManager(primary, [recording])
    try:
        manager.touch(iter([key(1), key(2)]))  # an iterator: every tier sees every key
        assert recording.calls == [("touch", (key(1), key(2)))]
    finally:
        manager.shutdown()


def test_a_secondary_hears_a_request_finish_after_its_last_write_through() -> None:
    """MGR-7: a store completed after its request finished is written through under the request's id,
    and only then does the secondary hear on_request_finished."""
    primary = MemoryPrimaryTier(num_slots=4, block_bytes=BLOCK)
    recording = Recording(MemoryTier(primary.buffer, name="m"))
    manager = TieringManager(primary, [recording])
    try:
        out = manager.prepare_store([key(1)], R1)
        assert out is not None
        manager.on_request_finished(R1)
        assert recording.calls == []  # the request still has a store in flight
        primary.slot_view(out.slots[0])[:] = block(1)
        manager.complete_store(out.keys_to_store, True)
        assert recording.calls == [("submit_store", "r1"), ("on_request_finished", "r1")]
        assert manager.tracked_sizes()["requests_finishing"] == 0
    finally:
        manager.shutdown()


def test_events_nobody_takes_stay_bounded() -> None:
    """MGR-18: the reference tiers keep at most 65,536 untaken events, dropping the oldest."""
    primary = MemoryPrimaryTier(num_slots=1, block_bytes=1)
    memory = MemoryTier(primary.buffer, name="m", capacity_blocks=1)
    for i in range(70_000):
        k = make_key(i.to_bytes(8, "big"), 0)
        out = primary.prepare_store([k], R1)  # evicts the previous block: REMOVED + STORED
        assert out is not None
        primary.complete_store(out.keys_to_store, True)
        memory.submit_store(TransferJob(i, (k,), (0,), promotion=False))
    memory.get_finished_jobs()
    newest = make_key((69_999).to_bytes(8, "big"), 0)
    for tier in (primary, memory):
        events = list(tier.take_events())
        assert len(events) == 65_536
        assert newest in events[-1].keys or newest in events[-2].keys  # the newest are kept
        assert list(tier.take_events()) == []
