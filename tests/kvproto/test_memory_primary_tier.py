"""MemoryPrimaryTier: the torch-free reference primary tier (TIER-3..TIER-17, mirroring CPU-3..CPU-10).

Three parts: the whole primary conformance kit run against it; unit tests of
each transition, edge case and misuse error; and a state machine against a
dict model with deadlines, late writes landing in quarantined slots, and
eviction in exact LRU order.
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvproto import (
    BatchLookup,
    BlockState,
    Capabilities,
    EventKind,
    LookupResult,
    MemoryPrimaryTier,
    OffloadingEvent,
    OffloadKey,
    PrimaryTier,
    ReadyKeys,
    ReqContext,
    make_key,
    unreachable,
)
from kvproto import members as lr
from kvproto.errors import (
    ConfigurationError,
    InvalidArgumentError,
    InvalidKeyError,
    KvprotoError,
    TierMisuseError,
)
from kvproto.testing import PrimaryTierFactory, PrimaryTierTests

REQ = ReqContext("req-0")
NAME = "memory-primary"


class FakeClock:
    """A monotonic clock the test moves by hand; counts how often it is read."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def key(i: int, group: int = 0) -> OffloadKey:
    return make_key(i.to_bytes(8, "big"), group)


def keys(*ids: int) -> list[OffloadKey]:
    return [key(i) for i in ids]


def make_tier(
    num_slots: int = 4, block_bytes: int = 8, *, deadline: float | None = None
) -> tuple[MemoryPrimaryTier, FakeClock]:
    clock = FakeClock()
    tier = MemoryPrimaryTier(
        num_slots=num_slots, block_bytes=block_bytes, pending_deadline_s=deadline, clock=clock
    )
    return tier, clock


def stored(tier: MemoryPrimaryTier, *ids: int) -> tuple[int, ...]:
    """Store keys ``ids`` (each must be new) and return their slots."""
    out = tier.prepare_store(keys(*ids), REQ)
    assert out is not None and out.keys_to_store == tuple(keys(*ids))
    tier.complete_store(out.keys_to_store, True)
    return out.slots


def answers(tier: MemoryPrimaryTier, ids: Iterable[int]) -> list[LookupResult]:
    return [tier.lookup(key(i), REQ) for i in ids]


# ---------------------------------------------------------------- the conformance kit

# The same capabilities the reference cpu TierSpec declares (kvproto/testing/_reference.py).
CPU_SPEC_CAPABILITIES = Capabilities(
    eviction=True,
    reasons={
        "async_lookup": "a primary tier never answers RETRY",
        "persistence": "host memory",
        "sharing": "one process's buffer",
        "partial_jobs": "stores complete per call",
    },
)


class TestMemoryPrimaryTierConformance(PrimaryTierTests):
    """Every check of the primary conformance kit, against MemoryPrimaryTier."""

    capabilities = CPU_SPEC_CAPABILITIES

    @pytest.fixture
    def tier_factory(self) -> PrimaryTierFactory:
        return lambda: MemoryPrimaryTier(num_slots=32, block_bytes=64)


def test_declared_capabilities_match_the_cpu_spec() -> None:
    tier = MemoryPrimaryTier(num_slots=1, block_bytes=1)
    fields = ("async_lookup", "max_retry_steps", "persistence", "eviction", "sharing", "partial_jobs")
    for field in fields:
        assert getattr(tier.capabilities, field) == getattr(CPU_SPEC_CAPABILITIES, field), field
    assert set(tier.capabilities.reasons) == set(CPU_SPEC_CAPABILITIES.reasons)


# ---------------------------------------------------------------- protocol and buffer (TIER-1, TIER-3)


def test_satisfies_the_primary_protocols_structurally() -> None:
    tier, _ = make_tier()
    as_primary: PrimaryTier = tier  # mypy proves the structure; isinstance checks the names
    as_batch: BatchLookup = tier
    as_ready: ReadyKeys = tier
    assert isinstance(as_primary, PrimaryTier)
    assert isinstance(as_batch, BatchLookup)
    assert isinstance(as_ready, ReadyKeys)
    assert tier.name == NAME
    assert MemoryPrimaryTier(num_slots=1, block_bytes=1, name="hot").name == "hot"


def test_buffer_is_a_writable_2d_byte_view_shared_with_slot_views() -> None:
    tier, _ = make_tier(num_slots=3, block_bytes=8)
    view = tier.buffer
    assert view.format == "B" and view.ndim == 2 and view.shape == (3, 8)
    assert not view.readonly and view.c_contiguous and view.nbytes == 24
    assert tier.buffer.obj is view.obj  # the same memory on every access
    view[2, 5] = 77
    assert tier.slot_view(2)[5] == 77
    tier.slot_view(1)[7] = 3
    assert view[1, 7] == 3 and tier.buffer[1, 7] == 3


def test_buffer_outlives_the_tier() -> None:
    tier, _ = make_tier(num_slots=2, block_bytes=8)
    view = tier.buffer
    del tier
    view[1, 7] = 5
    assert view[1, 7] == 5


