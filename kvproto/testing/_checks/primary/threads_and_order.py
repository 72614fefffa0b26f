"""The primary tier's checks of section 1's classes of bugs (issue 17): batch answers in any order
(TIER-17), changing threads (TIER-19, TIER-20), a declared LRU order (CAP-6), and events that follow
``complete_store`` and eviction (TIER-21): :class:`PrimaryClassChecks`, a base of
:class:`~kvproto.testing.PrimaryTierTests`.
"""

from __future__ import annotations

from collections.abc import Callable

from kvproto import members as lr
from kvproto._events import EventKind
from kvproto._keys import OffloadKey
from kvproto._protocols import PrimaryTier
from kvproto.testing._checks.threads_and_order import ClassChecks
from kvproto.testing._harness.data import key_pool
from kvproto.testing._harness.decorator import check
from kvproto.testing._harness.driver import short_key
from kvproto.testing._harness.failures import ConformanceFailure, answer_of
from kvproto.testing._harness.primary_driver import PrimaryDriver

__all__ = ["PrimaryClassChecks"]


def _named(tier: PrimaryTier, kind: EventKind) -> set[OffloadKey]:
    """The keys the events taken now name with ``kind``."""
    return {k for e in tier.take_events() if e.kind is kind for k in e.keys}


class PrimaryClassChecks(ClassChecks[PrimaryDriver]):
    """Checks of whole classes of bugs, in the kit's order (see ``PrimaryTierTests``)."""


    @check("TIER-1")
    def test_keys_given_as_any_iterable(self, kit: PrimaryDriver) -> None:
        """``touch``, ``complete_store`` and ``complete_load`` take any iterable of keys (their protocol
        signatures say ``Iterable``): given a one-shot generator, each reads it once and does its work."""
        tier = kit.tier
        keys = key_pool("p-iterable", 3)
        out = kit.prepare(keys)
        if out is None or len(out.keys_to_store) != len(keys):
            raise ConformanceFailure("TIER-6", f"prepare_store of {len(keys)} new keys into an empty tier did not reserve them")

        def given_once(method: str, call: Callable[[], object]) -> None:
            answer_of(
                call,
                "TIER-1",
                f"{method} given its keys as a generator",
                "its protocol signature takes any iterable of keys (read it once)",
            )

        given_once("complete_store", lambda: tier.complete_store((k for k in out.keys_to_store), True))
        kit.expect(keys, lr.HIT, "TIER-1", "after complete_store(True) was given them as a generator")
        given_once("touch", lambda: tier.touch(k for k in keys))
        kit.load(keys)
        given_once("complete_load", lambda: tier.complete_load(k for k in keys))
        kit.expect_idle(
            "TIER-1",
            "after complete_load released, through a generator, the only pins taken: complete_load takes any "
            "iterable of keys",
        )

    @check("TIER-21")
    def test_events_follow_complete_store_and_eviction(self, kit: PrimaryDriver) -> None:
        """No STORED event for a block still being written (after prepare_store, before
        complete_store) or whose store failed; with eviction, a REMOVED event for every block
        prepare_store lists as evicted, by the next take_events."""
        tier = kit.tier
        list(tier.take_events())
        keys = key_pool("p-t21", 4)
        out = kit.prepare(keys)
        if out is None or len(out.keys_to_store) != len(keys):
            raise ConformanceFailure("TIER-6", f"prepare_store of {len(keys)} new keys into an empty tier did not reserve them")
        early = _named(tier, EventKind.STORED) & set(keys)
        if early:
            raise ConformanceFailure(
                "TIER-21",
                f"a STORED event named {short_key(sorted(early)[0])} after prepare_store, before complete_store: "
                "STORED may name a block only once its write completed",
            )
        tier.complete_store(out.keys_to_store[:2], True)
        tier.complete_store(out.keys_to_store[2:], False)
        failed = _named(tier, EventKind.STORED) & set(out.keys_to_store[2:])
        if failed:
            raise ConformanceFailure(
                "TIER-21", f"a STORED event named {short_key(sorted(failed)[0])}, whose complete_store failed"
            )
        if not kit.evicts:
            return
        evicted: set[OffloadKey] = set()
        removed: set[OffloadKey] = set()
        fill = key_pool("p-t21-fill", kit.num_slots + 8)
        for i in range(0, len(fill), 8):
            evicted |= set(kit.store(fill[i : i + 8]).evicted)
            removed |= _named(tier, EventKind.REMOVED)
        silent = sorted(evicted - removed)
        if silent:
            raise ConformanceFailure(
                "TIER-21",
                f"prepare_store evicted {len(evicted)} block(s) (listed in evicted), but no REMOVED event names "
                f"{len(silent)} of them (first {short_key(silent[0])}): every eviction emits REMOVED",
            )
