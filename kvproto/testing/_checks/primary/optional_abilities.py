"""The primary tier's checks of the optional abilities the tiering manager relies on when a primary
offers them: ``ready_contains`` (TIER-27, MGR-20's batched scans) and
:class:`~kvproto.SlotQuarantine` (TIER-28, MGR-17's abandoned stores):
:class:`PrimaryOptionalChecks`, a base of :class:`~kvproto.testing.PrimaryTierTests`.

A primary that does not offer an ability skips its check, naming what it needs (not checked, never
passed).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from kvproto import members as lr
from kvproto._keys import OffloadKey
from kvproto._protocols import ReadyKeys, SlotQuarantine
from kvproto.errors import TierMisuseError
from kvproto.testing._checks.shared import TierChecks
from kvproto.testing._harness.data import key_pool
from kvproto.testing._harness.decorator import check
from kvproto.testing._harness.driver import short_key
from kvproto.testing._harness.failures import ConformanceFailure, answer_of
from kvproto.testing._harness.primary_driver import PrimaryDriver

__all__ = ["PrimaryOptionalChecks"]


def _asked(contains: Callable[[OffloadKey], object], key: OffloadKey, when: str) -> bool:
    """``contains(key)``, which must answer a bool (TIER-27)."""
    answer = answer_of(
        lambda: contains(key),
        "TIER-27",
        f"{when}: ready_contains({short_key(key)})",
        "ready_contains must be a function of one key answering whether it is in ready_keys",
    )
    if not isinstance(answer, bool):
        raise ConformanceFailure("TIER-27", f"{when}: ready_contains({short_key(key)}) answered {answer!r}, not a bool")
    return answer


def through_every_ready_state(kit: PrimaryDriver, keys: Sequence[OffloadKey], agree: Callable[[str], None]) -> None:
    """Drive 6 ``keys`` through every state a key's HIT depends on, calling ``agree(when)`` at each:
    empty, with a store of 4 prepared, after complete_store succeeded for 2 and failed for 2, with a
    pin held, after reset_cache (the steps of TIER-17's ready_keys and TIER-27's ready_contains)."""
    agree("on an empty tier")
    out = kit.prepare(keys[:4])
    agree("with a store prepared")
    if out is not None:
        kit.tier.complete_store(out.keys_to_store[:2], True)
        agree("after complete_store(True)")
        kit.tier.complete_store(out.keys_to_store[2:], False)
        agree("after complete_store(False)")
    kit.load(keys[:1])
    agree("with a pin held")
    kit.tier.complete_load(keys[:1])
    kit.tier.reset_cache()
    agree("after reset_cache")


class PrimaryOptionalChecks(TierChecks[PrimaryDriver]):
    """The optional abilities, in the kit's order (see ``PrimaryTierTests``)."""

    @check("TIER-27")
    def test_ready_contains_agrees_with_ready_keys(self, kit: PrimaryDriver) -> None:
        """Where the tier offers ``ready_contains`` beside ``ready_keys``, the function read once, at
        the start (the manager reads it once, at its construction), answers ``key in ready_keys``,
        which is lookup's HIT, at every step: empty, with a store prepared, after complete_store
        succeeded and failed, with a pin held, after reset_cache."""
        tier = kit.tier
        if not isinstance(tier, ReadyKeys) or not hasattr(tier, "ready_contains"):
            pytest.skip("needs the optional ready_contains beside ready_keys (MGR-20), which the tier does not offer")
        contains: object = tier.ready_contains
        if not callable(contains):
            raise ConformanceFailure("TIER-27", f"ready_contains is {contains!r}, not a function of one key")
        ready = tier.ready_keys
        keys = key_pool("p-contains", 6)

        def agree(when: str) -> None:
            for key in keys:
                said = _asked(contains, key, when)
                hit = kit.lookup(key) is lr.HIT
                if said != (key in ready) or said != hit:
                    raise ConformanceFailure(
                        "TIER-27",
                        f"{when}: ready_contains({short_key(key)}) answered {said}, but the key is "
                        f"{'in' if key in ready else 'not in'} ready_keys and lookup answers "
                        f"{'HIT' if hit else 'not HIT'} (the function must stay a live test of ready_keys)",
                    )

        through_every_ready_state(kit, keys, agree)

    @check("TIER-28")
    def test_quarantined_stores_free_the_key_and_hold_the_slot(self, kit: PrimaryDriver) -> None:
        """Where the tier offers SlotQuarantine: ``quarantine_stores`` of a WRITING key (and of a key
        not being written, skipped) returns the key's slot; the key answers MISS at once and can be
        stored again; the slot is reserved for no other key, however many stores follow, until
        ``release_slots`` gives it back; releasing it a second time raises TierMisuseError."""
        tier = kit.tier
        if not isinstance(tier, SlotQuarantine):
            pytest.skip("needs the optional SlotQuarantine ability (quarantine_stores, release_slots)")
        key, other = key_pool("p-quarantine", 2)
        out = kit.prepare([key])
        if out is None or list(out.keys_to_store) != [key]:
            raise ConformanceFailure("TIER-6", "prepare_store of one new key into an empty tier did not reserve it")
        slot = out.slots[0]
        held: object = tier.quarantine_stores([key, other])
        if held != (slot,):
            raise ConformanceFailure(
                "TIER-28",
                f"quarantine_stores of the WRITING key {short_key(key)} (reserved in slot {slot}) and of a key "
                f"not being written returned {held!r}; it must return ({slot},): the slot of each WRITING key, "
                "the others skipped",
            )
        answer = kit.lookup(key)
        if answer is not lr.MISS:
            raise ConformanceFailure(
                "TIER-28", f"{short_key(key)}, whose store was quarantined, answers {answer.name}; it is ABSENT (MISS) at once"
            )
        again = kit.prepare([key])
        if again is None or list(again.keys_to_store) != [key]:
            raise ConformanceFailure(
                "TIER-28", f"prepare_store of {short_key(key)}, whose store was quarantined, did not reserve it again"
            )
        tier.complete_store(again.keys_to_store, True)
        fill = key_pool("p-quarantine-fill", kit.num_slots + 8)
        for i in range(0, len(fill), 4):
            more = kit.prepare(fill[i : i + 4])
            if more is None:
                break  # full, and it evicts nothing more: the slot was never offered
            if slot in more.slots:
                raise ConformanceFailure(
                    "TIER-28",
                    f"slot {slot}, held by quarantine_stores (its abandoned transfer may still land), was reserved "
                    f"for {short_key(more.keys_to_store[more.slots.index(slot)])} before release_slots gave it back",
                )
            tier.complete_store(more.keys_to_store, True)
        answer_of(
            lambda: tier.release_slots([slot]),
            "TIER-28",
            f"release_slots([{slot}]) of the slot quarantine_stores held",
            "release_slots returns a slot quarantine_stores held",
        )
        try:
            tier.release_slots([slot])
        except TierMisuseError:
            return
        raise ConformanceFailure(
            "TIER-28", f"release_slots([{slot}]) a second time (the slot is no longer held) raised no TierMisuseError"
        )
