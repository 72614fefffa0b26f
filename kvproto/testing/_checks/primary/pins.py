"""A primary tier's pin and capacity checks, for every primary, evicting or not (TIER-6, TIER-8,
TIER-9, CAP-2, CAP-5): :class:`PrimaryPinChecks`, a base of :class:`~kvproto.testing.PrimaryTierTests`.

Where a tier declares ``eviction``, a check shows a pin's protection by a store that evicts
everything else. Where it does not, a store into a full tier must answer ``None`` (it may drop no
block, CAP-2), so the check shows the pin by what such a tier does instead (CAP-5): a full tier
refuses while a block is pinned and after the pin is released, keeping every block;
``has_pending_work`` is True exactly while a pin is held; ``reset_cache`` refuses while one is.
"""

from __future__ import annotations

from kvproto import members as lr
from kvproto._events import EventKind
from kvproto.errors import TierMisuseError
from kvproto.testing._checks.shared import TierChecks
from kvproto.testing._harness.data import key_pool
from kvproto.testing._harness.decorator import check
from kvproto.testing._harness.driver import short_key
from kvproto.testing._harness.failures import ConformanceFailure
from kvproto.testing._harness.primary_driver import PrimaryDriver

__all__ = ["PrimaryPinChecks"]


class PrimaryPinChecks(TierChecks[PrimaryDriver]):
    """The pin checks of every primary tier (see the module's docstring); documented on ``PrimaryTierTests``."""

    @check("TIER-8")
    def test_pinned_block_is_not_evicted(self, kit: PrimaryDriver) -> None:
        """A pinned block stays HIT with its bytes while stores evict everything else; without
        eviction, a full tier refuses stores while it is pinned and after, keeping every block."""
        keys = key_pool("p-pin", kit.num_slots)
        kit.store(keys)
        kit.load(keys[:1])
        extra = key_pool("p-pin-extra", kit.num_slots - 1)
        if kit.evicts:
            out = kit.store(extra)
            if keys[0] in out.evicted:
                raise ConformanceFailure("TIER-8", "a pinned block was evicted")
            kit.expect(keys[:1], lr.HIT, "TIER-8", "for a pinned block while stores evicted")
        else:
            kit.refused(extra, "TIER-8", "while a block was pinned")
            kit.expect(keys, lr.HIT, "TIER-8", "on a full tier that declares no eviction, one block pinned")
            kit.pins_show(True, "TIER-8", "while a block is pinned")
        kit.load(keys[:1])
        kit.tier.complete_load([keys[0], keys[0]])
        if not kit.evicts:
            kit.pins_show(False, "TIER-9", "after both pins were released")
            kit.refused(extra, "CAP-2", "after its pins were released")
            kit.expect(keys, lr.HIT, "CAP-2", "on a full tier that declares no eviction, after a refused store")

    @check("TIER-9")
    def test_complete_load_releases_pin(self, kit: PrimaryDriver) -> None:
        """After complete_load the blocks are unpinned again: no pin leaks (they can be evicted, or,
        without eviction, has_pending_work is False and reset_cache forgets them)."""
        keys = key_pool("p-release", kit.num_slots)
        kit.store(keys)
        for i in range(0, len(keys), 4):
            kit.load(keys[i : i + 4])
            kit.tier.complete_load(keys[i : i + 4])
        extra = key_pool("p-release-extra", kit.num_slots)
        if not kit.evicts:
            pending: object = kit.tier.has_pending_work()
            if pending is not False:
                raise ConformanceFailure(
                    "TIER-9", f"after complete_load released every pin, has_pending_work answered {pending!r}: pins leaked"
                )
            if kit.tier.reset_cache() is not True:
                raise ConformanceFailure(
                    "TIER-9", "after complete_load released every pin, reset_cache refused: pins leaked"
                )
        out = kit.prepare(extra)
        if out is None or len(out.keys_to_store) != len(extra):
            raise ConformanceFailure(
                "TIER-9",
                f"after complete_load released every pin, prepare_store of {len(extra)} new blocks "
                f"could not {'evict the old ones' if kit.evicts else 'use the slots reset_cache freed'}: pins leaked",
            )
        kit.tier.complete_store(out.keys_to_store, True)
        if kit.tier.has_pending_work():
            raise ConformanceFailure("TIER-15", "has_pending_work is True with no store or load in flight")

    @check("TIER-9")
    def test_releasing_a_pin_never_taken_is_misuse(self, kit: PrimaryDriver) -> None:
        """complete_load of a key holding no pin raises TierMisuseError and leaves no negative count
        behind: a pin taken afterwards still protects the block (from eviction; without eviction, it
        still shows in has_pending_work and makes reset_cache refuse)."""
        keys = key_pool("p-misuse", kit.num_slots)
        kit.store(keys)
        try:
            kit.tier.complete_load(keys[:1])
        except TierMisuseError:
            pass
        else:
            raise ConformanceFailure(
                "TIER-9", "complete_load of a key holding no pin returned normally; it must raise TierMisuseError"
            )
        kit.load(keys[:1])
        if kit.evicts:
            out = kit.store(key_pool("p-misuse-extra", kit.num_slots - 1))
            if keys[0] in out.evicted:
                raise ConformanceFailure(
                    "TIER-9",
                    "a pin taken after an unmatched complete_load did not protect its block (negative pin count)",
                )
        else:
            kit.pins_show(
                True, "TIER-9", "with a pin taken after an unmatched complete_load (a negative pin count lost it)"
            )
        kit.tier.complete_load(keys[:1])

    @check("TIER-8")
    def test_two_pins_released_once_stay_protected(self, kit: PrimaryDriver) -> None:
        """Pins are counted: a block pinned twice and released once is still pinned, never evicted
        (without eviction: still pending work, reset_cache still refuses)."""
        keys = key_pool("p-twice", kit.num_slots)
        kit.store(keys)
        kit.load(keys[:1])
        kit.load(keys[:1])
        kit.tier.complete_load(keys[:1])
        if kit.evicts:
            out = kit.store(key_pool("p-twice-extra", kit.num_slots - 1))
            if keys[0] in out.evicted:
                raise ConformanceFailure(
                    "TIER-8", "a block pinned twice and released once was evicted: pins must be counted"
                )
        else:
            kit.pins_show(True, "TIER-8", "for a block pinned twice and released once (pins must be counted)")
        kit.expect(keys[:1], lr.HIT, "TIER-8", "(pinned twice, released once)")
        kit.tier.complete_load(keys[:1])
        if not kit.evicts:
            kit.pins_show(False, "TIER-9", "after the second pin was released")

    @check("TIER-6")
    def test_prepare_store_never_evicts_its_own_input(self, kit: PrimaryDriver) -> None:
        """On a full tier, prepare_store of a READY key plus new ones never evicts that READY key
        (without eviction it evicts nothing: it answers None)."""
        keys = key_pool("p-own", kit.num_slots)
        kit.store(keys)
        extra = key_pool("p-own-extra", 2)
        if not kit.evicts:
            kit.refused([keys[0], *extra], "CAP-2", "with one of its own input keys READY")
            kit.expect(keys, lr.HIT, "TIER-6", "(READY on a full tier after a prepare_store that had no room)")
            return
        kit.tier.touch(keys[1:])  # keys[0] is now the least recently used: the first victim
        out = kit.prepare([keys[0], *extra])
        if out is None:
            raise ConformanceFailure("TIER-6", "prepare_store returned None on a full tier with unpinned blocks")
        if keys[0] in out.evicted:
            raise ConformanceFailure(
                "TIER-6", f"prepare_store evicted {short_key(keys[0])}, one of its own input keys, to make room"
            )
        kit.tier.complete_store(out.keys_to_store, True)
        kit.expect(keys[:1], lr.HIT, "TIER-6", "(a READY input key of prepare_store on a full tier)")
        kit.load(keys[:1])
        kit.tier.complete_load(keys[:1])

    @check("CAP-2", unless=("eviction",))
    def test_holds_what_it_stored_without_eviction(self, kit: PrimaryDriver) -> None:
        """Without ``eviction`` declared, a tier driven past its slot count drops nothing: every
        block that answered HIT still does, stores that find no free slot answer None, and no
        REMOVED event names a block (only reset_cache may forget)."""
        list(kit.tier.take_events())
        keys = key_pool("p-hold", kit.num_slots)
        for i in range(0, len(keys), 4):
            kit.store(keys[i : i + 4])
            kit.expect(keys[i : i + 4], lr.HIT, "TIER-7", "after complete_store(success=True)")
        for round_ in range(3):
            kit.refused(key_pool(f"p-hold-extra-{round_}", round_ + 1), "CAP-2", f"(store {round_ + 1} past its slot count)")
            kit.refused([keys[round_], *key_pool(f"p-hold-mixed-{round_}", 2)], "CAP-2", "(a stored key and new ones)")
        kit.load(keys[-2:])
        kit.refused(key_pool("p-hold-pinned", 2), "CAP-2", "(with two blocks pinned)")
        kit.tier.complete_load(keys[-2:])
        kit.expect(keys, lr.HIT, "CAP-2", "after stores past its slot count; the tier declares no eviction")
        removed = [k for e in kit.tier.take_events() if e.kind is EventKind.REMOVED for k in e.keys]
        if removed:
            raise ConformanceFailure(
                "CAP-2",
                f"a REMOVED event names {short_key(removed[0])} although nothing was reset and the tier "
                "declares no eviction",
            )
        kit.load(keys)
        kit.tier.complete_load(keys)
