"""Liveness of the tiering manager: every deferral ends (MGR-9, MGR-10, AP-5).

Each test drives the scheduler's loop (scan, defer, next step) with a step
bound; without the guarantee under test the loop would defer forever.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import pytest

from kvproto import (
    AsyncProbe,
    Defer,
    Hits,
    LookupResult,
    MemoryTier,
    OffloadKey,
    ReqContext,
    TieringConfig,
    TieringManager,
    make_key,
    maximal_prefix_lookup,
    sliding_window_lookup,
)

from tests.kvproto.tiering_stack import ClaimsEverythingFailsLoads, RaisingTier, Stack, block, build_stack, key

R1 = ReqContext("r1")
STEP_BOUND = 100

pytestmark = pytest.mark.usefixtures("no_thread_leak")


def steps_until_decided(
    manager: TieringManager, keys: list[OffloadKey], *, tick: object = None
) -> tuple[int, Hits]:
    """Run scan/defer/step until the scan decides; fail the test past STEP_BOUND steps."""
    for step in range(STEP_BOUND):
        decision = maximal_prefix_lookup(lambda k: manager.lookup(k, R1), keys)
        if isinstance(decision, Hits):
            return step, decision
        assert isinstance(decision, Defer)
        manager.on_step_end()
        if callable(tick):
            tick()
    pytest.fail(f"the scan was still deferred after {STEP_BOUND} steps")


def test_failed_promotion_is_not_repeated_every_step(stacks: list[Stack]) -> None:
    """MGR-9: a failed promotion leaves a negative verdict, so a lying tier cannot livelock the scan."""
    s = build_stack(latencies=())
    stacks.append(s)
    liar = ClaimsEverythingFailsLoads()
    m = TieringManager(s.cpu, [liar], config=TieringConfig(negative_verdict_steps=50))
    s.extra_managers.append(m)
    taken, decision = steps_until_decided(m, [key(1), key(2)])
    assert decision == Hits(0)
    assert taken <= 3
    for _ in range(40):  # keep asking: still no new promotion within the verdict's lifetime
        maximal_prefix_lookup(lambda k: m.lookup(k, R1), [key(1), key(2)])
        m.on_step_end()
    assert liar.loads == 1
    assert m.stats.promotions_failed == 2


def test_negative_verdict_expires_and_is_cleared_by_a_store(stacks: list[Stack]) -> None:
    """MGR-9: the verdict lasts negative_verdict_steps steps or until the key is written there again."""
    s = build_stack(latencies=({},), config=TieringConfig(negative_verdict_steps=3))
    stacks.append(s)
    m = s.manager
    tier = s.tiers[0]
    tier.seed(key(1), block(1))
    tier.fail_keys([key(1)])
    steps_until_decided(m, [key(1)])
    tier._job_faults.keys.clear()  # the fault goes away
    assert m.lookup(key(1), R1) is LookupResult.MISS  # negative verdict still holds
    for _ in range(3):
        m.on_step_end()
    assert m.lookup(key(1), R1) is LookupResult.RETRY  # expired: promoted again
    steps_until_decided(m, [key(1)])
    assert s.read(key(1)) == block(1)
    # A fresh negative verdict is cleared when a write-through stores the key there again.
    tier.seed(key(2), block(2))
    tier.corrupt_on_read([key(2)])
    steps_until_decided(m, [key(2)])
    assert m.lookup(key(2), R1) is LookupResult.MISS
    assert s.store(key(2), block(2), R1)  # written through to mem0 again
    m.on_step_end()
    m.on_step_end()
    assert tier.read_stored(key(2)) == block(2)
    assert s.cpu.reset_cache()  # drop the primary copies behind the manager's back
    assert m.lookup(key(2), R1) is LookupResult.RETRY  # verdict cleared: promoted from mem0


def test_probe_deadline_ends_a_hung_existence_check(stacks: list[Stack]) -> None:
    """AP-5, MGR-9: a tier whose existence check hangs answers MISS after its deadline."""
    s = build_stack(latencies=())
    stacks.append(s)
    gate = threading.Event()
    data = MemoryTier(s.cpu.buffer, name="data")

    def hung_check(keys: Sequence[OffloadKey]) -> list[OffloadKey]:
        gate.wait()
        return list(keys)

    probe = AsyncProbe(hung_check, name="hung", deadline_steps=4)

    class HungLookupTier(ClaimsEverythingFailsLoads):
        name = "hung"

        def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
            return probe.lookup(key, req_context)

        def on_step_end(self) -> None:
            probe.on_step_end()

        def shutdown(self) -> None:
            gate.set()
            probe.shutdown()

    m = TieringManager(s.cpu, [HungLookupTier()])
    s.extra_managers.append(m)
    try:
        taken, decision = steps_until_decided(m, [key(1)])
        assert decision == Hits(0)
        assert taken == 4
    finally:
        gate.set()
        probe.shutdown()
        data.shutdown()


def test_primary_deadline_ends_a_promotion_that_never_finishes(stacks: list[Stack]) -> None:
    """MGR-3, MGR-9: HIT_PENDING of a hung load ends with the primary's pending deadline; never re-promoted."""
    s = build_stack(latencies=({"job_steps": 10**9},), pending_deadline_s=5.0)
    stacks.append(s)
    s.tiers[0].seed(key(1), block(1))
    m = s.manager

    def tick() -> None:
        s.clock.now += 1.0

    taken, decision = steps_until_decided(m, [key(1)], tick=tick)
    assert decision == Hits(0)
    assert 5 <= taken <= 7
    assert m.stats.promotion_jobs == 1  # the key was not promoted a second time
    assert m.lookup(key(1), R1) is LookupResult.MISS
    assert s.cpu.quarantined_slots == 1  # the hung load may still land in its slot
    m.shutdown()  # the hung job is settled as failed; its late completion frees the slot
    assert m.promotions_in_flight() == {}
    assert s.cpu.quarantined_slots == 0


