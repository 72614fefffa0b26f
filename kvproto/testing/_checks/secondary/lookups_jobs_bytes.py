"""The secondary tier's checks of answers, stores and loads (TIER-4, TIER-10, TIER-11, TIER-18,
LR-3): :class:`SecondaryDataChecks`, a base of :class:`~kvproto.testing.SecondaryTierTests`.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import fields

import pytest

from kvproto import members as lr
from kvproto._capabilities import Capabilities
from kvproto._keys import OffloadKey
from kvproto._protocols import SecondaryTier
from kvproto._results import unreachable
from kvproto._tiering._records import job_time_bound
from kvproto.errors import ConfigurationError
from kvproto.testing._checks.secondary.role import SecondaryRole, load_right_after_hit, load_slots, store_slots
from kvproto.testing._harness.data import block_for, key_pool, tricky_keys
from kvproto.testing._harness.decorator import check
from kvproto.testing._harness.driver import TrackedContext, short_key
from kvproto.testing._harness.failures import ConformanceFailure
from kvproto.testing._harness.secondary_driver import SecondaryDriver

__all__ = ["SecondaryDataChecks"]


class SecondaryDataChecks(SecondaryRole):
    """The checks of lookups' answers, stores and loads, in the kit's order (see ``SecondaryTierTests``)."""

    # ---- protocol and answers ------------------------------------------------------------
    @check("TIER-1")
    def test_satisfies_secondary_protocol(self, tier: SecondaryTier) -> None:
        """The tier has every member of its protocol (PrimaryTier or SecondaryTier) and a non-empty str name."""
        self._satisfies_protocol(tier)

    @check("TIER-18")
    def test_capabilities_are_consistent(self, tier: SecondaryTier) -> None:
        """Declared capabilities make sense: async lookups bound their RETRYs; reasons name real abilities;
        a declared ``job_time_bound_s`` is None or a finite number > 0, as the manager reads it (MGR-17)."""
        caps = self.declared_capabilities(tier)
        if caps.async_lookup and caps.max_retry_steps < 1:
            raise ConformanceFailure(
                "TIER-18", "async_lookup is declared with max_retry_steps < 1: RETRY must resolve within a bound"
            )
        known = {f.name for f in fields(Capabilities)} - {"reasons"}  # every ability, max_hold_steps included
        unknown = sorted(set(caps.reasons) - known)
        if unknown:
            raise ConformanceFailure("TIER-18", f"capability reasons name unknown abilities: {unknown}")
        try:
            job_time_bound(tier)  # what TieringManager reads at construction; a property that raises is the tier's
        except ConfigurationError as error:
            raise ConformanceFailure("MGR-17", f"{error}: TieringManager refuses to build over this tier") from None

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
            self.arm_fail_next_jobs(kit, 1)
        job = kit.submit_store(keys, [0, 1, 2, 3])
        seen: set[OffloadKey] = set()
        spare = itertools.cycle(range(8, kit.num_slots))  # each load is waited for: its slot is free again
        while job.job_id not in kit.results:
            for key in keys:
                match kit.lookup(key):
                    case lr.HIT:
                        seen.add(key)
                        if not inject and job.job_id not in kit.results:
                            load_right_after_hit(kit, key, next(spare), when=" while its store was in flight")
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
        self.arm_fail_next_jobs(kit, 1)
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
        kit.store(key_pool("partial-control", 1))  # set-up: a store with no fault must go through (KIT-17)
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
        kit.store(key_pool("hook-n-control", 1))  # set-up: a store with no fault must go through (KIT-17)
        self.fail_next_jobs(kit.tier, 1)
        self.fail_next_jobs(kit.tier, 2)  # sets the count to two; it does not add
        outcome = [kit.store(keys[i : i + 1], store_slots(kit, 1)).success for i in range(4)]
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
        if not kit.store(keys[4:], store_slots(kit, 2)).success:
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
        """Several store jobs, then several load jobs, in flight at once each move their own bytes.

        With eviction declared a stored key may answer MISS (a budget may hold fewer than the 12 blocks);
        the keys that answer HIT are loaded, in jobs in flight at once, and must move their own bytes."""
        keys = key_pool("concurrent", 12)
        stores = [kit.submit_store(keys[i : i + 3], range(i, i + 3)) for i in range(0, 12, 3)]
        results = kit.wait(stores)
        for result in results.values():
            if not result.success:
                raise ConformanceFailure("TIER-10", f"concurrent store job failed: {result}")
        answers = kit.resolve(keys)
        if not self.declared_capabilities(kit.tier).eviction:
            kit.expect(answers, lr.HIT, "TIER-10", "after concurrent stores")
        held = [k for k in keys if answers[k] is lr.HIT]
        loads = [kit.submit_load(held[i : i + 3][::-1], range(16 + i, 16 + i + len(held[i : i + 3])))
                 for i in range(0, len(held), 3)]
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

    @check("TIER-16")
    def test_a_key_stored_again_after_a_reset_loads_its_new_bytes(self, kit: SecondaryDriver) -> None:
        """Keys stored and loaded twice (whatever cache of reads the tier keeps holds them), ``reset_cache``, then
        the same keys stored again with other bytes (a weight update: the same tokens, other KV): each one
        that answers HIT loads its new bytes, never those from before the reset (a cache, an index entry or a
        handle the reset left behind). Without eviction declared every one answers HIT."""
        keys = key_pool("reset-new-bytes", 8)
        first = kit.store(keys, store_slots(kit, len(keys)))
        if not first.success:
            raise ConformanceFailure("TIER-10", f"storing {len(keys)} keys on an idle tier failed: {first}")
        for _ in range(2):
            loaded = kit.load(keys, load_slots(kit, len(keys)))
            if not loaded.success and not kit.capabilities.eviction:
                raise ConformanceFailure("TIER-10", f"a load of {len(keys)} keys just stored failed: {loaded}")
        kit.settle()
        if kit.tier.reset_cache() is not True:  # test_reset_with_queued_work judges a refusal with nothing in flight
            pytest.skip("not checked: reset_cache answered False with every job reported (an engine's tier with no reset)")
        kit.expect(kit.resolve(keys), lr.MISS, "TIER-16", "after reset_cache")
        kit.new_era(keys)
        again = kit.store(keys, store_slots(kit, len(keys)))
        if not again.success:
            raise ConformanceFailure("TIER-16", f"storing keys again after reset_cache failed: {again}")
        answers = kit.resolve(keys)
        if not kit.capabilities.eviction:
            kit.expect(answers, lr.HIT, "TIER-10", "stored again after reset_cache")
        hits = [key for key in keys if answers[key] is lr.HIT]
        if not hits:
            pytest.skip("vacuous: no key stored again after the reset answered HIT (its eviction is declared)")
        try:
            result = kit.load(hits, load_slots(kit, len(hits)))
        except ConformanceFailure as failure:
            if failure.clause == "TIER-10" and "before a reset_cache" in failure.detail:
                raise ConformanceFailure("TIER-16", f"{failure.detail}: reset_cache must forget every stored "
                                         "block, its bytes included") from failure
            raise
        if not result.success and not kit.capabilities.eviction:
            raise ConformanceFailure("TIER-4", f"keys stored again after reset_cache answered HIT, then their load "
                                     f"failed: {result}")

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
                # The driver checked its bytes as the load finished (wrong bytes fail TIER-10 there):
                # the right bytes came back, so the hook damaged nothing the tier read (KIT-5).
                raise ConformanceFailure(
                    "KIT-5",
                    f"the corrupt_on_read hook had no effect: block {order.index(damaged) + 1} of 4, which it "
                    "damaged, loaded with its right bytes",
                )
            if kit.resolve_one(damaged) is lr.HIT:
                # A tier may repair the block (from a replica); if it answers HIT, it must load.
                load_right_after_hit(kit, damaged, 14, when=" after its block failed a load as damaged")

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
            landing = kit.submit_store(fresh, [base, base + 1])
            if stored:
                key = rng.choice(stored)
                target = slots - 1 - (cursor % 4)
                cursor += 1
                if kit.capabilities.eviction:  # it may make room as a store lands (TIER-4): the HIT is asked after
                    kit.wait([landing])  # that, so the load right after it has nothing landing in between: the same
                    kit.quiet_steps(1)  # verdict whichever would have landed first
                match kit.lookup(key):
                    case lr.HIT:
                        load_right_after_hit(kit, key, target)
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

