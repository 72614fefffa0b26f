"""The checks both kinds of tier must pass, each written once (LR-1, TIER-1, TIER-4, TIER-12, TIER-14..TIER-17).

:class:`TierChecks` holds them. They are written against a small role
interface (the ``_role_*`` members below): how to store blocks so they are
readable, how to leave a store in flight, how to make one fail, how to load,
how to let the tier settle, and what to verify after a reset or a shutdown.
:class:`~kvproto.testing.PrimaryTierTests` says what each means for a primary
tier (prepare_store / complete_store, prepare_load / complete_load),
:class:`~kvproto.testing.SecondaryTierTests` for a secondary one (jobs, steps,
fault hooks).

Three shared checks carry the role in their name (the protocol a tier
satisfies, what ``has_pending_work`` tracks, what ``shutdown`` does with work
in flight). Each is written here once, under a private name that pytest does
not collect, and each role class declares its own check under its own public name, e.g.
``test_satisfies_primary_protocol``, whose body calls the shared one; the kit
knows a check by the name it is collected under (:func:`~kvproto.testing.checks_of`).
"""

from __future__ import annotations

import gc
import types
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import ClassVar, Generic, NamedTuple, TypeVar

import pytest

from kvproto import members as lr
from kvproto._events import EventKind, OffloadingEvent
from kvproto._keys import OffloadKey
from kvproto._protocols import BatchLookup, PrimaryTier, SecondaryTier
from kvproto._requests import ReqContext
from kvproto.testing._harness.base import KitBase
from kvproto.testing._harness.data import key_pool
from kvproto.testing._harness.decorator import check
from kvproto.testing._harness.driver import TrackedContext
from kvproto.testing._harness.failures import ConformanceFailure
from kvproto.testing._harness.primary_driver import PrimaryDriver
from kvproto.testing._harness.secondary_driver import SecondaryDriver

__all__ = ["CLOSED", "Finish", "PendingWorkWords", "TierChecks"]

CLOSED = pytest.StashKey[bool]()  # the check's tier was shut down already

Finish = Callable[[], None]
"""Finishes what a ``_role_start_*`` call left in flight."""

_D = TypeVar("_D", bound=PrimaryDriver | SecondaryDriver)


class PendingWorkWords(NamedTuple):
    """How a role words the three ways ``has_pending_work`` can be wrong (TIER-15)."""

    idle: str  # True before any work
    busy: str  # not True with a store in flight
    done: str  # still True once the store is done


def _strings_reachable(root: object, prefix: str, limit: int = 200_000) -> set[str]:
    """The str objects starting with ``prefix`` reachable from ``root`` (through containers and
    instances, not through classes, modules or functions), visiting at most ``limit`` objects."""
    found: set[str] = set()
    seen: set[int] = {id(root)}
    todo: list[object] = [root]
    skip = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.CodeType, memoryview)
    while todo and len(seen) < limit:
        obj = todo.pop()
        refs = gc.get_referents(obj)
        if isinstance(obj, dict):
            refs.extend(obj.keys())  # a dict of str keys does not report them to the gc
        for ref in refs:
            if id(ref) in seen:
                continue
            seen.add(id(ref))
            if isinstance(ref, str):
                if ref.startswith(prefix):
                    found.add(ref)
                continue
            if isinstance(ref, (*skip, bytes, bytearray, int, float)):
                continue
            todo.append(ref)
    return found


def _look_up(kit: PrimaryDriver | SecondaryDriver, keys: Iterable[OffloadKey]) -> None:
    """One checked lookup of each key, answers unused (the driver checks each one)."""
    for key in keys:
        kit.lookup(key)


def batch_lookup_or_skip(kit: PrimaryDriver | SecondaryDriver) -> BatchLookup:
    """The tier under ``kit`` as a BatchLookup (TIER-17's optional ``lookup_many``); the check is
    skipped (not checked) where the tier does not offer it."""
    tier = kit.tier
    if not isinstance(tier, BatchLookup):
        pytest.skip("needs the optional BatchLookup ability (lookup_many), which the tier does not offer")
    return tier


