"""Checks of whole classes of bugs that both kinds of tier can have (issue 17, section 1):
batch answers in any key order (TIER-17), calls from changing threads (TIER-19, TIER-20), and a
declared LRU order that honours ``touch`` (CAP-6).

Each is written once in :class:`ClassChecks` under a private name pytest does not collect, and each
role class binds it to its own public name (as :mod:`kvproto.testing._checks.shared` does), so a check
serves secondary and primary tiers alike.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import pytest

from kvproto import members as lr
from kvproto._events import EventKind
from kvproto._keys import OffloadKey
from kvproto._results import LookupResult
from kvproto.testing._checks.shared import TierChecks, batch_lookup_or_skip
from kvproto.testing._harness.decorator import check
from kvproto.testing._harness.driver import TrackedContext, short_key
from kvproto.testing._harness.failures import ConformanceFailure
from kvproto.testing._harness.primary_driver import PrimaryDriver
from kvproto.testing._harness.secondary_driver import SecondaryDriver

__all__ = ["ClassChecks", "ThreadHopper"]

_D = TypeVar("_D", bound=PrimaryDriver | SecondaryDriver)
_R = TypeVar("_R")

# Orders of 8 keys the batch check asks in: reversed, interleaved, and two fixed shuffles (the same
# every run: a check waits for conditions, never for luck).
_ORDERS: tuple[tuple[int, ...], ...] = (
    (7, 6, 5, 4, 3, 2, 1, 0),
    (4, 0, 5, 1, 6, 2, 7, 3),
    tuple(random.Random(17).sample(range(8), 8)),
    tuple(random.Random(1717).sample(range(8), 8)),
)


class ThreadHopper:
    """Runs each call on one of a few named threads of its own, one call at a time (never two at
    once), so a tier is driven from changing threads as vLLM 0.33 and LMCache drive it (TIER-19,
    TIER-20). An exception the tier raises on one of them fails ``clause``, naming the thread the
    call ran on and the one the call before it ran on. Joins its threads on exit."""

    def __init__(self, names: Sequence[str], clause: str) -> None:
        self._clause = clause
        self._pools = {name: ThreadPoolExecutor(max_workers=1, thread_name_prefix=name) for name in names}
        self._names = list(names)
        self._turn = 0
        self._last = threading.current_thread().name

    def __enter__(self) -> ThreadHopper:
        return self

    def __exit__(self, *exc: object) -> None:
        for pool in self._pools.values():
            pool.shutdown(wait=True)

    def next(self, what: str, call: Callable[[], _R]) -> _R:
        """``call`` on the next thread in turn."""
        name = self._names[self._turn % len(self._names)]
        self._turn += 1
        return self.on(name, what, call)

    def on(self, name: str, what: str, call: Callable[[], _R]) -> _R:
        """``call`` (``what`` names it in a failure) on thread ``name``, waited for."""

        def run() -> tuple[str, _R]:
            return threading.current_thread().name, call()

        before = self._last
        try:
            where, value = self._pools[name].submit(run).result()
        except ConformanceFailure:
            raise
        except Exception as error:  # any error the tier raises is the finding
            raise ConformanceFailure(
                self._clause,
                f"{what} raised {type(error).__name__}: {error} when called on thread {name!r} after the "
                f"call before it ran on thread {before!r}; calls never overlap, but may come from any "
                "thread (a handle bound to the thread that made it, such as an sqlite3 connection, breaks)",
            ) from error
        self._last = where
        return value


class ClassChecks(TierChecks[_D]):
    """The bodies of the checks of section 1's classes both roles share (see the module docstring)."""

    # ---- TIER-17: batch answers in the order of the keys given --------------------------
    @check("TIER-17")
    def test_lookup_many_answers_in_key_order(self, kit: _D) -> None:
        """lookup_many answers in the order of the keys it is given, whatever that order (reversed,
        interleaved, shuffled; stored and unknown keys mixed), each answer as lookup's for its key."""
        tier = batch_lookup_or_skip(kit)
        keys = self._role_keys("t17-order", 8)
        self._role_store(kit, keys[:4])
        context = TrackedContext("kvproto-kit-lookup-many-order")
        kit.resolve(keys, context)
        for order in _ORDERS:
            batch = [keys[i] for i in order]
            many: object = tier.lookup_many(batch, context)
            one = [kit.lookup(k, context) for k in batch]
            if not isinstance(many, list) or len(many) != len(batch):
                raise ConformanceFailure("TIER-17", f"lookup_many of {len(batch)} keys answered {many!r}")
            for at, (key, a, b) in enumerate(zip(batch, many, one, strict=True)):
                if a is not b:
                    raise ConformanceFailure(
                        "TIER-17",
                        f"lookup_many of {len(batch)} keys in the order {list(order)} answered {a!r} at position "
                        f"{at} (key {short_key(key)}), where lookup answers {b!r}: lookup_many must answer in "
                        "the order of the keys it is given, whatever that order",
                    )
        kit.tier.on_request_finished(context)
        # Unresolved keys (never asked, a store in flight) in a shuffled order too.
        fresh = self._role_keys("t17-order-fresh", 8)
        unresolved = TrackedContext("kvproto-kit-lookup-many-order-fresh")
        finish = self._role_start_store(kit, fresh[:3])
        self._compare_lookup_many(kit, tier, [fresh[i] for i in _ORDERS[2]], unresolved)
        finish()
        self._compare_lookup_many(kit, tier, [fresh[i] for i in _ORDERS[3]], unresolved)
        kit.tier.on_request_finished(unresolved)

    # ---- TIER-19, TIER-20: never concurrent, but from changing threads ----------------
    def _steps_on(self, kit: _D, hop: ThreadHopper, pick: Callable[[str], str], tag: str) -> None:
        """Store, look up, load, touch, take events and finish a request, each step on the thread
        ``pick(kind)`` names (kind: "jobs" or "lookups")."""
        keys = self._role_keys(tag, 4)
        context = TrackedContext(f"kvproto-kit-{tag}")

        def look(batch: Sequence[OffloadKey]) -> Callable[[], None]:
            def run() -> None:
                for key in batch:
                    kit.lookup(key, context)

            return run

        def take() -> None:
            list(kit.tier.take_events())

        hop.on(pick("lookups"), "lookup", look(keys))
        finish = hop.on(pick("jobs"), "a store", lambda: self._role_start_store(kit, keys[:2]))
        hop.on(pick("lookups"), "lookup", look(keys))
        hop.on(pick("jobs"), "finishing a store", finish)
        hop.on(pick("jobs"), "settling", lambda: self._role_settle(kit))

        def stored() -> None:
            why = "after its store, driven from changing threads"
            kit.expect_resolved(keys[:2], lr.HIT, self._hop_clause(pick), why, context)

        hop.on(pick("lookups"), "lookup", stored)
        done = hop.on(pick("jobs"), "a load", lambda: self._role_start_load(kit, keys[:2], context))
        hop.on(pick("jobs"), "finishing a load", done)
        hop.on(pick("lookups"), "touch", lambda: kit.tier.touch(keys[:1]))
        hop.on(pick("lookups"), "take_events", take)
        hop.on(pick("lookups"), "on_request_finished", lambda: kit.tier.on_request_finished(context))
        hop.on(pick("jobs"), "settling", lambda: self._role_settle(kit))
        pending: object = hop.on(pick("jobs"), "has_pending_work", kit.tier.has_pending_work)
        if pending is not False:
            raise ConformanceFailure(
                self._hop_clause(pick), f"has_pending_work answered {pending!r} with every job finished (changing threads)"
            )

    @staticmethod
    def _hop_clause(pick: Callable[[str], str]) -> str:
        return "TIER-20" if pick("jobs") != pick("lookups") else "TIER-19"

    @check("TIER-19")
    def test_driven_from_alternating_threads(self, kit: _D) -> None:
        """Calls that never overlap but come from changing threads (vLLM 0.33 polls a tier from a
        thread of its own): each step of a store, lookups, a load, touch and events runs on the
        other of two threads than the step before; everything still works."""
        with ThreadHopper(("kvproto-kit-a", "kvproto-kit-b"), "TIER-19") as hop:
            turn = iter(range(1_000))

            def alternate(kind: str) -> str:
                return "kvproto-kit-a" if next(turn) % 2 == 0 else "kvproto-kit-b"

            self._steps_on(kit, hop, alternate, "threads-alternating")

    @check("TIER-20")
    def test_jobs_and_lookups_on_two_threads(self, kit: _D) -> None:
        """LMCache's pattern (through the kvproto-lmcache adapter, which serializes the calls): job
        calls and steps on one thread, lookups, touch and events on another; everything still works."""
        with ThreadHopper(("kvproto-kit-jobs", "kvproto-kit-lookups"), "TIER-20") as hop:
            self._steps_on(kit, hop, lambda kind: f"kvproto-kit-{kind}", "threads-two-roles")

    # ---- CAP-6: a declared LRU order honours touch -------------------------------------
    @check("CAP-6", needs=("lru",))
    def test_touch_keeps_a_block_under_lru(self, kit: _D) -> None:
        """With ``lru`` declared (eviction of the least recently used block first), a block touched
        after every store outlives the blocks stored with it: stores of 8 blocks (half the blocks the
        tier holds, where it holds fewer than 16, KIT-26), each followed by a touch of the first block,
        until a REMOVED event shows an eviction; the touched block is then still held (HIT), and no
        REMOVED event names it."""
        tier = kit.tier
        held = self._held_before_eviction(kit, "lru-calibrate")
        if held < 2:
            pytest.skip(f"vacuous: the tier holds {held} block(s) before it evicts, too few to show an LRU order")
        size = min(8, held // 2)
        keys = self._role_keys("lru", 96)
        hot = keys[0]
        removed: set[OffloadKey] = set()
        stored: list[OffloadKey] = []
        for i in range(0, len(keys), size):
            batch = keys[i : i + size]
            if not self._role_store(kit, batch):
                raise ConformanceFailure("TIER-10", f"a store of {len(batch)} blocks failed after {i} were stored")
            stored.extend(batch)
            tier.touch([hot])
            self._role_settle(kit)
            removed |= {k for e in tier.take_events() if e.kind is EventKind.REMOVED for k in e.keys}
            if removed & set(stored[1:]):
                break
        else:
            pytest.skip(f"the tier evicted none of {len(keys)} blocks: its LRU order was not observable")
        answer: LookupResult = kit.resolve_one(hot) if isinstance(kit, SecondaryDriver) else kit.lookup(hot)
        if hot in removed or answer is not lr.HIT:
            first = sorted(removed - {hot})
            raise ConformanceFailure(
                "CAP-6",
                f"the tier declares lru, but the block {short_key(hot)}, touched after every store, was evicted "
                f"({answer.name}) while {len(removed - {hot})} block(s) used less recently were evicted too "
                f"(first {short_key(first[0]) if first else '-'}): touch must make a block recently used",
            )
