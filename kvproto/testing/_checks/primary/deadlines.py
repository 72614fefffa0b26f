"""The primary tier's check of its pending deadline (issue 17, section 1; TIER-25):
:class:`PrimaryDeadlineChecks`, a base of :class:`~kvproto.testing.PrimaryTierTests`.

A primary that declares a pending deadline (``pending_deadline_s``) fails a write still pending
past it; the transfer of that write may still land in its slot later, so the slot must not be
reused before the write's late completion arrives. The kit moves the tier's clock with the backdoor
hook ``advance_clock(tier, seconds)`` instead of waiting seconds.
"""

from __future__ import annotations

import math

import pytest

from kvproto import members as lr
from kvproto._jobs import PrepareStoreOutput
from kvproto._keys import OffloadKey
from kvproto._protocols import PrimaryTier
from kvproto.testing._checks.shared import TierChecks
from kvproto.testing._harness.data import block_for, key_pool, row
from kvproto.testing._harness.decorator import check
from kvproto.testing._harness.driver import short_key
from kvproto.testing._harness.failures import ConformanceFailure
from kvproto.testing._harness.primary_driver import PrimaryDriver

__all__ = ["PrimaryDeadlineChecks"]


class PrimaryDeadlineChecks(TierChecks[PrimaryDriver]):
    """The pending deadline, in the kit's order (see ``PrimaryTierTests``)."""

    def advance_clock(self, tier: PrimaryTier, seconds: float) -> None:
        """Move the clock ``tier`` measures its pending deadline by forward by ``seconds``: the
        backdoor hook of :meth:`test_a_late_write_never_lands_in_a_reused_slot` (KIT-5)."""
        raise NotImplementedError

    @check("TIER-25", hooks=("advance_clock",))
    def test_a_late_write_never_lands_in_a_reused_slot(self, kit: PrimaryDriver) -> None:
        """A ``pending_deadline_s`` the tier offers is None or a number of seconds. With a finite one
        (the clock moved by the advance_clock hook): a write completed once half its deadline passed
        and an on_step_end ran is stored (HIT); writes still pending past it answer MISS, whether a
        lookup or on_step_end finds them first, and after that on_step_end no longer count as pending
        work; their slots are reserved for no other key while their late transfers may still land,
        however many stores follow, a ``reset_cache`` between included (its answer either way); a late
        ``complete_store`` is accepted, and every block stored meanwhile keeps its bytes."""
        deadline = self._declared_deadline(kit.tier)
        self._in_time_write_is_stored(kit, deadline)
        slots = self._late_writes_fail(kit, deadline)
        self._reset_keeps_late_slots(kit, slots)
        self._late_key_is_not_reserved_elsewhere(kit, slots)
        placed = self._late_slots_stay_reserved(kit, slots)
        self._late_completions_are_accepted(kit, slots)
        held = [k for k in placed.values() if kit.lookup(k) is lr.HIT]
        for i in range(0, len(held), 8):
            kit.load(held[i : i + 8])  # checks each slot still holds its key's bytes (TIER-8)
            kit.tier.complete_load(held[i : i + 8])

    @staticmethod
    def _declared_deadline(tier: PrimaryTier) -> float:
        """The tier's finite ``pending_deadline_s`` (TIER-25); the check skips without one, and fails
        on one that is neither None nor a number."""
        deadline: object = getattr(tier, "pending_deadline_s", None)
        if deadline is not None and (not isinstance(deadline, (int, float)) or isinstance(deadline, bool)):
            raise ConformanceFailure(
                "TIER-25",
                f"pending_deadline_s is {deadline!r:.80}: where a primary offers it, it declares its pending "
                "deadline, so it must be None or a number of seconds",
            )
        if not isinstance(deadline, (int, float)) or not math.isfinite(deadline):
            pytest.skip("needs a primary with a declared pending deadline (a finite pending_deadline_s)")
        return float(deadline)

    def _in_time_write_is_stored(self, kit: PrimaryDriver, deadline: float) -> None:
        """A write completed once half its deadline passed, an on_step_end between, answers HIT (TIER-25)."""
        tier = kit.tier
        early = key_pool("p-in-time", 1)
        first = kit.prepare(early)
        if first is None or list(first.keys_to_store) != early:
            raise ConformanceFailure("TIER-6", "prepare_store of one new key into an empty tier did not reserve it")
        self.advance_clock(tier, deadline / 2)
        tier.on_step_end()
        tier.complete_store(early, True)
        answer = kit.lookup(early[0])
        if answer is not lr.HIT:
            raise ConformanceFailure(
                "TIER-25",
                f"a write completed when half its declared pending_deadline_s ({deadline:g} s) had passed (an "
                f"on_step_end between) answers {answer.name}: a write is failed only past its deadline",
            )

    def _late_writes_fail(self, kit: PrimaryDriver, deadline: float) -> dict[int, OffloadKey]:
        """Two writes left pending past the deadline answer MISS, found first by a lookup or by
        on_step_end, and are no longer pending work (TIER-25); their slots, by slot."""
        tier = kit.tier
        key, other = key_pool("p-late", 2)
        out = kit.prepare([key, other])
        if out is None or list(out.keys_to_store) != [key, other]:
            raise ConformanceFailure("TIER-6", "prepare_store of two new keys into a near-empty tier did not reserve them")
        slots = dict(zip(out.slots, out.keys_to_store, strict=True))
        self.advance_clock(tier, deadline * 2 + 1.0)
        answer = kit.lookup(key)
        if answer is not lr.MISS:
            raise ConformanceFailure(
                "TIER-25",
                f"a write pending for twice its declared pending_deadline_s ({deadline:g} s) answers {answer.name}: "
                "past the deadline it is failed and answers MISS",
            )
        tier.on_step_end()
        kit.expect_idle(
            "TIER-25",
            f"after an on_step_end with every write past its declared pending_deadline_s ({deadline:g} s) and no "
            "pin held: a write failed by its deadline is no longer pending work (else a write that never "
            "completes keeps the tier busy forever)",
        )
        answer = kit.lookup(other)
        if answer is not lr.MISS:
            raise ConformanceFailure(
                "TIER-25",
                f"a write pending past its declared pending_deadline_s ({deadline:g} s), an on_step_end since, "
                f"answers {answer.name}: past the deadline it is failed and answers MISS",
            )
        return slots

    @staticmethod
    def _reset_keeps_late_slots(kit: PrimaryDriver, slots: dict[int, OffloadKey]) -> None:
        """A ``reset_cache`` while failed writes' late transfers may still land forgets the blocks, not
        the slots those transfers may write (TIER-25, TIER-16): whatever it answers, the fill that
        follows (:meth:`_late_slots_stay_reserved`) must reserve none of ``slots`` for another key
        (held-out round 6: a primary whose reset rebuilt its free list from every slot handed a
        quarantined slot to the next block, and the stalled copy overwrote it)."""
        answered: object = kit.tier.reset_cache()
        if not isinstance(answered, bool):
            raise ConformanceFailure(
                "TIER-16", f"reset_cache() answered {answered!r:.80}, not a bool (True: reset; False: refused)"
            )
        for late in slots.values():
            answer = kit.lookup(late)
            if answer is not lr.MISS:
                raise ConformanceFailure(
                    "TIER-25",
                    f"{short_key(late)}, whose write passed its pending deadline, answers {answer.name} after "
                    f"reset_cache() answered {answered}: a failed write stays failed",
                )

    @staticmethod
    def _late_key_is_not_reserved_elsewhere(kit: PrimaryDriver, slots: dict[int, OffloadKey]) -> None:
        """A key whose write passed its deadline, offered again before that write's late completion arrived,
        is not reserved in another slot (TIER-25): ``complete_store`` names keys only, so the late completion
        would mark the new reservation stored before its own transfer landed (a HIT on another block's
        bytes). Declining it, or reserving its own quarantined slot again, is safe."""
        slot, late = next(iter(slots.items()))
        out: object = kit.tier.prepare_store([late], kit.context)
        if not isinstance(out, PrepareStoreOutput) or late not in out.keys_to_store:
            return
        again = out.slots[list(out.keys_to_store).index(late)]
        if again != slot:
            raise ConformanceFailure(
                "TIER-25",
                f"{short_key(late)}, whose write into slot {slot} passed its pending deadline, was reserved again in "
                f"slot {again} before that write's late completion arrived: complete_store names keys only, so the "
                "late completion marks the new reservation stored before its own bytes land (a HIT serving the "
                "slot's old bytes)",
            )

    @staticmethod
    def _late_slots_stay_reserved(kit: PrimaryDriver, slots: dict[int, OffloadKey]) -> dict[int, OffloadKey]:
        """Filling the tier reserves none of ``slots`` (their late transfers may still land) for
        another key (TIER-25); the keys stored meanwhile, by slot."""
        tier = kit.tier
        placed: dict[int, OffloadKey] = {}
        fill = key_pool("p-late-fill", kit.num_slots + 8)
        for i in range(0, len(fill), 4):
            batch = fill[i : i + 4]
            more = kit.prepare(batch)
            if more is None:
                break  # full, and it evicts nothing more: the slot was never offered
            for slot, late in slots.items():
                if slot in more.slots:
                    taker = more.keys_to_store[more.slots.index(slot)]
                    raise ConformanceFailure(
                        "TIER-25",
                        f"slot {slot}, whose write of {short_key(late)} passed its pending deadline, was reserved for "
                        f"{short_key(taker)} before that write's late completion arrived: the late transfer may still "
                        "land there and overwrite the new block",
                    )
            tier.complete_store(more.keys_to_store, True)
            for stored, where in zip(more.keys_to_store, more.slots, strict=True):
                placed[where] = stored
        return placed

    @staticmethod
    def _late_completions_are_accepted(kit: PrimaryDriver, slots: dict[int, OffloadKey]) -> None:
        """Each late write's transfer lands in its slot and its late complete_store is accepted (TIER-25)."""
        tier = kit.tier
        for slot, late in slots.items():
            row(kit.buffer, slot)[:] = block_for(late, kit.block_bytes)  # the late transfer lands
            try:
                tier.complete_store([late], True)
            except Exception as error:  # any error the tier raises is the finding
                raise ConformanceFailure(
                    "TIER-25",
                    f"the late complete_store of {short_key(late)}, past its pending deadline, raised "
                    f"{type(error).__name__}: {error}; a late completion must be accepted (it frees the slot)",
                ) from error
