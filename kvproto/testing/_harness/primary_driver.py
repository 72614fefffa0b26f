"""``PrimaryDriver``: the kit drives one primary tier as the manager would (KIT-2)."""

from __future__ import annotations

from collections.abc import Sequence

from kvproto import members as lr
from kvproto._capabilities import Capabilities
from kvproto._jobs import PrepareStoreOutput
from kvproto._keys import OffloadKey
from kvproto._protocols import PrimaryTier
from kvproto._requests import ReqContext
from kvproto._results import LookupResult, unreachable
from kvproto.testing._harness.data import block_for, row
from kvproto.testing._harness.driver import TierDriver, short_key
from kvproto.testing._harness.failures import ConformanceFailure
from kvproto.testing._harness.settings import KitLimits

__all__ = ["PrimaryDriver"]


class PrimaryDriver(TierDriver[PrimaryTier]):
    """One primary tier, driven the way the scheduler and the manager would, checking each answer."""

    _advice = "a lookup must answer at once"

    def __init__(self, tier: PrimaryTier, capabilities: Capabilities, limits: KitLimits) -> None:
        buffer: object = tier.buffer
        if not isinstance(buffer, memoryview) or buffer.ndim != 2 or buffer.shape is None:
            raise ConformanceFailure(
                "TIER-3", f"buffer is {buffer!r}; the contract requires a 2-D memoryview (slots, block bytes)"
            )
        super().__init__(tier, capabilities, limits)
        self.buffer = buffer
        self.num_slots, self.block_bytes = buffer.shape[0], buffer.shape[1]

    def _vet(self, key: OffloadKey, answer: LookupResult) -> LookupResult:
        """Never RETRY (LR-4)."""
        match answer:
            case lr.RETRY:
                raise ConformanceFailure(
                    "LR-4", f"lookup({short_key(key)}) answered RETRY; the primary tier never does"
                )
            case lr.HIT | lr.MISS | lr.HIT_PENDING:
                return answer
            case _ as other:
                unreachable(other, where="PrimaryDriver.lookup")

    def expect(self, keys: Sequence[OffloadKey], want: LookupResult, clause: str, why: str) -> None:
        """Fail ``clause`` naming the first key that does not answer ``want``."""
        self.expect_resolved(keys, want, clause, why)

    def prepare(
        self, keys: Sequence[OffloadKey], *, context: ReqContext | None = None
    ) -> PrepareStoreOutput | None:
        """``prepare_store`` and copy each reserved key's bytes into its slot, checking the output (TIER-6)."""
        out: object = self.tier.prepare_store(keys, self.context if context is None else context)
        if out is None:
            return None
        if not isinstance(out, PrepareStoreOutput):
            raise ConformanceFailure("TIER-6", f"prepare_store returned {out!r}, not a PrepareStoreOutput or None")
        if len(set(out.slots)) != len(out.slots) or any(not 0 <= s < self.num_slots for s in out.slots):
            raise ConformanceFailure("TIER-6", f"prepare_store reserved invalid or repeated slots {out.slots}")
        if not set(out.keys_to_store) <= set(keys):
            raise ConformanceFailure("TIER-6", "prepare_store reserved keys that were not asked for")
        if out.evicted and not self.capabilities.eviction:
            raise ConformanceFailure(
                "CAP-2",
                f"prepare_store evicted {len(out.evicted)} block(s) (first {short_key(out.evicted[0])}) but the "
                "tier does not declare eviction: an undeclared capability is a promise never to do it",
            )
        for key, slot in zip(out.keys_to_store, out.slots, strict=True):
            row(self.buffer, slot)[:] = block_for(key, self.block_bytes)
        return out

    @property
    def evicts(self) -> bool:
        """True if the tier declares eviction; a tier that does not must refuse a store it has no
        free slots for (CAP-2, CAP-5)."""
        return self.capabilities.eviction

    def refused(self, keys: Sequence[OffloadKey], clause: str, why: str) -> None:
        """``prepare_store`` of ``keys`` (none present) on a full tier that declares no eviction must
        answer None: it has no free slot and may drop no block (CAP-2); ``clause`` is what a slot
        found anyway breaks, ``why`` the situation."""
        out = self.prepare(keys)
        if out is None:
            return
        if out.keys_to_store:
            self.tier.complete_store(out.keys_to_store, False)
            raise ConformanceFailure(
                clause,
                f"prepare_store of {len(keys)} new keys on a full tier that declares no eviction reserved "
                f"{len(out.keys_to_store)} slot(s) {why}; with no free slot it must answer None, dropping nothing",
            )

    def pins_show(self, held: bool, clause: str, why: str) -> None:
        """What a primary that cannot show pins by eviction shows instead (TIER-15, TIER-16): with a
        pin ``held``, has_pending_work is True and reset_cache refuses (False); with none, has_pending_work
        is False. Fails ``clause`` saying ``why``. (reset_cache is asked only while a pin is held: idle it
        would forget the blocks.)"""
        pending: object = self.tier.has_pending_work()
        if held and pending is not True:
            raise ConformanceFailure(
                clause, f"has_pending_work answered {pending!r} {why}; a pin is held, so a load is in flight"
            )
        if not held and pending is not False:
            raise ConformanceFailure(clause, f"has_pending_work answered {pending!r} {why}; no pin is held")
        if held:
            answer: object = self.tier.reset_cache()
            if answer is not False:
                raise ConformanceFailure(
                    clause, f"reset_cache answered {answer!r} {why}; a pin is held, so it must refuse (False)"
                )

    def expect_idle(self, clause: str, why: str) -> None:
        """has_pending_work, asked now, answers False: with no pin held and no write pending a primary
        has no pending work (TIER-9). Else ``clause`` fails: ``has_pending_work answered X {why}``."""
        pending: object = self.tier.has_pending_work()
        if pending is not False:
            raise ConformanceFailure(clause, f"has_pending_work answered {pending!r} {why}")

    def store(
        self, keys: Sequence[OffloadKey], *, success: bool = True, context: ReqContext | None = None
    ) -> PrepareStoreOutput:
        """Prepare, copy and complete a store; fail TIER-6 if the tier refuses."""
        out = self.prepare(keys, context=context)
        if out is None:
            raise ConformanceFailure("TIER-6", f"prepare_store of {len(keys)} keys returned None with room to evict")
        self.tier.complete_store(out.keys_to_store, success)
        return out

    def load(self, keys: Sequence[OffloadKey], *, context: ReqContext | None = None) -> tuple[int, ...]:
        """``prepare_load`` (pins) and check each returned slot holds its key's bytes (TIER-8)."""
        slots: object = self.tier.prepare_load(keys, self.context if context is None else context)
        if not isinstance(slots, tuple) or len(slots) != len(keys):
            raise ConformanceFailure(
                "TIER-8", f"prepare_load of {len(keys)} keys returned {slots!r}, not a tuple of as many slots"
            )
        for key, slot in zip(keys, slots, strict=True):
            if not isinstance(slot, int) or not 0 <= slot < self.num_slots:
                raise ConformanceFailure("TIER-8", f"prepare_load returned slot {slot!r} for {short_key(key)}")
            if bytes(row(self.buffer, slot)) != block_for(key, self.block_bytes):
                raise ConformanceFailure(
                    "TIER-8", f"prepare_load returned slot {slot} for key {short_key(key)}, which does not hold its bytes"
                )
        return slots
