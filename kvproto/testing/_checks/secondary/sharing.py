"""The secondary tier's checks of visibility across instances (issue 17, section 1; TIER-18 with
``sharing``, TIER-4): :class:`SecondarySharingChecks`, a base of
:class:`~kvproto.testing.SecondaryTierTests`.

Two live instances over the same storage (the ``reopen`` hook). An existence verdict lives only as
long as a request that refers to it: a request asked before the other instance stored, and once it
finished a new request sees the block. One request finishing never disturbs another's pending
lookups. And a block another instance removed while a request held its HIT fails that request's
load; the request is not told HIT again unless a load right after succeeds. With the
``hold_publish(tier, on) -> int`` hook, two writers of one fresh key race inside a publish: instance A
is held where its block would become visible under its name while instance B stores the same key,
then let go; both stores must be reported succeeded and the block must load (TIER-10, TIER-23).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from kvproto import EventKind, members as lr
from kvproto._keys import OffloadKey
from kvproto._protocols import SecondaryTier
from kvproto.testing._checks.secondary.role import SecondaryRole, load_right_after_hit, load_slots, store_slots
from kvproto.testing._faults.probes import GATE_BOUND_S
from kvproto.testing._harness.data import block_for, key_pool, make_buffer
from kvproto.testing._harness.decorator import check
from kvproto.testing._harness.driver import TrackedContext, short_key
from kvproto.testing._harness.failures import ConformanceFailure, SetUpFailed
from kvproto.testing._harness.secondary_driver import SecondaryDriver

__all__ = ["SecondarySharingChecks"]


class SecondarySharingChecks(SecondaryRole):
    """Visibility across live instances, in the kit's order (see ``SecondaryTierTests``)."""

    def replace_block(self, tier: SecondaryTier, key: OffloadKey, data: bytes) -> None:
        """Replace the block stored under ``key`` by ``data`` (another writer on the same storage), the
        backdoor hook of :meth:`test_a_block_replaced_after_its_hit_never_loads_the_new_bytes`;
        declaring it promises TIER-34 (KIT-5)."""
        raise NotImplementedError

    def hold_publish(self, tier: SecondaryTier, on: bool) -> int:
        """While ``on``, make each block ``tier`` finishes storing wait right where it would become visible
        under its name (kvproto-fs: before its link), until called with False; return how many wait there
        now: the backdoor hook of :meth:`test_a_writer_held_inside_its_publish_finds_the_block_there` (KIT-5)."""
        raise NotImplementedError

    @contextmanager
    def _second_instance(self, kit: SecondaryDriver, first_job_id: int) -> Iterator[SecondaryDriver]:
        buffer = make_buffer(self.num_slots, self.block_bytes)
        other = SecondaryDriver(self.reopen(kit.tier, buffer), buffer, kit.capabilities, kit.limits, first_job_id=first_job_id)
        try:
            yield other
        finally:
            other.shutdown()

    @check("TIER-4", needs=("sharing", "eviction"), hooks=("reopen",))
    def test_a_load_holding_blocks_another_instance_evicted_forgets_no_other(self, kit: SecondaryDriver) -> None:
        """A second instance stores 4 blocks (victims); this one asks for them (HIT) and loads them in a
        request that then finishes, and stores 4 blocks of its own (keepers). The second instance, whose
        budget is known (a BlobTier's ``max_bytes``, the ``capacity_blocks`` hook), stores its budget and 8
        more, evicting victims (its REMOVED events say which), and is waited idle (``wait_idle``: its
        deletions ran). Then a new request here asks for keepers and victims, interleaved, and loads every
        HIT in one job. An evicted victim answering HIT may fail its load (once: TIERKIT-10's memo; a verdict
        cached across requests is not judged here). A load may fail from
        its first missing key on (CAP-4), but a keeper (never removed) it did not deliver stays stored: where
        the second instance still loads it, it answers HIT here in a new request and loads (held-out round 10:
        a batched read matching a multi-get's answers to its keys by position, with an evicted block left out
        of the answer, took the next key's block for a foreign one and never answered HIT for it again)."""
        with self._second_instance(kit, 9931) as other:
            budget = self._budget_of(other)
            if budget is None:
                pytest.skip("needs the second instance's budget: a BlobTier's max_bytes, or the capacity_blocks hook")
            victims, keepers = key_pool("evicted-there", 4), key_pool("kept-here", 4)
            if not other.store(victims, store_slots(other, len(victims))).success:
                raise SetUpFailed("TIER-4", f"a store of {len(victims)} blocks into the second instance failed", "TIER-4")
            asked = TrackedContext("kvproto-kit-asked-before-the-eviction")
            found = [k for k, a in kit.resolve(victims, asked, patient=True).items() if a is lr.HIT]
            if found:
                kit.load(found, load_slots(kit, len(found)), context=asked)
            kit.tier.on_request_finished(asked)
            if not kit.store(keepers, store_slots(kit, len(keepers))).success:
                raise SetUpFailed("TIER-4", f"a store of {len(keepers)} blocks into this instance failed", "TIER-4")
            filler = key_pool("evicting-there", budget[0] + 8)
            for at in range(0, len(filler), 16):
                other.store(filler[at : at + 16], store_slots(other, len(filler[at : at + 16])))
            other.quiet_steps(2)
            removed = {k for e in other.tier.take_events() if e.kind is EventKind.REMOVED for k in e.keys}
            gone = [k for k in victims if k in removed]
            if not gone:
                pytest.skip("not checked: the second instance evicted none of the 4 blocks it stored first")
            other.wait_checks_back()
            kit.quiet_steps(2)
            ours = {k for e in kit.tier.take_events() if e.kind is EventKind.REMOVED for k in e.keys}
            kept = [k for k in keepers if k not in ours]
            order = [k for pair in zip(keepers, victims, strict=True) for k in pair]
            later = TrackedContext("kvproto-kit-asked-after-the-eviction")
            hits = [k for k, a in kit.resolve(order, later, patient=True).items() if a is lr.HIT]
            result = kit.load(hits, load_slots(kit, len(hits)), context=later) if hits else None
            done = set() if result is None else result.succeeded_keys(kit.jobs[result.job_id])
            kit.tier.on_request_finished(later)
            failed = [k for k in hits if k not in done]
            # An evicted block answering HIT may fail its load once (TIERKIT-10: a shared index is a memo). A load
            # may fail from its first missing key on (CAP-4); the keys it did not deliver stay stored.
            self._still_here(kit, other, [k for k in failed if k in kept], len(gone))

    @staticmethod
    def _still_here(kit: SecondaryDriver, other: SecondaryDriver, keys: list[OffloadKey], gone: int) -> None:
        """Each of ``keys`` (stored by this instance, never removed, not delivered by a load job holding blocks
        another instance had evicted) answers HIT here in a new request and loads, unless the other instance
        reported it REMOVED: the failed job neither lost it nor forgot it (CAP-4, TIER-4)."""
        if not keys:
            return
        other.wait_checks_back()
        kit.wait_checks_back()
        other.quiet_steps(2)
        evicted = {k for e in other.tier.take_events() if e.kind is EventKind.REMOVED for k in e.keys}
        again = TrackedContext("kvproto-kit-asked-after-the-failed-load")
        answers = kit.resolve(keys, again, patient=True)
        for key in (k for k in keys if k not in evicted):
            if answers[key] is lr.HIT:
                result = kit.load([key], load_slots(kit, 1), context=again)
                if key in result.succeeded_keys(kit.jobs[result.job_id]):
                    continue
            there = other.resolve([key], patient=True)[key] is lr.HIT
            loaded = other.load([key], load_slots(other, 1)) if there else None
            where = ("while the other instance loads it" if loaded is not None
                     and key in loaded.succeeded_keys(other.jobs[loaded.job_id])
                     else "and it is gone from the storage, though neither instance evicted it")
            raise ConformanceFailure(
                "TIER-4",
                f"{short_key(key)}, stored here and never removed, was not delivered by a load job holding blocks "
                f"another instance had evicted ({gone} of them); in a new request here it then answered "
                f"{answers[key].name}{' and failed to load' if answers[key] is lr.HIT else ''}, {where}: a key a "
                "failed load did not deliver stays stored and loads later (CAP-4), and a batched read answers each "
                "key for itself",
            )
        kit.tier.on_request_finished(again)

    @check("TIER-10", needs=("sharing",), hooks=("reopen", "hold_publish"))
    def test_a_writer_held_inside_its_publish_finds_the_block_there(self, kit: SecondaryDriver) -> None:
        """Two instances store one fresh key. The first instance's store is held inside its publish, right
        where the block would become visible under its name (the ``hold_publish`` hook), while the second
        instance stores the same key; then the first goes on and finds the block there. No fault was
        injected: both stores are reported succeeded (the first writer won with the same bytes: "already
        exists" is success, TIER-23), and the block answers HIT in the first instance and loads its bytes."""
        key = key_pool("held-publish", 1)[0]
        with self._second_instance(kit, 9951) as other:
            other.wait_started()
            self.hold_publish(kit.tier, True)
            try:
                first = kit.submit_store([key], store_slots(kit, 1))
                deadline = time.monotonic() + GATE_BOUND_S
                while self.hold_publish(kit.tier, True) < 1:  # until the first store waits inside its publish
                    if first.job_id in kit.results or time.monotonic() > deadline:
                        pytest.skip("vacuous: the store was reported without reaching the point hold_publish holds")
                    kit.wait_step([first])
                    time.sleep(0.001)
                second = other.store([key], store_slots(other, 1))
            finally:
                self.hold_publish(kit.tier, False)
            done = kit.wait([first])[first.job_id]
            if not second.success:
                raise SetUpFailed("TIER-10", "the second instance's store of a fresh key failed with no fault injected",
                                  "TIER-10")
            if key not in done.succeeded_keys(kit.jobs[done.job_id]):
                raise ConformanceFailure(
                    "TIER-10",
                    f"the store of {short_key(key)}, held inside its publish while another instance over the same "
                    "storage stored the same block, was reported failed when it went on and found the block there: "
                    "the first writer won with the same bytes, and \"already exists\" is success (TIER-23)",
                )
        kit.quiet_steps(2)
        kit.expect(kit.resolve([key]), lr.HIT, "TIER-10", "after both instances' stores of it were reported succeeded")
        kit.load([key], load_slots(kit, 1))

    @check("TIER-18", needs=("sharing",), hooks=("reopen",))
    def test_verdicts_never_outlive_their_request(self, kit: SecondaryDriver) -> None:
        """Asked in one instance before a second one stores (MISS): once that request finished, a new
        request is not told MISS at once (it asks again: RETRY, or HIT) and a HIT loads. Two requests
        ask the same fresh keys; the first finishes while the second's lookups are pending: the second's
        RETRYs still resolve within ``max_retry_steps``, and as HIT wherever an undisturbed request
        asking other stored keys right after the finish was told HIT (a check that ran out of time may answer
        MISS, AP-5: the undisturbed request is the control)."""
        with self._second_instance(kit, 9901) as other:
            keys = key_pool("share-late", 4)
            early = TrackedContext("kvproto-kit-asked-early")
            kit.expect(kit.resolve(keys, early), lr.MISS, "TIER-4", "before any instance stored it")
            if not other.store(keys, store_slots(other, len(keys))).success:
                raise ConformanceFailure("TIER-10", f"a store of {len(keys)} blocks into the second instance failed")
            kit.tier.on_request_finished(early)
            later = TrackedContext("kvproto-kit-asked-later")
            first_answers = {k: kit.lookup(k, later) for k in keys}
            stale = [k for k in keys if first_answers[k] is lr.MISS]
            if stale:
                raise ConformanceFailure(
                    "TIER-18",
                    f"key {short_key(stale[0])} answered MISS at once to a new request of the first instance after "
                    "the second instance stored it: the MISS it answered to an earlier, finished request outlived "
                    "that request (an existence verdict lives only while a request refers to it)",
                )
            answers = kit.resolve(keys, later)  # a check that ran out of time may still answer MISS (AP-5)
            held = [k for k in keys if answers[k] is lr.HIT]
            if held:
                kit.load(held, load_slots(kit, len(held)), context=later)
            kit.tier.on_request_finished(later)
            fresh = key_pool("share-pending", 4)  # two for the disturbed request, two for an undisturbed one
            if not other.store(fresh, store_slots(other, len(fresh))).success:
                raise ConformanceFailure("TIER-10", f"a store of {len(fresh)} blocks into the second instance failed")
            first = TrackedContext("kvproto-kit-finishes-first")
            second = TrackedContext("kvproto-kit-still-asking")
            control = TrackedContext("kvproto-kit-undisturbed")
            for key in fresh[:2]:
                kit.lookup(key, first)
                kit.lookup(key, second)
            kit.tier.on_request_finished(first)  # while the second request's lookups are pending
            for key in fresh[2:]:
                kit.lookup(key, control)  # asked after the finish: nothing disturbs these
            undisturbed = kit.resolve(fresh[2:], control)
            disturbed = kit.resolve(fresh[:2], second)
            kit.tier.on_request_finished(control)
            kit.tier.on_request_finished(second)
            if all(undisturbed[k] is lr.HIT for k in fresh[2:]):
                wrong = [k for k in fresh[:2] if disturbed[k] is not lr.HIT]
                if wrong:
                    raise ConformanceFailure(
                        "TIER-18",
                        f"key {short_key(wrong[0])}, stored by the second instance, answered {disturbed[wrong[0]].name} "
                        "to a request whose lookups were pending when another request asking the same keys finished, "
                        "while keys asked right after by an undisturbed request answered HIT: one request "
                        "finishing must not disturb another's pending lookups",
                    )

    @check("TIER-4", needs=("sharing",), hooks=("reopen",))
    def test_no_hit_after_a_failed_load_in_a_live_request(self, kit: SecondaryDriver) -> None:
        """A live request saw HIT; then another instance removed the blocks (its reset_cache, which in
        a shared storage removes them for everyone) and the request's load of one failed: the
        request's next lookups of it answer HIT only if a load right after succeeds."""
        keys = key_pool("share-gone", 2)
        kit.store(keys, store_slots(kit, len(keys)))
        kit.quiet_steps(2)
        live = TrackedContext("kvproto-kit-live-across")
        kit.expect(kit.resolve(keys, live), lr.HIT, "TIER-10", "right after its store reported success")
        with self._second_instance(kit, 9951) as other:
            other.quiet_steps(1)
            if other.tier.reset_cache() is not True:
                raise ConformanceFailure("TIER-16", "reset_cache of an idle second instance did not answer True")
            other.quiet_steps(1)
        slot, spare = load_slots(kit, 2)
        result = kit.load(keys[:1], [slot], context=live)
        if keys[0] in result.succeeded_keys(kit.jobs[result.job_id]):
            kit.tier.on_request_finished(live)
            return  # the tier still held a readable copy: nothing failed (the driver checked its bytes)
        for _ in range(2):
            if kit.lookup(keys[0], live) is lr.HIT:
                load_right_after_hit(
                    kit, keys[0], spare, when=" again, to the live request whose load of it had just failed"
                )
            kit.step()
        kit.tier.on_request_finished(live)

    @check("TIER-4", needs=("sharing",), hooks=("reopen",))
    def test_blocks_another_instance_reset_and_stored_again_load_here(self, kit: SecondaryDriver) -> None:
        """A second instance stores 4 blocks; this instance, which knew none of them, is told HIT and loads
        them twice (whatever it keeps about a block it read: an index entry, a version, an ETag, a handle).
        Then the second instance resets (in a shared storage, for everyone) and stores the same keys again
        with other bytes (a weight update). Asked in a new request, every key this instance answers HIT
        loads, with the new bytes: nothing disturbed the storage since that HIT (TIER-4, TIER-16)."""
        keys = key_pool("share-reset-again", 4)
        with self._second_instance(kit, 9961) as other:
            other.wait_started()
            if not other.store(keys, store_slots(other, len(keys))).success:
                raise SetUpFailed("TIER-10", f"a store of {len(keys)} blocks into the second instance failed", "TIER-4")
            kit.wait_started()
            for attempt in ("kvproto-kit-before-reset", "kvproto-kit-before-reset-again"):
                context = TrackedContext(attempt)
                held = [k for k, answer in kit.resolve(keys, context).items() if answer is lr.HIT]
                if held:
                    kit.load(held, load_slots(kit, len(held)), context=context)  # the driver checks their bytes
                kit.tier.on_request_finished(context)
            kit.settle()
            other.quiet_steps(1)
            if other.tier.reset_cache() is not True:
                pytest.skip("not checked: the second instance's reset_cache answered False with nothing in flight")
            other.new_era(keys)
            kit.new_era(keys)
            if not other.store(keys, store_slots(other, len(keys))).success:
                raise ConformanceFailure("TIER-16", f"storing {len(keys)} keys again after reset_cache failed")
            other.quiet_steps(1)
        after = TrackedContext("kvproto-kit-after-reset-elsewhere")
        answers = kit.resolve(keys, after)
        try:
            for key in (k for k in keys if answers[k] is lr.HIT):
                load_right_after_hit(kit, key, load_slots(kit, 1)[0],
                                     when=" after another instance reset the storage and stored it again")
        finally:
            kit.tier.on_request_finished(after)

    @check("TIER-32", needs=("sharing",), hooks=("reopen",))
    def test_a_large_batch_sees_the_other_instances_blocks(self, kit: SecondaryDriver) -> None:
        """A second instance stores 32 blocks; the first instance, which knows none of them, asks for
        64 keys in one request and one step (those 32 and 32 never stored: one batch of existence
        checks, as a scheduler step asks): every stored key answers HIT and loads, every other key
        MISS. A key told MISS is asked again in a new request of one key at a time; a batch answer
        that differs from those (twice) is the batch's fault (a listing in place of per-key checks
        must decide what per-key checks decide)."""
        stored = key_pool("share-batch", 32)
        never = key_pool("share-batch-never", 32)
        asked = [k for pair in zip(stored, never, strict=True) for k in pair]  # interleaved: no range holds only one kind
        with self._second_instance(kit, 9971) as other:
            other.wait_started()
            for i in range(0, len(stored), 8):
                batch = stored[i : i + 8]
                if not other.store(batch, store_slots(other, len(batch))).success:
                    raise ConformanceFailure("TIER-10", f"a store of {len(batch)} blocks into the second instance failed")
            kit.wait_started()
            missed: list[OffloadKey] = []
            for attempt in ("kvproto-kit-large-batch", "kvproto-kit-large-batch-again"):
                context = TrackedContext(attempt)
                answers = kit.resolve(asked, context)
                for key in never:
                    if answers[key] is lr.HIT:
                        load_right_after_hit(kit, key, load_slots(kit, 1)[0], when=" in a batch of 64 keys, never stored")
                held = [k for k in stored if answers[k] is lr.HIT]
                for i in range(0, len(held), 8):
                    kit.load(held[i : i + 8], load_slots(kit, len(held[i : i + 8])), context=context)
                kit.tier.on_request_finished(context)
                missed = [k for k in stored if answers[k] is not lr.HIT and k in (missed or stored)]
                if not missed:
                    return
            alone = TrackedContext("kvproto-kit-one-at-a-time")
            seen = [k for k in missed if kit.resolve_one(k, alone) is lr.HIT]
            kit.tier.on_request_finished(alone)
            if seen:
                raise ConformanceFailure(
                    "TIER-32",
                    f"{len(seen)} of the 32 blocks a second instance stored answered MISS, twice, to a request asking "
                    f"64 keys in one step (first {short_key(seen[0])}), but HIT when asked alone: a batch of existence "
                    "checks must decide what per-key checks decide",
                )

    @check("TIER-34", needs=("sharing",), hooks=("reopen", "replace_block"))
    def test_a_block_replaced_after_its_hit_never_loads_the_new_bytes(self, kit: SecondaryDriver) -> None:
        """A second instance stores 2 blocks; the first instance, which knows neither, is told HIT for
        them in a request; then another writer replaces each stored block by other bytes under the same
        key (``replace_block``); the request's load of them fails, or loads the bytes that were there
        when it was told HIT, never the new ones."""
        keys = key_pool("t34-replaced", 2)
        with self._second_instance(kit, 9991) as other:
            other.wait_started()
            if not other.store(keys, store_slots(other, len(keys))).success:
                raise SetUpFailed("TIER-10", "a store of 2 blocks into the second instance failed", "TIER-34")
        kit.wait_started()
        context = TrackedContext("kvproto-kit-replaced-after-hit")
        answers = kit.resolve(keys, context)
        told = [k for k in keys if answers[k] is lr.HIT]
        if not told:
            raise SetUpFailed("TIER-18", "neither block another instance stored answered HIT", "TIER-34")
        for key in told:
            self.replace_block(kit.tier, key, bytes(reversed(block_for(key, kit.block_bytes))))
        try:
            kit.load(told, load_slots(kit, len(told)), context=context)  # the driver checks the bytes it reports
        except ConformanceFailure as failure:
            if failure.clause != "TIER-10":
                raise
            raise ConformanceFailure(
                "TIER-34",
                f"a block replaced by other bytes after the lookup that answered HIT for it: {failure.detail} "
                "(a load serves the block its HIT saw, or fails)",
            ) from failure
        finally:
            kit.tier.on_request_finished(context)