@pytest.mark.parametrize("slot", [-1, 4, 99, True, 1.0])
def test_slot_out_of_range_is_misuse(slot: object) -> None:
    tier, _ = make_tier(num_slots=4)
    with pytest.raises(TierMisuseError, match="out of range"):
        tier.check_slot(slot)  # type: ignore[arg-type]  # deliberately wrong input
    with pytest.raises(TierMisuseError, match="out of range"):
        tier.slot_view(slot)  # type: ignore[arg-type]  # deliberately wrong input


# ---------------------------------------------------------------- configuration


def test_defaults() -> None:
    tier = MemoryPrimaryTier(num_slots=5, block_bytes=3)
    assert (tier.num_slots, tier.block_bytes, tier.pending_deadline_s) == (5, 3, None)
    assert tier.free_slots == 5 and tier.quarantined_slots == 0
    assert MemoryPrimaryTier(num_slots=1, block_bytes=1, pending_deadline_s=2).pending_deadline_s == 2.0


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("num_slots", 0),
        ("num_slots", -3),
        ("num_slots", True),
        ("num_slots", 2.0),
        ("num_slots", "8"),
        ("num_slots", None),
        ("block_bytes", 0),
        ("block_bytes", False),
        ("block_bytes", 64.0),
        ("pending_deadline_s", 0),
        ("pending_deadline_s", -1.0),
        ("pending_deadline_s", math.nan),
        ("pending_deadline_s", True),
        ("pending_deadline_s", "5"),
        ("name", ""),
        ("name", 7),
        ("clock", 3.0),
    ],
)
def test_bad_configuration_is_a_configuration_error_naming_the_argument(argument: str, value: object) -> None:
    options: dict[str, object] = {"num_slots": 4, "block_bytes": 8, argument: value}
    with pytest.raises(ConfigurationError, match=argument) as info:
        MemoryPrimaryTier(**options)  # type: ignore[arg-type]  # deliberately wrong input
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, KvprotoError)
    assert repr(value) in str(info.value)


def test_configuration_is_keyword_only() -> None:
    with pytest.raises(TypeError):
        MemoryPrimaryTier(4, 8)  # type: ignore[call-arg]  # deliberately positional


# ---------------------------------------------------------------- states and lookups (CPU-3)


def test_states_absent_writing_ready_pinned() -> None:
    tier, _ = make_tier()
    k = key(1)
    assert tier.state(k) is BlockState.ABSENT and tier.lookup(k, REQ) is lr.MISS
    out = tier.prepare_store([k], REQ)
    assert out is not None and out.keys_to_store == (k,) and out.evicted == ()
    assert tier.state(k) is BlockState.WRITING and tier.lookup(k, REQ) is lr.HIT_PENDING
    assert tier.slot_of(k) == out.slots[0]
    tier.complete_store([k], True)
    assert tier.state(k) is BlockState.READY and tier.lookup(k, REQ) is lr.HIT
    assert tier.prepare_load([k], REQ) == out.slots
    assert tier.state(k) is BlockState.PINNED and tier.lookup(k, REQ) is lr.HIT
    assert tier.pin_count(k) == 1
    tier.complete_load([k])
    assert tier.state(k) is BlockState.READY and tier.pin_count(k) == 0
    assert tier.slot_of(key(2)) is None


def test_keys_differing_only_in_group_are_distinct() -> None:
    tier, _ = make_tier()
    assert tier.prepare_store([key(1, group=0)], REQ) is not None
    tier.complete_store([key(1, group=0)], True)
    assert tier.lookup(key(1, group=0), REQ) is lr.HIT
    assert tier.lookup(key(1, group=1), REQ) is lr.MISS


def test_ready_keys_is_a_live_view_of_the_hits() -> None:
    tier, _ = make_tier(num_slots=2)
    view = tier.ready_keys
    assert tier.prepare_store(keys(1, 2), REQ) is not None
    assert key(1) not in view  # WRITING is HIT_PENDING, not HIT
    tier.complete_store(keys(1, 2), True)
    tier.prepare_load(keys(1), REQ)
    assert key(1) in view and key(2) in view  # PINNED is still HIT
    tier.complete_load(keys(1))
    out = tier.prepare_store(keys(3), REQ)
    assert out is not None and out.evicted == (key(1),)
    assert key(1) not in view and tier.lookup(key(1), REQ) is lr.MISS
    assert tier.reset_cache() is False  # key 3 is WRITING
    tier.complete_store(keys(3), True)
    assert tier.reset_cache() is True
    assert key(2) not in view and key(3) not in view


def test_lookup_many_matches_lookup() -> None:
    tier, _ = make_tier()
    stored(tier, 1)
    assert tier.prepare_store(keys(2), REQ) is not None
    assert tier.lookup_many(keys(1, 2, 3), REQ) == [lr.HIT, lr.HIT_PENDING, lr.MISS]
    assert tier.lookup_many(keys(3, 1), REQ) == answers(tier, [3, 1])


