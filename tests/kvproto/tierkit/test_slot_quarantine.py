"""``SlotTable.quarantine_stores`` / ``release_slots`` (kvproto.SlotQuarantine): an abandoned store frees its key
at once and holds its slot until its transfer is over (CPU-8, MGR-17)."""

from __future__ import annotations

import pytest

from kvproto import MemoryPrimaryTier, OffloadKey, ReqContext, SlotQuarantine, make_key
from kvproto.errors import InvalidArgumentError, TierMisuseError

R = ReqContext("r")


def key(i: int) -> OffloadKey:
    return make_key(i.to_bytes(4, "big"), 0)


def test_an_abandoned_store_frees_its_key_and_holds_its_slot() -> None:
    tier = MemoryPrimaryTier(num_slots=2, block_bytes=4)
    assert isinstance(tier, SlotQuarantine)
    out = tier.prepare_store([key(1)], R)
    assert out is not None
    (held,) = tier.quarantine_stores([key(1), key(9)])  # key(9) was never reserved: skipped
    assert held == out.slots[0]
    assert tier.lookup(key(1), R).name == "MISS" and not tier.has_pending_work()
    assert tier.quarantined_slots == 1 and tier.free_slots == 1 and tier.stats.abandoned_stores == 1
    again = tier.prepare_store([key(1)], R)  # the key can be stored again, in another slot
    assert again is not None and again.keys_to_store == (key(1),) and again.slots[0] != held
    tier.complete_store([key(1)], True)
    other = tier.prepare_store([key(2)], R)  # evicts key(1): the held slot is never handed out
    assert other is not None and other.slots == again.slots and other.evicted == (key(1),)
    tier.complete_store([key(2)], True)
    assert tier.reset_cache() and tier.quarantined_slots == 1 and tier.free_slots == 1
    tier.release_slots([held])
    assert tier.quarantined_slots == 0 and tier.free_slots == 2 and tier.stats.released_slots == 1


def test_an_expired_write_can_be_abandoned_too() -> None:
    now = [0.0]
    tier = MemoryPrimaryTier(num_slots=1, block_bytes=4, pending_deadline_s=1.0, clock=lambda: now[0])
    out = tier.prepare_store([key(1)], R)
    assert out is not None
    now[0] = 5.0
    tier.on_step_end()  # expired: the key itself is quarantined (CPU-8)
    assert tier.prepare_store([key(1)], R) is not None and tier.prepare_store([key(1)], R).keys_to_store == ()  # type: ignore[union-attr]  # checked just before
    assert tier.quarantine_stores([key(1)]) == out.slots
    again = tier.prepare_store([key(1)], R)
    assert again is None  # the only slot is held: no room, but the key is no longer refused
    tier.release_slots(out.slots)
    again = tier.prepare_store([key(1)], R)
    assert again is not None and again.keys_to_store == (key(1),)


def test_releasing_a_slot_not_held_is_misuse_and_changes_nothing() -> None:
    tier = MemoryPrimaryTier(num_slots=3, block_bytes=4)
    out = tier.prepare_store([key(1), key(2)], R)
    assert out is not None
    held = tier.quarantine_stores([key(1)])
    with pytest.raises(TierMisuseError, match="not held"):
        tier.release_slots([held[0], out.slots[1]])
    with pytest.raises(TierMisuseError, match="twice"):
        tier.release_slots([held[0], held[0]])
    with pytest.raises(TierMisuseError, match="out of range"):
        tier.release_slots([7])
    assert tier.quarantined_slots == 1
    with pytest.raises(InvalidArgumentError):
        tier.quarantine_stores(key(2))  # type: ignore[arg-type]  # a single key, not a batch
    tier.release_slots(held)
    with pytest.raises(TierMisuseError, match="not held"):
        tier.release_slots(held)