class TierChecks(KitBase, Generic[_D]):
    """The checks common to :class:`~kvproto.testing.PrimaryTierTests` and
    :class:`~kvproto.testing.SecondaryTierTests`; ``_D`` is the role's driver."""

    # ---- the role interface: what each step means for this kind of tier ------------------
    #: The protocol the tier must satisfy (TIER-1).
    _role_protocol: ClassVar[type]
    #: Prefix of every key namespace of the role's checks.
    _role_key_prefix: ClassVar[str] = ""
    #: True where a store in flight stays in flight until the kit finishes it (a primary's
    #: prepared store); False where it may finish at any step (a secondary's job).
    _role_holds_stores: ClassVar[bool]
    #: The failure messages of the has_pending_work check (TIER-15).
    _role_pending_words: ClassVar[PendingWorkWords]

    def _role_keys(self, tag: str, count: int) -> list[OffloadKey]:
        """``count`` keys of the check's own namespace ``tag``."""
        return key_pool(self._role_key_prefix + tag, count)

    def _role_store(self, kit: _D, keys: Sequence[OffloadKey], context: ReqContext | None = None) -> bool:
        """Store ``keys`` for ``context``'s request and wait until it is done; False if the tier
        reported the store failed."""
        raise NotImplementedError

    def _role_start_store(self, kit: _D, keys: Sequence[OffloadKey]) -> Finish:
        """Start a store of ``keys`` and leave it in flight; the call returned finishes it."""
        raise NotImplementedError

    def _role_fail_store(self, kit: _D, keys: Sequence[OffloadKey]) -> set[OffloadKey]:
        """Store ``keys`` so that the store fails, where the role can make it fail; the keys
        whose store failed (none where it cannot)."""
        raise NotImplementedError

    def _role_start_load(self, kit: _D, keys: Sequence[OffloadKey], context: ReqContext | None = None) -> Finish:
        """Start a load of the stored ``keys`` for ``context``'s request; the call returned waits
        for it and releases what it holds."""
        raise NotImplementedError

    def _role_settle(self, kit: _D) -> None:
        """Let the tier finish what follows its reported work (a few quiet steps, where it has steps)."""
        raise NotImplementedError

    def _role_check_forgotten(self, kit: _D, keys: Sequence[OffloadKey]) -> None:
        """After a reset, what besides a MISS shows ``keys`` are gone (TIER-16)."""
        raise NotImplementedError

    def _role_check_shut_down(self, kit: _D, keys: Sequence[OffloadKey]) -> None:
        """After ``shutdown``, the stores of ``keys`` that were in flight ended as the role's
        contract says (TIER-16)."""
        raise NotImplementedError

    # ---- steps the checks share -----------------------------------------------------------
    def _held_before_eviction(self, kit: _D, tag: str, most: int = 16) -> int:
        """How many blocks the tier holds before it evicts, learned from a clean round (KIT-26): one-block
        stores of fresh keys, one at a time, each followed by lookups of all stored so far, until one of
        them answers MISS or a REMOVED event names one; the answer is the most that answered HIT at once
        (``most`` where ``most`` were stored and all held). Lookups, not events alone, so a tier that
        evicts silently is still sized right and then judged (TIER-14). For a check whose set-up would
        otherwise assume a tier holds one of its jobs: a tier declaring eviction may hold fewer (CAP-2).
        Its blocks stay; the events are taken."""
        tier = kit.tier
        list(tier.take_events())
        keys = self._role_keys(tag, most)
        held = 0
        for stored in range(1, most + 1):
            if not self._role_store(kit, keys[stored - 1 : stored]):
                return held
            self._role_settle(kit)
            removed = any(e.kind is EventKind.REMOVED for e in tier.take_events())
            hits = sum(answer is lr.HIT for answer in kit.resolve(keys[:stored]).values())
            held = max(held, hits)
            if removed or hits < stored:
                return held
        return most

    def _look_up_through_a_store(self, kit: _D, keys: Sequence[OffloadKey], stored: int) -> None:
        """Look every key up before, during and after a store of the first ``stored`` of them."""
        _look_up(kit, keys)
        finish = self._role_start_store(kit, keys[:stored])
        _look_up(kit, keys)
        finish()
        kit.resolve(keys)

    # ---- bodies of the checks each role names for itself (declared in the role's class) --
    def _satisfies_protocol(self, tier: PrimaryTier | SecondaryTier) -> None:
        """The tier has every member of its protocol (PrimaryTier or SecondaryTier) and a non-empty str name."""
        protocol = self._role_protocol
        members = (n for n in dir(protocol) if not n.startswith("_"))
        missing = [m for m in members if not hasattr(tier, m)]
        if missing:
            raise ConformanceFailure(
                "TIER-1", f"{type(tier).__name__} lacks {protocol.__name__} member(s): {', '.join(missing)}"
            )
        name: object = tier.name
        if not isinstance(name, str) or not name:
            raise ConformanceFailure("TIER-1", f"name is {name!r}; the contract requires a non-empty str")

    def _pending_work_tracks_stores(self, kit: _D) -> None:
        """has_pending_work is True while a store is in flight (prepared, or submitted and unreported), else False."""
        words = self._role_pending_words
        tier = kit.tier
        if tier.has_pending_work() is not False:
            raise ConformanceFailure("TIER-15", words.idle)
        finish = self._role_start_store(kit, self._role_keys("pending", 2))
        if tier.has_pending_work() is not True:
            raise ConformanceFailure("TIER-15", words.busy)
        finish()
        self._role_settle(kit)
        if tier.has_pending_work() is not False:
            raise ConformanceFailure("TIER-15", words.done)

    def _pending_work_tracks_loads(self, kit: _D) -> None:
        """has_pending_work is True while a load is in flight (pinned, or submitted and unreported),
        and False once it finished."""
        keys = self._role_keys("pending-load", 2)
        self._role_store(kit, keys)
        self._role_settle(kit)
        if kit.tier.has_pending_work() is not False:
            raise ConformanceFailure("TIER-15", "has_pending_work is True with no job in flight")
        finish = self._role_start_load(kit, keys)
        if kit.tier.has_pending_work() is not True:
            raise ConformanceFailure("TIER-15", "has_pending_work is not True while a load is in flight")
        finish()
        self._role_settle(kit)
        if kit.tier.has_pending_work() is not False:
            raise ConformanceFailure("TIER-15", "has_pending_work is still True after the load finished")

    def _shutdown_ends_work_in_flight(self, kit: _D) -> None:
        """shutdown ends every store in flight: a primary fails it (MISS), a secondary reports it; nothing is lost."""
        keys = self._role_keys("shutdown", 6)
        self._role_store(kit, keys[:2])
        self._role_start_store(kit, keys[2:4])
        self._role_start_store(kit, keys[4:])
        self._role_start_load(kit, keys[:2])
        kit.shutdown()
        self._role_check_shut_down(kit, keys[2:])

    # ---- answers --------------------------------------------------------------------------
    @check("LR-1")
    def test_lookup_answers_a_lookup_result(self, kit: _D) -> None:
        """Every lookup answers a LookupResult member (not bool, not None), whatever the block's state."""
        self._look_up_through_a_store(kit, self._role_keys("lr1", 4), 2)

    @check("TIER-4")
    def test_lookup_does_not_block(self, kit: _D) -> None:
        """Lookups answer at once in every state, also while stores and loads are in flight."""
        keys = self._role_keys("t4", 6)
        self._look_up_through_a_store(kit, keys, 3)
        finish = self._role_start_load(kit, keys[:3])
        _look_up(kit, keys)
        finish()
        for _ in range(3):
            _look_up(kit, keys)

    @check("TIER-17")
    def test_lookup_many_matches_lookup(self, kit: _D) -> None:
        """Where the tier offers lookup_many (BatchLookup), it answers as lookup does, key by key."""
        tier = batch_lookup_or_skip(kit)
        keys = self._role_keys("t17", 6)
        self._role_store(kit, keys[:2])
        # While keys are unresolved (never asked, a store in flight) and after: a job may finish
        # between two calls, so lookup's answer must match lookup_many's before or after it.
        fresh = TrackedContext("kvproto-kit-lookup-many")
        finish = self._role_start_store(kit, keys[2:4])
        self._compare_lookup_many(kit, tier, keys, fresh)
        self._compare_lookup_many(kit, tier, keys, fresh)
        finish()
        self._compare_lookup_many(kit, tier, keys, fresh)
        kit.resolve(keys, fresh)
        self._compare_lookup_many(kit, tier, keys, fresh)
        kit.tier.on_request_finished(fresh)

    def _compare_lookup_many(self, kit: _D, tier: BatchLookup, keys: Sequence[OffloadKey], context: ReqContext) -> None:
        """lookup_many, lookup key by key, lookup_many again: each lookup answer must be one of the
        two batch answers for its key (TIER-17)."""
        before: object = tier.lookup_many(keys, context)
        one = [kit.lookup(k, context) for k in keys]
        after: object = tier.lookup_many(keys, context)
        for many in (before, after):
            if not isinstance(many, list) or len(many) != len(keys):
                raise ConformanceFailure("TIER-17", f"lookup_many of {len(keys)} keys answered {many!r}")
        assert isinstance(before, list) and isinstance(after, list)
        for key, a, b, c in zip(keys, before, one, after, strict=True):
            if b is not a and b is not c:
                raise ConformanceFailure(
                    "TIER-17",
                    f"lookup_many answered {a!r} then {c!r} for {key.hex()[:12]}.., but lookup answered "
                    f"{b!r} between them (lookup_many must answer as lookup does, also while unresolved)",
                )

    # ---- lifecycle ------------------------------------------------------------------------
    @check("TIER-12")
    def test_on_request_finished_drops_request_state(self, kit: _D) -> None:
        """After on_request_finished the tier holds no reference to the request's context."""
        keys = self._role_keys("request", 4)
        context = TrackedContext("kvproto-kit-finished-request")
        self._role_store(kit, keys[:2], context)
        kit.resolve(keys, context)
        self._role_start_load(kit, keys[:2], context)()
        kit.tier.on_request_finished(context)
        self._role_settle(kit)
        ref = weakref.ref(context)
        del context
        gc.collect()
        if ref() is not None:
            raise ConformanceFailure(
                "TIER-12", "the tier still holds the ReqContext of a finished request (per-request state leaked)"
            )
        kit.expect_resolved(
            keys[:2], lr.HIT, "TIER-12", "for another request after one finished", TrackedContext("kvproto-kit-next")
        )

    @check("TIER-12")
    def test_request_state_does_not_grow(self, kit: _D) -> None:
        """What the tier retains does not grow with finished requests: after 120 requests that looked
        up, stored and loaded, then finished, it holds no state keyed by (or naming) most of their ids."""
        keys = self._role_keys("requests", 2)
        self._role_store(kit, keys)
        token = f"kvproto-kit-req-{id(kit):x}-"
        for i in range(120):
            context = TrackedContext(f"{token}{i}")
            kit.resolve(keys, context)
            self._role_start_load(kit, keys, context)()
            kit.tier.on_request_finished(context)
        self._role_settle(kit)
        held = _strings_reachable(kit.tier, token)
        if len(held) > 32:
            raise ConformanceFailure(
                "TIER-12",
                f"the tier still holds the request ids of {len(held)} of 120 finished requests "
                "(per-request state keyed by req_id is never dropped in on_request_finished)",
            )

    @check("TIER-14")
    def test_events_name_stored_blocks(self, kit: _D) -> None:
        """STORED events name only blocks stored successfully, carry the tier's name, and are returned once."""
        tier = kit.tier
        list(tier.take_events())
        keys = self._role_keys("events", 4)
        self._role_store(kit, keys[:2])
        failed = self._role_fail_store(kit, keys[2:])
        self._role_settle(kit)
        events = list(tier.take_events())
        for event in events:
            if not isinstance(event, OffloadingEvent):
                raise ConformanceFailure("TIER-14", f"take_events returned {event!r}, not an OffloadingEvent")
            if event.tier != tier.name:
                raise ConformanceFailure("TIER-14", f"event names tier {event.tier!r}; the tier is {tier.name!r}")
            if event.kind is EventKind.STORED and set(event.keys) & failed:
                raise ConformanceFailure("TIER-14", "a STORED event names a block whose store failed")
        if list(tier.take_events()):
            raise ConformanceFailure("TIER-14", "take_events returned the same events twice (it must forget them)")

    @check("TIER-16")
    def test_reset_cache_forgets_blocks(self, kit: _D) -> None:
        """reset_cache refuses (False) or forgets (True) with a store in flight; idle, it forgets all (True, MISS).

        Blocks stored afterwards answer HIT again."""
        keys = self._role_keys("reset", 4)
        self._role_store(kit, keys[:2])
        finish = self._role_start_store(kit, keys[2:])
        busy: object = kit.tier.reset_cache()
        if busy is True:
            kit.expect_resolved(keys[:2], lr.MISS, "TIER-16", "after reset_cache answered True")
        elif busy is not False:
            raise ConformanceFailure("TIER-16", f"reset_cache answered {busy!r}, not a bool")
        finish()
        self._role_settle(kit)
        answer: object = kit.tier.reset_cache()
        if answer is not True:
            raise ConformanceFailure("TIER-16", f"reset_cache with no work in flight answered {answer!r}, not True")
        kit.expect_resolved(keys, lr.MISS, "TIER-16", "after reset_cache", TrackedContext("kvproto-kit-after-reset"))
        self._role_check_forgotten(kit, keys[:1])
        if not self._role_store(kit, keys):
            raise ConformanceFailure("TIER-16", "storing after reset_cache failed")
        kit.expect_resolved(keys, lr.HIT, "TIER-16", "stored after reset_cache")
