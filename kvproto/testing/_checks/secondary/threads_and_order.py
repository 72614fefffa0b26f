"""The secondary tier's checks of section 1's classes of bugs (issue 17): batch answers in any
order (TIER-17), changing threads (TIER-19, TIER-20), a declared LRU order (CAP-6), and when STORED
events may be taken (TIER-21): :class:`SecondaryClassChecks`, a base of
:class:`~kvproto.testing.SecondaryTierTests`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence

import pytest

from kvproto import members as lr
from kvproto._events import EventKind
from kvproto._jobs import JobResult
from kvproto._keys import OffloadKey
from kvproto._protocols import SecondaryTier
from kvproto.testing._checks.secondary.role import (
    SecondaryRole,
    hit_and_loaded,
    load_right_after_hit,
    load_slots,
    store_slots,
)
from kvproto.testing._checks.threads_and_order import ClassChecks
from kvproto.testing._faults.backend import _OPS, FaultyBackend, OpFault
from kvproto.testing._faults.probes import KitBackend, faulty_backend_of, instrumented
from kvproto.testing._harness.data import key_pool, make_buffer
from kvproto.testing._harness.decorator import check
from kvproto.testing._harness.driver import TrackedContext, short_key
from kvproto.testing._harness.failures import ConformanceFailure
from kvproto.testing._harness.secondary_driver import SecondaryDriver

__all__ = ["SLOW_BACKEND_S", "SecondaryClassChecks", "another_layout_keeps_apart"]


def another_layout_keeps_apart(theirs: SecondaryDriver, keys: Sequence[OffloadKey], stored: str, tag: str,
                               why: str = "") -> None:
    """TIER-22 in an instance ``theirs`` for another layout over the storage where ``keys`` were stored
    (``stored`` says how, ``why`` what it means when it fails): each answers MISS, and a load of them fails;
    then ``theirs`` stores 2 blocks of its own (keys ``tag``) and resets its cache (its namespace only). The
    caller then checks that the first instance still serves ``keys``."""
    answers = theirs.resolve(keys)
    seen = [k for k in keys if answers[k] is not lr.MISS]
    if seen:
        raise ConformanceFailure(
            "TIER-22",
            f"key {short_key(seen[0])}, stored {stored}, answered {answers[seen[0]].name} in an instance over the "
            f"same storage for another layout: it must not load{why}",
        )
    result = theirs.load(keys, load_slots(theirs, len(keys)))
    loaded = sorted(result.succeeded_keys(theirs.jobs[result.job_id]))
    if loaded:
        raise ConformanceFailure(
            "TIER-22",
            f"a load of {short_key(loaded[0])} in an instance for another layout succeeded: it read a block "
            f"stored {stored}{why}",
        )
    own = key_pool(tag, 2)
    theirs.store(own, store_slots(theirs, len(own)))
    theirs.quiet_steps(2)
    theirs.tier.reset_cache()  # its own namespace only, whatever it answers
    theirs.quiet_steps(2)

SLOW_BACKEND_S = 0.1
"""How long every backend call takes in the kit's latency mode (TIER-4, TIER-13): far above a
lookup's budget, so a lookup or step that waited for one backend call took at least this long."""


def _latency_mode(backend: FaultyBackend) -> Callable[[float], None]:
    """Arms (``delay_s`` > 0) or disarms (0) a delay of every call of every operation of ``backend``."""

    def slow(delay_s: float) -> None:
        backend.disarm()
        if delay_s > 0:
            for op in _OPS:
                backend.arm(OpFault(op, count=1_000_000, delay_s=delay_s, error=None))

    return slow