def test_lookups_that_hit_or_miss_never_read_the_clock() -> None:
    tier, clock = make_tier(deadline=5.0)
    stored(tier, 1)
    reads = clock.reads
    for _ in range(100):
        assert tier.lookup(key(1), REQ) is lr.HIT
        assert tier.lookup(key(2), REQ) is lr.MISS
    assert clock.reads == reads
    assert tier.prepare_store(keys(3), REQ) is not None
    reads = clock.reads
    assert tier.lookup(key(3), REQ) is lr.HIT_PENDING  # a deadline to check: one read
    assert clock.reads == reads + 1


def test_without_a_deadline_a_write_stays_pending_and_the_clock_is_not_read_on_lookup() -> None:
    tier, clock = make_tier(deadline=None)
    assert tier.prepare_store(keys(1), REQ) is not None
    reads = clock.reads
    clock.advance(1e9)
    tier.on_step_end()
    assert tier.lookup(key(1), REQ) is lr.HIT_PENDING
    assert clock.reads == reads
    tier.complete_store(keys(1), True)
    assert tier.lookup(key(1), REQ) is lr.HIT


# ---------------------------------------------------------------- prepare_store (CPU-4)


def test_prepare_store_skips_present_and_repeated_keys() -> None:
    tier, _ = make_tier()
    stored(tier, 1)
    assert tier.prepare_store(keys(2), REQ) is not None
    out = tier.prepare_store(keys(1, 2, 3, 3), REQ)
    assert out is not None
    assert out.keys_to_store == (key(3),) and len(out.slots) == 1 and out.evicted == ()


def test_prepare_store_with_nothing_to_store_is_empty_not_none() -> None:
    tier, _ = make_tier(num_slots=1)
    stored(tier, 1)
    tier.prepare_load(keys(1), REQ)  # pinned: nothing could be evicted either
    out = tier.prepare_store(keys(1), REQ)
    assert out is not None and out.keys_to_store == () and out.slots == ()
    assert tier.prepare_store([], REQ) == out


def test_slots_are_distinct_ascending_and_in_range() -> None:
    tier, _ = make_tier(num_slots=4)
    out = tier.prepare_store(keys(4, 3, 2, 1), REQ)
    assert out is not None and out.slots == (0, 1, 2, 3)
    assert out.keys_to_store == tuple(keys(4, 3, 2, 1))


def test_eviction_takes_exactly_the_shortfall_in_lru_order() -> None:
    tier, _ = make_tier(num_slots=4)
    stored(tier, 1, 2, 3)
    tier.take_events()
    out = tier.prepare_store(keys(10, 11, 12), REQ)  # 1 free slot, shortfall 2
    assert out is not None
    assert out.evicted == (key(1), key(2))
    assert answers(tier, [1, 2, 3]) == [lr.MISS, lr.MISS, lr.HIT]
    assert tier.take_events() == [OffloadingEvent(EventKind.REMOVED, (key(1), key(2)), NAME)]


def test_touch_updates_recency_and_ignores_unknown_keys() -> None:
    tier, _ = make_tier(num_slots=2)
    stored(tier, 1, 2)
    tier.touch(keys(1, 99))
    out = tier.prepare_store(keys(3), REQ)
    assert out is not None and out.evicted == (key(2),)


def test_a_completed_store_is_most_recently_used() -> None:
    tier, _ = make_tier(num_slots=3)
    stored(tier, 1)
    assert tier.prepare_store(keys(2), REQ) is not None
    stored(tier, 3)
    tier.complete_store(keys(2), True)  # completes last: most recently used
    out = tier.prepare_store(keys(4, 5), REQ)
    assert out is not None and out.evicted == (key(1), key(3))


def test_never_evicts_an_input_key() -> None:
    tier, _ = make_tier(num_slots=2)
    stored(tier, 1, 2)  # 1 is least recently used
    out = tier.prepare_store(keys(1, 3), REQ)
    assert out is not None and out.keys_to_store == (key(3),) and out.evicted == (key(2),)
    assert tier.lookup(key(1), REQ) is lr.HIT


def test_never_evicts_pinned_or_writing_blocks() -> None:
    tier, _ = make_tier(num_slots=3)
    stored(tier, 1, 2)
    tier.prepare_load(keys(1), REQ)
    assert tier.prepare_store(keys(3), REQ) is not None  # WRITING, takes the free slot
    out = tier.prepare_store(keys(4), REQ)
    assert out is not None and out.evicted == (key(2),)
    assert tier.state(key(1)) is BlockState.PINNED and tier.state(key(3)) is BlockState.WRITING
    assert tier.prepare_store(keys(5), REQ) is None  # only pinned and writing blocks left


def test_all_or_nothing_with_a_ready_input_key_on_a_full_tier() -> None:
    tier, _ = make_tier(num_slots=2)
    stored(tier, 1, 2)  # full; 1 is least recently used
    tier.take_events()
    # Two new keys need two victims; key 1 is named in the input, so only key 2 may go.
    assert tier.prepare_store(keys(1, 3, 4), REQ) is None
    assert answers(tier, [1, 2, 3, 4]) == [lr.HIT, lr.HIT, lr.MISS, lr.MISS]
    assert tier.take_events() == [] and tier.free_slots == 0
    assert not tier.has_pending_work()
    # The refusal left the LRU order alone: key 1 is still the first to go.
    out = tier.prepare_store(keys(5), REQ)
    assert out is not None and out.evicted == (key(1),)


