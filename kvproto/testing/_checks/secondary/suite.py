"""``SecondaryTierTests``: the conformance checks for a secondary tier (TIER-*, LR-*, KIT-*).

The checks both kinds of tier share live in :mod:`kvproto.testing._checks.shared`; this
module says what their steps mean for a secondary tier and adds the secondary's own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Final

import pytest

from kvproto import LookupResult, OffloadKey, members as lr
from kvproto._events import EventKind, OffloadingEvent
from kvproto._results import unreachable
from kvproto.testing._checks.secondary.budgets import SecondaryBudgetChecks
from kvproto.testing._checks.secondary.crash import SecondaryCrashChecks
from kvproto.testing._checks.secondary.faults_below import SecondaryFaultsBelowChecks
from kvproto.testing._checks.secondary.faults_inside import SecondaryFaultsInsideChecks
from kvproto.testing._checks.secondary.held_calls import SecondaryHeldCallChecks
from kvproto.testing._checks.secondary.held_hits import HeldHitsChecks
from kvproto.testing._checks.secondary.lookups_jobs_bytes import SecondaryDataChecks
from kvproto.testing._checks.secondary.namespaces import SecondaryNamespaceChecks
from kvproto.testing._checks.secondary.request_plans import SecondaryRequestChecks
from kvproto.testing._checks.secondary.role import SecondaryTierFactory, load_exact, store_slots
from kvproto.testing._checks.secondary.sharing import SecondarySharingChecks
from kvproto.testing._checks.secondary.threads_and_order import SecondaryClassChecks
from kvproto.testing._harness.data import block_for, key_pool, make_buffer
from kvproto.testing._harness.decorator import check
from kvproto.testing._harness.driver import TrackedContext, short_key
from kvproto.testing._harness.failures import ConformanceFailure
from kvproto.testing._harness.secondary_driver import SecondaryDriver
from kvproto.testing._harness.thread_ledger import ThreadLedger

__all__ = ["PERSIST_MANY", "SecondaryTierFactory", "SecondaryTierTests"]

PERSIST_MANY: Final = 300
"""Blocks ``test_persistence_of_many_blocks`` stores before it reopens: more than a restart scan or a
listing takes in its first batch or page (BlobTier's restart scan indexes 256 at a time)."""


OVERSIZED_JOB: Final = 128
"""The blocks of :meth:`SecondaryTierTests.test_a_job_larger_than_the_tier_keeps_its_events_in_order`'s one
store job: more than the kit's 48-block budgets hold, and 4 times its primary buffer's rows."""


class SecondaryTierTests(
    SecondaryNamespaceChecks,
    SecondaryClassChecks,
    SecondaryFaultsBelowChecks,
    SecondaryFaultsInsideChecks,
    SecondaryCrashChecks,
    SecondarySharingChecks,
    SecondaryDataChecks,
    HeldHitsChecks,
    SecondaryHeldCallChecks,
    SecondaryBudgetChecks,
    SecondaryRequestChecks,
):
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
    * ``reopen(tier, buffer) -> tier``: a new instance over the same storage (persistence);
    * ``short_io(tier, max_bytes)``, ``fail_io(tier, n)``: short transfers and I/O errors inside the
      tier's own storage code (TIER-30, TIER-31);
    * ``refuse_direct(tier, after) -> int``, ``lose_directories(tier, n) -> int``: the storage refuses
      the tier's direct I/O (EINVAL) after ``after`` more direct-I/O calls, or has just removed the
      directory of the next ``n`` blocks put at their names (ENOENT); each returns how many calls it
      hit since its previous call (TIER-35, TIER-36); ``refuse_links(tier, on) -> int``: the storage
      refuses hard links (EPERM) while ``on``, returning how many it refused (TIER-35);
    * ``plant_leftovers(tier)``: leave crashed writers' and an interrupted reset's leftovers in the
      storage, one the tier cannot remove and one removed while the next instance lists it (TIER-18);
      ``leftovers(tier) -> int``: how many of those the start-up promises to remove are still there (KIT-22; kvproto-fs: FS-14).
    * ``storage_requests(tier)``, ``grow_storage(tier, objects)``, ``request_plan(tier, n)``: the
      requests the tier makes and its declared plan for existence batches (TIER-33).
    * ``storage_names(tier)``, ``namespace_of(tier)``: every name in the storage instances share, and
      the prefix every name the tier writes lies under (TIER-37).
    * ``reopen_with_layout(tier, buffer, layout) -> tier | None``: a new instance over the same storage
      for the model layout the kit gives (TIER-22: layouts that differ only slightly keep apart).

    A hook with less effect than it says (nothing failed) or more (other jobs or keys failed too)
    fails KIT-5, never the tier's clauses.
    """


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

    @check("TIER-15")
    def test_has_pending_work_tracks_jobs(self, kit: SecondaryDriver) -> None:
        """has_pending_work is True while a store is in flight (prepared, or submitted and unreported), else False."""
        self._pending_work_tracks_stores(kit)

    @check("TIER-15")
    def test_has_pending_work_tracks_loads(self, kit: SecondaryDriver) -> None:
        """has_pending_work is True while a load is in flight (pinned, or submitted and unreported),
        and False once it finished."""
        self._pending_work_tracks_loads(kit)

    # ---- lifecycle ------------------------------------------------------------------------
    @check("TIER-16")
    def test_shutdown_reports_jobs_in_flight(self, kit: SecondaryDriver) -> None:
        """shutdown ends every store in flight: a primary fails it (MISS), a secondary reports it; nothing is lost."""
        self._shutdown_ends_work_in_flight(kit)

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
            other.wait_started()  # asked once started, not while its start-up races the clock (KIT-19)
            other.expect(other.resolve(keys), lr.HIT, "TIER-18", "in a new instance over the same storage")
            other.load(keys, [10, 11, 12])
        finally:
            other.shutdown()

    @check("TIER-18", needs=("persistence",), hooks=("reopen",))
    def test_blocks_stored_after_a_reset_outlive_a_restart(self, kit: SecondaryDriver, primary_buffer: memoryview) -> None:
        """Three keys stored, ``reset_cache``, then those keys stored again with other bytes (a weight update)
        and one more: a new instance over the same storage sees each of them (but those the first instance
        reported REMOVED) and loads its new bytes (held-out round 10: a pack-file tier whose start-up scan
        applied its reset markers and tombstones after the members written since, not in file order, so a
        restart lost every block stored after a reset)."""
        keys = key_pool("reset-restart", 4)
        if not kit.store(keys[:3], store_slots(kit, 3)).success:
            raise ConformanceFailure("TIER-10", "storing 3 keys on an idle tier failed")
        kit.settle()
        if kit.tier.reset_cache() is not True:  # test_reset_with_queued_work judges a refusal with nothing in flight
            pytest.skip("not checked: reset_cache answered False with every job reported (an engine's tier with no reset)")
        kit.tier.take_events()  # the reset's REMOVED events: what counts is what the store after it reports
        kit.new_era(keys[:3])
        again = kit.store(keys, store_slots(kit, len(keys)))
        done = again.succeeded_keys(kit.jobs[again.job_id])
        if not done:
            raise ConformanceFailure("TIER-16", f"storing {len(keys)} keys after reset_cache failed: {again}")
        kit.quiet_steps(2)
        removed = {k for e in kit.tier.take_events() if e.kind is EventKind.REMOVED for k in e.keys}
        kept = [k for k in keys if k in done and k not in removed]
        kit.shutdown()
        other = SecondaryDriver(self.reopen(kit.tier, primary_buffer), primary_buffer, kit.capabilities, kit.limits,
                                first_job_id=9051)
        other.new_era(keys[:3])
        try:
            other.wait_started()  # asked once started (KIT-19)
            other.expect_seen(kept, "TIER-18", "stored after a reset_cache, in a new instance over the same storage",
                              patient=True)
            load_exact(other, kept, "TIER-18", "stored after a reset_cache, in a new instance over the same storage")
        finally:
            other.shutdown()

    @check("TIER-18", needs=("persistence",), hooks=("reopen",))
    def test_persistence_of_many_blocks(self, kit: SecondaryDriver, primary_buffer: memoryview) -> None:
        """A new instance over the same storage sees every one of ``PERSIST_MANY`` stored blocks (more
        than a restart scan's or a listing's first batch or page), but those the first instance
        reported REMOVED (its eviction, TIER-14) or did not store (a partial job)."""
        keys = key_pool("persist-many", PERSIST_MANY)
        stored: list[OffloadKey] = []
        chunk = max(1, min(kit.num_slots, 32))
        for i in range(0, len(keys), chunk):
            part = keys[i : i + chunk]
            result = kit.store(part, list(range(len(part))))
            done = result.succeeded_keys(kit.jobs[result.job_id])
            stored += [k for k in part if k in done]
        kit.quiet_steps(2)
        removed = {k for e in kit.tier.take_events() if e.kind is EventKind.REMOVED for k in e.keys}
        kept = [k for k in stored if k not in removed]
        kit.shutdown()
        if len(kept) <= len(keys) // 2:
            pytest.skip(f"needs more than half of {len(keys)} stored blocks kept: the tier kept {len(kept)} "
                        "(a small capacity)")
        reopened = self.reopen(kit.tier, primary_buffer)
        other = SecondaryDriver(reopened, primary_buffer, kit.capabilities, kit.limits, first_job_id=9101)
        try:
            other.wait_started()  # asked once started (KIT-19)
            other.expect_seen(kept, "TIER-18", f"in a new instance over the same storage, one of {len(kept)} blocks "
                              "stored and never reported REMOVED", patient=True)
            other.load(kept[-3:], [10, 11, 12])  # the last stored: past any first batch
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
            other.wait_started()  # asked once started, not while its start-up races the clock (KIT-19)
            keys = key_pool("share", 4)
            kit.store(keys[:2])
            other.expect_seen(keys[:2], "TIER-18", "in a second live instance after the first stored it")
            other.load(keys[:2], [10, 11])
            other.store(keys[2:], [2, 3])
            kit.expect_seen(keys[2:], "TIER-18", "in the first instance after the second stored it")
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
        ledger = kit.threads
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
        if started and ledger is None:  # a kit fixture overridden: only a look at the threads is left
            raise ConformanceFailure(
                "TIER-16", f"thread {started[0].name!r}, started by the tier, is still running after shutdown returned"
            )
        # Recorded, not sampled: the kit holds each thread the tier started at its end until it is
        # joined, so a thread the tier leaves to end on its own is found every run (ThreadLedger).
        for thread in [] if ledger is None else self._threads_left_by_the_tier(kit, ledger):
            raise ConformanceFailure(
                "TIER-16",
                f"thread {thread.name!r}, started by the tier, is still running after shutdown returned "
                "(shutdown never joined it: the kit holds a thread's end until it is joined, so this is found every "
                "run, however early the thread's work ended)",
            )
        del reported

    def _threads_left_by_the_tier(self, kit: SecondaryDriver, ledger: ThreadLedger) -> list[threading.Thread]:
        """The recorded threads no join saw end, less the fixture's (KIT-26): where every one left is the
        build's (started while the spec's factory ran, or by such a thread), another instance is built (the
        ``reopen`` hook's, over the same storage, else the factory's) and shut down; if it leaves no thread
        of its build unjoined, the first build's were set-up the spec's factory does once (a process-wide
        helper, the storage's own server), not the instance's. Each thread started after the build is the
        tier's; so is each of the build's when the second build leaves one too (a thread per instance)."""
        left = ledger.unjoined()
        if not left or not all(ledger.from_build(t) for t in left) or kit.another_build is None:
            return left
        buffer = make_buffer(self.num_slots, self.block_bytes)
        with ThreadLedger(hold_s=self.limits.job_timeout_s) as again:
            other = kit.another_build(buffer)
            again.mark_built()
            other.shutdown()
            per_instance = [t for t in again.unjoined() if again.from_build(t)]
        return left if per_instance else []

    test_shutdown_reports_queued_work.records_threads = True  # type: ignore[attr-defined]  # read by the tier fixture

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

    @check("CAP-2")
    def test_holds_what_it_stored_past_its_capacity(self, kit: SecondaryDriver) -> None:
        """Stores of 96 blocks: without ``eviction`` declared every one still answers HIT at the end
        (a tier that drops blocks must declare it: CAP-2; one that never answered HIT was a lost
        write, TIER-10); with it, any may answer MISS, and each HIT loads its bytes."""
        evicts = self.declared_capabilities(kit.tier).eviction
        keys = key_pool("capacity", 96)
        for i in range(0, len(keys), 16):
            batch = keys[i : i + 16]
            result = kit.store(batch, range(16))
            if not result.success and not evicts:
                raise ConformanceFailure("TIER-10", f"a store of 16 blocks failed after {i} were stored: {result}")
            if not evicts:
                kit.expect(kit.resolve(batch), lr.HIT, "TIER-10", "right after its store reported success")
        answers = kit.resolve(keys)
        held = [k for k in keys if answers[k] is lr.HIT]
        lost = [k for k in keys if answers[k] is not lr.HIT]
        if lost and not evicts:
            raise ConformanceFailure(
                "CAP-2",
                f"{len(lost)} of {len(keys)} stored blocks that answered HIT after their store now answer MISS "
                f"(first {short_key(lost[0])}, after {len(held)} held; nothing was reset): the tier drops "
                "blocks but does not declare eviction",
            )
        for i in range(0, len(held), 12):
            kit.load(held[i : i + 12], range(16, 16 + len(held[i : i + 12])))

    @check("CAP-3", unless=("async_lookup",))
    def test_retry_only_when_declared(self, kit: SecondaryDriver) -> None:
        """Without ``async_lookup`` declared, no lookup answers RETRY: not for new keys, not while a
        store or load is in flight, not after (the driver checks every lookup of every check)."""
        keys = key_pool("cap3", 4)
        for key in keys:
            kit.lookup(key)
        job = kit.submit_store(keys[:2], [0, 1])
        while job.job_id not in kit.results:
            for key in keys:
                kit.lookup(key)
            kit.wait_step([job])
        load = kit.submit_load(keys[:2], [10, 11])
        while load.job_id not in kit.results:
            for key in keys:
                kit.lookup(key)
            kit.wait_step([load])
        fresh = TrackedContext("kvproto-kit-cap3")
        for key in keys:
            kit.lookup(key, fresh)
        kit.tier.on_request_finished(fresh)

    @check("CAP-4", hooks=("fail_keys",), unless=("partial_jobs",))
    def test_jobs_are_whole_without_partial_jobs(self, kit: SecondaryDriver) -> None:
        """Without ``partial_jobs`` declared, a job that fails for some keys (the fail_keys hook)
        fails whole: no result names a subset of its keys as done (the driver checks every result)."""
        keys = key_pool("cap4", 4)
        self.fail_keys(kit.tier, keys[1:2])
        result = kit.store(keys)
        answers = kit.resolve(keys)
        if result.success:
            if answers[keys[1]] is lr.HIT:
                raise ConformanceFailure("KIT-5", "the fail_keys hook had no effect: a key it names was stored")
            raise ConformanceFailure(
                "TIER-11", f"a store job was reported successful, but {short_key(keys[1])} answers MISS: it was not stored"
            )
        kit.expect({k: answers[k] for k in keys[1:2]}, lr.MISS, "TIER-4", "after its store job failed")
        other = key_pool("cap4-other", 2)
        if not kit.store(other, [4, 5]).success:
            raise ConformanceFailure(
                "KIT-5", "the fail_keys hook had more effect than asked: a store of keys it does not name failed"
            )

    @check("TIER-14")
    def test_events_report_removals(self, kit: SecondaryDriver) -> None:
        """reset_cache (and, with eviction, an eviction) emits REMOVED for the blocks it drops; no
        event names a key the tier never held; STORED names only keys whose store succeeded; applied in
        order, the events leave no evicted block held (its STORED before the REMOVED of its eviction)."""
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
            # Jobs of 16 blocks, or of half the blocks the tier holds where it holds fewer (KIT-26).
            held = self._held_before_eviction(kit, "removed-calibrate")
            size = 16 if held >= 16 else max(1, held // 2)
            tier.reset_cache()
            list(tier.take_events())
            many = key_pool("removed-evict", 96)
            stored: set[OffloadKey] = set()
            for i in range(0, len(many), size):
                result = kit.store(many[i : i + size], range(size))
                # A key whose publish the storage refused (its own hard cap, TIER-29) was never stored: no REMOVED due.
                stored.update(result.succeeded_keys(kit.jobs[result.job_id]))
            kit.quiet_steps(2)
            answers = kit.resolve(many)
            gone = {k for k in many if k in stored and answers[k] is lr.MISS}
            events = list(tier.take_events())
            removed = {k for e in events if e.kind is EventKind.REMOVED for k in e.keys}
            if gone - removed:
                raise ConformanceFailure(
                    "TIER-14",
                    f"{len(gone - removed)} stored blocks were evicted (they answer MISS) without a REMOVED event",
                )
            self._events_in_order(events, many, answers)

    @check("TIER-14", needs=("eviction",))
    def test_a_job_larger_than_the_tier_keeps_its_events_in_order(
        self, kit: SecondaryDriver, tier_factory: SecondaryTierFactory
    ) -> None:
        """One store job of ``OVERSIZED_JOB`` (128) fresh blocks, into a fresh instance over a primary buffer of
        as many rows: a tier that holds fewer evicts blocks of that very job. Applied in order, its events
        leave none of the evicted blocks held (each block's STORED before the REMOVED of its eviction). A tier
        holding all 128 evicts none of them: nothing to judge, it passes."""
        buffer = make_buffer(OVERSIZED_JOB, self.block_bytes)
        big = SecondaryDriver(tier_factory(buffer), buffer, kit.capabilities, kit.limits, first_job_id=9701)
        try:
            big.wait_started()
            list(big.tier.take_events())
            keys = key_pool("oversized-job", OVERSIZED_JOB)
            big.store(keys, range(OVERSIZED_JOB))
            big.quiet_steps(2)
            answers = big.resolve(keys)
            self._events_in_order(list(big.tier.take_events()), keys, answers)
        finally:
            big.shutdown()

    @staticmethod
    def _events_in_order(
        events: Sequence[OffloadingEvent], keys: Sequence[OffloadKey], answers: Mapping[OffloadKey, LookupResult]
    ) -> None:
        """TIER-14: ``events`` (every event since ``keys`` were first stored, fresh after a reset), applied in
        order to an empty set, leave none of the keys that answer MISS: a block's STORED comes before the
        REMOVED of its eviction. (A block answering HIT after its REMOVED is not judged: a shared tier's file
        deleted in the background may still be found by an existence check.)"""
        held: set[OffloadKey] = set()
        for event in events:
            match event.kind:
                case EventKind.STORED:
                    held.update(event.keys)
                case EventKind.REMOVED:
                    held.difference_update(event.keys)
                case _ as other:
                    unreachable(other, where="test_events_report_removals: an event's kind")
        ghosts = sorted(k for k in keys if answers[k] is lr.MISS and k in held)
        if ghosts:
            raise ConformanceFailure(
                "TIER-14",
                f"{len(ghosts)} evicted block(s) answer MISS, but applied in order the tier's events say they are held "
                f"(first {short_key(ghosts[0])}): a STORED event naming each came after the REMOVED of its eviction; a "
                "block's STORED must come before the REMOVED that takes it away",
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
        from kvproto.testing._checks.machines import run_machine

        run_machine(self, tier_factory, self.profile(request), request, differential=False)

    @check("TIER-10", hypothesis=True)
    def test_differential_against_memory_tier(
        self, tier_factory: SecondaryTierFactory, request: pytest.FixtureRequest
    ) -> None:
        """The same operations on the tier and on MemoryTier leave the same blocks readable."""
        from kvproto.testing._checks.machines import run_machine

        run_machine(self, tier_factory, self.profile(request), request, differential=True)

    @check("TIER-10", hypothesis=True)
    def test_explore_instances_sizes_and_interleavings(
        self, tier_factory: SecondaryTierFactory, request: pytest.FixtureRequest
    ) -> None:
        """Instances over one storage (live beside each other where the tier shares, or restarted, where
        it has the ``reopen`` hook; one instance without it), rows
        from 48 bytes to MiB, and swarms of interleaved stores, loads, lookups and resets agree with one
        model of what each instance may see (KIT-23)."""
        from kvproto.testing._checks.machines import run_explorer

        run_explorer(self, tier_factory, self.profile(request), request)


SecondaryTierTests._kit_base = SecondaryTierTests
