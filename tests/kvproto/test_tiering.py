"""TieringManager scenarios over the CPU tier and MemoryTier secondaries (MGR-1..MGR-14)."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import pytest

from kvproto import (
    EventKind,
    Hits,
    LookupResult,
    OffloadingManager,
    OffloadKey,
    ReqContext,
    TieringConfig,
    TieringManager,
    maximal_prefix_lookup,
)
from kvproto.errors import ConfigurationError, ContractViolation, TierMisuseError

from tests.kvproto.tiering_stack import (
    BLOCK,
    R1,
    RecordingTier,
    Stack,
    block,
    build_stack,
    key,
)

R2 = ReqContext("r2")


def make(stacks: list[Stack], **kwargs: object) -> Stack:
    s = build_stack(**kwargs)  # type: ignore[arg-type]  # test knobs
    stacks.append(s)
    return s


def test_manager_is_an_offloading_manager(stacks: list[Stack]) -> None:
    """MGR-1: TieringManager satisfies OffloadingManager (mypy checks this annotation)."""
    s = make(stacks)
    manager: OffloadingManager = s.manager
    assert isinstance(manager, OffloadingManager)


def test_promotion_answers_retry_then_hit_after_two_steps(stacks: list[Stack]) -> None:
    """MGR-2, MGR-3, MGR-4: RETRY now, HIT_PENDING after one step, HIT with the right bytes after two."""
    s = make(stacks)
    s.tiers[1].seed(key(1), block(1))
    m = s.manager
    assert m.lookup(key(1), R1) is LookupResult.RETRY
    assert m.promotions_in_flight() == {key(1): "mem1"}
    m.on_step_end()
    assert m.lookup(key(1), R1) is LookupResult.HIT_PENDING
    m.on_step_end()
    assert m.lookup(key(1), R1) is LookupResult.HIT
    assert s.read(key(1)) == block(1)
    assert m.promotions_in_flight() == {}
    assert m.stats.promotion_jobs == 1


def test_second_request_gets_hit_pending_and_no_second_job(stacks: list[Stack]) -> None:
    """MGR-3: a key being promoted is HIT_PENDING for every other request; one load job only."""
    s = make(stacks)
    s.tiers[0].seed(key(1), block(1))
    m = s.manager
    assert m.lookup(key(1), R1) is LookupResult.RETRY
    assert m.lookup(key(1), R2) is LookupResult.HIT_PENDING
    assert m.lookup(key(1), R1) is LookupResult.HIT_PENDING
    m.on_step_end()
    m.on_step_end()
    assert m.stats.promotion_jobs == 1
    assert m.stats.promotions_started == 1
    assert m.lookup(key(1), R2) is LookupResult.HIT


def test_two_requests_promotions_yield_two_jobs_at_step_end(stacks: list[Stack]) -> None:
    """MGR-3: one submit_load per (tier, request) per step, submitted at the end-of-step hook."""
    s = make(stacks)
    for i in range(4):
        s.tiers[0].seed(key(i), block(i))
    m = s.manager
    assert maximal_prefix_lookup(lambda k: m.lookup(k, R1), [key(0), key(1)]) != Hits(2)
    assert maximal_prefix_lookup(lambda k: m.lookup(k, R2), [key(2), key(3)]) != Hits(2)
    assert m.stats.promotion_jobs == 0  # staged, not yet submitted
    assert m.has_pending_work()
    m.on_step_end()
    assert m.stats.promotion_jobs == 2
    m.on_step_end()
    for i in range(4):
        assert s.read(key(i)) == block(i)


def test_write_through_reaches_every_tier_and_releases_pins(stacks: list[Stack]) -> None:
    """MGR-5, MGR-6: each tier's job pins the primary block; pins drop after the jobs end."""
    s = make(stacks, latencies=({"job_steps": 1}, {"job_steps": 2}))
    m = s.manager
    assert s.store(key(7), block(7), R1)
    assert s.cpu.pin_count(key(7)) == 2  # one pin per secondary tier
    m.on_step_end()  # submitted; mem0 runs its job at this hook
    assert s.cpu.pin_count(key(7)) == 2
    m.on_step_end()  # mem0's result collected; mem1 runs its job
    assert s.cpu.pin_count(key(7)) == 1
    m.on_step_end()
    assert s.cpu.pin_count(key(7)) == 0
    for tier in s.tiers:
        assert tier.read_stored(key(7)) == block(7)
    assert not m.has_pending_work()
    kinds = {(e.tier, e.kind) for e in m.take_events()}
    assert kinds == {("cpu", EventKind.STORED), ("mem0", EventKind.STORED), ("mem1", EventKind.STORED)}


