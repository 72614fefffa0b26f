"""The primary state machine shared by every tier built on SlotTable (TIER-3..TIER-17, CPU-3..CPU-10, MEM-10).

Each test runs against ``kvproto.MemoryPrimaryTier`` and, where torch imports,
``kvproto_cpu.CpuTier`` with the LRU and the ARC policy (``flavor``); tests of
exact LRU order run on the LRU flavors only (``lru``). Each tier's own
data-plane and configuration tests stay with it
(``tests/kvproto/test_memory_primary_tier.py``, ``tests/impls/cpu/test_tier.py``);
the model-based state machine is ``test_slot_machine.py``.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Container
from typing import Any, cast

import pytest

from kvproto import (
    BatchLookup,
    BlockState,
    EventKind,
    OffloadingEvent,
    OffloadKey,
    PrimaryTier,
    ReadyKeys,
    ReqContext,
    members as lr,
)
from kvproto.errors import ConfigurationError, InvalidArgumentError, InvalidKeyError, KvprotoError, TierMisuseError
from kvproto.tierkit import BlockState as KitBlockState, LruPolicy, SlotStats, SlotTable

from tests.kvproto.tierkit._slots_support import FLAVORS, LRU_FLAVORS, REQ, Flavor, Tier, answers, key, keys, stored


@pytest.fixture(params=FLAVORS)
def flavor(request: pytest.FixtureRequest) -> Flavor:
    """Every tier built on SlotTable."""
    chosen: Flavor = request.param
    return chosen


@pytest.fixture(params=LRU_FLAVORS)
def lru(request: pytest.FixtureRequest) -> Flavor:
    """The tiers that evict in exact LRU order."""
    chosen: Flavor = request.param
    return chosen


# ---------------------------------------------------------------- protocol and buffer (TIER-1, TIER-3, CPU-2)


def test_one_block_state_enum() -> None:
    assert BlockState is KitBlockState


def test_satisfies_primary_tier_structurally(flavor: Flavor) -> None:
    tier, _ = flavor.make()
    as_primary: PrimaryTier = tier  # mypy proves the structure; isinstance checks the names
    as_batch: BatchLookup = tier
    as_ready: ReadyKeys = tier
    assert isinstance(as_primary, PrimaryTier)
    assert isinstance(as_batch, BatchLookup)
    assert isinstance(as_ready, ReadyKeys)
    assert tier.name == flavor.default_name


def test_buffer_is_a_writable_2d_byte_view_shared_with_slot_views(flavor: Flavor) -> None:
    tier, _ = flavor.make(num_slots=3, block_bytes=8)
    view = tier.buffer
    assert view.format == "B" and view.ndim == 2 and view.shape == (3, 8)
    assert not view.readonly and view.c_contiguous and view.nbytes == 24
    assert tier.buffer.obj is view.obj  # the same memory on every access
    view[2, 5] = 77
    assert tier.slot_view(2)[5] == 77
    row = tier.slot_view(1)
    assert row.nbytes == 8
    row[7] = 3
    assert view[1, 7] == 3 and tier.buffer[1, 7] == 3


def test_buffer_outlives_the_tier(flavor: Flavor) -> None:
    tier, _ = flavor.make(num_slots=2, block_bytes=8)
    view = tier.buffer
    del tier
    view[1, 7] = 5
    assert view[1, 7] == 5


@pytest.mark.parametrize("slot", [-1, 4, 99, True, 1.0])
def test_slot_out_of_range_is_misuse(flavor: Flavor, slot: object) -> None:
    tier, _ = flavor.make(num_slots=4)
    with pytest.raises(TierMisuseError, match="out of range"):
        tier.check_slot(slot)  # type: ignore[arg-type]  # deliberately wrong input
    with pytest.raises(TierMisuseError, match="out of range"):
        tier.slot_view(slot)  # type: ignore[arg-type]  # deliberately wrong input


# ---------------------------------------------------------------- states and lookups (CPU-3)


def test_states_absent_writing_ready_pinned(flavor: Flavor) -> None:
    tier, _ = flavor.make()
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


def test_keys_differing_only_in_group_are_distinct(flavor: Flavor) -> None:
    tier, _ = flavor.make()
    assert tier.prepare_store([key(1, group=0)], REQ) is not None
    tier.complete_store([key(1, group=0)], True)
    assert tier.lookup(key(1, group=0), REQ) is lr.HIT
    assert tier.lookup(key(1, group=1), REQ) is lr.MISS


def test_ready_keys_is_a_live_view_of_the_hits(flavor: Flavor) -> None:
    tier, _ = flavor.make(num_slots=2)
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
    stored(tier, 4)
    assert key(4) in view  # the view taken before the reset still sees new blocks: one container (MGR-15)


def test_lookup_many_matches_lookup(flavor: Flavor) -> None:
    tier, _ = flavor.make()
    stored(tier, 1)
    assert tier.prepare_store(keys(2), REQ) is not None
    assert tier.lookup_many(keys(1, 2, 3), REQ) == [lr.HIT, lr.HIT_PENDING, lr.MISS]
    assert tier.lookup_many(keys(3, 1), REQ) == answers(tier, [3, 1])


def test_lookups_that_hit_or_miss_never_read_the_clock(flavor: Flavor) -> None:
    tier, clock = flavor.make(deadline=5.0)
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


def test_without_a_deadline_a_write_stays_pending_and_the_clock_is_not_read_on_lookup(flavor: Flavor) -> None:
    tier, clock = flavor.make(deadline=None)
    assert tier.prepare_store(keys(1), REQ) is not None
    reads = clock.reads
    clock.advance(1e9)
    tier.on_step_end()
    assert tier.lookup(key(1), REQ) is lr.HIT_PENDING
    assert clock.reads == reads
    tier.complete_store(keys(1), True)
    assert tier.lookup(key(1), REQ) is lr.HIT


# ---------------------------------------------------------------- prepare_store (TIER-6, CPU-4)


def test_prepare_store_skips_present_and_duplicate_keys(flavor: Flavor) -> None:
    tier, _ = flavor.make()
    stored(tier, 1)
    assert tier.prepare_store(keys(2), REQ) is not None
    out = tier.prepare_store(keys(1, 2, 3, 3), REQ)
    assert out is not None
    assert out.keys_to_store == (key(3),) and len(out.slots) == 1 and out.evicted == ()


def test_prepare_store_with_nothing_to_store_is_empty_not_none(flavor: Flavor) -> None:
    tier, _ = flavor.make(num_slots=1)
    stored(tier, 1)
    tier.prepare_load(keys(1), REQ)  # pinned: nothing could be evicted either
    out = tier.prepare_store(keys(1), REQ)
    assert out is not None and out.keys_to_store == () and out.slots == ()
    assert tier.prepare_store([], REQ) == out


def test_slots_are_distinct_and_in_range(flavor: Flavor) -> None:
    """Distinct, in range and ascending, in the order of the keys."""
    tier, _ = flavor.make(num_slots=4)
    out = tier.prepare_store(keys(4, 3, 2, 1), REQ)
    assert out is not None and out.slots == (0, 1, 2, 3)
    assert out.keys_to_store == tuple(keys(4, 3, 2, 1))


def test_eviction_takes_exactly_the_shortfall_in_lru_order(lru: Flavor) -> None:
    tier, _ = lru.make(num_slots=4)
    stored(tier, 1, 2, 3)
    tier.take_events()
    out = tier.prepare_store(keys(10, 11, 12), REQ)  # 1 free slot, shortfall 2
    assert out is not None
    assert out.evicted == (key(1), key(2))
    assert answers(tier, [1, 2, 3]) == [lr.MISS, lr.MISS, lr.HIT]
    assert tier.take_events() == [OffloadingEvent(EventKind.REMOVED, (key(1), key(2)), tier.name)]
    assert tier.stats.evictions == 2


def test_touch_updates_recency(lru: Flavor) -> None:
    tier, _ = lru.make(num_slots=2)
    stored(tier, 1, 2)
    tier.touch(keys(1, 99))  # unknown keys are ignored
    out = tier.prepare_store(keys(3), REQ)
    assert out is not None and out.evicted == (key(2),)


def test_a_completed_store_is_most_recently_used(lru: Flavor) -> None:
    tier, _ = lru.make(num_slots=3)
    stored(tier, 1)
    assert tier.prepare_store(keys(2), REQ) is not None
    stored(tier, 3)
    tier.complete_store(keys(2), True)  # completes last: most recently used
    out = tier.prepare_store(keys(4, 5), REQ)
    assert out is not None and out.evicted == (key(1), key(3))


def test_never_evicts_an_input_key(flavor: Flavor) -> None:
    tier, _ = flavor.make(num_slots=2)
    stored(tier, 1, 2)  # 1 is least recently used
    out = tier.prepare_store(keys(1, 3), REQ)
    assert out is not None and out.keys_to_store == (key(3),) and out.evicted == (key(2),)
    assert tier.lookup(key(1), REQ) is lr.HIT


def test_never_evicts_pinned_or_writing_blocks(flavor: Flavor) -> None:
    tier, _ = flavor.make(num_slots=3)
    stored(tier, 1, 2)
    tier.prepare_load(keys(1), REQ)
    assert tier.prepare_store(keys(3), REQ) is not None  # WRITING, takes the free slot
    out = tier.prepare_store(keys(4), REQ)
    assert out is not None and out.evicted == (key(2),)
    assert tier.state(key(1)) is BlockState.PINNED and tier.state(key(3)) is BlockState.WRITING
    assert tier.prepare_store(keys(5), REQ) is None  # only pinned and writing blocks left


def test_all_or_nothing_with_a_ready_input_key_on_a_full_tier(lru: Flavor) -> None:
    tier, _ = lru.make(num_slots=2)
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


def test_all_or_nothing_none_changes_nothing(flavor: Flavor) -> None:
    tier, _ = flavor.make(num_slots=3)
    stored(tier, 1, 2)
    tier.prepare_load(keys(1), REQ)
    tier.take_events()
    assert tier.prepare_store(keys(5, 6, 7), REQ) is None  # needs 2 evictions, only 1 possible
    assert answers(tier, [1, 2, 5, 6, 7]) == [lr.HIT, lr.HIT, lr.MISS, lr.MISS, lr.MISS]
    assert tier.take_events() == [] and tier.free_slots == 1 and tier.stats.evictions == 0


# ---------------------------------------------------------------- complete_store (TIER-7, CPU-4)


def test_completed_store_emits_stored_event(flavor: Flavor) -> None:
    """One STORED event for the batch, keys in completion order."""
    tier, _ = flavor.make()
    assert tier.prepare_store(keys(1, 2), REQ) is not None
    tier.complete_store(keys(2, 1), True)
    assert tier.take_events() == [OffloadingEvent(EventKind.STORED, (key(2), key(1)), tier.name)]
    assert tier.take_events() == []
    assert tier.stats.stores_completed == 2


def test_failed_store_becomes_absent_and_frees_the_slot(flavor: Flavor) -> None:
    tier, _ = flavor.make(num_slots=1)
    out = tier.prepare_store(keys(1), REQ)
    assert out is not None and tier.free_slots == 0
    tier.complete_store(keys(1), False)
    assert tier.lookup(key(1), REQ) is lr.MISS and tier.free_slots == 1
    assert tier.stats.stores_failed == 1
    assert tier.take_events() == []
    again = tier.prepare_store(keys(1), REQ)
    assert again is not None and again.keys_to_store == (key(1),)


def test_failure_leaves_ready_blocks_untouched(flavor: Flavor) -> None:
    """A failure over a batch naming READY and PINNED keys leaves them as they were."""
    tier, _ = flavor.make(num_slots=4)
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


# ---------------------------------------------------------------- pins (TIER-8, TIER-9, CPU-5)


def test_two_pins_released_once_stay_protected(flavor: Flavor) -> None:
    tier, _ = flavor.make(num_slots=1)
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


def test_pins_are_counted(flavor: Flavor) -> None:
    tier, _ = flavor.make(num_slots=1)
    stored(tier, 1)
    tier.prepare_load(keys(1), REQ)
    tier.prepare_load(keys(1, 1), REQ)
    assert tier.pin_count(key(1)) == 3
    tier.complete_load(keys(1, 1))
    assert tier.prepare_store(keys(2), REQ) is None  # still pinned once
    tier.complete_load(keys(1))
    assert tier.pin_count(key(1)) == 0 and tier.state(key(1)) is BlockState.READY
    out = tier.prepare_store(keys(2), REQ)
    assert out is not None and out.evicted == (key(1),)


def test_one_call_pins_once_per_occurrence(flavor: Flavor) -> None:
    tier, _ = flavor.make()
    slots = stored(tier, 1, 2)
    assert tier.prepare_load(keys(2, 1, 2), REQ) == (slots[1], slots[0], slots[1])
    assert tier.pin_count(key(1)) == 1 and tier.pin_count(key(2)) == 2
    tier.complete_load(keys(2, 2, 1))
    assert tier.pin_count(key(1)) == 0 and tier.pin_count(key(2)) == 0


# ---------------------------------------------------------------- misuse (CPU-10) and argument types (CPU-8)


def test_complete_store_of_unprepared_key_is_misuse_and_changes_nothing(flavor: Flavor) -> None:
    tier, _ = flavor.make()
    assert tier.prepare_store(keys(1), REQ) is not None
    with pytest.raises(TierMisuseError, match="never prepared") as info:
        tier.complete_store(keys(1, 2), True)
    assert info.value.key == key(2) and repr(key(2)) in str(info.value)
    assert isinstance(info.value, KvprotoError)
    assert tier.state(key(1)) is BlockState.WRITING and tier.take_events() == []


@pytest.mark.parametrize("setup", ["absent", "writing", "expired"])
def test_prepare_load_of_a_block_not_ready_is_misuse(flavor: Flavor, setup: str) -> None:
    tier, clock = flavor.make(deadline=5.0)
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


def test_releasing_more_pins_than_taken_is_misuse(flavor: Flavor) -> None:
    tier, _ = flavor.make()
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
_BATCH_CALLS: dict[str, Callable[[Tier, Any], object]] = {
    "prepare_store": lambda tier, ks: tier.prepare_store(ks, REQ),
    "complete_store": lambda tier, ks: tier.complete_store(ks, True),
    "prepare_load": lambda tier, ks: tier.prepare_load(ks, REQ),
    "complete_load": lambda tier, ks: tier.complete_load(ks),
    "touch": lambda tier, ks: tier.touch(ks),
    "lookup_many": lambda tier, ks: tier.lookup_many(ks, REQ),
}


@pytest.mark.parametrize("method", ["prepare_store", "complete_store", "prepare_load", "complete_load"])
def test_a_non_bytes_key_is_an_invalid_key_error_naming_it(flavor: Flavor, method: str) -> None:
    tier, _ = flavor.make()
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
def test_a_single_key_or_str_passed_as_keys_is_an_invalid_argument(flavor: Flavor, method: str, single: object) -> None:
    tier, _ = flavor.make()
    stored(tier, 1)
    with pytest.raises(InvalidArgumentError, match="takes a sequence of keys") as info:
        _BATCH_CALLS[method](tier, single)
    assert method in str(info.value)
    assert tier.free_slots == 3 and tier.pin_count(key(1)) == 0


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda tier: tier.prepare_store("xyz", REQ), "single str"),
        (lambda tier: tier.prepare_store([b"ok", 7], REQ), "key #1 is 7"),
        (lambda tier: tier.prepare_load(key(1), REQ), "single bytes"),
        (lambda tier: tier.complete_store(keys(1), "no"), "success must be a bool"),
    ],
)
def test_bad_arguments_are_typed_errors_and_change_nothing(
    flavor: Flavor, call: Callable[[Tier], object], words: str
) -> None:
    """A str or single key as ``keys``, a non-bytes key or a non-bool success: InvalidArgumentError, no change."""
    tier, _ = flavor.make(num_slots=2)
    stored(tier, 1)
    with pytest.raises(InvalidArgumentError, match=words):
        call(tier)
    assert tier.lookup(key(1), REQ) is lr.HIT and tier.free_slots == 1 and not tier.has_pending_work()


@pytest.mark.parametrize("success", [1, 0, None, "yes"])
def test_a_non_bool_success_is_an_invalid_argument_naming_it(flavor: Flavor, success: object) -> None:
    tier, _ = flavor.make()
    assert tier.prepare_store(keys(1), REQ) is not None
    with pytest.raises(InvalidArgumentError, match="success must be a bool") as info:
        tier.complete_store(keys(1), success)  # type: ignore[arg-type]  # deliberately wrong input
    assert repr(success) in str(info.value)
    assert tier.state(key(1)) is BlockState.WRITING


def test_keys_may_be_any_iterable_where_the_protocol_says_iterable(flavor: Flavor) -> None:
    tier, _ = flavor.make()
    assert tier.prepare_store(keys(1, 2), REQ) is not None
    tier.complete_store(iter(keys(1, 2)), True)
    tier.prepare_load(keys(1, 1), REQ)
    tier.complete_load(k for k in keys(1, 1))
    tier.touch(iter(keys(2)))
    assert tier.pin_count(key(1)) == 0 and answers(tier, [1, 2]) == [lr.HIT, lr.HIT]


# ---------------------------------------------------------------- deadline and quarantine (CPU-7, CPU-8)


def test_write_past_deadline_answers_miss_on_lookup(flavor: Flavor) -> None:
    tier, clock = flavor.make(deadline=5.0)
    assert tier.prepare_store(keys(1), REQ) is not None
    clock.advance(5.0)
    assert tier.lookup(key(1), REQ) is lr.HIT_PENDING  # exactly at the deadline: still pending
    clock.advance(0.5)
    assert tier.lookup(key(1), REQ) is lr.MISS
    assert tier.state(key(1)) is BlockState.ABSENT and tier.quarantined_slots == 1
    assert tier.stats.expired_writes == 1
    assert not tier.has_pending_work()


def test_on_step_end_expires_only_overdue_writes(flavor: Flavor) -> None:
    tier, clock = flavor.make(deadline=5.0)
    assert tier.prepare_store(keys(1), REQ) is not None
    clock.advance(3.0)
    assert tier.prepare_store(keys(2), REQ) is not None
    clock.advance(3.0)
    tier.on_step_end()
    assert tier.state(key(1)) is BlockState.ABSENT and tier.state(key(2)) is BlockState.WRITING
    assert tier.quarantined_slots == 1


def test_expired_slot_is_never_reused_while_its_late_write_is_outstanding(flavor: Flavor) -> None:
    tier, clock = flavor.make(num_slots=2, block_bytes=8, deadline=5.0)
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
    assert tier.stats.late_completions == 1
    # Now the slot and the key are usable again.
    fresh = tier.prepare_store(keys(1, 2), REQ)
    assert fresh is not None and leaked in fresh.slots and fresh.keys_to_store == tuple(keys(1, 2))


def test_expired_slot_is_quarantined_until_the_late_completion(flavor: Flavor) -> None:
    tier, clock = flavor.make(num_slots=2, deadline=5.0)
    out = tier.prepare_store(keys(1), REQ)
    assert out is not None
    leaked = out.slots[0]
    clock.advance(6.0)
    tier.on_step_end()
    assert tier.free_slots == 1
    other = tier.prepare_store(keys(2), REQ)
    assert other is not None and other.slots != (leaked,)
    assert tier.prepare_store(keys(3), REQ) is None  # the quarantined slot is not handed out
    # The key itself is not re-reserved while its old write may still complete.
    again = tier.prepare_store(keys(1), REQ)
    assert again is not None and again.keys_to_store == ()
    # The late completion frees the slot and is ignored: the key never becomes READY.
    tier.complete_store(keys(1), True)
    assert tier.lookup(key(1), REQ) is lr.MISS and tier.stats.late_completions == 1
    assert tier.free_slots == 1
    assert tier.take_events() == []


def test_quarantine_never_ends_by_time_only_by_the_late_completion(flavor: Flavor) -> None:
    """CPU-8: however long the late write takes, its slot is not reused before it completes."""
    tier, clock = flavor.make(num_slots=1, deadline=5.0)
    assert tier.prepare_store(keys(1), REQ) is not None
    clock.advance(6.0)
    tier.on_step_end()
    for _ in range(5):
        clock.advance(10_000.0)
        tier.on_step_end()
        assert tier.free_slots == 0 and tier.prepare_store(keys(2), REQ) is None
    tier.complete_store(keys(1), True)  # the late completion: ignored, frees the slot
    assert tier.lookup(key(1), REQ) is lr.MISS and tier.stats.late_completions == 1
    assert tier.free_slots == 1
    with pytest.raises(TierMisuseError):
        tier.complete_store(keys(1), True)  # a second one is misuse


def test_a_failed_late_completion_also_frees_the_quarantined_slot(flavor: Flavor) -> None:
    tier, clock = flavor.make(num_slots=1, deadline=5.0)
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


def test_key_can_be_stored_again_after_its_late_completion(flavor: Flavor) -> None:
    tier, clock = flavor.make(num_slots=1, deadline=5.0)
    assert tier.prepare_store(keys(1), REQ) is not None
    clock.advance(6.0)
    tier.on_step_end()  # expired: quarantined from now
    tier.complete_store(keys(1), False)  # the late transfer reports (failed)
    out = tier.prepare_store(keys(1), REQ)
    assert out is not None and out.keys_to_store == (key(1),)
    tier.complete_store(keys(1), True)
    assert tier.lookup(key(1), REQ) is lr.HIT


def test_store_finishing_after_the_deadline_is_a_late_completion(flavor: Flavor) -> None:
    tier, clock = flavor.make(num_slots=2, deadline=5.0)
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


def test_has_pending_work_tracks_writes_and_pins(flavor: Flavor) -> None:
    tier, _ = flavor.make()
    assert tier.has_pending_work() is False
    assert tier.prepare_store(keys(1), REQ) is not None
    assert tier.has_pending_work() is True
    tier.complete_store(keys(1), True)
    assert tier.has_pending_work() is False
    tier.prepare_load(keys(1), REQ)
    assert tier.has_pending_work() is True
    tier.complete_load(keys(1))
    assert tier.has_pending_work() is False


def test_reset_cache_refuses_while_work_in_flight(flavor: Flavor) -> None:
    tier, _ = flavor.make()
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
    assert set(events[0].keys) == set(keys(1, 2)) and events[0].tier == tier.name
    assert tier.reset_cache() is True and tier.take_events() == []  # nothing left: no event


def test_reset_cache_keeps_quarantined_slots(flavor: Flavor) -> None:
    tier, clock = flavor.make(num_slots=2, deadline=1.0)
    assert tier.prepare_store(keys(1), REQ) is not None
    clock.advance(2.0)
    tier.on_step_end()
    assert tier.reset_cache() is True
    assert tier.free_slots == 1 and tier.quarantined_slots == 1


def test_shutdown_fails_writes_and_refuses_new_stores(flavor: Flavor) -> None:
    """Writes in flight are failed and quarantined; READY blocks stay; later stores answer None; idempotent."""
    tier, _ = flavor.make(num_slots=3)
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


def test_on_request_finished_keeps_blocks(flavor: Flavor) -> None:
    tier, _ = flavor.make()
    stored(tier, 1)
    tier.on_request_finished(ReqContext("other"))
    assert tier.lookup(key(1), REQ) is lr.HIT


def test_untaken_events_are_bounded(flavor: Flavor) -> None:
    """At most 65,536 untaken events: the oldest are dropped (MGR-18)."""
    tier, _ = flavor.make(num_slots=1)
    for i in range(33_000):  # each round: one REMOVED (from the second on) and one STORED event
        stored(tier, i)
    events = tier.take_events()
    assert len(events) == 65_536
    assert events[-1] == OffloadingEvent(EventKind.STORED, (key(32_999),), tier.name)


# ---------------------------------------------------------------- SlotTable itself: hooks and a bare table


def _docstring_example() -> Callable[[int, int], SlotTable]:
    """The class the SlotTable docstring shows, run from the docstring itself (so the example stays true)."""
    doc = SlotTable.__doc__ or ""
    start = doc.index("class BytesPrimary(SlotTable):")
    end = doc.index("``kvproto.MemoryPrimaryTier``", start)
    namespace: dict[str, object] = {"SlotTable": SlotTable}
    exec(textwrap.dedent("    " + doc[start:end]), namespace)  # our own docstring
    built = namespace["BytesPrimary"]
    assert isinstance(built, type) and issubclass(built, SlotTable)
    return cast(Callable[[int, int], SlotTable], built)  # BytesPrimary(num_slots, block_bytes)


def test_a_slot_table_plus_a_buffer_is_a_primary_tier() -> None:
    """The docstring's example: a primary tier in a few lines (MemoryPrimaryTier and CpuTier are built so)."""
    tier = _docstring_example()(4, 16)
    assert isinstance(tier, PrimaryTier)
    slots = stored(tier, 1, 2)
    tier.buffer[slots[0], 0] = 9
    assert tier.lookup(key(1), REQ) is lr.HIT and tier.pending_deadline_s == 30.0
    assert tier.stats == SlotStats(stores_completed=2)