def test_all_or_nothing_none_changes_nothing() -> None:
    tier, _ = make_tier(num_slots=3)
    stored(tier, 1, 2)
    tier.prepare_load(keys(1), REQ)
    tier.take_events()
    assert tier.prepare_store(keys(5, 6, 7), REQ) is None  # needs 2 evictions, only 1 possible
    assert answers(tier, [1, 2, 5, 6, 7]) == [lr.HIT, lr.HIT, lr.MISS, lr.MISS, lr.MISS]
    assert tier.take_events() == [] and tier.free_slots == 1


# ---------------------------------------------------------------- complete_store (CPU-4)


def test_completed_store_emits_one_stored_event_in_completion_order() -> None:
    tier, _ = make_tier()
    assert tier.prepare_store(keys(1, 2), REQ) is not None
    tier.complete_store(keys(2, 1), True)
    assert tier.take_events() == [OffloadingEvent(EventKind.STORED, (key(2), key(1)), NAME)]
    assert tier.take_events() == []


def test_failed_store_becomes_absent_and_frees_the_slot() -> None:
    tier, _ = make_tier(num_slots=1)
    out = tier.prepare_store(keys(1), REQ)
    assert out is not None and tier.free_slots == 0
    tier.complete_store(keys(1), False)
    assert tier.lookup(key(1), REQ) is lr.MISS and tier.free_slots == 1
    assert tier.take_events() == []
    again = tier.prepare_store(keys(1), REQ)
    assert again is not None and again.keys_to_store == (key(1),)


def test_failure_over_a_batch_with_ready_and_pinned_keys_leaves_them_untouched() -> None:
    tier, _ = make_tier(num_slots=4)
    slots = stored(tier, 1, 2)
    tier.prepare_load(keys(2), REQ)
    tier.take_events()
    out = tier.prepare_store(keys(1, 2, 3), REQ)
    assert out is not None and out.keys_to_store == (key(3),)
    tier.complete_store(keys(1, 2, 3), False)
    assert answers(tier, [1, 2, 3]) == [lr.HIT, lr.HIT, lr.MISS]
    assert tier.state(key(1)) is BlockState.READY and tier.state(key(2)) is BlockState.PINNED
    assert (tier.slot_of(key(1)), tier.slot_of(key(2))) == slots
    assert tier.free_slots == 2 and tier.take_events() == []
    # A success naming a READY key again changes nothing either (no second STORED event).
    tier.complete_store(keys(1), True)
    assert tier.take_events() == [] and tier.state(key(1)) is BlockState.READY


# ---------------------------------------------------------------- pins (CPU-5)


def test_two_pins_released_once_stay_protected() -> None:
    tier, _ = make_tier(num_slots=1)
    stored(tier, 1)
    tier.prepare_load(keys(1), REQ)
    tier.prepare_load(keys(1), REQ)
    assert tier.pin_count(key(1)) == 2
    tier.complete_load(keys(1))
    assert tier.pin_count(key(1)) == 1 and tier.state(key(1)) is BlockState.PINNED
    assert tier.prepare_store(keys(2), REQ) is None  # still pinned once: not evictable
    assert tier.reset_cache() is False
    assert tier.lookup(key(1), REQ) is lr.HIT and tier.has_pending_work()
    tier.complete_load(keys(1))
    assert tier.pin_count(key(1)) == 0 and not tier.has_pending_work()
    out = tier.prepare_store(keys(2), REQ)
    assert out is not None and out.evicted == (key(1),)


def test_one_call_pins_once_per_occurrence() -> None:
    tier, _ = make_tier()
    slots = stored(tier, 1, 2)
    assert tier.prepare_load(keys(2, 1, 2), REQ) == (slots[1], slots[0], slots[1])
    assert tier.pin_count(key(1)) == 1 and tier.pin_count(key(2)) == 2
    tier.complete_load(keys(2, 2, 1))
    assert tier.pin_count(key(1)) == 0 and tier.pin_count(key(2)) == 0


# ---------------------------------------------------------------- misuse (CPU-10) and argument types


def test_complete_store_of_an_unprepared_key_is_misuse_naming_it_and_changes_nothing() -> None:
    tier, _ = make_tier()
    assert tier.prepare_store(keys(1), REQ) is not None
    with pytest.raises(TierMisuseError, match="never prepared") as info:
        tier.complete_store(keys(1, 2), True)
    assert info.value.key == key(2) and repr(key(2)) in str(info.value)
    assert isinstance(info.value, KvprotoError)
    assert tier.state(key(1)) is BlockState.WRITING and tier.take_events() == []