def test_write_through_failure_still_releases_pin(stacks: list[Stack]) -> None:
    """MGR-6: a failed write-through job releases its pin too."""
    s = make(stacks)
    s.tiers[0].fail_next_jobs(1)
    s.tiers[1].fail_keys([key(3)])
    assert s.store(key(3), block(3), R1)
    s.manager.on_step_end()
    s.manager.on_step_end()
    assert s.cpu.pin_count(key(3)) == 0
    assert all(t.read_stored(key(3)) is None for t in s.tiers)
    assert s.manager.stats.write_throughs_failed == 2


def test_failed_store_writes_nothing_through(stacks: list[Stack]) -> None:
    """MGR-5: complete_store(success=False) reaches no secondary."""
    s = make(stacks)
    assert s.store(key(2), block(2), R1, success=False)
    s.manager.on_step_end()
    s.manager.on_step_end()
    assert s.manager.stats.write_through_jobs == 0
    assert all(t.stored_keys() == frozenset() for t in s.tiers)
    assert s.manager.lookup(key(2), R1) is LookupResult.MISS


def test_request_finished_reaches_tier_after_its_write_throughs(stacks: list[Stack]) -> None:
    """MGR-7: on_request_finished reaches a secondary only after that request's staged jobs."""
    s = make(stacks, latencies=())
    log: list[str] = []
    from kvproto import MemoryTier

    inner = MemoryTier(s.cpu.buffer, name="rec")
    m = TieringManager(s.cpu, [RecordingTier(inner, log)])
    try:
        out = m.prepare_store([key(1)], R1)
        assert out is not None
        m.complete_store(out.keys_to_store, True)
        m.on_request_finished(R1)
        assert log == ["submit_store:r1", "on_request_finished:r1"]
        m.on_step_end()
        assert inner.read_stored(key(1)) is not None
        assert s.cpu.pin_count(key(1)) == 0
    finally:
        m.shutdown()


def test_reset_drops_staged_promotions(stacks: list[Stack]) -> None:
    """MGR-13: reset_cache drops staged promotions (reservation failed, no job submitted)."""
    s = make(stacks)
    s.tiers[0].seed(key(1), block(1))
    m = s.manager
    assert m.lookup(key(1), R1) is LookupResult.RETRY
    assert m.reset_cache()
    assert m.promotions_in_flight() == {}
    assert s.cpu.lookup(key(1), R1) is LookupResult.MISS
    m.on_step_end()
    assert m.stats.promotion_jobs == 0
    assert m.lookup(key(1), R1) is LookupResult.MISS  # the tier forgot it too
    assert not m.has_pending_work()


def test_reset_refuses_while_jobs_in_flight(stacks: list[Stack]) -> None:
    """MGR-13: reset_cache answers False and changes nothing while a job is in flight."""
    s = make(stacks, latencies=({"job_steps": 3},))
    s.tiers[0].seed(key(1), block(1))
    m = s.manager
    assert m.lookup(key(1), R1) is LookupResult.RETRY
    m.on_step_end()
    assert not m.reset_cache()
    assert m.promotions_in_flight() == {key(1): "mem0"}


def test_no_slot_answers_miss(stacks: list[Stack]) -> None:
    """MGR-2: a secondary HIT with no primary slot to reserve is a MISS."""
    s = make(stacks, num_slots=1)
    s.tiers[0].seed(key(1), block(1))
    s.tiers[0].seed(key(2), block(2))
    m = s.manager
    assert m.lookup(key(1), R1) is LookupResult.RETRY  # takes the only slot (WRITING, not evictable)
    assert m.lookup(key(2), R1) is LookupResult.MISS