def test_tier_raising_everywhere_never_reaches_the_scheduler(
    stacks: list[Stack], caplog: pytest.LogCaptureFixture
) -> None:
    """MGR-10: a tier raising in every method becomes MISS / failed jobs, logged with its name."""
    s = build_stack(latencies=({},))
    stacks.append(s)
    raiser = RaisingTier(MemoryTier(s.cpu.buffer, name="inner"))
    m = TieringManager(s.cpu, [raiser, s.tiers[0]])
    s.extra_managers.append(m)
    s.tiers[0].seed(key(1), block(1))
    with caplog.at_level(logging.WARNING, logger="kvproto.tiering"):
        taken, decision = steps_until_decided(m, [key(1), key(2)])
        assert decision == Hits(1)  # key(1) promoted from the healthy tier
        assert s.store(key(3), block(3), R1, via=m)
        m.on_step_end()
        m.on_step_end()
        assert s.cpu.pin_count(key(3)) == 0  # the raising tier's pin was released
        assert s.tiers[0].read_stored(key(3)) == block(3)
        m.touch([key(1)])
        m.take_events()
        m.has_pending_work()
        m.on_request_finished(R1)
        assert not m.reset_cache()  # the raising tier cannot reset
        m.shutdown()
    assert "'raiser'" in caplog.text
    for method in ("lookup", "submit_store", "on_step_end", "on_request_finished", "shutdown"):
        assert method in raiser.calls
        assert f"in {method}" in caplog.text


def test_tier_raising_in_submit_load_fails_the_promotion(stacks: list[Stack]) -> None:
    """MGR-10, MGR-9: submit_load raising is a failed promotion: slot freed, no livelock."""
    s = build_stack(latencies=({},))
    stacks.append(s)
    inner = s.tiers[0]
    inner.seed(key(1), block(1))
    raiser = RaisingTier(inner, failing=lambda name: name == "submit_load")
    m = TieringManager(s.cpu, [raiser])
    s.extra_managers.append(m)
    taken, decision = steps_until_decided(m, [key(1)])
    assert decision == Hits(0)
    assert raiser.calls.count("submit_load") == 1
    assert s.cpu.lookup(key(1), R1) is LookupResult.MISS


def test_window_scan_terminates_over_failing_promotions(stacks: list[Stack]) -> None:
    """MGR-9: the sliding-window scan also decides in bounded steps when promotions fail."""
    s = build_stack(latencies=({},))
    stacks.append(s)
    tier = s.tiers[0]
    for i in range(6):
        tier.seed(key(i), block(i))
    tier.fail_keys([key(4)])
    m = s.manager
    keys = [key(i) for i in range(6)]
    for _ in range(STEP_BOUND):
        decision = sliding_window_lookup(lambda k: m.lookup(k, R1), keys, 2)
        if isinstance(decision, Hits):
            break
        m.on_step_end()
    else:
        pytest.fail("window scan still deferred")
    assert decision == Hits(4)  # keys 2..3 are the rightmost full window before key(4)


@pytest.mark.parametrize("hold_steps", [2, 0])
def test_two_requests_exceeding_the_primary_do_not_evict_each_others_promotions_forever(hold_steps: int) -> None:
    """MGR-9: two prefixes that together exceed the primary (25 + 16 blocks over 32 slots), scanned in a
    fixed order every step. Without the promotion hold each request's promotions evict the other's
    just-promoted blocks before they are loaded, for ever (found by `kvproto simulate`)."""
    from kvproto import MemoryPrimaryTier

    cpu = MemoryPrimaryTier(num_slots=32, block_bytes=16)
    mem = MemoryTier(cpu.buffer, name="mem")
    manager = TieringManager(cpu, [mem], config=TieringConfig(promotion_hold_steps=hold_steps))
    prompts: dict[str, list[OffloadKey]] = {}
    try:
        for name, blocks, resident in (("A", 25, 13), ("B", 16, 11)):
            keys = [make_key(b"%s%d" % (name.encode(), i), 0) for i in range(blocks)]
            for k in keys:
                mem.seed(k, bytes(16))
            out = manager.prepare_store(keys[:resident], ReqContext("earlier"))
            assert out is not None
            manager.complete_store(out.keys_to_store, True)
            prompts[name] = [*keys, make_key(name.encode() + b"-new", 0)]
        for _ in range(3):
            manager.on_step_end()
        contexts = {name: ReqContext(name) for name in prompts}
        decided: dict[str, int] = {}
        for step in range(1, 61):
            for name, keys in prompts.items():
                if name in decided:
                    continue
                context = contexts[name]

                def ask(k: OffloadKey, context: ReqContext = context) -> LookupResult:
                    return manager.lookup(k, context)

                decision = maximal_prefix_lookup(ask, keys)
                if isinstance(decision, Hits):
                    decided[name] = step
                    if decision.count:
                        manager.prepare_load(keys[: decision.count], contexts[name])
                        manager.complete_load(keys[: decision.count])
            manager.on_step_end()
        if hold_steps:
            assert set(decided) == {"A", "B"}, f"still deferred after 60 steps: {sorted(set(prompts) - set(decided))}"
        else:
            assert set(decided) != {"A", "B"}  # the livelock the hold prevents (keeps this test honest)
    finally:
        manager.shutdown()
