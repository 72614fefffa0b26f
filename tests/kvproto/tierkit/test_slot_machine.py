"""The primary tiers built on SlotTable against one dict model under random operation sequences (CPU-3..CPU-10, MEM-10).

One Hypothesis state machine, run against ``MemoryPrimaryTier`` and, where
torch imports, ``CpuTier`` with LRU and with ARC. Rules: store (with eviction
pressure), complete ok or failed, lookup, load pin and release, touch, misuse
calls, clock advances with deadline expiry, late writes of expired stores
landing in their old (quarantined) slot, reset. After every step: states, pin
counts, free and quarantined slots match the model; pin counts are never
negative; every READY block's bytes are the bytes written; no slot handed out
is one a late write may still land in. On the LRU tiers evictions are checked
in exact LRU order; under ARC, that exactly the shortfall of evictable blocks goes.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvproto import BlockState, EventKind, OffloadingEvent, OffloadKey, members as lr, unreachable
from kvproto.errors import TierMisuseError

from tests.kvproto.tierkit._slots_support import CPU_ARC, CPU_LRU, HAS_TORCH, MEMORY, REQ, Flavor, key

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


class SlotTierMachine(RuleBasedStateMachine):
    """The tier against a model of ABSENT / WRITING / READY, pins, recency order and quarantined slots."""

    FLAVOR: Flavor = MEMORY

    def __init__(self) -> None:
        super().__init__()
        self.tier, self.clock = self.FLAVOR.make(NUM_SLOTS, BLOCK_BYTES, deadline=DEADLINE)
        self.name = self.tier.name
        self.exact_lru = self.FLAVOR.policy == "lru"
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

    def expire(self, k: OffloadKey) -> None:
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
        if self.exact_lru:
            assert list(out.evicted) == evictable[:shortfall]  # exactly the shortfall, LRU first
        else:
            assert len(out.evicted) == shortfall and set(out.evicted) <= set(evictable)
        assert events == ([OffloadingEvent(EventKind.REMOVED, out.evicted, self.name)] if out.evicted else [])
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
        want = [OffloadingEvent(EventKind.STORED, tuple(done), self.name)] if done else []
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
                self.expire(k)
            want = lr.MISS
        got = self.tier.lookup(k, REQ)
        match got:
            case lr.HIT | lr.HIT_PENDING | lr.MISS:
                assert got is want, (k, got, want)
            case lr.RETRY:
                raise AssertionError("a primary tier never answers RETRY (LR-4)")
            case _ as other:
                unreachable(other, where="SlotTierMachine.lookup")

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

    @rule(dt=st.sampled_from([1.0, 3.0, 6.0, 25.0]))
    def step(self, dt: float) -> None:
        self.clock.advance(dt)
        for k in [k for k, w in self.writing.items() if self.clock.now - w.started > DEADLINE]:
            self.expire(k)
        self.tier.on_step_end()

    @rule()
    def reset(self) -> None:
        expected = not self.writing and +self.pins == Counter()
        assert self.tier.reset_cache() is expected
        events = self.tier.take_events()
        if expected and self.ready:
            assert len(events) == 1 and events[0].kind is EventKind.REMOVED and events[0].tier == self.name
            assert sorted(events[0].keys) == sorted(self.ready)
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


class CpuLruMachine(SlotTierMachine):
    FLAVOR = CPU_LRU


class CpuArcMachine(SlotTierMachine):
    FLAVOR = CPU_ARC


_SETTINGS = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
_NO_TORCH = pytest.mark.skipif(not HAS_TORCH, reason="CpuTier needs torch and kvproto-cpu")
SlotTierMachine.TestCase.settings = _SETTINGS
CpuLruMachine.TestCase.settings = _SETTINGS
CpuArcMachine.TestCase.settings = _SETTINGS
TestMemoryPrimaryTierMachine = SlotTierMachine.TestCase
TestCpuTierMachineLru = _NO_TORCH(CpuLruMachine.TestCase)
TestCpuTierMachineArc = _NO_TORCH(CpuArcMachine.TestCase)