def test_secondary_retry_is_retry_then_resolves(stacks: list[Stack]) -> None:
    """MGR-2: no HIT but a RETRY below answers RETRY; a MISS everywhere answers MISS."""
    s = make(stacks, latencies=({"lookup_steps": 1}, {}))
    s.tiers[0].seed(key(1), block(1))
    m = s.manager
    assert m.lookup(key(1), R1) is LookupResult.RETRY
    assert m.lookup(key(9), R1) is LookupResult.RETRY
    m.on_step_end()
    assert m.lookup(key(1), R1) is LookupResult.RETRY  # now a promotion
    assert m.lookup(key(9), R1) is LookupResult.MISS
    m.on_step_end()
    m.on_step_end()
    assert m.lookup(key(1), R1) is LookupResult.HIT


def test_partial_promotion_readies_succeeded_keys_only(stacks: list[Stack]) -> None:
    """MGR-4: a partial JobResult readies the keys that succeeded and fails the rest."""
    s = make(stacks, latencies=({},))
    for i in (1, 2):
        s.tiers[0].seed(key(i), block(i))
    s.tiers[0].fail_keys([key(2)])
    m = s.manager
    assert maximal_prefix_lookup(lambda k: m.lookup(k, R1), [key(1), key(2)]) != Hits(2)
    m.on_step_end()
    m.on_step_end()
    assert m.lookup(key(1), R1) is LookupResult.HIT
    assert s.read(key(1)) == block(1)
    assert s.cpu.lookup(key(2), R1) is LookupResult.MISS
    assert m.lookup(key(2), R1) is LookupResult.MISS
    assert m.stats.promotions_failed == 1


def test_corrupted_block_is_never_served(stacks: list[Stack]) -> None:
    """MGR-4, MEM-6: a block failing its checksum is a failed promotion, then a MISS."""
    s = make(stacks, latencies=({},))
    s.tiers[0].seed(key(1), block(1))
    s.tiers[0].corrupt_on_read([key(1)])
    m = s.manager
    assert m.lookup(key(1), R1) is LookupResult.RETRY
    m.on_step_end()
    m.on_step_end()
    assert m.lookup(key(1), R1) is LookupResult.MISS
    assert s.cpu.lookup(key(1), R1) is LookupResult.MISS


class _PendingSecondary(RecordingTier):
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return LookupResult.HIT_PENDING


def test_secondary_hit_pending_is_a_contract_violation(stacks: list[Stack]) -> None:
    """MGR-8: a secondary's HIT_PENDING raises in strict mode, else is a counted MISS."""
    s = make(stacks, latencies=())
    from kvproto import MemoryTier

    bad = _PendingSecondary(MemoryTier(s.cpu.buffer, name="bad"), [])
    strict = TieringManager(s.cpu, [bad], config=TieringConfig(strict=True))
    with pytest.raises(ContractViolation, match="'bad' answered HIT_PENDING"):
        strict.lookup(key(1), R1)
    lax = TieringManager(s.cpu, [bad])
    assert lax.lookup(key(1), R1) is LookupResult.MISS
    assert lax.stats.contract_violations == 1
    strict.shutdown()
    lax.shutdown()


def test_primary_retry_is_a_contract_violation(stacks: list[Stack]) -> None:
    """MGR-8: the primary's RETRY (or a non-LookupResult) is a violation; lax mode asks below."""
    s = make(stacks, latencies=({},))
    s.tiers[0].seed(key(1), block(1))
    answers: list[object] = [LookupResult.RETRY, None]
    real = s.cpu.lookup

    def odd_lookup(k: OffloadKey, req: ReqContext) -> LookupResult:
        if answers:
            return answers.pop(0)  # type: ignore[return-value]  # deliberately broken tier
        return real(k, req)

    s.cpu.lookup = odd_lookup  # type: ignore[method-assign, assignment]  # patch the instance
    strict = TieringManager(s.cpu, s.tiers, config=TieringConfig(strict=True))
    with pytest.raises(ContractViolation, match="answered RETRY"):
        strict.lookup(key(1), R1)
    with pytest.raises(ContractViolation, match="None"):
        strict.lookup(key(1), R1)
    answers.extend([LookupResult.RETRY])
    lax = TieringManager(s.cpu, s.tiers)
    assert lax.lookup(key(1), R1) is LookupResult.RETRY  # promotion from mem0
    assert lax.stats.contract_violations == 1
    lax.shutdown()