def test_evict_drops_only_ready_unpinned_keys_with_one_removed_event() -> None:
    table = SlotTable(4, name="t")
    stored(table, 1, 2, 3)
    assert table.prepare_store(keys(4), REQ) is not None
    table.prepare_load(keys(2), REQ)
    table.take_events()
    assert table.evict(keys(1, 2, 4, 9, 1)) == (key(1),)  # 2 pinned, 4 WRITING, 9 absent, a repeat
    assert table.take_events() == [OffloadingEvent(EventKind.REMOVED, (key(1),), "t")]
    assert table.free_slots == 1 and table.stats.evictions == 1
    assert table.evict(keys(9)) == () and table.take_events() == []


def test_select_victims_changes_nothing(lru: Flavor) -> None:
    tier, _ = lru.make(num_slots=3)
    stored(tier, 1, 2, 3)
    tier.prepare_load(keys(1), REQ)
    keep: Container[OffloadKey] = {key(3)}
    assert tier.select_victims(1, keep) == [key(2)]
    assert tier.select_victims(2, keep) is None  # 1 pinned, 3 kept
    assert answers(tier, [1, 2, 3]) == [lr.HIT, lr.HIT, lr.HIT] and tier.free_slots == 0


def test_ready_slots_and_pins_are_read_only_live_views() -> None:
    table = SlotTable(2)
    slots_view, pins_view = table.ready_slots, table.pins
    slots = stored(table, 1)
    table.prepare_load(keys(1, 1), REQ)
    assert dict(slots_view) == {key(1): slots[0]} and dict(pins_view) == {key(1): 2}
    with pytest.raises(TypeError):
        pins_view[key(1)] = 0  # type: ignore[index]  # deliberately writing a read-only view
    table.complete_load(keys(1, 1))
    assert dict(pins_view) == {}