class SecondaryClassChecks(SecondaryRole, ClassChecks[SecondaryDriver]):
    """Checks of whole classes of bugs, in the kit's order (see ``SecondaryTierTests``)."""


    def reopen_other_layout(self, tier: SecondaryTier, buffer: memoryview) -> SecondaryTier:
        """A new tier instance over the same storage as ``tier``, for another namespace (another
        model layout): the backdoor hook of :meth:`test_another_layouts_blocks_never_load` (KIT-5)."""
        raise NotImplementedError

    def slow_backend(self, tier: SecondaryTier, delay_s: float) -> None:
        """Make every call the tier makes to its storage take ``delay_s`` seconds (0: back to normal):
        the backdoor hook of :meth:`test_first_lookups_never_wait_for_a_slow_backend` for a tier that
        is not a :class:`~kvproto.tierkit.BlobTier` built with ``wrap=FaultyBackend`` (KIT-5)."""
        raise NotImplementedError

    def _slow_mode(self, tier: SecondaryTier) -> Callable[[float], None] | None:
        """The tier's latency mode: its FaultyBackend (``tier.backend``), else the slow_backend hook."""
        backend = getattr(tier, "backend", None)
        if isinstance(backend, FaultyBackend):
            return _latency_mode(backend)
        if self.has_hook("slow_backend"):
            return lambda delay_s: self.slow_backend(tier, delay_s)
        return None

    @check("TIER-4")
    def test_first_lookups_never_wait_for_a_slow_backend(self, kit: SecondaryDriver) -> None:
        """Blocking I/O found by structure, not by a budget on a fast backend: with every backend call
        made slow (a FaultyBackend under a BlobTier, or the slow_backend hook), the first lookup of each
        key (stored here, or never stored), and the steps after, return before one backend call could."""
        slow = self._slow_mode(kit.tier)
        if slow is None:
            pytest.skip(
                "needs a BlobTier built with wrap=FaultyBackend or the backdoor hook slow_backend(), "
                f"which {getattr(self, '_hook_owner', None) or type(self).__name__} does not define"
            )
        keys = key_pool("t4-slow", 6)
        confirm = iter(key_pool("t4-slow-confirm", 4))
        kit.store(keys[:2])
        kit.quiet_steps(2)
        context = TrackedContext("kvproto-kit-slow-backend")

        def waited(call: Callable[[], object], fresh: bool) -> float | None:
            """How long ``call`` took if it waited for a backend call: a call as slow as one backend call
            is repeated (on a fresh key where it was a first lookup) with every call ten times slower,
            and counts only if it is slow again (a busy machine is not blocking I/O; KIT-2)."""
            began = time.perf_counter()
            call()
            if time.perf_counter() - began < SLOW_BACKEND_S:
                return None
            slow(SLOW_BACKEND_S * 10)
            try:
                again = next(confirm) if fresh else None
                began = time.perf_counter()
                if again is not None:
                    kit.tier.lookup(again, context)
                else:
                    call()
                took = time.perf_counter() - began
            finally:
                slow(SLOW_BACKEND_S)
            return took if took >= SLOW_BACKEND_S * 10 else None

        slow(SLOW_BACKEND_S)
        try:
            for key in keys:
                took = waited(functools.partial(kit.tier.lookup, key, context), fresh=True)
                if took is not None:
                    raise ConformanceFailure(
                        "TIER-4",
                        f"the first lookup of {short_key(key)} took as long as a backend call, and a first lookup "
                        f"of a fresh key took {took * 1000:.0f} ms with every backend call taking "
                        f"{SLOW_BACKEND_S * 10000:.0f} ms: it waited for backend I/O (a tier that must check "
                        "remotely answers RETRY and checks in the background)",
                    )
            for _ in range(2):
                took = waited(kit.tier.on_step_end, fresh=False)
                if took is not None:
                    raise ConformanceFailure(
                        "TIER-13",
                        f"on_step_end took {took * 1000:.0f} ms with lookups to check and every backend call "
                        f"taking {SLOW_BACKEND_S * 10000:.0f} ms: it waited for backend I/O",
                    )
        finally:
            slow(0.0)
            kit.tier.on_request_finished(context)
        kit.quiet_steps(2)

    @check("TIER-4", hooks=("corrupt_on_read",))
    def test_no_cached_hit_after_a_damaged_load(self, kit: SecondaryDriver) -> None:
        """Within one live request that saw HIT: after a load of that request finds a block damaged,
        the request's next lookup of it answers HIT only if a load right after succeeds (no verdict
        cached for the request outlives what the load found). A tier holding HITs may serve the HIT taken
        before the damage (TIER-26): then the damaged block is asked for in a new request, and loaded."""
        keys = key_pool("t4-live", 3)
        kit.store(keys)
        kit.quiet_steps(2)
        context = TrackedContext("kvproto-kit-live-request")
        kit.expect(kit.resolve(keys, context), lr.HIT, "TIER-10", "right after its store reported success")
        self.corrupt_on_read(kit.tier, keys[1:2])
        result = kit.load(keys, load_slots(kit, len(keys)), context=context)
        if keys[1] in result.succeeded_keys(kit.jobs[result.job_id]):
            if not kit.capabilities.holds_hits:
                raise ConformanceFailure("KIT-5", "the corrupt_on_read hook had no effect: the block it damaged loaded")
            # A held HIT reads what was there when it was answered (TIER-26): the damage came after it.
            # Asked again in a new request, the HIT is taken over the damaged storage.
            kit.tier.on_request_finished(context)
            context = TrackedContext("kvproto-kit-live-request-after-damage")
            if kit.resolve(keys[1:2], context)[keys[1]] is not lr.HIT:
                kit.tier.on_request_finished(context)
                return  # the lookup itself found the damage: no cached HIT to judge
            result = kit.load(keys[1:2], load_slots(kit, 1), context=context)
            if keys[1] in result.succeeded_keys(kit.jobs[result.job_id]):
                raise ConformanceFailure(
                    "KIT-5", "the corrupt_on_read hook had no effect: the block it damaged loaded, in a request "
                    "whose HIT came after the damage (the tier holds HITs)",
                )
        for _ in range(2):
            if kit.lookup(keys[1], context) is lr.HIT:
                load_right_after_hit(
                    kit, keys[1], load_slots(kit, 4)[3], when=" again, to the request that saw its block fail a load as damaged"
                )
            kit.step()
        kit.tier.on_request_finished(context)

    @check("TIER-23")
    def test_a_stored_block_is_never_overwritten(self, kit: SecondaryDriver) -> None:
        """Create-if-absent, counted through the backend wrapper of a BlobTier built with
        ``wrap=FaultyBackend``: a second store of blocks already stored (another request's, as a second
        engine's write-through; with ``sharing`` and the reopen hook, also from a second instance, which
        knows nothing of them) creates no blob and deletes none, is reported succeeded (the block is
        there: storing it again is no failure, whatever the storage answered the conditional write),
        and the blocks still load."""
        backend = faulty_backend_of(kit.tier)
        if backend is None:
            pytest.skip("needs a BlobTier built with wrap=FaultyBackend (the kit counts its backend's writes)")
        keys = key_pool("t23", 2)
        kit.store(keys)
        kit.quiet_steps(2)
        with instrumented(backend) as counted:
            again = kit.store(keys, context=TrackedContext("kvproto-kit-second-writer"))
            kit.quiet_steps(2)
        self._never_overwrote(counted, len(keys), "")
        self._stored_again(again, "")
        asked = counted.created + counted.existed
        caps = kit.capabilities
        if caps.sharing and self.has_hook("reopen"):
            buffer = make_buffer(self.num_slots, self.block_bytes)
            other = SecondaryDriver(self.reopen(kit.tier, buffer), buffer, caps, kit.limits, first_job_id=9801)
            try:
                second = faulty_backend_of(other.tier)
                if second is not None:
                    with instrumented(second) as counted:
                        again = other.store(keys, store_slots(other, len(keys)))
                        other.quiet_steps(2)
                    self._never_overwrote(counted, len(keys), " from a second instance over the same storage")
                    self._stored_again(again, " from a second instance over the same storage")
                    asked += counted.created + counted.existed
            finally:
                other.shutdown()
        if not asked:
            pytest.skip(
                "vacuous: no second store reached the backend (the tier trusts what it knows of its blocks), "
                "and no second instance (sharing and the reopen hook) was there to ask it"
            )
        kit.load(keys, load_slots(kit, len(keys)))

    @staticmethod
    def _stored_again(result: JobResult, where: str) -> None:
        if not result.success:
            raise ConformanceFailure(
                "TIER-23",
                f"a second store{where} of 2 blocks already stored, with no fault injected, was reported failed "
                f"({result}): a block already there is stored (the first writer won), not an error",
            )

    @staticmethod
    def _never_overwrote(counted: KitBackend, stored: int, where: str) -> None:
        if counted.created or counted.deleted:
            raise ConformanceFailure(
                "TIER-23",
                f"a second store{where} of {stored} blocks already stored created {counted.created} blob(s) and "
                f"deleted {counted.deleted}: an existing block must never be overwritten (create-if-absent)",
            )

    @check("TIER-22", hooks=("reopen_other_layout",))
    def test_another_layouts_blocks_never_load(self, kit: SecondaryDriver) -> None:
        """A block stored under one namespace never loads in an instance over the same storage for
        another layout (the reopen_other_layout hook): there it answers MISS, and a load of it fails;
        that instance then stores blocks of its own and resets its cache (its namespace only), and the
        first instance still serves every block it stored, with its bytes."""
        keys = key_pool("t22", 3)
        kit.store(keys)
        kit.quiet_steps(2)
        buffer = make_buffer(self.num_slots, self.block_bytes)
        other = SecondaryDriver(
            self.reopen_other_layout(kit.tier, buffer), buffer, kit.capabilities, kit.limits, first_job_id=9701
        )
        try:
            another_layout_keeps_apart(other, keys, "under another namespace (model layout)", "t22-theirs")
        finally:
            other.shutdown()
        what = "in the first instance after another layout's instance asked, stored blocks of its own and reset its cache"
        hit_and_loaded(kit, keys, "TIER-22", what)

    @check("TIER-21")
    def test_stored_events_only_once_readable(self, kit: SecondaryDriver) -> None:
        """Events taken while a store is in flight, step by step: a STORED event names a block only
        once it is readable (a load submitted right when the event is taken reads its bytes back), and
        never a key the job then reports failed for (with the fail_keys hook: a partial store)."""
        tier = kit.tier
        list(tier.take_events())
        keys = key_pool("t21", 4)
        failing: set[OffloadKey] = set()
        if self.has_hook("fail_keys"):
            failing = set(keys[3:])
            self.fail_keys(tier, keys[3:])
        job = kit.submit_store(keys, store_slots(kit, len(keys)))
        named: set[OffloadKey] = set()
        free = iter(load_slots(kit, len(keys)))
        while True:
            reported = job.job_id in kit.results
            fresh = {k for e in tier.take_events() if e.kind is EventKind.STORED for k in e.keys} - named
            named |= fresh
            for key in sorted(fresh & set(keys)):
                if reported:
                    continue
                result = kit.load([key], [next(free)])  # the driver checks the bytes of a load that succeeds
                if key not in result.succeeded_keys(kit.jobs[result.job_id]):
                    raise ConformanceFailure(
                        "TIER-21",
                        f"a STORED event naming {short_key(key)} was taken while its store job was in flight, "
                        "but a load submitted right then failed: STORED may name a block only once it is readable",
                    )
            if reported:
                break
            kit.wait_step([job])
        kit.quiet_steps(2)
        named |= {k for e in tier.take_events() if e.kind is EventKind.STORED for k in e.keys}
        done = kit.results[job.job_id].succeeded_keys(job)
        wrong = sorted(named & (set(keys) - done))
        if wrong:
            why = " (the fail_keys hook failed it)" if set(wrong) & failing else ""
            raise ConformanceFailure(
                "TIER-21",
                f"a STORED event named {short_key(wrong[0])}, but its store job reported it failed{why}: "
                "STORED names only blocks whose store succeeded, also when the event is taken while the job "
                "is in flight",
            )
        if failing and failing <= done:
            raise ConformanceFailure("KIT-5", "the fail_keys hook had no effect: the key it names was stored")