def test_scheduler_misuse_of_the_primary_passes_through(stacks: list[Stack]) -> None:
    """MGR-11: the primary's typed errors for the caller's misuse reach the caller."""
    s = make(stacks)
    with pytest.raises(TierMisuseError):
        s.manager.complete_store([key(5)], True)
    with pytest.raises(TierMisuseError):
        s.manager.prepare_load([key(5)], R1)
    s.tiers[0].seed(key(6), block(6))
    assert s.manager.lookup(key(6), R1) is LookupResult.RETRY
    with pytest.raises(TierMisuseError, match="being promoted"):
        s.manager.complete_store([key(6)], True)  # would serve an unfilled slot
    assert s.cpu.lookup(key(6), R1) is LookupResult.HIT_PENDING  # nothing changed


def test_bad_configuration_is_a_typed_error(stacks: list[Stack]) -> None:
    """MGR-9: bad configuration and duplicate tier names raise ConfigurationError."""
    with pytest.raises(ConfigurationError, match="negative_verdict_steps"):
        TieringConfig(negative_verdict_steps=0)
    with pytest.raises(ConfigurationError, match="strict"):
        TieringConfig(strict=1)  # type: ignore[arg-type]  # deliberately wrong
    s = make(stacks)
    with pytest.raises(ConfigurationError, match="used twice"):
        TieringManager(s.cpu, [s.tiers[0], s.tiers[0]])
    with pytest.raises(ConfigurationError, match="PrimaryTier"):
        TieringManager(object(), [])  # type: ignore[arg-type]  # deliberately wrong


def test_take_events_collects_tier_events_only(stacks: list[Stack]) -> None:
    """MGR-12: events come from the tiers; the manager invents none."""
    s = make(stacks)
    s.tiers[0].seed(key(1), block(1))
    m = s.manager
    assert m.take_events() == []
    m.lookup(key(1), R1)
    m.on_step_end()
    m.on_step_end()
    events = m.take_events()
    assert [(e.tier, e.kind, e.keys) for e in events] == [("cpu", EventKind.STORED, (key(1),))]
    assert m.take_events() == []


def test_shutdown_settles_jobs_in_flight(stacks: list[Stack]) -> None:
    """MGR-14: shutdown fails staged and unfinished promotions; nothing stays pending or pinned."""
    s = make(stacks, latencies=({"job_steps": 5},))
    for i in (1, 2):
        s.tiers[0].seed(key(i), block(i))
    m = s.manager
    assert m.lookup(key(1), R1) is LookupResult.RETRY
    m.on_step_end()  # key(1)'s job submitted, not finished
    assert m.lookup(key(2), R1) is LookupResult.RETRY  # staged only
    assert s.store(key(3), block(3), R1)  # write-through staged, pinned
    m.shutdown()
    assert m.promotions_in_flight() == {}
    assert not m.has_pending_work()
    assert s.cpu.pin_count(key(3)) == 0
    for i in (1, 2):
        assert s.cpu.lookup(key(i), R1) is LookupResult.MISS
    m.shutdown()  # idempotent


def test_bytes_round_trip_through_both_tiers(stacks: list[Stack]) -> None:
    """MGR-5, MGR-2: a block written through, evicted from the primary, comes back byte-exact."""
    s = make(stacks, num_slots=2)
    m = s.manager
    for i in range(2):
        assert s.store(key(i), block(i), R1)
    m.on_step_end()
    m.on_step_end()
    for i in (2, 3):  # evicts key(0) and key(1) from the primary
        assert s.store(key(i), block(i), R1)
    m.on_step_end()
    m.on_step_end()
    assert s.cpu.lookup(key(0), R1) is LookupResult.MISS
    assert m.lookup(key(0), R1) is LookupResult.RETRY
    m.on_step_end()
    m.on_step_end()
    assert m.lookup(key(0), R1) is LookupResult.HIT
    assert s.read(key(0)) == block(0)
    assert len(block(0)) == BLOCK


