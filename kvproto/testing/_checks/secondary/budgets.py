"""Byte budgets (TIER-29): every check of a tier's declared storage budget, with and without held
HITs: :class:`SecondaryBudgetChecks` and :class:`SecondaryBudgetChecks`, bases of
:class:`~kvproto.testing.SecondaryTierTests`.

A BlobTier configured with ``max_bytes`` (another tier: through the ``capacity_blocks`` hook) declares
how much storage it may hold; the kit stores past
it and counts, through the ``read_block`` hook (the storage itself, not the tier's own accounting),
the blobs left once the jobs are reported and the background deletions had time to run. Any other
tier skips, naming what it needs. Found by mutation testing (docs/mutation/blobtier.json: a budget
that was never enforced passed every check, its eviction checks skipping as vacuous).

With HITs held (:class:`SecondaryBudgetChecks`, TIERKIT-6): a held HIT keeps its blob's bytes on
the storage (an open handle on a deleted file still occupies the
disk), so a block evicted while held still counts against ``max_bytes`` until its handle closes
(TIERKIT-6): the tier evicts more to make room. The budget check (TIER-29) stores with no HIT held,
so an eviction that forgot the held bytes passed it (found by mutation testing,
docs/mutation/blobtier.json). Here the kit holds a HIT on every block the budget allows, stores past
the budget, and counts the storage's bytes as the blocks still readable (``read_block``) plus the
held blocks no longer readable (their bytes live on in the handles).
"""

from __future__ import annotations

import time

import pytest

from kvproto import envelope as env, members as lr
from kvproto._events import EventKind
from kvproto._keys import OffloadKey
from kvproto.testing._checks.secondary.faults_inside import first_setup_failure
from kvproto.testing._checks.secondary.role import SecondaryRole, store_slots
from kvproto.testing._harness.data import key_pool, same_bytes_pool
from kvproto.testing._harness.decorator import check
from kvproto.testing._harness.driver import TrackedContext
from kvproto.testing._harness.failures import ConformanceFailure, SetUpFailed
from kvproto.testing._harness.secondary_driver import SecondaryDriver
from kvproto.tierkit import BlobTier

__all__ = ["SecondaryBudgetChecks", "SecondaryBudgetChecks"]


