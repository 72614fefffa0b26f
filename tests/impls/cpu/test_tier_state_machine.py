"""CpuTier against a dict model under random operation sequences (CPU-3..CPU-10).

Rules: store (with eviction pressure), complete ok or failed, lookup, load pin
and release, touch, misuse calls, clock advances with deadline expiry, late
writes of expired stores landing in their old slot, reset. After every step:
states, pin counts and free slots match the model, pin counts are never
negative, and every READY block's bytes in the buffer are the bytes written.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvproto_cpu import BlockState, CpuTier
from kvproto import EventKind, OffloadingEvent, OffloadKey
from kvproto import members as lr
from kvproto.errors import TierMisuseError

from tests.impls.cpu._support import REQ, FakeClock, key, make_tier

NUM_SLOTS = 4
BLOCK_BYTES = 8
DEADLINE = 5.0
KEYS = [key(i) for i in range(8)]

key_st = st.sampled_from(KEYS)


@dataclass
class _Writing:
    slot: int
    content: bytes
    started: float


class CpuTierMachine(RuleBasedStateMachine):
    POLICY = "lru"

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.tier: CpuTier
        self.tier, _ = make_tier(
            NUM_SLOTS,
            BLOCK_BYTES,
            policy=self.POLICY,
            deadline=DEADLINE,
            clock=self.clock,
        )
        self.ready: dict[OffloadKey, tuple[int, bytes]] = {}
        self.writing: dict[OffloadKey, _Writing] = {}
        self.pins: Counter[OffloadKey] = Counter()
        self.quarantined: dict[OffloadKey, tuple[int, float]] = {}
        self.expired: set[OffloadKey] = set()
        self.serial = 0

    # ------------------------------------------------------------ model helpers

    def free(self) -> int:
        return NUM_SLOTS - len(self.ready) - len(self.writing) - len(self.quarantined)

    def expire(self, k: OffloadKey) -> None:
        w = self.writing.pop(k)
        self.quarantined[k] = (w.slot, self.clock.now)

    def content(self) -> bytes:
        self.serial += 1
        return bytes((self.serial * 31 + i) % 256 for i in range(BLOCK_BYTES))

    def write_slot(self, slot: int, data: bytes) -> None:
        self.tier.slot_view(slot)[:] = data

    # ------------------------------------------------------------ rules

    @rule(ks=st.lists(key_st, min_size=1, max_size=5))
    def prepare_store(self, ks: list[OffloadKey]) -> None:
        to_store: list[OffloadKey] = []
        for k in ks:
            if k in to_store or k in self.ready or k in self.writing or k in self.quarantined:
                continue
            to_store.append(k)
        shortfall = len(to_store) - self.free()
        evictable = {k for k in self.ready if self.pins[k] == 0 and k not in ks}
        out = self.tier.prepare_store(ks, REQ)
        events = self.tier.take_events()
        if shortfall > len(evictable):
            assert out is None and events == []
            return
        assert out is not None
        assert list(out.keys_to_store) == to_store
        assert len(out.evicted) == max(0, shortfall) and set(out.evicted) <= evictable
        removed = [OffloadingEvent(EventKind.REMOVED, out.evicted, "cpu")] if out.evicted else []
        assert events == removed
        for victim in out.evicted:
            del self.ready[victim]
            self.expired.discard(victim)
        taken = {s for s, _ in self.ready.values()} | {w.slot for w in self.writing.values()}
        taken |= {s for s, _ in self.quarantined.values()}
        assert len(set(out.slots)) == len(out.slots)
        for k, slot in zip(out.keys_to_store, out.slots, strict=True):
            assert 0 <= slot < NUM_SLOTS and slot not in taken
            data = self.content()
            self.write_slot(slot, data)  # the transfer writing the block
            self.writing[k] = _Writing(slot, data, self.clock.now)
            self.expired.discard(k)

    @precondition(lambda self: bool(self.writing) or bool(self.ready))
    @rule(data=st.data(), ok=st.booleans())
    def complete_store(self, data: st.DataObject, ok: bool) -> None:
        candidates = sorted(self.writing) + sorted(self.ready)
        ks = data.draw(st.lists(st.sampled_from(candidates), min_size=1, max_size=4))
        self.tier.complete_store(ks, ok)
        stored: list[OffloadKey] = []
        for k in ks:
            w = self.writing.pop(k, None)
            if w is not None and ok:
                self.ready[k] = (w.slot, w.content)
                stored.append(k)
        done = [OffloadingEvent(EventKind.STORED, tuple(stored), "cpu")] if stored else []
        assert self.tier.take_events() == done

    @rule(k=key_st)
    def complete_store_of_unknown_key_is_misuse(self, k: OffloadKey) -> None:
        known = k in self.writing or k in self.ready or k in self.quarantined or k in self.expired
        if known:
            return
        with pytest.raises(TierMisuseError) as info:
            self.tier.complete_store([k], True)
        assert info.value.key == k

    @precondition(lambda self: bool(self.quarantined) or bool(self.expired))
    @rule(data=st.data(), ok=st.booleans())
    def late_write_then_completion(self, data: st.DataObject, ok: bool) -> None:
        k = data.draw(st.sampled_from(sorted(set(self.quarantined) | self.expired)))
        if k in self.quarantined:
            slot, _ = self.quarantined.pop(k)
            self.write_slot(slot, b"\xee" * BLOCK_BYTES)  # the stale transfer lands late
        else:
            self.expired.discard(k)
        self.tier.complete_store([k], ok)
        assert self.tier.take_events() == []

    @rule(k=key_st)
    def lookup(self, k: OffloadKey) -> None:
        if k in self.ready:
            expected = lr.HIT
        elif k in self.writing:
            if self.clock.now - self.writing[k].started > DEADLINE:
                self.expire(k)
                expected = lr.MISS
            else:
                expected = lr.HIT_PENDING
        else:
            expected = lr.MISS
        assert self.tier.lookup(k, REQ) is expected

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

    @rule(dt=st.sampled_from([1.0, 3.0, 6.0, 25.0]))
    def step(self, dt: float) -> None:
        self.clock.advance(dt)
        now = self.clock.now
        for k in [k for k, w in self.writing.items() if now - w.started > DEADLINE]:
            self.expire(k)
        self.tier.on_step_end()

    @rule()
    def reset(self) -> None:
        expected = not self.writing and +self.pins == Counter()
        assert self.tier.reset_cache() is expected
        events = self.tier.take_events()
        if expected and self.ready:
            assert len(events) == 1 and events[0].kind is EventKind.REMOVED
            assert set(events[0].keys) == set(self.ready)
        else:
            assert events == []
        if expected:
            self.ready.clear()

    # ------------------------------------------------------------ invariants

    @invariant()
    def states_match_the_model(self) -> None:
        for k in KEYS:
            if k in self.ready:
                want = BlockState.PINNED if self.pins[k] > 0 else BlockState.READY
            elif k in self.writing:
                want = BlockState.WRITING
            else:
                want = BlockState.ABSENT
            assert self.tier.state(k) is want, k
            assert self.tier.pin_count(k) == self.pins[k] >= 0

    @invariant()
    def free_slots_match_the_model(self) -> None:
        assert self.tier.free_slots == self.free()
        assert self.tier.has_pending_work() is (bool(self.writing) or +self.pins != Counter())

    @invariant()
    def ready_bytes_are_the_bytes_written(self) -> None:
        for k, (slot, data) in self.ready.items():
            assert self.tier.slot_of(k) == slot
            assert bytes(self.tier.slot_view(slot)) == data


class ArcCpuTierMachine(CpuTierMachine):
    POLICY = "arc"


_SETTINGS = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
CpuTierMachine.TestCase.settings = _SETTINGS
ArcCpuTierMachine.TestCase.settings = _SETTINGS
TestCpuTierMachineLru = CpuTierMachine.TestCase
TestCpuTierMachineArc = ArcCpuTierMachine.TestCase
