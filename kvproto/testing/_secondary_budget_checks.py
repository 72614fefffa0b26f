"""The byte budget of a :class:`~kvproto.tierkit.BlobTier` (TIER-29): :class:`SecondaryBudgetChecks`,
a base of :class:`~kvproto.testing.SecondaryTierTests`.

A BlobTier configured with ``max_bytes`` declares how much storage it may hold; the kit stores past
it and counts, through the ``read_block`` hook (the storage itself, not the tier's own accounting),
the blobs left once the jobs are reported and the background deletions had time to run. Any other
tier skips, naming what it needs. Found by mutation testing (docs/mutation/blobtier.json: a budget
that was never enforced passed every check, its eviction checks skipping as vacuous).
"""

from __future__ import annotations

import time

import pytest

from kvproto import envelope as env
from kvproto._events import EventKind
from kvproto.testing._checks import check
from kvproto.testing._data import key_pool
from kvproto.testing._failures import ConformanceFailure
from kvproto.testing._secondary_driver import SecondaryDriver
from kvproto.testing._secondary_roles import SecondaryRole, store_slots
from kvproto.tierkit import BlobTier

__all__ = ["SecondaryBudgetChecks"]


class SecondaryBudgetChecks(SecondaryRole):
    """The byte budget, in the kit's order (see ``SecondaryTierTests``)."""

    @check("TIER-29", needs=("eviction",), hooks=("read_block",))
    def test_a_byte_budget_is_kept(self, kit: SecondaryDriver) -> None:
        """A BlobTier with ``max_bytes``: after storing 16 blocks more than the budget holds (8 per
        job, a step after each), at most the budget's worth of the stored blocks are left in the
        storage (read_block) once the jobs are reported and its deletions ran (waited for within the
        kit's job bound), and a REMOVED event named the evicted ones."""
        tier = kit.tier
        budget = tier.blob_config.max_bytes if isinstance(tier, BlobTier) else None
        if budget is None:
            pytest.skip("needs a BlobTier with a byte budget (BlobTierConfig.max_bytes)")
        room = budget // (env.HEADER_BYTES + kit.block_bytes)
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
                f"after storing {len(keys)} blocks into a BlobTier whose max_bytes ({budget}) holds {room}, the "
                f"storage still holds {len(left)} of them ({kit.limits.job_timeout_s:g} s after the last job was "
                "reported): the budget is not kept (the least recently used blocks must be evicted and deleted)",
            )
        unnamed = [k for k in keys if k in stored and k not in left and k not in removed]
        if unnamed:
            raise ConformanceFailure(
                "TIER-14",
                f"{len(unnamed)} of the blocks evicted to keep the byte budget were named by no REMOVED event",
            )