@pytest.mark.parametrize("setup", ["absent", "writing", "expired"])
def test_prepare_load_of_a_block_not_ready_is_misuse_naming_it(setup: str) -> None:
    tier, clock = make_tier(deadline=5.0)
    stored(tier, 1)
    if setup != "absent":
        assert tier.prepare_store(keys(2), REQ) is not None
    if setup == "expired":
        clock.advance(6.0)
        tier.on_step_end()
    with pytest.raises(TierMisuseError, match="not READY") as info:
        tier.prepare_load(keys(1, 2), REQ)
    assert info.value.key == key(2) and repr(key(2)) in str(info.value)
    assert tier.pin_count(key(1)) == 0  # all or nothing


def test_releasing_a_pin_never_taken_is_misuse_naming_the_key() -> None:
    tier, _ = make_tier()
    stored(tier, 1, 2)
    tier.prepare_load(keys(1, 2), REQ)
    with pytest.raises(TierMisuseError, match="holds 1") as info:
        tier.complete_load(keys(2, 1, 1))
    assert info.value.key == key(1) and repr(key(1)) in str(info.value)
    assert tier.pin_count(key(1)) == 1 and tier.pin_count(key(2)) == 1  # nothing released
    with pytest.raises(TierMisuseError) as unknown:
        tier.complete_load(keys(3))
    assert unknown.value.key == key(3)


# Each batch method, called with a deliberately wrong ``keys`` argument.
_BATCH_CALLS: dict[str, Callable[[MemoryPrimaryTier, Any], object]] = {
    "prepare_store": lambda tier, ks: tier.prepare_store(ks, REQ),
    "complete_store": lambda tier, ks: tier.complete_store(ks, True),
    "prepare_load": lambda tier, ks: tier.prepare_load(ks, REQ),
    "complete_load": lambda tier, ks: tier.complete_load(ks),
    "touch": lambda tier, ks: tier.touch(ks),
    "lookup_many": lambda tier, ks: tier.lookup_many(ks, REQ),
}


@pytest.mark.parametrize("method", ["prepare_store", "complete_store", "prepare_load", "complete_load"])
def test_a_non_bytes_key_is_an_invalid_key_error_naming_it(method: str) -> None:
    tier, _ = make_tier()
    stored(tier, 1)
    tier.take_events()
    with pytest.raises(InvalidKeyError, match=r"key #1 is 'not-a-key' of type str") as info:
        _BATCH_CALLS[method](tier, [key(1), "not-a-key"])
    assert isinstance(info.value, InvalidArgumentError)
    assert isinstance(info.value, ValueError)
    assert method in str(info.value)
    assert tier.state(key(1)) is BlockState.READY and tier.pin_count(key(1)) == 0
    assert tier.free_slots == 3 and tier.take_events() == []


@pytest.mark.parametrize("single", ["abcdef", key(1), bytearray(key(1))])
@pytest.mark.parametrize("method", sorted(_BATCH_CALLS))
def test_a_single_key_or_str_passed_as_keys_is_an_invalid_argument(method: str, single: object) -> None:
    tier, _ = make_tier()
    stored(tier, 1)
    with pytest.raises(InvalidArgumentError, match="takes a sequence of keys") as info:
        _BATCH_CALLS[method](tier, single)
    assert method in str(info.value)
    assert tier.free_slots == 3 and tier.pin_count(key(1)) == 0


@pytest.mark.parametrize("success", [1, 0, None, "yes"])
def test_a_non_bool_success_is_an_invalid_argument_naming_it(success: object) -> None:
    tier, _ = make_tier()
    assert tier.prepare_store(keys(1), REQ) is not None
    with pytest.raises(InvalidArgumentError, match="success must be a bool") as info:
        tier.complete_store(keys(1), success)  # type: ignore[arg-type]  # deliberately wrong input
    assert repr(success) in str(info.value)
    assert tier.state(key(1)) is BlockState.WRITING


def test_keys_may_be_any_iterable_where_the_protocol_says_iterable() -> None:
    tier, _ = make_tier()
    assert tier.prepare_store(keys(1, 2), REQ) is not None
    tier.complete_store(iter(keys(1, 2)), True)
    tier.prepare_load(keys(1, 1), REQ)
    tier.complete_load(k for k in keys(1, 1))
    tier.touch(iter(keys(2)))
    assert tier.pin_count(key(1)) == 0 and answers(tier, [1, 2]) == [lr.HIT, lr.HIT]


# ---------------------------------------------------------------- deadline and quarantine (CPU-7, CPU-8)


def test_write_past_deadline_answers_miss_on_lookup() -> None:
    tier, clock = make_tier(deadline=5.0)
    assert tier.prepare_store(keys(1), REQ) is not None
    clock.advance(5.0)
    assert tier.lookup(key(1), REQ) is lr.HIT_PENDING  # exactly at the deadline: still pending
    clock.advance(0.5)
    assert tier.lookup(key(1), REQ) is lr.MISS
    assert tier.state(key(1)) is BlockState.ABSENT and tier.quarantined_slots == 1
    assert not tier.has_pending_work()