class SecondaryBudgetChecks(SecondaryRole):
    """The byte budget, with no HIT held and with HITs held (TIER-29, TIERKIT-6)."""

    @check("TIER-29", needs=("eviction",), hooks=("read_block",))
    def test_a_byte_budget_is_kept(self, kit: SecondaryDriver) -> None:
        """A BlobTier with ``max_bytes``, or a tier whose ``capacity_blocks`` hook says its budget: after
        storing 16 blocks more than the budget holds (8 per job, a step after each), at most the
        budget's worth of the stored blocks are left in the storage (read_block) once the jobs are
        reported and its deletions ran (waited for within the kit's job bound), and a REMOVED event
        named the evicted ones."""
        tier = kit.tier
        room, said = self._room(kit)
        keys = key_pool("budget", room + 16)
        removed: set[bytes] = set()
        stored: set[bytes] = set()
        for i in range(0, len(keys), 8):
            result = kit.store(keys[i : i + 8], store_slots(kit, len(keys[i : i + 8])))
            stored |= result.succeeded_keys(kit.jobs[result.job_id])
            kit.step()
            removed |= {k for e in tier.take_events() if e.kind is EventKind.REMOVED for k in e.keys}
        deadline = time.monotonic() + kit.limits.job_timeout_s
        while True:
            kit.quiet_steps(1)
            removed |= {k for e in tier.take_events() if e.kind is EventKind.REMOVED for k in e.keys}
            left = [k for k in keys if self.read_block(tier, k) is not None]
            if len(left) <= room or time.monotonic() > deadline:
                break
        if len(left) > room:
            raise ConformanceFailure(
                "TIER-29",
                f"after storing {len(keys)} blocks into a tier {said} {room}, the "
                f"storage still holds {len(left)} of them ({kit.limits.job_timeout_s:g} s after the last job was "
                "reported): the budget is not kept (the least recently used blocks must be evicted and deleted)",
            )
        unnamed = [k for k in keys if k in stored and k not in left and k not in removed]
        if unnamed:
            raise ConformanceFailure(
                "TIER-14",
                f"{len(unnamed)} of the blocks evicted to keep the byte budget were named by no REMOVED event",
            )

    def _room(self, kit: SecondaryDriver) -> tuple[int, str]:
        """:meth:`_budget_of`; a tier with no known budget skips the check."""
        known = self._budget_of(kit)
        if known is None:
            pytest.skip("needs a byte budget: a BlobTier with BlobTierConfig.max_bytes, or the capacity_blocks() hook")
        return known

    @check("TIER-29", needs=("eviction",), hooks=("storage_names",))
    def test_evictions_leave_nothing_behind(self, kit: SecondaryDriver) -> None:
        """A tier with a byte budget (as :meth:`test_a_byte_budget_is_kept`), filled to it (8 blocks per
        job), holds some number of names in its storage (``storage_names``: blobs, chunks, sidecars,
        manifests; directories, named with a trailing ``/``, are not counted). After twice the budget
        more fresh blocks are stored (8 per job, a step after each), every one past the budget evicting
        one, the storage holds within the kit's job bound at most that number plus one block's names:
        an eviction deletes everything its block had in the storage, or the storage outgrows the budget
        while every eviction is reported (a chunked blob whose last chunk a delete forgets: a held-out
        Redis tier, which the byte count through ``read_block`` could not see)."""
        self._names_past_the_budget(kit, "t29-names", [], "")

    @check("TIER-29", needs=("eviction",), hooks=("storage_names",))
    def test_evicted_blocks_with_the_same_bytes_keep_the_budget(self, kit: SecondaryDriver) -> None:
        """As :meth:`test_evictions_leave_nothing_behind`, with up to 64 keys holding one and the same block
        stored between the fill and the fresh blocks (``same_bytes_pool``: an engine's padding blocks).
        A tier that keeps such a block once (content-addressed) must still keep its budget once those keys
        are evicted: each eviction frees the stored bytes only with the block's last key (round 8's
        content-addressed directory subtracted a block per key evicted, and its storage grew past the
        budget without bound while it believed itself at it)."""
        room, _ = self._room(kit)
        same = list(same_bytes_pool()[: max(2, min(64, room))])
        self._names_past_the_budget(kit, "t29-same", same, f", {len(same)} of them holding one and the same block")

    def _names_past_the_budget(self, kit: SecondaryDriver, tag: str, middle: list[OffloadKey], told: str) -> None:
        """Fill the budget with fresh blocks (``tag``), count the storage's names, store ``middle`` then twice
        the budget in fresh blocks (8 per job, a step after each), and fail TIER-29 if the storage then holds
        more names than the full budget plus one block's (``told`` describes ``middle`` in the reason)."""
        room, said = self._room(kit)
        first = key_pool(tag, room)
        for i in range(0, room, _JOB):
            if not kit.store(first[i : i + _JOB], store_slots(kit, len(first[i : i + _JOB]))).success:
                raise SetUpFailed("TIER-10", first_setup_failure(kit), "TIER-29")
            kit.step()
        kit.quiet_steps(2)
        full = self._settled_names(kit, None)
        per_block = max(1, -(-full // max(1, room)))  # what one block holds, rounded up (a manifest counted in)
        bound = full + per_block  # the budget's floor in blocks may leave room for one more
        past = middle + key_pool(f"{tag}-past", 2 * room)
        for i in range(0, len(past), _JOB):
            kit.store(past[i : i + _JOB], store_slots(kit, len(past[i : i + _JOB])))
            kit.step()
        held = self._settled_names(kit, bound)
        if held > bound:
            raise ConformanceFailure(
                "TIER-29",
                f"a tier {said} {room} of the kit's blocks held {full} names in its storage when full; after "
                f"{len(past)} more blocks were stored past its budget{told} it holds {held} "
                f"({kit.limits.job_timeout_s:g} s after the last job was reported), more than the {bound} that the "
                "budget explains: its evictions leave something behind (a chunk, a sidecar, a block other keys "
                "no longer share), and the storage outgrows the budget while each eviction is reported",
            )

    def _entries(self, kit: SecondaryDriver) -> int:
        """How many names the storage holds, directories (names ending in ``/``) left out: a fan-out of
        directories is bounded by its layout, not by the blocks stored."""
        return sum(1 for name in self.storage_names(kit.tier) if not name.endswith("/"))

    def _settled_names(self, kit: SecondaryDriver, bound: int | None) -> int:
        """How many names the storage holds once the tier's background deletions ran: polled, a quiet step
        apart, until the count stops falling (``bound`` None) or is at most ``bound``, within the kit's job
        bound."""
        deadline = time.monotonic() + kit.limits.job_timeout_s
        count = self._entries(kit)
        while time.monotonic() < deadline:
            if bound is not None and count <= bound:
                break
            kit.quiet_steps(1)
            now = self._entries(kit)
            if bound is None and now >= count:
                return now
            count = now
        return count

    @check("TIER-29", needs=("eviction", "holds_hits"), hooks=("read_block",))
    def test_held_blocks_count_against_the_byte_budget(self, kit: SecondaryDriver) -> None:
        """A BlobTier with ``max_bytes`` holding HITs: it stores as many blocks as the budget holds (8 per
        job), answers HIT on all of them in one live request (each held), then stores 8 more. Within the
        kit's job bound, with no further step (the holds stay), the storage holds at most the budget: the
        blocks still readable (``read_block``) plus the held blocks no longer readable."""
        tier = kit.tier
        budget = tier.blob_config.max_bytes if isinstance(tier, BlobTier) else None
        if budget is None:
            pytest.skip("needs a BlobTier with a byte budget (BlobTierConfig.max_bytes)")
        room = budget // (env.HEADER_BYTES + kit.block_bytes)
        first = key_pool("t29-held", room)
        for i in range(0, room, _JOB):
            chunk = first[i : i + _JOB]
            if not kit.store(chunk, store_slots(kit, len(chunk))).success:
                raise SetUpFailed("TIER-10", first_setup_failure(kit), "TIER-29")
        request = TrackedContext("kvproto-kit-t29-held")
        answers = kit.resolve(first, request)
        kit.expect(answers, lr.HIT, "TIER-29", "stored within the byte budget")
        held = getattr(tier, "held_hits", 0)
        if held != room:
            pytest.skip(f"the tier held {held!r} of {room} HITs (its cap of held handles): not checked")
        past = key_pool("t29-past", _PAST)
        if not kit.store(past, store_slots(kit, _PAST)).success:
            raise SetUpFailed("TIER-10", first_setup_failure(kit), "TIER-29")
        deadline = time.monotonic() + kit.limits.job_timeout_s
        while True:
            readable = {k for k in (*first, *past) if self.read_block(tier, k) is not None}
            on_storage = len(readable) + sum(1 for k in first if k not in readable)
            if on_storage <= room or time.monotonic() > deadline:
                break
            time.sleep(0.01)  # the tier's deletions run in the background; polled within the bound
        tier.on_request_finished(request)
        if on_storage > room:
            raise ConformanceFailure(
                "TIER-29",
                f"with a HIT held on each of the {room} blocks its max_bytes ({budget}) holds, {_PAST} more stored: "
                f"the storage holds {on_storage} blocks ({len(readable)} readable, {on_storage - len(readable)} "
                f"evicted but held), {kit.limits.job_timeout_s:g} s after the store was reported; an evicted block a "
                "handle keeps still counts against the budget (TIERKIT-6): evict more",
            )

_JOB = 8  # blocks per store job
_PAST = 8  # blocks stored past the budget while every block the budget holds is held


