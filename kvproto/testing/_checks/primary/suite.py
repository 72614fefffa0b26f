"""``PrimaryTierTests``: the conformance checks for a primary (CPU) tier (TIER-*, LR-*, KIT-*).

The checks both kinds of tier share live in :mod:`kvproto.testing._checks.shared`; this
module says what their steps mean for a primary tier and adds the primary's own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import pytest

from kvproto import members as lr
from kvproto._keys import OffloadKey
from kvproto._protocols import PrimaryTier, ReadyKeys
from kvproto._requests import ReqContext
from kvproto.testing._checks.primary.data_plane import PrimaryDataPlaneChecks
from kvproto.testing._checks.primary.deadlines import PrimaryDeadlineChecks
from kvproto.testing._checks.primary.optional_abilities import PrimaryOptionalChecks, through_every_ready_state
from kvproto.testing._checks.primary.pins import PrimaryPinChecks
from kvproto.testing._checks.primary.threads_and_order import PrimaryClassChecks
from kvproto.testing._checks.shared import CLOSED, Finish, PendingWorkWords
from kvproto.testing._harness.data import block_for, key_pool, row, tricky_keys
from kvproto.testing._harness.decorator import check
from kvproto.testing._harness.driver import short_key
from kvproto.testing._harness.failures import ConformanceFailure
from kvproto.testing._harness.lock_order import LockOrder
from kvproto.testing._harness.primary_driver import PrimaryDriver

__all__ = ["PrimaryTierFactory", "PrimaryTierTests"]

PrimaryTierFactory = Callable[[], PrimaryTier]
"""Builds an EMPTY primary tier (it owns its slot buffer)."""


class PrimaryTierTests(
    PrimaryClassChecks, PrimaryPinChecks, PrimaryDeadlineChecks, PrimaryOptionalChecks, PrimaryDataPlaneChecks
):
    """Subclass this (as ``TestMyPrimary``) and override the ``tier_factory`` fixture,
    which returns a zero-argument callable building an EMPTY primary tier."""

    @pytest.fixture
    def tier_factory(self) -> PrimaryTierFactory:
        """Override: return a callable that builds an EMPTY primary tier."""
        raise ConformanceFailure(
            "KIT-5", f"{type(self).__name__} must override the tier_factory fixture (a callable: () -> an empty tier)"
        )

    @pytest.fixture
    def tier(self, tier_factory: PrimaryTierFactory, request: pytest.FixtureRequest) -> Iterator[PrimaryTier]:
        """An empty primary tier, shut down after the check (once); the order it takes its locks in is
        recorded (TIER-11, :class:`LockOrder`)."""
        with LockOrder() as self._lock_order:
            built = tier_factory()
            yield built
            if not request.node.stash.get(CLOSED, False):
                built.shutdown()

    @pytest.fixture
    def kit(self, tier: PrimaryTier, request: pytest.FixtureRequest) -> Iterator[PrimaryDriver]:
        """A driver for ``tier``; shuts it down after the check."""
        driver = PrimaryDriver(tier, self.declared_capabilities(tier), self.limits)
        yield driver
        request.node.stash[CLOSED] = True
        driver.shutdown()

    # ---- the role interface of the shared checks (see TierChecks) -------------------------
    _role_protocol = PrimaryTier
    _role_key_prefix = "p-"
    _role_holds_stores = True
    _role_pending_words = PendingWorkWords(
        idle="an empty tier says it has pending work",
        busy="has_pending_work is not True while a store is prepared",
        done="has_pending_work is still True after the store completed",
    )

    def _role_store(self, kit: PrimaryDriver, keys: Sequence[OffloadKey], context: ReqContext | None = None) -> bool:
        """prepare_store, copy, complete_store(success=True)."""
        kit.store(keys, context=context)
        return True

    def _role_start_store(self, kit: PrimaryDriver, keys: Sequence[OffloadKey]) -> Finish:
        """prepare_store and copy; finishing completes the store (success=True)."""
        out = kit.prepare(keys)

        def finish() -> None:
            if out is not None:
                kit.tier.complete_store(out.keys_to_store, True)

        return finish

    def _role_fail_store(self, kit: PrimaryDriver, keys: Sequence[OffloadKey]) -> set[OffloadKey]:
        """prepare_store, copy, complete_store(success=False)."""
        kit.store(keys, success=False)
        return set(keys)

    def _role_start_load(
        self, kit: PrimaryDriver, keys: Sequence[OffloadKey], context: ReqContext | None = None
    ) -> Finish:
        """prepare_load (pins, slots checked); finishing is complete_load (releases the pins)."""
        kit.load(keys, context=context)
        return lambda: kit.tier.complete_load(keys)

    def _role_settle(self, kit: PrimaryDriver) -> None:
        """Nothing: a primary has no jobs that end after the kit's calls."""

    def _role_check_forgotten(self, kit: PrimaryDriver, keys: Sequence[OffloadKey]) -> None:
        """A primary's MISS is authoritative (prepare_load of it is misuse); and with every block
        forgotten and nothing in flight, every slot is free again: a prepare_store of as many new keys
        as the tier has slots reserves them all (failed at once, they leave nothing) (TIER-16)."""
        fresh = key_pool("p-after-reset", kit.num_slots)
        out = kit.prepare(fresh)
        reserved = 0 if out is None else len(out.keys_to_store)
        if out is not None:
            kit.tier.complete_store(out.keys_to_store, False)
        if reserved != len(fresh):
            raise ConformanceFailure(
                "TIER-16",
                f"after reset_cache answered True with nothing in flight, prepare_store of {len(fresh)} new keys "
                f"(one per slot) reserved {reserved}: reset_cache forgets every block, so every slot is free again",
            )

    def _role_check_shut_down(self, kit: PrimaryDriver, keys: Sequence[OffloadKey]) -> None:
        """Each store that was in flight was failed: it answers MISS."""
        for key in keys:
            got = kit.lookup(key)
            if got is not lr.MISS:
                raise ConformanceFailure(
                    "TIER-16", f"after shutdown, a store that was in flight answers {got.name}; it must be failed (MISS)"
                )

    # ---- shape ---------------------------------------------------------------------------
    @check("TIER-1")
    def test_satisfies_primary_protocol(self, tier: PrimaryTier) -> None:
        """The tier has every member of its protocol (PrimaryTier or SecondaryTier) and a non-empty str name."""
        self._satisfies_protocol(tier)

    @check("TIER-3")
    def test_buffer_is_a_shared_writable_2d_byte_view(self, tier: PrimaryTier) -> None:
        """``buffer`` is a writable 2-D memoryview of format "B", the same memory on every access."""
        buffer: object = tier.buffer
        if not isinstance(buffer, memoryview):
            raise ConformanceFailure("TIER-3", f"buffer is a {type(buffer).__name__}, not a memoryview")
        if buffer.ndim != 2 or buffer.format != "B" or buffer.readonly:
            raise ConformanceFailure(
                "TIER-3",
                f"buffer has ndim={buffer.ndim} format={buffer.format!r} readonly={buffer.readonly}; "
                "the contract requires a writable 2-D view of format 'B'",
            )
        row(buffer, 0)[:] = block_for(b"kvproto-kit-probe", buffer.shape[1] if buffer.shape else 0)
        again = tier.buffer
        if bytes(row(again, 0)) != bytes(row(buffer, 0)):
            raise ConformanceFailure("TIER-3", "buffer returns a copy: a write through one access is not seen by the next")

    @check("LR-4")
    def test_never_answers_retry(self, kit: PrimaryDriver) -> None:
        """No lookup answers RETRY: not for absent, writing, ready, pinned or failed blocks."""
        keys = key_pool("p-lr4", 4)
        for key in keys:
            kit.lookup(key)
        kit.store(keys[:1])
        out = kit.prepare(keys[1:3])
        for key in keys:
            kit.lookup(key)
        if out is not None:
            kit.tier.complete_store(out.keys_to_store, False)
        kit.load(keys[:1])
        for key in keys:
            kit.lookup(key)
        kit.tier.complete_load(keys[:1])

    # ---- stores -------------------------------------------------------------------------------
    @check("TIER-6")
    def test_prepared_store_is_hit_pending_until_complete(self, kit: PrimaryDriver) -> None:
        """Reserved keys answer HIT_PENDING until complete_store; then HIT."""
        keys = key_pool("p-pending", 3)
        out = kit.prepare(keys)
        if out is None or set(out.keys_to_store) != set(keys):
            raise ConformanceFailure("TIER-6", f"prepare_store on an empty tier did not reserve every key: {out}")
        kit.expect(keys, lr.HIT_PENDING, "TIER-6", "between prepare_store and complete_store")
        kit.tier.complete_store(out.keys_to_store, True)
        kit.expect(keys, lr.HIT, "TIER-7", "after complete_store(success=True)")

    @check("TIER-7")
    def test_completed_store_is_hit(self, kit: PrimaryDriver) -> None:
        """After a successful store each key answers HIT and its slot holds its bytes."""
        keys = key_pool("p-done", 4)
        kit.store(keys[:2])
        kit.store(keys[2:])
        kit.expect(keys, lr.HIT, "TIER-7", "after complete_store(success=True)")
        kit.load(keys)
        kit.tier.complete_load(keys)

    @check("TIER-7")
    def test_failed_store_is_miss(self, kit: PrimaryDriver) -> None:
        """After complete_store(success=False) the keys answer MISS, and can be stored again."""
        keys = key_pool("p-fail", 3)
        kit.store(keys, success=False)
        kit.expect(keys, lr.MISS, "TIER-7", "after complete_store(success=False)")
        kit.store(keys)
        kit.expect(keys, lr.HIT, "TIER-7", "after storing again")

    @check("TIER-6")
    def test_prepare_store_skips_present_keys(self, kit: PrimaryDriver) -> None:
        """Keys already stored or being stored, and repeats, are not reserved again."""
        keys = key_pool("p-skip", 4)
        kit.store(keys[:1])
        pending = kit.prepare(keys[1:2])
        out = kit.prepare([keys[0], keys[1], keys[2], keys[2], keys[3]])
        if out is None:
            raise ConformanceFailure("TIER-6", "prepare_store refused with free slots")
        if set(out.keys_to_store) != {keys[2], keys[3]} or len(out.keys_to_store) != 2:
            raise ConformanceFailure(
                "TIER-6",
                f"prepare_store reserved {[short_key(k) for k in out.keys_to_store]}; "
                "present, writing and repeated keys must be skipped",
            )
        kit.tier.complete_store(out.keys_to_store, True)
        if pending is not None:
            kit.tier.complete_store(pending.keys_to_store, True)
        kit.expect(keys, lr.HIT, "TIER-7", "after every store completed")

    @check("TIER-6")
    def test_prepare_store_is_all_or_nothing(self, kit: PrimaryDriver) -> None:
        """With every slot pinned, prepare_store returns None and reserves nothing."""
        keys = key_pool("p-full", kit.num_slots)
        kit.store(keys)
        kit.load(keys)
        extra = key_pool("p-full-extra", 2)
        out = kit.prepare(extra)
        if out is not None and out.keys_to_store:
            raise ConformanceFailure("TIER-6", "prepare_store reserved a slot although every slot was pinned")
        kit.expect(extra, lr.MISS, "TIER-6", "after a refused prepare_store")
        kit.expect(keys, lr.HIT, "TIER-6", "for pinned blocks after a refused prepare_store")
        kit.tier.complete_load(keys)

    @check("TIER-6", needs=("eviction",))
    def test_eviction_reports_evicted_keys(self, kit: PrimaryDriver) -> None:
        """A store into a full tier evicts unpinned blocks, lists them, and they answer MISS."""
        keys = key_pool("p-evict", kit.num_slots)
        kit.store(keys)
        extra = key_pool("p-evict-extra", 3)
        out = kit.store(extra)
        evicted = set(out.evicted)
        if len(evicted) < len(extra):
            raise ConformanceFailure(
                "TIER-6", f"a full tier stored {len(extra)} new blocks but lists {len(evicted)} evicted"
            )
        if not evicted <= set(keys):
            raise ConformanceFailure("TIER-6", "evicted lists keys that were not stored")
        kit.expect(sorted(evicted), lr.MISS, "TIER-6", "after being evicted")
        kept = [k for k in keys if k not in evicted]
        kit.expect(kept, lr.HIT, "TIER-6", "for a block that was not evicted")
        kit.load([*kept, *extra])
        kit.tier.complete_load([*kept, *extra])

    @check("TIER-8")
    def test_prepare_load_returns_slots_holding_stored_bytes(self, kit: PrimaryDriver) -> None:
        """prepare_load returns, in order, slots holding each key's bytes; repeats are pinned twice."""
        keys = key_pool("p-load", 5)
        kit.store(keys[:3])
        kit.store(keys[3:])
        order = [keys[4], keys[0], keys[2], keys[0]]
        slots = kit.load(order)
        if slots[1] != slots[3]:
            raise ConformanceFailure("TIER-8", "prepare_load returned two slots for one key")
        if len({slots[0], slots[1], slots[2]}) != 3:
            raise ConformanceFailure("TIER-8", "prepare_load returned one slot for different keys")
        kit.tier.complete_load(order)

    @check("TIER-6")
    def test_keys_isolated_by_hash_and_group(self, kit: PrimaryDriver) -> None:
        """Keys that differ only in hash or only in group never see each other's blocks."""
        keys = tricky_keys()[: 2 * (kit.num_slots // 2)]
        stored, absent = keys[0::2], keys[1::2]
        kit.store(stored)
        kit.expect(stored, lr.HIT, "TIER-7", "after its store completed")
        kit.expect(absent, lr.MISS, "TIER-6", "(never stored; it differs from a stored key only in hash or group)")
        kit.load(stored)
        kit.tier.complete_load(stored)

    @check("TIER-6")
    def test_prepare_store_short_of_room_changes_nothing(self, kit: PrimaryDriver) -> None:
        """With some room but not enough (one free slot, one evictable block, three keys to store),
        prepare_store returns None and evicts nothing."""
        keys = key_pool("p-short", kit.num_slots - 1)
        kit.store(keys)
        pinned = keys[1:]
        kit.load(pinned)
        extra = key_pool("p-short-extra", 3)
        out = kit.prepare(extra)
        if out is not None:
            raise ConformanceFailure(
                "TIER-6", f"prepare_store of 3 keys with room for 2 did not return None: {out}"
            )
        kit.expect(keys[:1], lr.HIT, "TIER-6", "after a refused prepare_store (it must evict nothing)")
        kit.expect(extra, lr.MISS, "TIER-6", "after a refused prepare_store (it must reserve nothing)")
        kit.tier.complete_load(pinned)

    @check("TIER-7")
    def test_failed_store_leaves_ready_keys(self, kit: PrimaryDriver) -> None:
        """complete_store(False) over a batch holding READY keys fails only the keys in flight: the
        READY ones stay READY (HIT, with their bytes)."""
        keys = key_pool("p-keep", 4)
        kit.store(keys[:2])
        out = kit.prepare(keys)
        if out is None:
            raise ConformanceFailure("TIER-6", "prepare_store refused with free slots")
        kit.tier.complete_store(keys, False)
        kit.expect(keys[:2], lr.HIT, "TIER-7", "after complete_store(False) of a batch it was READY in")
        kit.expect(keys[2:], lr.MISS, "TIER-7", "after complete_store(success=False)")
        kit.load(keys[:2])
        kit.tier.complete_load(keys[:2])

    @check("TIER-16")
    def test_reset_cache_with_pins_held(self, kit: PrimaryDriver) -> None:
        """reset_cache while a block is pinned (a load in flight) answers False and changes nothing: every
        block still answers HIT, the pinned slot still holds its bytes for the load in flight, and the
        others load theirs (a refused reset that scrubbed the rows anyway is caught here)."""
        keys = key_pool("p-reset-pin", 3)
        kit.store(keys)
        (pinned,) = kit.load(keys[:1])
        answer: object = kit.tier.reset_cache()
        if answer is not False:
            raise ConformanceFailure(
                "TIER-16", f"reset_cache with a pin held answered {answer!r}; a load is in flight, so it must be False"
            )
        kit.expect(keys, lr.HIT, "TIER-16", "after reset_cache refused")
        if bytes(row(kit.buffer, pinned)) != block_for(keys[0], kit.block_bytes):
            raise ConformanceFailure(
                "TIER-16", f"after reset_cache refused (a load in flight), slot {pinned}, pinned by that load, no longer "
                f"holds the bytes of {short_key(keys[0])}: a refused reset changes nothing",
            )
        try:
            kit.load(keys[1:])
        except ConformanceFailure as failure:
            if failure.clause != "TIER-8":
                raise
            raise ConformanceFailure("TIER-16", f"after reset_cache refused: {failure.detail}; a refused reset "
                                     "changes nothing") from failure
        kit.tier.complete_load(keys[1:])
        kit.tier.complete_load(keys[:1])
        if kit.tier.reset_cache() is not True:
            raise ConformanceFailure("TIER-16", "reset_cache with every pin released did not answer True")

    @check("TIER-17")
    def test_ready_keys_agrees_with_lookup(self, kit: PrimaryDriver) -> None:
        """Where the tier offers ready_keys (ReadyKeys), one container, held from the start, holds
        exactly the keys lookup answers HIT for, at every step."""
        tier = kit.tier
        if not isinstance(tier, ReadyKeys):
            pytest.skip("needs the optional ReadyKeys ability (ready_keys), which the tier does not offer")
        ready = tier.ready_keys
        keys = key_pool("p-ready", 6)

        def agree(when: str) -> None:
            for key in keys:
                hit = kit.lookup(key) is lr.HIT
                if (key in ready) != hit:
                    raise ConformanceFailure(
                        "TIER-17",
                        f"{when}: lookup({short_key(key)}) answers {'HIT' if hit else 'not HIT'} but the "
                        f"ready_keys container {'lacks' if hit else 'holds'} it (it must be a live view)",
                    )

        through_every_ready_state(kit, keys, agree)

    @check("TIER-5")
    def test_touch_of_unknown_keys_is_a_no_op(self, kit: PrimaryDriver) -> None:
        """touch of keys the tier does not hold (absent or WRITING) changes nothing."""
        keys = key_pool("p-touch", 3)
        unknown = key_pool("p-touch-unknown", 3)
        kit.store(keys[:1])
        out = kit.prepare(keys[1:2])
        list(kit.tier.take_events())
        kit.tier.touch([*unknown, keys[0], keys[1]])
        kit.expect(unknown, lr.MISS, "TIER-5", "after touch of a key the tier does not hold")
        kit.expect(keys[1:2], lr.HIT_PENDING, "TIER-5", "after touch of a WRITING key")
        if any(set(e.keys) & set(unknown) for e in kit.tier.take_events()):
            raise ConformanceFailure("TIER-5", "touch of keys the tier does not hold produced an event naming them")
        if out is not None:
            kit.tier.complete_store(out.keys_to_store, True)
        kit.expect(keys[:2], lr.HIT, "TIER-7", "after touch and complete_store")

    # ---- lifecycle ----------------------------------------------------------------------
    @check("TIER-15")
    def test_has_pending_work_tracks_stores(self, kit: PrimaryDriver) -> None:
        """has_pending_work is True while a store is in flight (prepared, or submitted and unreported), else False."""
        self._pending_work_tracks_stores(kit)

    @check("TIER-15")
    def test_has_pending_work_tracks_pins(self, kit: PrimaryDriver) -> None:
        """has_pending_work is True while a load is in flight (pinned, or submitted and unreported),
        and False once it finished."""
        self._pending_work_tracks_loads(kit)

    @check("TIER-16")
    def test_shutdown_fails_stores_in_flight(self, kit: PrimaryDriver) -> None:
        """shutdown ends every store in flight: a primary fails it (MISS), a secondary reports it; nothing is lost."""
        self._shutdown_ends_work_in_flight(kit)

    # ---- Hypothesis ----------------------------------------------------------------------
    @check("TIER-7", hypothesis=True)
    def test_state_machine_against_model(self, tier_factory: PrimaryTierFactory, request: pytest.FixtureRequest) -> None:
        """Random stores, failures, loads, releases and resets agree with a model of block states."""
        from kvproto.testing._checks.machines import run_primary_machine

        run_primary_machine(self, tier_factory, self.profile(request), request)

    @check("TIER-6", hypothesis=True)
    def test_state_machine_from_a_full_tier(self, tier_factory: PrimaryTierFactory, request: pytest.FixtureRequest) -> None:
        """The same machine on a tier filled first (up to 64 blocks, 0 to 3 slots left), most of them pinned or
        none, READY blocks asked for too: stores evict, or are refused and change nothing (TIER-6), and every
        READY block keeps its bytes (TIER-8)."""
        from kvproto.testing._checks.machines import run_primary_machine

        run_primary_machine(self, tier_factory, self.profile(request), request, full=True)


PrimaryTierTests._kit_base = PrimaryTierTests
