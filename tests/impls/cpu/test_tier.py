"""Unit tests of every CpuTier transition and misuse error (CPU-2..CPU-10)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from kvproto_cpu import BlockState, CpuTier, CpuTierConfig
from kvproto import EventKind, OffloadingEvent, PrimaryTier, ReqContext
from kvproto import members as lr
from kvproto.errors import ConfigurationError, InvalidArgumentError, KvprotoError, TierMisuseError

from tests.impls.cpu._support import REQ, key, keys, make_tier


def stored(tier: CpuTier, *ids: int) -> None:
    out = tier.prepare_store(keys(*ids), REQ)
    assert out is not None
    tier.complete_store(out.keys_to_store, True)


# ---------------------------------------------------------------- protocol and buffer (CPU-2)


def test_satisfies_primary_tier_structurally() -> None:
    tier, _ = make_tier()
    as_protocol: PrimaryTier = tier  # mypy proves the structure; isinstance checks names
    assert isinstance(as_protocol, PrimaryTier)
    assert tier.name == "cpu"


def test_buffer_is_writable_2d_bytes_view_sharing_the_tensor() -> None:
    tier, _ = make_tier(num_slots=3, block_bytes=8)
    view = tier.buffer
    assert view.format == "B" and view.ndim == 2 and view.shape == (3, 8)
    assert not view.readonly and view.c_contiguous
    view[2, 5] = 77
    assert int(tier.tensor[2, 5]) == 77
    tier.tensor[1, 0] = 9
    assert view[1, 0] == 9
    assert tier.tensor.dtype == torch.uint8 and tuple(tier.tensor.shape) == (3, 8)
    row = tier.slot_view(1)
    assert row.nbytes == 8 and row[0] == 9
    row[7] = 3
    assert int(tier.tensor[1, 7]) == 3


def test_buffer_outlives_the_tier() -> None:
    tier, _ = make_tier(num_slots=2, block_bytes=8)
    view = tier.buffer
    del tier
    view[1, 7] = 5
    assert view[1, 7] == 5


def test_pin_memory_off_is_unpinned() -> None:
    tier, _ = make_tier()
    assert tier.pinned is False


@pytest.mark.parametrize("slot", [-1, 4, 99, True, 1.0])
def test_slot_out_of_range_is_misuse(slot: object) -> None:
    tier, _ = make_tier(num_slots=4)
    with pytest.raises(TierMisuseError, match="out of range"):
        tier.check_slot(slot)  # type: ignore[arg-type]  # deliberately wrong input
    with pytest.raises(TierMisuseError):
        tier.slot_view(slot)  # type: ignore[arg-type]  # deliberately wrong input


def test_capacity_bytes_rounds_down_to_whole_slots() -> None:
    tier = CpuTier(CpuTierConfig(capacity_bytes=100, block_bytes=16, pin_memory="off"))
    assert tier.num_slots == 6 and tier.buffer.shape == (6, 16)


# ---------------------------------------------------------------- states and lookups (CPU-3)


def test_states_absent_writing_ready_pinned() -> None:
    tier, _ = make_tier()
    k = key(1)
    assert tier.state(k) is BlockState.ABSENT and tier.lookup(k, REQ) is lr.MISS
    out = tier.prepare_store([k], REQ)
    assert out is not None and out.keys_to_store == (k,)
    assert tier.state(k) is BlockState.WRITING and tier.lookup(k, REQ) is lr.HIT_PENDING
    assert tier.slot_of(k) == out.slots[0]
    tier.complete_store([k], True)
    assert tier.state(k) is BlockState.READY and tier.lookup(k, REQ) is lr.HIT
    assert tier.prepare_load([k], REQ) == out.slots
    assert tier.state(k) is BlockState.PINNED and tier.lookup(k, REQ) is lr.HIT
    tier.complete_load([k])
    assert tier.state(k) is BlockState.READY


def test_failed_store_becomes_absent_and_frees_the_slot() -> None:
    tier, _ = make_tier(num_slots=1)
    out = tier.prepare_store(keys(1), REQ)
    assert out is not None and tier.free_slots == 0
    tier.complete_store(keys(1), False)
    assert tier.lookup(key(1), REQ) is lr.MISS and tier.free_slots == 1
    assert tier.stats.stores_failed == 1
    assert tier.take_events() == []


def test_failure_leaves_ready_blocks_untouched() -> None:
    tier, _ = make_tier()
    stored(tier, 1)
    out = tier.prepare_store(keys(1, 2), REQ)
    assert out is not None and out.keys_to_store == (key(2),)
    tier.complete_store(keys(1, 2), False)
    assert tier.lookup(key(1), REQ) is lr.HIT
    assert tier.lookup(key(2), REQ) is lr.MISS


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


def test_lookup_many_matches_lookup() -> None:
    tier, _ = make_tier()
    stored(tier, 1)
    assert tier.prepare_store(keys(2), REQ) is not None
    assert tier.lookup_many(keys(1, 2, 3), REQ) == [lr.HIT, lr.HIT_PENDING, lr.MISS]


# ---------------------------------------------------------------- prepare_store (CPU-4)


def test_prepare_store_skips_present_and_duplicate_keys() -> None:
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


def test_slots_are_distinct_and_in_range() -> None:
    tier, _ = make_tier(num_slots=4)
    out = tier.prepare_store(keys(1, 2, 3, 4), REQ)
    assert out is not None and sorted(out.slots) == [0, 1, 2, 3]


def test_eviction_takes_exactly_the_shortfall_in_lru_order() -> None:
    tier, _ = make_tier(num_slots=4)
    stored(tier, 1, 2, 3)
    tier.take_events()
    out = tier.prepare_store(keys(10, 11, 12), REQ)  # 1 free slot, shortfall 2
    assert out is not None
    assert out.evicted == (key(1), key(2))
    assert tier.lookup(key(1), REQ) is lr.MISS and tier.lookup(key(3), REQ) is lr.HIT
    assert tier.take_events() == [OffloadingEvent(EventKind.REMOVED, (key(1), key(2)), "cpu")]
    assert tier.stats.evictions == 2


def test_touch_updates_recency() -> None:
    tier, _ = make_tier(num_slots=2)
    stored(tier, 1, 2)
    tier.touch(keys(1, 99))  # unknown keys are ignored
    out = tier.prepare_store(keys(3), REQ)
    assert out is not None and out.evicted == (key(2),)


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


def test_all_or_nothing_none_changes_nothing() -> None:
    tier, _ = make_tier(num_slots=3)
    stored(tier, 1, 2)
    tier.prepare_load(keys(1), REQ)
    tier.take_events()
    assert tier.prepare_store(keys(5, 6, 7), REQ) is None  # needs 2 evictions, only 1 possible
    assert [tier.lookup(k, REQ) for k in keys(1, 2, 5, 6, 7)] == [lr.HIT, lr.HIT, lr.MISS, lr.MISS, lr.MISS]
    assert tier.take_events() == [] and tier.free_slots == 1 and tier.stats.evictions == 0


def test_completed_store_emits_stored_event() -> None:
    tier, _ = make_tier()
    out = tier.prepare_store(keys(1, 2), REQ)
    assert out is not None
    tier.complete_store(keys(2, 1), True)
    assert tier.take_events() == [OffloadingEvent(EventKind.STORED, (key(2), key(1)), "cpu")]
    assert tier.take_events() == []


def test_arc_policy_is_selectable() -> None:
    tier, _ = make_tier(num_slots=2, policy="arc")
    stored(tier, 1, 2)
    tier.touch(keys(1))  # 1 moves to T2; 2 stays in T1 and goes first
    out = tier.prepare_store(keys(3), REQ)
    assert out is not None and out.evicted == (key(2),)


# ---------------------------------------------------------------- misuse (CPU-10)


def test_complete_store_of_unprepared_key_is_misuse_and_changes_nothing() -> None:
    tier, _ = make_tier()
    assert tier.prepare_store(keys(1), REQ) is not None
    with pytest.raises(TierMisuseError, match="never prepared") as info:
        tier.complete_store(keys(1, 2), True)
    assert info.value.key == key(2)
    assert isinstance(info.value, KvprotoError)
    assert tier.state(key(1)) is BlockState.WRITING


@pytest.mark.parametrize("setup", ["absent", "writing"])
def test_prepare_load_of_a_block_not_ready_is_misuse(setup: str) -> None:
    tier, _ = make_tier()
    stored(tier, 1)
    if setup == "writing":
        assert tier.prepare_store(keys(2), REQ) is not None
    with pytest.raises(TierMisuseError, match="not READY") as info:
        tier.prepare_load(keys(1, 2), REQ)
    assert info.value.key == key(2)
    assert tier.pin_count(key(1)) == 0  # all or nothing


def test_pins_are_counted() -> None:
    tier, _ = make_tier(num_slots=1)
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


def test_releasing_more_pins_than_taken_is_misuse() -> None:
    tier, _ = make_tier()
    stored(tier, 1, 2)
    tier.prepare_load(keys(1, 2), REQ)
    with pytest.raises(TierMisuseError, match="holds 1") as info:
        tier.complete_load(keys(2, 1, 1))
    assert info.value.key == key(1)
    assert tier.pin_count(key(1)) == 1 and tier.pin_count(key(2)) == 1
    with pytest.raises(TierMisuseError):
        tier.complete_load(keys(3))


# ---------------------------------------------------------------- deadline and quarantine (CPU-7, CPU-8)


def test_write_past_deadline_answers_miss_on_lookup() -> None:
    tier, clock = make_tier(deadline=5.0)
    assert tier.prepare_store(keys(1), REQ) is not None
    clock.advance(5.0)
    assert tier.lookup(key(1), REQ) is lr.HIT_PENDING  # exactly at the deadline: still pending
    clock.advance(0.5)
    assert tier.lookup(key(1), REQ) is lr.MISS
    assert tier.state(key(1)) is BlockState.ABSENT and tier.stats.expired_writes == 1
    assert not tier.has_pending_work()


def test_on_step_end_expires_only_overdue_writes() -> None:
    tier, clock = make_tier(deadline=5.0)
    assert tier.prepare_store(keys(1), REQ) is not None
    clock.advance(3.0)
    assert tier.prepare_store(keys(2), REQ) is not None
    clock.advance(3.0)
    tier.on_step_end()
    assert tier.state(key(1)) is BlockState.ABSENT and tier.state(key(2)) is BlockState.WRITING


def test_expired_slot_is_quarantined_until_the_late_completion() -> None:
    tier, clock = make_tier(num_slots=2, deadline=5.0)
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


def test_quarantine_never_ends_by_time_only_by_the_late_completion() -> None:
    """CPU-8: however long the late write takes, its slot is not reused before it completes."""
    tier, clock = make_tier(num_slots=1, deadline=5.0)
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


def test_key_can_be_stored_again_after_its_late_completion() -> None:
    tier, clock = make_tier(num_slots=1, deadline=5.0)
    assert tier.prepare_store(keys(1), REQ) is not None
    clock.advance(6.0)
    tier.on_step_end()  # expired: quarantined from now
    tier.complete_store(keys(1), False)  # the late transfer reports (failed)
    out = tier.prepare_store(keys(1), REQ)
    assert out is not None and out.keys_to_store == (key(1),)
    tier.complete_store(keys(1), True)
    assert tier.lookup(key(1), REQ) is lr.HIT


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda tier: tier.prepare_store("xyz", REQ), "single str"),
        (lambda tier: tier.prepare_store([b"ok", 7], REQ), "key #1 is 7"),
        (lambda tier: tier.prepare_load(key(1), REQ), "single bytes"),
        (lambda tier: tier.complete_store(keys(1), "no"), "success must be a bool"),
    ],
)
def test_bad_arguments_are_typed_errors_and_change_nothing(call: Callable[[CpuTier], object], words: str) -> None:
    """A str or single key as ``keys``, a non-bytes key or a non-bool success: InvalidArgumentError, no change."""
    tier, _ = make_tier(num_slots=2)
    first = tier.prepare_store(keys(1), REQ)
    assert first is not None
    tier.complete_store(keys(1), True)
    with pytest.raises(InvalidArgumentError, match=words):
        call(tier)
    assert tier.lookup(key(1), REQ) is lr.HIT and tier.free_slots == 1 and not tier.has_pending_work()


def test_a_buffer_too_large_to_map_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="cannot allocate the slot buffer"):
        make_tier(num_slots=2**20, block_bytes=2**40)


# ---------------------------------------------------------------- lifecycle (TIER-12..16)


def test_has_pending_work_tracks_writes_and_pins() -> None:
    tier, _ = make_tier()
    assert not tier.has_pending_work()
    assert tier.prepare_store(keys(1), REQ) is not None
    assert tier.has_pending_work()
    tier.complete_store(keys(1), True)
    assert not tier.has_pending_work()
    tier.prepare_load(keys(1), REQ)
    assert tier.has_pending_work()
    tier.complete_load(keys(1))
    assert not tier.has_pending_work()


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
    assert tier.lookup(key(1), REQ) is lr.MISS and tier.free_slots == 4
    events = tier.take_events()
    assert len(events) == 1 and events[0].kind is EventKind.REMOVED
    assert set(events[0].keys) == set(keys(1, 2))


def test_reset_cache_keeps_quarantined_slots() -> None:
    tier, clock = make_tier(num_slots=2, deadline=1.0)
    assert tier.prepare_store(keys(1), REQ) is not None
    clock.advance(2.0)
    tier.on_step_end()
    assert tier.reset_cache() is True
    assert tier.free_slots == 1


def test_shutdown_fails_writes_and_refuses_new_stores() -> None:
    tier, _ = make_tier()
    stored(tier, 1)
    assert tier.prepare_store(keys(2), REQ) is not None
    tier.shutdown()
    tier.shutdown()
    assert tier.lookup(key(2), REQ) is lr.MISS
    assert tier.prepare_store(keys(3), REQ) is None
    assert not tier.has_pending_work()


def test_on_request_finished_keeps_blocks() -> None:
    tier, _ = make_tier()
    stored(tier, 1)
    tier.on_request_finished(ReqContext("other"))
    assert tier.lookup(key(1), REQ) is lr.HIT
