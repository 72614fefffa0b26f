"""``kvproto.tierkit.ForwardingSecondary`` / ``ForwardingPrimary``: every call reaches ``inner``; the
optional abilities (``lookup_many``, ``ready_keys``, ``capabilities``) exist exactly when ``inner`` has
them and never bypass a changed ``lookup``; unchanged wrappers pass the conformance kit."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pytest

import kvproto
from kvproto import (
    BatchLookup,
    Capabilities,
    JobResult,
    LookupResult,
    MemoryPrimaryTier,
    OffloadKey,
    ReadyKeys,
    ReqContext,
    SecondaryTier,
    TransferJob,
)
from kvproto.testing import MEMORY_HOOKS, PrimaryTierTests, SecondaryTierTests
from kvproto.testing.faults import LatencySecondary
from kvproto.tierkit import ForwardingPrimary, ForwardingSecondary, declared_capabilities

R = ReqContext("r")
HIT, MISS = LookupResult.HIT, LookupResult.MISS


def k(i: int) -> OffloadKey:
    return kvproto.make_key(i.to_bytes(4, "big"), 0)


class _Recording:
    """A secondary tier that records every call and answers HIT for the keys in ``stored``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.stored: set[OffloadKey] = set()

    @property
    def name(self) -> str:
        return "recording"

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        self.calls.append(("lookup", (key, req_context)))
        return HIT if key in self.stored else MISS

    def touch(self, keys: Iterable[OffloadKey]) -> None:
        self.calls.append(("touch", (tuple(keys),)))

    def submit_store(self, job: TransferJob) -> None:
        self.calls.append(("submit_store", (job,)))

    def submit_load(self, job: TransferJob) -> None:
        self.calls.append(("submit_load", (job,)))

    def get_finished_jobs(self) -> Sequence[JobResult]:
        self.calls.append(("get_finished_jobs", ()))
        return [JobResult(1, True)]

    def on_request_finished(self, req_context: ReqContext) -> None:
        self.calls.append(("on_request_finished", (req_context,)))

    def on_step_end(self) -> None:
        self.calls.append(("on_step_end", ()))

    def take_events(self) -> Sequence[kvproto.OffloadingEvent]:
        self.calls.append(("take_events", ()))
        return []

    def has_pending_work(self) -> bool:
        self.calls.append(("has_pending_work", ()))
        return True

    def reset_cache(self) -> bool:
        self.calls.append(("reset_cache", ()))
        return False

    def shutdown(self) -> None:
        self.calls.append(("shutdown", ()))