def test_on_step_end_expires_only_overdue_writes() -> None:
    tier, clock = make_tier(deadline=5.0)
    assert tier.prepare_store(keys(1), REQ) is not None
    clock.advance(3.0)
    assert tier.prepare_store(keys(2), REQ) is not None
    clock.advance(3.0)
    tier.on_step_end()
    assert tier.state(key(1)) is BlockState.ABSENT and tier.state(key(2)) is BlockState.WRITING
    assert tier.quarantined_slots == 1


def test_expired_slot_is_never_reused_while_its_late_write_is_outstanding() -> None:
    tier, clock = make_tier(num_slots=2, block_bytes=8, deadline=5.0)
    out = tier.prepare_store(keys(1), REQ)
    assert out is not None
    leaked = out.slots[0]
    clock.advance(6.0)
    assert tier.lookup(key(1), REQ) is lr.MISS
    assert tier.free_slots == 1 and tier.quarantined_slots == 1
    # However long the late write takes, and under full eviction pressure, its slot is not handed out.
    for i in range(10, 30):
        clock.advance(1000.0)
        tier.on_step_end()
        got = tier.prepare_store(keys(i), REQ)
        assert got is not None and got.slots != (leaked,)
        assert tier.prepare_store(keys(i + 1000), REQ) is None  # only the quarantined slot would fit
        tier.complete_store(keys(i), True)
    assert tier.reset_cache() is True
    assert tier.free_slots == 1 and tier.quarantined_slots == 1  # reset keeps the quarantine
    # The key itself is not reserved again while its old write may still complete.
    again = tier.prepare_store(keys(1), REQ)
    assert again is not None and again.keys_to_store == ()
    # The late write lands in its old slot, then completes: ignored, the key never becomes READY.
    tier.slot_view(leaked)[:] = b"\xee" * 8
    tier.take_events()
    tier.complete_store(keys(1), True)
    assert tier.lookup(key(1), REQ) is lr.MISS and tier.take_events() == []
    assert tier.free_slots == 2 and tier.quarantined_slots == 0
    # Now the slot and the key are usable again.
    fresh = tier.prepare_store(keys(1, 2), REQ)
    assert fresh is not None and leaked in fresh.slots and fresh.keys_to_store == tuple(keys(1, 2))


def test_a_failed_late_completion_also_frees_the_quarantined_slot() -> None:
    tier, clock = make_tier(num_slots=1, deadline=5.0)
    assert tier.prepare_store(keys(1), REQ) is not None
    clock.advance(6.0)
    tier.on_step_end()
    assert tier.prepare_store(keys(2), REQ) is None
    tier.complete_store(keys(1), False)
    assert tier.free_slots == 1
    with pytest.raises(TierMisuseError):
        tier.complete_store(keys(1), False)  # a second completion is misuse: no write is outstanding
    out = tier.prepare_store(keys(2), REQ)
    assert out is not None and out.keys_to_store == (key(2),)


def test_store_finishing_after_the_deadline_is_a_late_completion() -> None:
    tier, clock = make_tier(num_slots=2, deadline=5.0)
    assert tier.prepare_store(keys(1), REQ) is not None
    clock.advance(6.0)
    tier.complete_store(keys(1), True)  # nobody looked it up or ended a step: still WRITING
    assert tier.lookup(key(1), REQ) is lr.HIT
    assert tier.prepare_store(keys(2), REQ) is not None
    clock.advance(6.0)
    tier.on_step_end()
    tier.complete_store(keys(2), True)  # expired first: ignored
    assert tier.lookup(key(2), REQ) is lr.MISS


# ---------------------------------------------------------------- lifecycle (TIER-12..TIER-16, CPU-9)


def test_has_pending_work_tracks_writes_and_pins() -> None:
    tier, _ = make_tier()
    assert tier.has_pending_work() is False
    assert tier.prepare_store(keys(1), REQ) is not None
    assert tier.has_pending_work() is True
    tier.complete_store(keys(1), True)
    assert tier.has_pending_work() is False
    tier.prepare_load(keys(1), REQ)
    assert tier.has_pending_work() is True
    tier.complete_load(keys(1))
    assert tier.has_pending_work() is False


def test_reset_cache_refuses_while_work_in_flight() -> None:
    tier, _ = make_tier()
    stored(tier, 1)
    assert tier.prepare_store(keys(2), REQ) is not None
    assert tier.reset_cache() is False
    tier.complete_store(keys(2), True)
    tier.prepare_load(keys(1), REQ)
    assert tier.reset_cache() is False
    assert tier.lookup(key(1), REQ) is lr.HIT
    tier.complete_load(keys(1))
    tier.take_events()
    assert tier.reset_cache() is True
    assert answers(tier, [1, 2]) == [lr.MISS, lr.MISS] and tier.free_slots == 4
    events = tier.take_events()
    assert len(events) == 1 and events[0].kind is EventKind.REMOVED
    assert set(events[0].keys) == set(keys(1, 2)) and events[0].tier == NAME
    assert tier.reset_cache() is True and tier.take_events() == []  # nothing left: no event


