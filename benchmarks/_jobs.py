"""Waiting for a tier's jobs as a scheduler does: shared by ``bench fs`` and ``bench obj``."""

from __future__ import annotations

import time

from kvproto import SecondaryTier

__all__ = ["wait_all"]


def wait_all(tier: SecondaryTier, ids: set[int], poll_s: float) -> bool:
    """Run ``tier``'s end-of-step hook and take its finished jobs every ``poll_s`` seconds until every
    job in ``ids`` is reported (``ids`` is emptied); True if all of them succeeded."""
    ok = True
    while ids:
        tier.on_step_end()
        for r in tier.get_finished_jobs():
            ids.discard(r.job_id)
            ok &= r.success
        time.sleep(poll_s)
    return ok