def test_a_policy_instance_is_used_as_given() -> None:
    policy = LruPolicy()
    table = SlotTable(2, policy=policy)
    assert table.policy is policy
    stored(table, 1, 2)
    assert len(policy) == 2


@pytest.mark.parametrize(
    ("argument", "options"),
    [
        ("num_slots", {"num_slots": 0}),
        ("num_slots", {"num_slots": True}),
        ("pending_deadline_s", {"pending_deadline_s": 0}),
        ("pending_deadline_s", {"pending_deadline_s": float("nan")}),
        ("name", {"name": ""}),
        ("clock", {"clock": 3.0}),
        ("policy", {"policy": "fifo"}),
        ("policy", {"policy": object()}),
    ],
)
def test_bad_configuration_is_a_configuration_error_naming_the_argument(argument: str, options: dict[str, object]) -> None:
    given: dict[str, object] = {"num_slots": 4, **options}
    with pytest.raises(ConfigurationError, match=argument) as info:
        SlotTable(**given)  # type: ignore[arg-type]  # deliberately wrong input
    assert "SlotTable" in str(info.value) and isinstance(info.value, ValueError)


def test_an_infinite_deadline_is_no_deadline() -> None:
    clock_reads = [0]

    def clock() -> float:
        clock_reads[0] += 1
        return 0.0

    table = SlotTable(1, pending_deadline_s=float("inf"), clock=clock)
    assert table.pending_deadline_s == float("inf")
    assert table.prepare_store(keys(1), REQ) is not None
    reads = clock_reads[0]
    assert table.lookup(key(1), REQ) is lr.HIT_PENDING and clock_reads[0] == reads