def test_shutdown_fails_writes_quarantines_them_and_refuses_new_stores() -> None:
    tier, _ = make_tier(num_slots=3)
    stored(tier, 1)
    assert tier.prepare_store(keys(2), REQ) is not None
    tier.shutdown()
    tier.shutdown()
    assert answers(tier, [1, 2]) == [lr.HIT, lr.MISS]
    assert tier.prepare_store(keys(3), REQ) is None
    assert not tier.has_pending_work()
    assert tier.quarantined_slots == 1 and tier.free_slots == 1
    tier.complete_store(keys(2), True)  # the late completion still frees the slot
    assert tier.free_slots == 2 and tier.lookup(key(2), REQ) is lr.MISS


def test_on_request_finished_keeps_blocks() -> None:
    tier, _ = make_tier()
    stored(tier, 1)
    tier.on_request_finished(ReqContext("other"))
    assert tier.lookup(key(1), REQ) is lr.HIT


# ---------------------------------------------------------------- state machine against a model

NUM_SLOTS = 4
BLOCK_BYTES = 8
DEADLINE = 5.0
MODEL_KEYS = [key(i) for i in range(8)]
key_st = st.sampled_from(MODEL_KEYS)


@dataclass
class _ModelWrite:
    slot: int
    content: bytes
    started: float


