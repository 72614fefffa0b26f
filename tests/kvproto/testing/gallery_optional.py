"""Broken primaries that offer an optional ability the tiering manager relies on and do not keep it:
``ready_contains`` (TIER-27) and :class:`kvproto.SlotQuarantine` (TIER-28); and one whose reset loses
slots (TIER-16) and one that takes only sequences where its protocol says any iterable (TIER-1).
Found by mutation testing (issue 17, section 5: docs/mutation/memory-primary.json). And one whose
refused store loses its eviction candidates (TIER-6, held-out round 10's LFU primary).

Each is a MemoryPrimaryTier with exactly one bug; ``OPTIONAL_GALLERY`` maps each ``kvproto conform``
target to the check and clause it must fail on, and gallery_index.py gathers it into ``GALLERY``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Container, Iterable, Sequence

from kvproto import MemoryPrimaryTier, OffloadKey
from kvproto.testing import TierSpec

from tests.kvproto.testing.gallery import memory_primary_spec
from tests.kvproto.testing.gallery_registry import Gallery

OPTIONAL_GALLERY = Gallery()
"""This module's targets, each registered by its factory's ``fails`` decorator (gallery_registry.py)."""


class SnapshotReadyContains(MemoryPrimaryTier):
    """Bug: ``ready_contains`` tests a copy of the ready keys taken when it is read, not the live
    dict: the manager reads it once, at its construction, and would find no key HIT ever after."""

    @property
    def ready_contains(self) -> Callable[[OffloadKey], bool]:
        return set(self.ready_slots).__contains__  # the bug: a snapshot


@OPTIONAL_GALLERY.fails("test_ready_contains_agrees_with_ready_keys", "TIER-27", "must stay a live test of ready_keys")
def snapshot_ready_contains() -> TierSpec:
    return memory_primary_spec(SnapshotReadyContains)


class QuarantineFreesItsSlot(MemoryPrimaryTier):
    """Bug: ``quarantine_stores`` gives the slot of an abandoned store back at once, so a later store
    may be reserved in a row the abandoned transfer can still land in."""

    def quarantine_stores(self, keys: Sequence[OffloadKey]) -> tuple[int, ...]:
        slots = super().quarantine_stores(keys)
        super().release_slots(slots)  # the bug: the slot is not held
        return slots

    def release_slots(self, slots: object) -> None:
        pass  # nothing held, so nothing to give back


@OPTIONAL_GALLERY.fails("test_quarantined_stores_free_the_key_and_hold_the_slot", "TIER-28", "before release_slots gave it back")
def quarantine_frees_its_slot() -> TierSpec:
    return memory_primary_spec(QuarantineFreesItsSlot)


class ResetLosesSlots(MemoryPrimaryTier):
    """Bug: ``reset_cache`` rebuilds its free list from slot 2 up, so every reset loses slots 0 and 1
    (found by mutation testing, like the two above)."""

    def reset_cache(self) -> bool:
        done = super().reset_cache()
        if done:
            self._free[:] = [s for s in self._free if s > 1]  # the bug
        return done


@OPTIONAL_GALLERY.fails("test_reset_cache_forgets_blocks", "TIER-16", "every slot is free again")
def reset_loses_slots() -> TierSpec:
    return memory_primary_spec(ResetLosesSlots)


class SequencesOnly(MemoryPrimaryTier):
    """Bug: ``complete_store`` sizes its keys with ``len`` first, so the iterable its protocol signature
    allows (a generator) raises TypeError (found by mutation testing: a fast path that did so)."""

    def complete_store(self, keys: Iterable[OffloadKey], success: bool) -> None:
        if len(keys) == 0:  # type: ignore[arg-type]  # the bug: an Iterable has no len
            return
        super().complete_store(keys, success)


@OPTIONAL_GALLERY.fails("test_keys_given_as_any_iterable", "TIER-1", "takes any iterable of keys")
def sequences_only() -> TierSpec:
    return memory_primary_spec(SequencesOnly)


class _Either:
    """Keys in either of two containers."""

    def __init__(self, first: Container[OffloadKey], second: Container[OffloadKey]) -> None:
        self.first, self.second = first, second

    def __contains__(self, key: object) -> bool:
        return key in self.first or key in self.second


class RefusedStoreForgetsItsCandidates(MemoryPrimaryTier):
    """Bug: its policy takes candidates off its own heap as it looks for victims and puts them back only
    when it found enough: after one store refused while most blocks were pinned (a long prefill loading its
    prefix), those blocks stay READY but are never evicted again, and every later store that needs room is
    refused, pins released or not (held-out round 10's LFU primary)."""

    def __init__(self, *, num_slots: int, block_bytes: int) -> None:
        super().__init__(num_slots=num_slots, block_bytes=block_bytes)
        self._lost: set[OffloadKey] = set()

    def select_victims(
        self, count: int, keep: Container[OffloadKey], incoming: Collection[OffloadKey] = ()
    ) -> list[OffloadKey] | None:
        chosen = super().select_victims(count, _Either(keep, self._lost), incoming)
        if chosen is None:
            self._lost.update(self.ready_slots)  # the bug: the candidates it took off are not put back
        return chosen

    def reset_cache(self) -> bool:
        done = super().reset_cache()
        if done:
            self._lost.clear()
        return done


@OPTIONAL_GALLERY.fails(
    "test_state_machine_from_a_full_tier", "TIER-6", "a refusal must mean not enough can be evicted", profile="default"
)
def refused_store_forgets_its_candidates() -> TierSpec:
    return memory_primary_spec(RefusedStoreForgetsItsCandidates)
