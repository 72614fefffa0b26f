"""Waiting for a tier's jobs, or a raw client's futures, as an engine's scheduler does: it never blocks on
them, it looks at what finished once per step."""

from __future__ import annotations

import time
from collections.abc import Iterable
from concurrent.futures import Future

from kvproto import SecondaryTier

__all__ = ["poll_futures", "wait_all"]


def wait_all(tier: SecondaryTier, ids: set[int], poll_s: float) -> bool:
    """Run ``tier``'s end-of-step hook and take its finished jobs every ``poll_s`` seconds until every
    job in ``ids`` is reported (``ids`` is emptied); True if all of them succeeded."""
    ok = True
    while ids:
        tier.on_step_end()
        for r in tier.get_finished_jobs():
            ids.discard(r.job_id)
            ok &= r.success
        if ids:
            time.sleep(poll_s)
    return ok


def poll_futures(futures: Iterable[Future[bool]], poll_s: float) -> bool:
    """A raw client's jobs waited for as :func:`wait_all` waits for a tier's: every ``poll_s`` seconds the
    scheduler's thread looks at which futures are done and takes their results, never blocking on one (an
    engine's scheduler thread cannot: it has the next step to run); True if every one answered True."""
    pending = list(futures)
    ok = True
    while pending:
        running = []
        for future in pending:
            if future.done():
                ok &= future.result()
            else:
                running.append(future)
        pending = running
        if pending:
            time.sleep(poll_s)
    return ok