class MemoryPrimaryTierMachine(RuleBasedStateMachine):
    """The tier against a model of ABSENT / WRITING / READY, pins, LRU order and quarantined slots.

    After every step: states, pins, free and quarantined slots match; every
    READY block's bytes are the bytes written; no slot handed out is one a
    late write may still land in.
    """

    def __init__(self) -> None:
        super().__init__()
        self.tier, self.clock = make_tier(NUM_SLOTS, BLOCK_BYTES, deadline=DEADLINE)
        self.ready: OrderedDict[OffloadKey, tuple[int, bytes]] = OrderedDict()  # LRU first
        self.writing: dict[OffloadKey, _ModelWrite] = {}
        self.pins: Counter[OffloadKey] = Counter()
        self.quarantined: dict[OffloadKey, int] = {}
        self.serial = 0

    def free(self) -> int:
        return NUM_SLOTS - len(self.ready) - len(self.writing) - len(self.quarantined)

    def content(self) -> bytes:
        self.serial += 1
        return bytes((self.serial * 31 + i) % 256 for i in range(BLOCK_BYTES))

    def expire_overdue(self) -> None:
        for k in [k for k, w in self.writing.items() if self.clock.now - w.started > DEADLINE]:
            self.quarantined[k] = self.writing.pop(k).slot

    @rule(ks=st.lists(key_st, min_size=1, max_size=5))
    def prepare_store(self, ks: list[OffloadKey]) -> None:
        to_store: list[OffloadKey] = []
        for k in ks:
            known = k in self.ready or k in self.writing or k in self.quarantined
            if k not in to_store and not known:
                to_store.append(k)
        shortfall = max(0, len(to_store) - self.free())
        evictable = [k for k in self.ready if self.pins[k] == 0 and k not in ks]
        out = self.tier.prepare_store(ks, REQ)
        events = self.tier.take_events()
        if shortfall > len(evictable):
            assert out is None and events == []
            return
        assert out is not None
        assert list(out.keys_to_store) == to_store
        assert list(out.evicted) == evictable[:shortfall]  # exactly the shortfall, LRU first
        assert events == ([OffloadingEvent(EventKind.REMOVED, out.evicted, NAME)] if out.evicted else [])
        for victim in out.evicted:
            del self.ready[victim]
        taken = {s for s, _ in self.ready.values()} | {w.slot for w in self.writing.values()}
        taken |= set(self.quarantined.values())
        assert list(out.slots) == sorted(set(out.slots))
        for k, slot in zip(out.keys_to_store, out.slots, strict=True):
            assert 0 <= slot < NUM_SLOTS and slot not in taken
            data = self.content()
            self.tier.slot_view(slot)[:] = data  # the transfer writing the block
            self.writing[k] = _ModelWrite(slot, data, self.clock.now)

    @precondition(lambda self: bool(self.writing) or bool(self.ready))
    @rule(data=st.data(), ok=st.booleans())
    def complete_store(self, data: st.DataObject, ok: bool) -> None:
        candidates = sorted(self.writing) + sorted(self.ready)
        ks = data.draw(st.lists(st.sampled_from(candidates), min_size=1, max_size=4))
        self.tier.complete_store(ks, ok)
        done: list[OffloadKey] = []
        for k in ks:
            w = self.writing.pop(k, None)
            if w is not None and ok:
                self.ready[k] = (w.slot, w.content)
                done.append(k)
        want = [OffloadingEvent(EventKind.STORED, tuple(done), NAME)] if done else []
        assert self.tier.take_events() == want

    @precondition(lambda self: bool(self.quarantined))
    @rule(data=st.data(), ok=st.booleans())
    def late_write_then_completion(self, data: st.DataObject, ok: bool) -> None:
        k = data.draw(st.sampled_from(sorted(self.quarantined)))
        slot = self.quarantined.pop(k)
        self.tier.slot_view(slot)[:] = b"\xee" * BLOCK_BYTES  # the stale transfer lands late
        self.tier.complete_store([k], ok)
        assert self.tier.take_events() == []

    @rule(k=key_st, ok=st.booleans())
    def complete_store_of_an_unknown_key_is_misuse(self, k: OffloadKey, ok: bool) -> None:
        if k in self.writing or k in self.ready or k in self.quarantined:
            return
        with pytest.raises(TierMisuseError) as info:
            self.tier.complete_store([k], ok)
        assert info.value.key == k

    @rule(k=key_st)
    def lookup(self, k: OffloadKey) -> None:
        w = self.writing.get(k)
        if k in self.ready:
            want = lr.HIT
        elif w is not None and self.clock.now - w.started <= DEADLINE:
            want = lr.HIT_PENDING
        else:
            if w is not None:
                self.quarantined[k] = self.writing.pop(k).slot
            want = lr.MISS
        got = self.tier.lookup(k, REQ)
        match got:
            case lr.HIT | lr.HIT_PENDING | lr.MISS:
                assert got is want, (k, got, want)
            case lr.RETRY:
                raise AssertionError("a primary tier never answers RETRY (LR-4)")
            case _ as other:
                unreachable(other, where="MemoryPrimaryTierMachine.lookup")

    @precondition(lambda self: bool(self.ready))
    @rule(data=st.data())
    def prepare_load(self, data: st.DataObject) -> None:
        ks = data.draw(st.lists(st.sampled_from(sorted(self.ready)), min_size=1, max_size=3))
        slots = self.tier.prepare_load(ks, REQ)
        assert slots == tuple(self.ready[k][0] for k in ks)
        for k, slot in zip(ks, slots, strict=True):
            self.pins[k] += 1
            assert bytes(self.tier.slot_view(slot)) == self.ready[k][1]

    @rule(k=key_st)
    def prepare_load_of_a_block_not_ready_is_misuse(self, k: OffloadKey) -> None:
        if k in self.ready:
            return
        with pytest.raises(TierMisuseError) as info:
            self.tier.prepare_load([k], REQ)
        assert info.value.key == k

    @precondition(lambda self: +self.pins != Counter())
    @rule(data=st.data())
    def complete_load(self, data: st.DataObject) -> None:
        k = data.draw(st.sampled_from(sorted(k for k, n in self.pins.items() if n > 0)))
        self.tier.complete_load([k])
        self.pins[k] -= 1

    @rule(k=key_st)
    def releasing_an_unheld_pin_is_misuse(self, k: OffloadKey) -> None:
        if self.pins[k] > 0:
            return
        with pytest.raises(TierMisuseError) as info:
            self.tier.complete_load([k])
        assert info.value.key == k

    @rule(ks=st.lists(key_st, max_size=3))
    def touch(self, ks: list[OffloadKey]) -> None:
        self.tier.touch(ks)
        for k in ks:
            if k in self.ready:
                self.ready.move_to_end(k)

    @rule(dt=st.sampled_from([1.0, 3.0, 6.0]))
    def step(self, dt: float) -> None:
        self.clock.advance(dt)
        self.expire_overdue()
        self.tier.on_step_end()

    @rule()
    def reset(self) -> None:
        expected = not self.writing and +self.pins == Counter()
        assert self.tier.reset_cache() is expected
        events = self.tier.take_events()
        if expected and self.ready:
            assert events == [OffloadingEvent(EventKind.REMOVED, tuple(self.ready), NAME)]
        else:
            assert events == []
        if expected:
            self.ready.clear()

    @invariant()
    def states_match_the_model(self) -> None:
        for k in MODEL_KEYS:
            if k in self.ready:
                want = BlockState.PINNED if self.pins[k] > 0 else BlockState.READY
            elif k in self.writing:
                want = BlockState.WRITING
            else:
                want = BlockState.ABSENT
            assert self.tier.state(k) is want, k
            assert self.tier.pin_count(k) == self.pins[k] >= 0
            assert (k in self.tier.ready_keys) is (k in self.ready)

    @invariant()
    def slots_match_the_model(self) -> None:
        assert self.tier.free_slots == self.free()
        assert self.tier.quarantined_slots == len(self.quarantined)
        assert self.tier.has_pending_work() is (bool(self.writing) or +self.pins != Counter())

    @invariant()
    def ready_bytes_are_the_bytes_written(self) -> None:
        for k, (slot, data) in self.ready.items():
            assert self.tier.slot_of(k) == slot
            assert bytes(self.tier.slot_view(slot)) == data


MemoryPrimaryTierMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestMemoryPrimaryTierMachine = MemoryPrimaryTierMachine.TestCase


def test_a_buffer_too_large_to_allocate_is_a_configuration_error() -> None:
    """A 16 TiB request is a ConfigurationError naming the size, never a raw MemoryError."""
    with pytest.raises(ConfigurationError, match="cannot allocate"):
        MemoryPrimaryTier(num_slots=2**22, block_bytes=2**22)
