"""Broken tiers whose bug is a declaration the tier does not keep, or a pin bug a non-evicting
primary hides from eviction-based checks (CAP-2..CAP-4, TIER-9; KIT-13).

Each has exactly one bug; ``CAPS_GALLERY`` maps each ``kvproto conform`` target to the check and
clause it must fail on, and gallery_index.py gathers it into ``GALLERY``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import replace

import kvproto
from kvproto import MemoryPrimaryTier, MemoryTier, OffloadKey, ReqContext, members as lr
from kvproto.errors import TierMisuseError
from kvproto.testing import MEMORY_HOOKS, TierSpec

from tests.kvproto.testing.gallery import _QUICK, _secondary
from tests.kvproto.testing.gallery_registry import Gallery
from tests.kvproto.testing.honest_tiers import NoEvictionPrimary

CAPS_GALLERY = Gallery()
"""This module's targets, each registered by its factory's ``fails`` decorator (gallery_registry.py)."""


def _primary(cls: type[MemoryPrimaryTier], name: str) -> TierSpec:
    return TierSpec(name, "primary", lambda: cls(num_slots=16, block_bytes=32), limits=_QUICK, tier_class=cls)


class EvictsUndeclared(MemoryPrimaryTier):
    """Bug: evicts (and lists what it evicts) but declares no eviction: it claims never to drop a block."""

    def __init__(self, *, num_slots: int, block_bytes: int) -> None:
        super().__init__(num_slots=num_slots, block_bytes=block_bytes, name="evicts-undeclared")
        self.capabilities = kvproto.Capabilities()  # the bug: the declaration says "never evicts"


@CAPS_GALLERY.fails("test_holds_what_it_stored_without_eviction", "CAP-2", "does not declare eviction")
def evicts_undeclared() -> TierSpec:
    return _primary(EvictsUndeclared, "evicts-undeclared")


class EvictsSilentlyUndeclared(EvictsUndeclared):
    """Bug: evicts without listing the evicted keys, declaring no eviction."""

    def prepare_store(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> kvproto.PrepareStoreOutput | None:
        out = super().prepare_store(keys, req_context)
        return None if out is None else replace(out, evicted=())  # the bug: drops blocks, says nothing


@CAPS_GALLERY.fails("test_holds_what_it_stored_without_eviction", "CAP-2", "declares no eviction reserved")
def evicts_silently_undeclared() -> TierSpec:
    return _primary(EvictsSilentlyUndeclared, "evicts-silently-undeclared")


class PinGoesNegative(NoEvictionPrimary):
    """Bug (non-evicting): complete_load of a key holding no pin raises TierMisuseError, but only
    after counting the release: the count goes to -1, and the next pin taken is lost."""

    def __init__(self, *, num_slots: int, block_bytes: int) -> None:
        super().__init__(num_slots=num_slots, block_bytes=block_bytes, name="pin-goes-negative")
        self._owed: Counter[OffloadKey] = Counter()

    def complete_load(self, keys: Iterable[OffloadKey]) -> None:
        batch = list(keys)
        for key in batch:
            if self.pin_count(key) == 0:
                self._owed[key] += 1  # the bug: the release is counted before the misuse is raised
                raise TierMisuseError(f"{self.name}: complete_load of key {key!r}, which holds no pin", key=key)
        super().complete_load(batch)

    def prepare_load(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> tuple[int, ...]:
        slots = super().prepare_load(keys, req_context)
        for key in keys:
            if self._owed[key]:  # the count was -1: this pin only brings it back to 0
                self._owed[key] -= 1
                super().complete_load([key])
        return slots


@CAPS_GALLERY.fails("test_releasing_a_pin_never_taken_is_misuse", "TIER-9", "negative pin count")
def pin_goes_negative() -> TierSpec:
    return _primary(PinGoesNegative, "pin-goes-negative")


class RetryWithoutAsyncLookup(MemoryTier):
    """Bug: answers RETRY the first time each key is asked, declaring no async_lookup."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="retry-without-async-lookup")
        self._asked: set[OffloadKey] = set()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> kvproto.LookupResult:
        if key not in self._asked:
            self._asked.add(key)
            return lr.RETRY  # the bug: async_lookup is not declared
        return super().lookup(key, req_context)


@CAPS_GALLERY.fails("test_retry_only_when_declared", "CAP-3", "does not declare the async_lookup")
def retry_without_async_lookup() -> TierSpec:
    return _secondary(RetryWithoutAsyncLookup)


class PartialUndeclared(MemoryTier):
    """Bug: reports partial jobs (MemoryTier's fail_keys does) while declaring no partial_jobs."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="partial-undeclared")
        self.capabilities = replace(self.capabilities, partial_jobs=False)  # the bug


@CAPS_GALLERY.fails("test_jobs_are_whole_without_partial_jobs", "CAP-4", "does not declare partial_jobs")
def partial_undeclared() -> TierSpec:
    return _secondary(PartialUndeclared)


class StoredAfterItsEvictions(MemoryTier):
    """Bug: a store job's STORED event is emitted when the job ends, after the REMOVED events of the evictions
    its own puts caused, so a block the job stored and then evicted is named REMOVED, then STORED: a consumer
    applying the events in order (a KV-aware router, a manager skipping write-throughs) believes the tier
    holds blocks it dropped (found by a held-out from-scratch LRU tier, round 3)."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="stored-after-its-evictions", capacity_blocks=16)

    def _run_store(self, job: kvproto.TransferJob) -> list[OffloadKey]:
        ok: list[OffloadKey] = []
        size = self._block_bytes
        for key, slot in zip(job.keys, job.slots, strict=True):
            if key in self._job_faults.keys:
                continue
            self._put(key, bytes(self._flat[slot * size : (slot + 1) * size]))  # evictions' REMOVED go out now
            self._corrupt.discard(key)
            ok.append(key)
        if ok:  # the bug: STORED after the REMOVED events its own puts appended
            self._events.append(kvproto.OffloadingEvent(kvproto.EventKind.STORED, tuple(ok), self.name))
        return ok


@CAPS_GALLERY.fails(
    "test_a_job_larger_than_the_tier_keeps_its_events_in_order", "TIER-14", "came after the REMOVED of its eviction"
)
def stored_after_its_evictions() -> TierSpec:
    return _secondary(StoredAfterItsEvictions)


class KeepsTwiceItsBudget(MemoryTier):
    """Bug: a tier whose configured budget (``budget_blocks``) reaches its eviction doubled (a unit
    mix-up: the budget taken for half-blocks), so its storage holds twice what the operator allowed. It
    declares the budget to the kit through the ``capacity_blocks`` hook (TIER-29)."""

    budget_blocks = 16

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="keeps-twice-its-budget", capacity_blocks=2 * self.budget_blocks)  # the bug


@CAPS_GALLERY.fails("test_a_byte_budget_is_kept", "TIER-29", "the budget is not kept")
def keeps_twice_its_budget() -> TierSpec:
    hooks = {**MEMORY_HOOKS, "capacity_blocks": lambda tier: KeepsTwiceItsBudget.budget_blocks}
    return TierSpec("KeepsTwiceItsBudget", "secondary", KeepsTwiceItsBudget, hooks=hooks, limits=_QUICK,
                    tier_class=KeepsTwiceItsBudget)
