"""``SecondaryTierTests``: the conformance checks for a secondary tier (TIER-*, LR-*, KIT-*).

The checks both kinds of tier share live in :mod:`kvproto.testing._common`; this
module says what their steps mean for a secondary tier and adds the secondary's own.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import ClassVar

import pytest

from kvproto import members as lr
from kvproto._events import EventKind
from kvproto._keys import OffloadKey
from kvproto._protocols import SecondaryTier
from kvproto._requests import ReqContext
from kvproto._results import unreachable
from kvproto.testing._checks import check
from kvproto.testing._common import CLOSED, Finish, PendingWorkWords, TierChecks
from kvproto.testing._data import block_for, key_pool, make_buffer, tricky_keys
from kvproto.testing._driver import SecondaryDriver, TrackedContext, short_key
from kvproto.testing._failures import ConformanceFailure
from kvproto.testing._tier_spec import SECONDARY_BLOCK_BYTES, SECONDARY_NUM_SLOTS

__all__ = ["SecondaryTierFactory", "SecondaryTierTests"]

SecondaryTierFactory = Callable[[memoryview], SecondaryTier]
"""Builds an EMPTY secondary tier bound to the given primary buffer."""


def _load_right_after_hit(kit: SecondaryDriver, key: OffloadKey, slot: int, *, when: str = "") -> None:
    """Load ``key`` into ``slot`` right after it answered HIT ``when``; HIT means readable now,
    so a failed load breaks TIER-4."""
    result = kit.load([key], [slot])
    if key not in result.succeeded_keys(kit.jobs[result.job_id]):
        raise ConformanceFailure(
            "TIER-4", f"lookup({short_key(key)}) answered HIT{when}, but a load submitted right after it failed"
        )


def _store_slots(kit: SecondaryDriver, count: int) -> list[int]:
    """The first ``count`` slots of the lower half of the buffer, where the shared checks store,
    that no job in flight uses."""
    busy = {slot for job_id in kit.pending() for slot in kit.jobs[job_id].slots}
    return [slot for slot in range(kit.num_slots // 2) if slot not in busy][:count]


def _load_slots(kit: SecondaryDriver, count: int) -> list[int]:
    """``count`` slots in the upper half of the buffer, where the shared checks load."""
    first = kit.num_slots // 2
    return list(range(first, first + count))


class SecondaryTierTests(TierChecks[SecondaryDriver]):
    """Subclass this (as ``TestMyTier``) and override the ``tier_factory`` fixture.

    ``tier_factory`` returns a callable that builds an EMPTY tier bound to a
    primary buffer (a writable 2-D ``memoryview``, one row per slot); the kit
    calls it once per check and once per Hypothesis example, and shuts each
    tier down afterwards.

    Optional backdoor hooks (define them as methods to enable the checks that
    need them; a check whose hook is missing skips, naming it) (KIT-5):

    * ``seed_block(tier, key, data)``: store ``data`` under ``key`` without the tier's methods;
    * ``read_block(tier, key) -> bytes | None``: what the storage holds under ``key``;
    * ``fail_next_jobs(tier, n)``: the next ``n`` jobs submitted fail whole (``success=False``); ``n``
      SETS the count (it does not add; 0 disarms), so calling it twice with 1 fails one job;
    * ``fail_keys(tier, keys)``: ADDS ``keys`` to the failing keys: every later job touching them
      fails for them (a partial result with ``partial_jobs``, else the whole job), never for other keys;
    * ``corrupt_on_read(tier, keys)``: damage the stored copy of ``keys``, so that the next read of
      each is damaged (the tier must detect it: fail the key, never serve it);
    * ``reopen(tier, buffer) -> tier``: a new instance over the same storage (persistence).

    A hook with less effect than it says (nothing failed) or more (other jobs or keys failed too)
    fails KIT-5, never the tier's clauses.
    """

    num_slots: ClassVar[int] = SECONDARY_NUM_SLOTS
    block_bytes: ClassVar[int] = SECONDARY_BLOCK_BYTES

    # ---- fixtures ----------------------------------------------------------------------
    @pytest.fixture
    def primary_buffer(self) -> memoryview:
        """A fresh primary buffer of ``num_slots`` rows of ``block_bytes`` bytes."""
        return make_buffer(self.num_slots, self.block_bytes)

    @pytest.fixture
    def tier_factory(self) -> SecondaryTierFactory:
        """Override: return a callable that builds an EMPTY tier bound to a primary buffer."""
        raise ConformanceFailure(
            "KIT-5",
            f"{type(self).__name__} must override the tier_factory fixture "
            "(a callable: primary buffer -> an empty tier)",
        )

    @pytest.fixture
    def tier(
        self, tier_factory: SecondaryTierFactory, primary_buffer: memoryview, request: pytest.FixtureRequest
    ) -> Iterator[SecondaryTier]:
        """An empty tier bound to ``primary_buffer``, shut down after the check (once)."""
        built = tier_factory(primary_buffer)
        yield built
        if not request.node.stash.get(CLOSED, False):
            built.shutdown()

    @pytest.fixture
    def kit(
        self, tier: SecondaryTier, primary_buffer: memoryview, request: pytest.FixtureRequest
    ) -> Iterator[SecondaryDriver]:
        """A driver for ``tier``; shuts the tier down after the check."""

        def closed() -> None:
            request.node.stash[CLOSED] = True

        driver = SecondaryDriver(
            tier, primary_buffer, self.declared_capabilities(tier), self.limits, on_close=closed
        )
        yield driver
        driver.shutdown()

    # ---- backdoor hooks (KIT-5); the base versions mean "not available" -----------------
    def seed_block(self, tier: SecondaryTier, key: OffloadKey, data: bytes) -> None:
        """Store ``data`` under ``key`` directly in the tier's storage."""
        raise NotImplementedError

    def read_block(self, tier: SecondaryTier, key: OffloadKey) -> bytes | None:
        """The bytes the tier's storage holds under ``key``, or None."""
        raise NotImplementedError

    def fail_next_jobs(self, tier: SecondaryTier, n: int) -> None:
        """Make the next ``n`` jobs submitted to ``tier`` fail entirely."""
        raise NotImplementedError

    def fail_keys(self, tier: SecondaryTier, keys: Iterable[OffloadKey]) -> None:
        """Make jobs fail for ``keys`` (and only them)."""
        raise NotImplementedError

    def corrupt_on_read(self, tier: SecondaryTier, keys: Iterable[OffloadKey]) -> None:
        """Damage what the tier will read back for ``keys``."""
        raise NotImplementedError

    def reopen(self, tier: SecondaryTier, buffer: memoryview) -> SecondaryTier:
        """A new tier instance over the same storage as ``tier``."""
        raise NotImplementedError

    # ---- the role interface of the shared checks (see TierChecks) -------------------------
    _role_protocol = SecondaryTier
    _role_holds_stores = False
    _role_pending_words = PendingWorkWords(
        idle="an empty tier with no jobs says it has pending work",
        busy="has_pending_work is not True right after a job was submitted (not yet reported)",
        done="has_pending_work is still True after every job was reported",
    )

    def _role_store(
        self, kit: SecondaryDriver, keys: Sequence[OffloadKey], context: ReqContext | None = None
    ) -> bool:
        """A store job for ``context``'s request, waited for."""
        return kit.store(keys, _store_slots(kit, len(keys)), context=context).success

    def _role_start_store(self, kit: SecondaryDriver, keys: Sequence[OffloadKey]) -> Finish:
        """A store job submitted; finishing waits until it is reported."""
        job = kit.submit_store(keys, _store_slots(kit, len(keys)))

        def finish() -> None:
            kit.wait([job])

        return finish

    def _role_fail_store(self, kit: SecondaryDriver, keys: Sequence[OffloadKey]) -> set[OffloadKey]:
        """A store job made to fail through the fail_next_jobs hook; without the hook, none."""
        if not self.has_hook("fail_next_jobs"):
            return set()
        self.fail_next_jobs(kit.tier, 1)
        result = kit.store(keys)
        return set(keys) - result.succeeded_keys(kit.jobs[result.job_id])

    def _role_start_load(
        self, kit: SecondaryDriver, keys: Sequence[OffloadKey], context: ReqContext | None = None
    ) -> Finish:
        """A load job into the upper half of the buffer (stores use the lower); finishing waits for it."""
        job = kit.submit_load(keys, _load_slots(kit, len(keys)), context=context)

        def finish() -> None:
            kit.wait([job])

        return finish

    def _role_settle(self, kit: SecondaryDriver) -> None:
        """Two quiet steps, so late reports and duplicates show up."""
        kit.quiet_steps(2)

    def _role_check_shut_down(self, kit: SecondaryDriver, keys: Sequence[OffloadKey]) -> None:
        """Every job in flight at shutdown was reported, finished or failed, and no work is left."""
        jobs = [kit.jobs[job_id] for job_id in kit.pending()]
        deadline = time.monotonic() + kit.limits.job_timeout_s
        while any(j.job_id not in kit.results for j in jobs) and time.monotonic() < deadline:
            kit.collect()
            time.sleep(0.001)
        lost = [j.job_id for j in jobs if j.job_id not in kit.results]
        if lost:
            raise ConformanceFailure(
                "TIER-16", f"job(s) {lost} in flight at shutdown were never reported finished or failed"
            )
        if kit.tier.has_pending_work():
            raise ConformanceFailure("TIER-16", "has_pending_work is True after shutdown reported every job")

    def _role_check_forgotten(self, kit: SecondaryDriver, keys: Sequence[OffloadKey]) -> None:
        """A load of a forgotten block must fail."""
        result = kit.load(keys, _load_slots(kit, len(keys)))
        if set(keys) & result.succeeded_keys(kit.jobs[result.job_id]):
            raise ConformanceFailure("TIER-16", "a block loaded after reset_cache")

    # ---- protocol and answers ------------------------------------------------------------
    test_satisfies_secondary_protocol = TierChecks._satisfies_protocol

    @check("TIER-18")
    def test_capabilities_are_consistent(self, tier: SecondaryTier) -> None:
        """Declared capabilities make sense: async lookups bound their RETRYs; reasons name real abilities."""
        caps = self.declared_capabilities(tier)
        if caps.async_lookup and caps.max_retry_steps < 1:
            raise ConformanceFailure(
                "TIER-18", "async_lookup is declared with max_retry_steps < 1: RETRY must resolve within a bound"
            )
        known = {"async_lookup", "max_retry_steps", "persistence", "eviction", "sharing", "partial_jobs"}
        unknown = sorted(set(caps.reasons) - known)
        if unknown:
            raise ConformanceFailure("TIER-18", f"capability reasons name unknown abilities: {unknown}")

    @check("LR-3")
    def test_never_answers_hit_pending(self, kit: SecondaryDriver) -> None:
        """No lookup answers HIT_PENDING: not while a store or load is in flight, not after."""
        keys = key_pool("lr3", 3)
        job = kit.submit_store(keys)
        while job.job_id not in kit.results:
            for key in keys:
                kit.lookup(key)
            kit.wait_step([job])
        kit.resolve(keys)
        load = kit.submit_load(keys, [10, 11, 12])
        while load.job_id not in kit.results:
            for key in keys:
                kit.lookup(key)
            kit.wait_step([load])
        kit.resolve(keys)

    @check("TIER-4")
    def test_empty_tier_misses(self, kit: SecondaryDriver) -> None:
        """An empty tier answers MISS (after any RETRYs) for every key."""
        answers = kit.resolve(key_pool("empty", 8))
        kit.expect(answers, lr.MISS, "TIER-4", "on an empty tier")

    @check("TIER-18")
    def test_retry_resolves_within_declared_steps(self, kit: SecondaryDriver) -> None:
        """RETRY only with async_lookup declared, and it resolves within max_retry_steps steps."""
        keys = key_pool("t18", 6)
        kit.resolve(keys)
        result = kit.store(keys[:3])
        done = result.succeeded_keys(kit.jobs[result.job_id])
        answers = kit.resolve(keys)
        kit.expect({k: answers[k] for k in keys[:3] if k in done}, lr.HIT, "TIER-10", "after its store succeeded")
        other = TrackedContext("kvproto-kit-second-request")
        kit.resolve(keys, other)
        kit.tier.on_request_finished(other)

    # ---- stores ---------------------------------------------------------------------------
    @check("TIER-10")
    def test_hit_after_successful_store(self, kit: SecondaryDriver) -> None:
        """A key whose store job reported success answers HIT (no lost write)."""
        keys = key_pool("stored", 6)
        first = kit.store(keys[:4], [0, 1, 2, 3])
        second = kit.store(keys[4:], [4, 5])
        for result, batch in ((first, keys[:4]), (second, keys[4:])):
            if not result.success:
                raise ConformanceFailure(
                    "TIER-10", f"a store of {len(batch)} blocks into an empty tier failed: {result}"
                )
        answers = kit.resolve(keys)
        lost = [key for key, answer in answers.items() if answer is not lr.HIT]
        if lost:
            raise ConformanceFailure(
                "TIER-10",
                f"store job reported success but key {short_key(lost[0])} answers "
                f"{answers[lost[0]].name}: the write was lost ({len(lost)} of {len(keys)} keys)",
            )

    @check("TIER-4")
    def test_no_hit_before_store_finished(self, kit: SecondaryDriver) -> None:
        """While a store job is in flight, a HIT for its keys must already be readable,
        and must not belong to a store that then fails."""
        keys = key_pool("early", 4)
        inject = self.has_hook("fail_next_jobs")
        if inject:
            self.fail_next_jobs(kit.tier, 1)
        job = kit.submit_store(keys, [0, 1, 2, 3])
        seen: set[OffloadKey] = set()
        spare = iter(range(8, kit.num_slots))
        while job.job_id not in kit.results:
            for key in keys:
                match kit.lookup(key):
                    case lr.HIT:
                        seen.add(key)
                        if not inject and job.job_id not in kit.results:
                            _load_right_after_hit(kit, key, next(spare), when=" while its store was in flight")
                    case lr.MISS | lr.RETRY | lr.HIT_PENDING:
                        pass
                    case _ as other:
                        unreachable(other, where="test_no_hit_before_store_finished")
            kit.wait_step([job])
        result = kit.results[job.job_id]
        failed = seen - result.succeeded_keys(job)
        if failed:
            raise ConformanceFailure(
                "TIER-4",
                f"lookup({short_key(next(iter(failed)))}) answered HIT while its store job was in "
                "flight, and the job then failed: a HIT came before the store finished",
            )

    @check("TIER-4", hooks=("fail_next_jobs",))
    def test_no_hit_after_failed_store(self, kit: SecondaryDriver) -> None:
        """After a store job fails, its keys answer MISS; a later store of them works."""
        keys = key_pool("failed", 4)
        self.fail_next_jobs(kit.tier, 1)
        result = kit.store(keys)
        if result.success:
            raise ConformanceFailure("KIT-5", "the fail_next_jobs hook had no effect: the store succeeded")
        done = result.succeeded_keys(kit.jobs[result.job_id])
        answers = kit.resolve(keys)
        for key in keys:
            if key not in done and answers[key] is lr.HIT:
                raise ConformanceFailure(
                    "TIER-4", f"lookup({short_key(key)}) answers HIT after its store job failed"
                )
        retry = kit.store(keys)
        if not retry.success:
            if kit.store(keys).success:
                raise ConformanceFailure(
                    "KIT-5", "fail_next_jobs(1) failed more than one job: the store after the failed one failed too"
                )
            raise ConformanceFailure("TIER-10", f"storing the keys again after a failed store failed: {retry}")
        kit.expect(kit.resolve(keys), lr.HIT, "TIER-10", "after a successful store that followed a failed one")

    @check("TIER-11", needs=("partial_jobs",), hooks=("fail_keys",))
    def test_partial_job_reports_succeeded_keys(self, kit: SecondaryDriver) -> None:
        """A job that fails some keys names only keys it stored in ``succeeded``; those answer HIT, the
        failed ones do not. Stopping at the first bad block (the keys after it fail untried) is allowed."""
        keys = key_pool("partial", 4)
        failing = {keys[1], keys[3]}
        self.fail_keys(kit.tier, sorted(failing))
        result = kit.store(keys)
        done = result.succeeded_keys(kit.jobs[result.job_id])
        answers = kit.resolve(keys)
        for key in keys:
            if key in done and answers[key] is not lr.HIT:
                raise ConformanceFailure(
                    "TIER-11",
                    f"a store job named key {short_key(key)} succeeded, but it answers {answers[key].name}: "
                    "a result must name only keys that were stored",
                )
            if key not in done and answers[key] is lr.HIT:
                raise ConformanceFailure(
                    "TIER-4", f"lookup({short_key(key)}) answers HIT although its store job reported it failed"
                )
        if done & failing:
            raise ConformanceFailure(
                "KIT-5", "the fail_keys hook had no effect: the keys it names were stored and answer HIT"
            )
        other = key_pool("partial-other", 2)
        after = kit.store(other)
        if not after.success:
            raise ConformanceFailure(
                "KIT-5",
                "the fail_keys hook had more effect than asked: a store of keys it does not name failed",
            )

    @check("KIT-5", hooks=("fail_next_jobs",))
    def test_fail_next_jobs_hook_fails_exactly_n_jobs(self, kit: SecondaryDriver) -> None:
        """``fail_next_jobs(n)`` SETS the count: exactly the next n jobs fail whole, later ones run;
        a hook with too little or too much effect fails KIT-5."""
        keys = key_pool("hook-n", 6)
        self.fail_next_jobs(kit.tier, 1)
        self.fail_next_jobs(kit.tier, 2)  # sets the count to two; it does not add
        outcome = [kit.store(keys[i : i + 1], _store_slots(kit, 1)).success for i in range(4)]
        if outcome != [False, False, True, True]:
            failed = outcome.count(False)
            how = "too little" if failed < 2 or outcome[:2] != [False, False] else "too much"
            raise ConformanceFailure(
                "KIT-5",
                f"fail_next_jobs(1) then fail_next_jobs(2) must fail exactly the next 2 jobs (the count is set, "
                f"not added); the next 4 stores {'succeeded' if outcome[0] else 'failed'}"
                f"{''.join(', ' + ('succeeded' if ok else 'failed') for ok in outcome[1:])}: "
                f"the hook has {how} effect",
            )
        self.fail_next_jobs(kit.tier, 1)
        self.fail_next_jobs(kit.tier, 0)  # disarms
        if not kit.store(keys[4:], _store_slots(kit, 2)).success:
            raise ConformanceFailure("KIT-5", "fail_next_jobs(0) did not disarm the hook: the next store failed")

    @check("TIER-10", hooks=("read_block",))
    def test_store_writes_exact_bytes(self, kit: SecondaryDriver) -> None:
        """The storage holds exactly the bytes of each stored slot; nothing for other keys."""
        keys = key_pool("exact", 4)
        kit.store(keys, [3, 7, 1, 9])
        for key in keys:
            got = self.read_block(kit.tier, key)
            if got is None or bytes(got) != block_for(key, kit.block_bytes):
                raise ConformanceFailure(
                    "TIER-10", f"the storage does not hold the stored bytes of key {short_key(key)}"
                )
        stray = key_pool("exact-unstored", 1)[0]
        if self.read_block(kit.tier, stray) is not None:
            raise ConformanceFailure("TIER-10", "the storage holds bytes for a key never stored")

    @check("TIER-10")
    def test_duplicate_store_is_idempotent(self, kit: SecondaryDriver) -> None:
        """Storing a key again, one after the other or in two jobs at once, keeps it HIT with its bytes."""
        keys = key_pool("dup", 3)
        kit.store(keys, [0, 1, 2])
        again = kit.store(keys, [3, 4, 5])
        if not again.success:
            raise ConformanceFailure("TIER-10", f"storing stored keys again failed: {again}")
        a = kit.submit_store(keys[:2], [6, 7])
        b = kit.submit_store(keys[:2], [8, 9])
        kit.wait([a, b])
        kit.expect(kit.resolve(keys), lr.HIT, "TIER-10", "after duplicate stores")
        kit.load(keys, [20, 21, 22])
        if self.has_hook("read_block"):
            for key in keys:
                if self.read_block(kit.tier, key) != block_for(key, kit.block_bytes):
                    raise ConformanceFailure("TIER-10", f"duplicate stores changed the bytes of {short_key(key)}")

    @check("TIER-10")
    def test_concurrent_jobs_on_distinct_keys_do_not_interfere(self, kit: SecondaryDriver) -> None:
        """Several store jobs, then several load jobs, in flight at once each move their own bytes."""
        keys = key_pool("concurrent", 12)
        stores = [kit.submit_store(keys[i : i + 3], range(i, i + 3)) for i in range(0, 12, 3)]
        results = kit.wait(stores)
        for result in results.values():
            if not result.success:
                raise ConformanceFailure("TIER-10", f"concurrent store job failed: {result}")
        kit.expect(kit.resolve(keys), lr.HIT, "TIER-10", "after concurrent stores")
        loads = [kit.submit_load(keys[i : i + 3][::-1], range(16 + i, 19 + i)) for i in range(0, 12, 3)]
        for result in kit.wait(loads).values():
            if not result.success:
                raise ConformanceFailure("TIER-10", f"concurrent load job of stored keys failed: {result}")

    @check("TIER-10")
    def test_keys_isolated_by_hash_and_group(self, kit: SecondaryDriver) -> None:
        """Keys that differ only in hash or only in group never see each other's blocks.

        Each batch is checked right after its store, so a tier that declares eviction and keeps few
        blocks passes: with ``eviction`` a stored key may answer MISS, never HIT for another's."""
        keys = tricky_keys()
        stored = [k for i, k in enumerate(keys) if i % 2 == 0]
        absent = [k for i, k in enumerate(keys) if i % 2 == 1]
        evicts = self.declared_capabilities(kit.tier).eviction
        for i in range(0, len(stored), 8):
            batch = stored[i : i + 8]
            result = kit.store(batch, range(len(batch)))
            if not result.success:
                raise ConformanceFailure("TIER-10", f"store of keys {[short_key(k) for k in batch]} failed")
            answers = kit.resolve(batch)
            held = [k for k in batch if answers[k] is lr.HIT]
            if not evicts:
                kit.expect(answers, lr.HIT, "TIER-10", "after its store succeeded")
            if held:
                result = kit.load(held, range(16, 16 + len(held)))
                if not result.success:
                    raise ConformanceFailure("TIER-10", f"load of stored keys failed: {result}")
        answers = kit.resolve(keys)
        for key in absent:
            if answers[key] is not lr.MISS:
                raise ConformanceFailure(
                    "TIER-10",
                    f"key {short_key(key)} was never stored but answers {answers[key].name}: "
                    "it collides with a key that differs only in hash or group",
                )
        if not evicts:
            kit.expect({k: answers[k] for k in stored}, lr.HIT, "TIER-10", "after its store succeeded")

    # ---- loads ----------------------------------------------------------------------------
    @check("TIER-10")
    def test_load_copies_stored_bytes_into_requested_slots(self, kit: SecondaryDriver) -> None:
        """A load writes exactly each key's stored bytes into exactly its slot, and no other slot."""
        keys = key_pool("load", 4)
        kit.store(keys, [0, 1, 2, 3])
        for slot in range(4):
            kit.clear_slot(slot)
        first = kit.load(keys[::-1], [11, 9, 13, 8])
        second = kit.load([keys[2], keys[0]], [20, 5])
        for result in (first, second):
            if not result.success:
                raise ConformanceFailure("TIER-10", f"load of stored keys failed: {result}")

    @check("TIER-10")
    def test_load_of_missing_key_fails(self, kit: SecondaryDriver) -> None:
        """A load job naming a key never stored does not report that key done."""
        stored, missing = key_pool("missing", 2)
        kit.store([stored], [0])
        result = kit.load([stored, missing], [4, 5])
        job = kit.jobs[result.job_id]
        if missing in result.succeeded_keys(job):
            raise ConformanceFailure(
                "TIER-10", f"a load job reported key {short_key(missing)} done although it was never stored"
            )

    @check("TIER-10", hooks=("seed_block",))
    def test_load_of_seeded_block(self, kit: SecondaryDriver) -> None:
        """A block put into storage through the backdoor answers HIT and loads its bytes."""
        keys = key_pool("seeded", 3)
        for key in keys:
            self.seed_block(kit.tier, key, block_for(key, kit.block_bytes))
        kit.expect(kit.resolve(keys), lr.HIT, "TIER-10", "for a seeded block")
        result = kit.load(keys, [5, 2, 30])
        if not result.success:
            raise ConformanceFailure("TIER-10", f"load of seeded blocks failed: {result}")

    @check("TIER-10", hooks=("corrupt_on_read",))
    def test_corrupt_block_fails_load(self, kit: SecondaryDriver) -> None:
        """A damaged block fails its load wherever it sits in a multi-block job; the tier never hands
        out wrong bytes, and a block found damaged stops answering HIT."""
        keys = key_pool("corrupt", 4)
        for position in range(len(keys)):
            kit.store(keys, [0, 1, 2, 3])
            self.corrupt_on_read(kit.tier, keys[position : position + 1])
            order = keys[position:] + keys[:position] if position % 2 else keys[::-1]
            result = kit.load(order, [10, 11, 12, 13])
            damaged = keys[position]
            if damaged in result.succeeded_keys(kit.jobs[result.job_id]):
                raise ConformanceFailure(
                    "TIER-10", f"a load reported a damaged block done (block {order.index(damaged) + 1} of 4)"
                )
            if kit.resolve_one(damaged) is lr.HIT:
                # A tier may repair the block (from a replica); if it answers HIT, it must load.
                _load_right_after_hit(kit, damaged, 14, when=" after its block failed a load as damaged")

    @check("TIER-4")
    def test_hit_is_loadable_under_racing_stores(self, kit: SecondaryDriver, request: pytest.FixtureRequest) -> None:
        """A HIT stays loadable: a load submitted right after it succeeds, and one submitted
        after racing stores (that may evict) never returns other bytes."""
        rounds = self.profile(request).race_rounds
        rng = random.Random(20240611)
        pool = key_pool("race", max(8, rounds * 2))
        stored: list[OffloadKey] = []
        slots = kit.num_slots
        cursor = 0
        for i in range(rounds):
            fresh = pool[2 * i : 2 * i + 2]
            base = (4 * i) % (slots - 4)
            kit.submit_store(fresh, [base, base + 1])
            if stored:
                key = rng.choice(stored)
                target = slots - 1 - (cursor % 4)
                cursor += 1
                match kit.lookup(key):
                    case lr.HIT:
                        _load_right_after_hit(kit, key, target)
                    case lr.MISS | lr.RETRY | lr.HIT_PENDING:
                        pass
                    case _ as other:
                        unreachable(other, where="test_hit_is_loadable_under_racing_stores")
                racing = kit.submit_store(pool[2 * i + 1 : 2 * i + 2], [base + 2])
                match kit.lookup(key):
                    case lr.HIT:
                        kit.submit_store([pool[2 * i]], [base + 3])
                        kit.wait([kit.submit_load([key], [target])])
                    case lr.MISS | lr.RETRY | lr.HIT_PENDING:
                        pass
                    case _ as other:
                        unreachable(other, where="test_hit_is_loadable_under_racing_stores")
                kit.wait([racing])
            kit.settle()
            stored.extend(fresh)

    # ---- jobs -------------------------------------------------------------------------------
    @check("TIER-11")
    def test_each_job_reported_exactly_once(self, kit: SecondaryDriver) -> None:
        """Every submitted job, store or load, is reported finished exactly once."""
        keys = key_pool("once", 6)
        a = kit.submit_store(keys[:3], [0, 1, 2])
        b = kit.submit_store(keys[3:], [3, 4, 5])
        kit.wait([a, b])
        loads = [kit.submit_load(keys[:2], [10, 11]), kit.submit_load(keys[4:], [12, 13])]
        c = kit.submit_store(key_pool("once-more", 2), [6, 7])
        kit.wait([*loads, c])
        kit.quiet_steps()
        for job_id in kit.jobs:
            if job_id not in kit.results:
                raise ConformanceFailure("TIER-11", f"job {job_id} was never reported")

    test_has_pending_work_tracks_jobs = TierChecks._pending_work_tracks_stores
    test_has_pending_work_tracks_loads = TierChecks._pending_work_tracks_loads

    # ---- lifecycle ------------------------------------------------------------------------
    test_shutdown_reports_jobs_in_flight = TierChecks._shutdown_ends_work_in_flight

    @check("TIER-18", needs=("persistence",), hooks=("reopen",))
    def test_persistence_across_instances(self, kit: SecondaryDriver, primary_buffer: memoryview) -> None:
        """A new instance over the same storage sees the stored blocks with their bytes."""
        keys = key_pool("persist", 3)
        kit.store(keys)
        kit.quiet_steps(2)
        kit.shutdown()
        reopened = self.reopen(kit.tier, primary_buffer)
        other = SecondaryDriver(reopened, primary_buffer, kit.capabilities, kit.limits, first_job_id=9001)
        try:
            other.expect(other.resolve(keys), lr.HIT, "TIER-18", "in a new instance over the same storage")
            other.load(keys, [10, 11, 12])
        finally:
            other.shutdown()

    @check("TIER-18", needs=("sharing",), hooks=("reopen",))
    def test_sharing_between_instances(self, kit: SecondaryDriver) -> None:
        """Two live instances over the same storage see each other's stored blocks."""
        other_buffer = make_buffer(self.num_slots, self.block_bytes)
        other = SecondaryDriver(
            self.reopen(kit.tier, other_buffer), other_buffer, kit.capabilities, kit.limits, first_job_id=9501
        )
        try:
            keys = key_pool("share", 4)
            kit.store(keys[:2])
            other.expect(other.resolve(keys[:2]), lr.HIT, "TIER-18", "in a second live instance after the first stored it")
            other.load(keys[:2], [10, 11])
            other.store(keys[2:], [2, 3])
            kit.expect(kit.resolve(keys[2:]), lr.HIT, "TIER-18", "in the first instance after the second stored it")
            kit.load(keys[2:], [12, 13])
        finally:
            other.shutdown()

    # ---- slot lifetime, queued work, capacity, events, requests ------------------------
    @check("TIER-10")
    def test_store_reads_its_slots_before_it_is_reported(self, kit: SecondaryDriver) -> None:
        """A store job's slots stay unchanged only until the job is reported: the manager may reuse
        them at once, before the next on_step_end, so the stored bytes must be read by then."""
        keys = key_pool("lifetime", 3)
        reuse = key_pool("lifetime-next", 3)
        slots = [4, 5, 6]
        job = kit.submit_store(keys, slots)
        kit.collect()  # a job may be reported at once, before any end-of-step hook
        while job.job_id not in kit.results:
            kit.wait_step([job])
        for slot, other in zip(slots, reuse, strict=True):
            kit.put_block(slot, other)  # reused at once, before the next hook, as the manager may
        done = kit.results[job.job_id].succeeded_keys(job)
        for _ in range(3):
            kit.step()
        stored = [k for k in keys if k in done and kit.resolve_one(k) is lr.HIT]
        if not stored:
            return
        target = [20 + i for i in range(len(stored))]
        load = kit.submit_load(stored, target)
        try:
            kit.wait([load])
        except ConformanceFailure as failure:
            for key, slot in zip(stored, target, strict=True):
                index = keys.index(key)
                if kit.slot_bytes(slot) == block_for(reuse[index], kit.block_bytes):
                    raise ConformanceFailure(
                        "TIER-10",
                        f"the store of key {short_key(key)} read slot {slots[index]} after the job was "
                        "reported: the load returned what the slot was reused for (a store must have "
                        "read its slots by the time it is reported)",
                    ) from failure
            raise

    @check("TIER-13")
    def test_step_end_does_not_block(self, kit: SecondaryDriver) -> None:
        """on_step_end returns at once with work to hand over (jobs submitted in the step), step after step."""
        keys = key_pool("step-end", 24)
        jobs = []
        for i in range(0, 24, 2):
            jobs.append(kit.submit_store(keys[i : i + 2], [i, i + 1]))
            kit.step()
        kit.wait(jobs)
        loads = []
        for i in range(0, 12, 2):
            loads.append(kit.submit_load(keys[i : i + 2], [24 + i % 8, 25 + i % 8]))
            kit.step()
            kit.wait(loads[-1:])

    @check("TIER-16")
    def test_shutdown_reports_queued_work(self, kit: SecondaryDriver) -> None:
        """With more jobs submitted than a tier runs at once, shutdown reports each exactly once, by
        the time it returns; nothing is reported or written later, and every thread it started is joined."""
        before = set(threading.enumerate())
        keys = key_pool("queued", 24)
        kit.store(keys[:4], [0, 1, 2, 3])
        for i in range(4, 24, 2):
            kit.submit_store(keys[i : i + 2], [i, i + 1])
        for i in range(4):
            kit.submit_load(keys[i : i + 1], [28 + i])
        kit.shutdown()
        started = [t for t in threading.enumerate() if t not in before and t.is_alive()]
        reported = kit.collect()
        missing = kit.pending()
        if missing:
            raise ConformanceFailure(
                "TIER-16",
                f"{len(missing)} job(s) queued at shutdown were never reported finished or failed "
                f"(first: job {missing[0]}); shutdown must report every job, queued ones too",
            )
        snapshot = [kit.slot_bytes(s) for s in range(kit.num_slots)]
        time.sleep(0.02)
        late = kit.collect()
        if late:
            raise ConformanceFailure(
                "TIER-16", f"job {late[0].job_id} was reported after shutdown returned (its worker was not joined)"
            )
        if [kit.slot_bytes(s) for s in range(kit.num_slots)] != snapshot:
            raise ConformanceFailure("TIER-16", "a primary slot changed after shutdown returned")
        if started:
            raise ConformanceFailure(
                "TIER-16", f"thread {started[0].name!r}, started by the tier, is still running after shutdown returned"
            )
        del reported

    @check("TIER-16")
    def test_reset_with_queued_work(self, kit: SecondaryDriver) -> None:
        """reset_cache with many jobs queued refuses (False) or forgets; either way each job is
        reported exactly once, and once idle a reset forgets everything."""
        keys = key_pool("reset-queued", 20)
        kit.store(keys[:4], [0, 1, 2, 3])
        jobs = [kit.submit_store(keys[i : i + 2], [i, i + 1]) for i in range(4, 20, 2)]
        jobs.append(kit.submit_load(keys[:4], [24, 25, 26, 27]))
        answer: object = kit.tier.reset_cache()
        if answer is not True and answer is not False:
            raise ConformanceFailure("TIER-16", f"reset_cache answered {answer!r}, not a bool")
        kit.wait(jobs)
        kit.quiet_steps(2)
        if kit.tier.reset_cache() is not True:
            raise ConformanceFailure("TIER-16", "reset_cache with every job reported did not answer True")
        kit.expect(kit.resolve(keys), lr.MISS, "TIER-16", "after reset_cache")

    @check("TIER-10")
    def test_holds_what_it_stored_past_its_capacity(self, kit: SecondaryDriver) -> None:
        """Stores of 96 blocks: without ``eviction`` declared every one still answers HIT (a tier
        that drops blocks must declare it); with it, any may answer MISS, and each HIT loads its bytes."""
        keys = key_pool("capacity", 96)
        for i in range(0, len(keys), 16):
            result = kit.store(keys[i : i + 16], range(16))
            if not result.success and not self.declared_capabilities(kit.tier).eviction:
                raise ConformanceFailure("TIER-10", f"a store of 16 blocks failed after {i} were stored: {result}")
        answers = kit.resolve(keys)
        held = [k for k in keys if answers[k] is lr.HIT]
        lost = [k for k in keys if answers[k] is not lr.HIT]
        if lost and not self.declared_capabilities(kit.tier).eviction:
            raise ConformanceFailure(
                "TIER-10",
                f"{len(lost)} of {len(keys)} stored blocks answer MISS (first {short_key(lost[0])}, "
                f"after {len(held)} held): the tier drops blocks but does not declare eviction",
            )
        for i in range(0, len(held), 12):
            kit.load(held[i : i + 12], range(16, 16 + len(held[i : i + 12])))

    @check("TIER-14")
    def test_events_report_removals(self, kit: SecondaryDriver) -> None:
        """reset_cache (and, with eviction, an eviction) emits REMOVED for the blocks it drops; no
        event names a key the tier never held; STORED names only keys whose store succeeded."""
        tier = kit.tier
        list(tier.take_events())
        keys = key_pool("removed", 4)
        kit.store(keys, [0, 1, 2, 3])
        kit.quiet_steps(2)
        stored_events = list(tier.take_events())
        named = {k for e in stored_events for k in e.keys}
        stray = named - set(keys)
        if stray:
            raise ConformanceFailure("TIER-14", f"an event names {short_key(next(iter(stray)))}, which was never stored")
        if tier.reset_cache() is not True:
            raise ConformanceFailure("TIER-16", "reset_cache with no work in flight did not answer True")
        events = list(tier.take_events())
        removed = {k for e in events if e.kind is EventKind.REMOVED for k in e.keys}
        if not set(keys) <= removed:
            missing = sorted(set(keys) - removed)
            raise ConformanceFailure(
                "TIER-14",
                f"reset_cache dropped {len(keys)} stored blocks but no REMOVED event names {short_key(missing[0])}",
            )
        stray = {k for e in events for k in e.keys} - set(keys)
        if stray:
            raise ConformanceFailure("TIER-14", f"an event names {short_key(next(iter(stray)))}, which was never stored")
        if self.declared_capabilities(tier).eviction:
            many = key_pool("removed-evict", 96)
            for i in range(0, len(many), 16):
                kit.store(many[i : i + 16], range(16))
            kit.quiet_steps(2)
            answers = kit.resolve(many)
            gone = {k for k in many if answers[k] is lr.MISS}
            removed = {k for e in tier.take_events() if e.kind is EventKind.REMOVED for k in e.keys}
            if gone - removed:
                raise ConformanceFailure(
                    "TIER-14",
                    f"{len(gone - removed)} stored blocks were evicted (they answer MISS) without a REMOVED event",
                )

    @check("TIER-5")
    def test_touch_of_unknown_keys_is_a_no_op(self, kit: SecondaryDriver) -> None:
        """touch of keys the tier does not hold changes nothing: they still answer MISS, stored keys HIT."""
        keys = key_pool("touch", 4)
        unknown = key_pool("touch-unknown", 4)
        kit.store(keys[:2], [0, 1])
        list(kit.tier.take_events())
        kit.tier.touch([*unknown, keys[0]])
        kit.tier.touch(unknown[:1])
        kit.quiet_steps(1)
        answers = kit.resolve([*keys, *unknown])
        for key in [*keys[2:], *unknown]:
            if answers[key] is not lr.MISS:
                raise ConformanceFailure(
                    "TIER-5", f"touch of key {short_key(key)}, which the tier does not hold, made it answer {answers[key].name}"
                )
        if any(set(e.keys) & set(unknown) for e in kit.tier.take_events()):
            raise ConformanceFailure("TIER-5", "touch of keys the tier does not hold produced an event naming them")
        kit.expect({k: answers[k] for k in keys[:2]}, lr.HIT, "TIER-5", "after touch (stored keys stay)")

    # ---- Hypothesis --------------------------------------------------------------------
    @check("TIER-10", hypothesis=True)
    def test_state_machine_against_model(
        self, tier_factory: SecondaryTierFactory, request: pytest.FixtureRequest
    ) -> None:
        """Random interleavings of stores, loads, lookups, steps and resets agree with a dict model."""
        from kvproto.testing._machines import run_machine

        run_machine(self, tier_factory, self.profile(request), request, differential=False)

    @check("TIER-10", hypothesis=True)
    def test_differential_against_memory_tier(
        self, tier_factory: SecondaryTierFactory, request: pytest.FixtureRequest
    ) -> None:
        """The same operations on the tier and on MemoryTier leave the same blocks readable."""
        from kvproto.testing._machines import run_machine

        run_machine(self, tier_factory, self.profile(request), request, differential=True)


SecondaryTierTests._kit_base = SecondaryTierTests