def test_tier_errors_are_logged_with_the_tier_name(
    stacks: list[Stack], caplog: pytest.LogCaptureFixture
) -> None:
    """MGR-10: see also test_tiering_liveness; here the log line names the tier."""
    s = make(stacks, latencies=({},))

    def boom(k: OffloadKey, req: ReqContext) -> LookupResult:
        raise OSError("disk gone")

    s.tiers[0].lookup = boom  # type: ignore[method-assign, assignment]  # patch the instance
    m = TieringManager(s.cpu, s.tiers)  # binds the patched method
    with caplog.at_level(logging.WARNING, logger="kvproto.tiering"):
        assert m.lookup(key(1), R1) is LookupResult.MISS
    assert "'mem0'" in caplog.text and "disk gone" in caplog.text
    assert m.stats.tier_errors == 1
    m.shutdown()


def test_ready_keys_fast_path_answers_like_the_primary(stacks: list[Stack]) -> None:
    """MGR-15: with a ReadyKeys view, primary HITs skip the lookup call; other answers are unchanged."""
    from kvproto import MemoryPrimaryTier, MemoryTier, ReadyKeys

    from tests.kvproto.tiering_stack import FakeClock

    cpu = MemoryPrimaryTier(num_slots=2, block_bytes=BLOCK, clock=FakeClock())
    view: ReadyKeys = cpu  # mypy proves MemoryPrimaryTier offers the view
    assert isinstance(view, ReadyKeys)
    calls: list[OffloadKey] = []
    real = cpu.lookup

    def counting(key: OffloadKey, req_context: ReqContext) -> LookupResult:
        calls.append(key)
        return real(key, req_context)

    cpu.lookup = counting  # type: ignore[method-assign]  # count the calls
    tier = MemoryTier(cpu.buffer, name="m")
    m = TieringManager(cpu, [tier])
    try:
        out = m.prepare_store([key(1)], R1)
        assert out is not None
        assert m.lookup(key(1), R1) is LookupResult.HIT_PENDING  # WRITING: not in the view
        m.complete_store(out.keys_to_store, True)
        calls.clear()
        assert m.lookup(key(1), R1) is LookupResult.HIT
        assert calls == []  # answered from the view
        m.on_step_end()
        m.on_step_end()
        for i in (2, 3):  # evicts key(1) from the 2-slot primary
            out = m.prepare_store([key(i)], R1)
            assert out is not None
            m.complete_store(out.keys_to_store, True)
        m.on_step_end()
        m.on_step_end()  # the write-throughs end and release their pins
        assert m.lookup(key(1), R1) is LookupResult.RETRY  # gone from the view: promoted from m
    finally:
        m.shutdown()
        tier.shutdown()


def test_refused_batch_completion_is_settled_key_by_key(stacks: list[Stack]) -> None:
    """MGR-4, MGR-10: if the primary refuses a promotion batch, each key is settled on its own."""
    from kvproto import MemoryPrimaryTier, MemoryTier

    poison = key(2)

    class Refusing(MemoryPrimaryTier):
        def complete_store(self, keys: Iterable[OffloadKey], success: bool) -> None:
            batch = tuple(keys)
            if poison in batch:
                raise TierMisuseError("refused", key=poison)
            super().complete_store(batch, success)

    cpu = Refusing(num_slots=4, block_bytes=BLOCK)
    tier = MemoryTier(cpu.buffer, name="m")
    m = TieringManager(cpu, [tier])
    try:
        for i in (1, 2, 3):
            tier.seed(key(i), block(i))
        assert maximal_prefix_lookup(lambda k: m.lookup(k, R1), [key(1), key(2), key(3)]) != Hits(3)
        m.on_step_end()
        m.on_step_end()
        assert m.stats.promotion_jobs == 1
        assert m.lookup(key(1), R1) is LookupResult.HIT
        assert m.lookup(key(3), R1) is LookupResult.HIT
        assert cpu.lookup(key(2), R1) is LookupResult.HIT_PENDING  # left to the pending deadline
        assert m.stats.tier_errors == 2  # the refused key, as success and then as failure
    finally:
        m.shutdown()
        tier.shutdown()