class _Batched(_Recording):
    """The same, with ``lookup_many`` (BatchLookup) and declared capabilities."""

    capabilities = Capabilities(eviction=True, reasons={"sharing": "one process"})

    def lookup_many(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> list[LookupResult]:
        self.calls.append(("lookup_many", (tuple(keys), req_context)))
        return [HIT if key in self.stored else MISS for key in keys]


def test_every_secondary_method_reaches_inner_with_its_arguments_and_answer() -> None:
    inner = _Recording()
    tier: SecondaryTier = ForwardingSecondary(inner)  # mypy proves the protocol (TIER-1)
    store, load = TransferJob(1, (k(1),), (0,), False), TransferJob(2, (k(1),), (0,), True)
    inner.stored.add(k(1))
    assert tier.name == "recording"
    assert tier.lookup(k(1), R) is HIT
    tier.touch([k(1)])
    tier.submit_store(store)
    tier.submit_load(load)
    assert tier.get_finished_jobs() == [JobResult(1, True)]
    tier.on_request_finished(R)
    tier.on_step_end()
    assert tier.take_events() == []
    assert tier.has_pending_work() is True
    assert tier.reset_cache() is False
    tier.shutdown()
    assert inner.calls == [
        ("lookup", (k(1), R)),
        ("touch", ((k(1),),)),
        ("submit_store", (store,)),
        ("submit_load", (load,)),
        ("get_finished_jobs", ()),
        ("on_request_finished", (R,)),
        ("on_step_end", ()),
        ("take_events", ()),
        ("has_pending_work", ()),
        ("reset_cache", ()),
        ("shutdown", ()),
    ]


def test_every_primary_method_reaches_inner() -> None:
    inner = MemoryPrimaryTier(num_slots=4, block_bytes=8)
    tier: kvproto.PrimaryTier = ForwardingPrimary(inner)  # mypy proves the protocol (TIER-1)
    assert tier.buffer is inner.buffer and tier.name == inner.name
    out = tier.prepare_store([k(1), k(2)], R)
    assert out is not None and inner.lookup(k(1), R) is LookupResult.HIT_PENDING
    tier.complete_store([k(1), k(2)], True)
    assert inner.lookup(k(1), R) is HIT and tier.lookup(k(1), R) is HIT
    slots = tier.prepare_load([k(1)], R)
    assert slots == (out.slots[0],) and tier.has_pending_work() is True
    tier.complete_load([k(1)])
    assert tier.has_pending_work() is False
    tier.touch([k(2)])
    tier.on_step_end()
    assert len(tier.take_events()) > 0 and inner.take_events() == []  # inner's events, taken once
    assert tier.reset_cache() is True and inner.lookup(k(1), R) is MISS
    tier.shutdown()


def test_optional_abilities_are_absent_when_inner_lacks_them() -> None:
    tier = ForwardingSecondary(_Recording())
    assert not isinstance(tier, BatchLookup)
    assert not hasattr(tier, "lookup_many")
    assert not hasattr(tier, "capabilities") and declared_capabilities(tier) is None
    primary = ForwardingPrimary(MemoryPrimaryTier(num_slots=4, block_bytes=8))
    assert isinstance(primary, ReadyKeys) and isinstance(primary, BatchLookup)


def test_optional_abilities_are_inner_s_own_when_it_has_them() -> None:
    inner = _Batched()
    inner.stored.add(k(2))
    tier = ForwardingSecondary(inner)
    assert isinstance(tier, BatchLookup)
    assert tier.capabilities is inner.capabilities
    assert tier.lookup_many == inner.lookup_many  # the inner's bound method: no extra call per batch
    assert tier.lookup_many([k(1), k(2)], R) == [MISS, HIT]
    # Through a stack of wrappers, the abilities are still mirrored.
    outer = ForwardingSecondary(ForwardingSecondary(inner))
    assert isinstance(outer, BatchLookup) and outer.capabilities is inner.capabilities
    assert outer.inner.inner is inner


def test_ready_keys_is_inner_s_live_view_while_lookup_is_unchanged() -> None:
    inner = MemoryPrimaryTier(num_slots=4, block_bytes=8)
    tier = ForwardingPrimary(inner)
    assert isinstance(tier, ReadyKeys)
    view = tier.ready_keys
    assert k(1) not in view
    out = inner.prepare_store([k(1)], R)
    assert out is not None
    inner.complete_store([k(1)], True)
    assert k(1) in view  # live: kept up to date in place (MGR-15)


class _Deaf(ForwardingPrimary[MemoryPrimaryTier]):
    """Changes ``lookup`` only: answers MISS for key 1."""

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return MISS if key == k(1) else super().lookup(key, req_context)


def test_a_changed_lookup_is_never_bypassed_by_lookup_many_or_ready_keys() -> None:
    inner = MemoryPrimaryTier(num_slots=4, block_bytes=8)
    out = inner.prepare_store([k(1), k(2)], R)
    assert out is not None
    inner.complete_store([k(1), k(2)], True)
    tier = _Deaf(inner)
    assert not isinstance(tier, ReadyKeys)  # its answers are not inner's: no live view of inner's HITs
    assert isinstance(tier, BatchLookup)
    assert tier.lookup_many([k(1), k(2)], R) == [MISS, HIT]  # key by key through its lookup (TIER-17)


class _Doubled(ForwardingSecondary[_Batched]):
    """Changes the batch answers itself (and lookup alike)."""

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return HIT

    def _lookup_many(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> list[LookupResult]:
        super()._lookup_many(keys, req_context)
        return [HIT for _ in keys]


def test_a_subclass_s_lookup_many_hook_is_offered_only_over_a_batch_tier() -> None:
    inner = _Batched()
    tier = _Doubled(inner)
    assert isinstance(tier, BatchLookup) and tier.lookup_many([k(1)], R) == [HIT]
    assert inner.calls == [("lookup_many", ((k(1),), R))]


class _Declares(ForwardingSecondary[SecondaryTier]):
    def _wrap_capabilities(self, inner: Capabilities | None) -> Capabilities | None:
        return Capabilities(async_lookup=True, max_retry_steps=1)


def test_a_subclass_declares_capabilities_through_the_hook() -> None:
    assert _Declares(_Recording()).capabilities == Capabilities(async_lookup=True, max_retry_steps=1)
    assert LatencySecondary(_Recording(), lookup_steps=2).capabilities.max_retry_steps == 2
    assert not hasattr(LatencySecondary(_Recording()), "capabilities")


def test_capabilities_can_be_set_as_on_any_tier() -> None:
    tier = ForwardingSecondary(_Recording())
    tier.capabilities = Capabilities(persistence=True)
    assert tier.capabilities.persistence is True and declared_capabilities(tier) == Capabilities(persistence=True)


def test_repr_names_the_wrapper_and_inner() -> None:
    inner = _Recording()
    assert repr(ForwardingSecondary(inner)) == f"ForwardingSecondary({inner!r})"


class TestForwardingSecondaryConforms(SecondaryTierTests):
    """An unchanged wrapper is the tier it wraps: the kit passes over MemoryTier, whose backdoor
    hooks reach it through ``inner`` (KIT-5)."""

    kit_profile = "fast"

    def seed_block(self, tier: SecondaryTier, key: OffloadKey, data: bytes) -> None:
        MEMORY_HOOKS["seed_block"](tier, key, data)

    def read_block(self, tier: SecondaryTier, key: OffloadKey) -> bytes | None:
        found: bytes | None = MEMORY_HOOKS["read_block"](tier, key)
        return found

    def fail_next_jobs(self, tier: SecondaryTier, n: int) -> None:
        MEMORY_HOOKS["fail_next_jobs"](tier, n)

    def fail_keys(self, tier: SecondaryTier, keys: Iterable[OffloadKey]) -> None:
        MEMORY_HOOKS["fail_keys"](tier, keys)

    def corrupt_on_read(self, tier: SecondaryTier, keys: Iterable[OffloadKey]) -> None:
        MEMORY_HOOKS["corrupt_on_read"](tier, keys)

    @pytest.fixture
    def tier_factory(self) -> Callable[[memoryview], SecondaryTier]:
        return lambda buffer: ForwardingSecondary(kvproto.MemoryTier(buffer))


class TestForwardingPrimaryConforms(PrimaryTierTests):
    """An unchanged wrapper over the reference CPU tier keeps ready_keys and lookup_many, and conforms."""

    kit_profile = "fast"

    @pytest.fixture
    def tier_factory(self) -> Callable[[], kvproto.PrimaryTier]:
        return lambda: ForwardingPrimary(MemoryPrimaryTier(num_slots=32, block_bytes=64))

