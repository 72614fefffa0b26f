"""Jobs of :class:`~kvproto.tierkit.BlobTier`: a job's keys fan out over a bounded worker pool, or a loop.

A job of many blocks uses every thread of its pool (the manager sends one
job per request and step); it ends when its last key does. Over an
asynchronous backend (not wrapped) a job is one task on the backend's event
loop instead: its keys' operations are gathered there, at most a
semaphore's worth in flight (:func:`run_job_on_loop`): no thread hand-off
per operation. The result is a :class:`JobOutcome` the scheduler's thread
applies when it reports the job.

With a job timeout (``BlobTierConfig.job_timeout_s``) a job ends by then
whatever its storage does (MGR-17): on the pools, keys not started by the
deadline fail without I/O (keys running finish within their operation's
bound); on the loop, the operations still running are cancelled, and the
job ends once they have unwound, so nothing writes a slot after its report.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from kvproto._jobs import TransferJob
from kvproto._keys import OffloadKey
from kvproto.tierkit._blob_async import LoopBackend
from kvproto.tierkit._blob_ops import KeyVerdict

__all__ = ["AsyncKeyRun", "JobOutcome", "KeyRun", "failed_outcome", "run_job", "run_job_on_loop"]

_log = logging.getLogger("kvproto.tierkit")

KeyRun = Callable[[OffloadKey, int], tuple[KeyVerdict, int]]
"""One key's operation: ``(key, slot) -> (verdict, tick)`` (a :class:`~kvproto.tierkit._blob_ops.BlobOps` method)."""

AsyncKeyRun = Callable[[LoopBackend, OffloadKey, int], Awaitable[tuple[KeyVerdict, int]]]
"""One key's operation on the loop: ``(io, key, slot) -> (verdict, tick)`` (``BlobOps.store_async``, ``load_async``)."""


@dataclass(slots=True)
class JobOutcome:
    """Each key's verdict and tick, in the job's order; ``since``: the tick when the job was submitted."""

    job: TransferJob
    since: int
    verdicts: list[tuple[KeyVerdict, int]]


def failed_outcome(job: TransferJob, since: int, verdict: KeyVerdict) -> Future[JobOutcome]:
    """A finished future where every key of ``job`` ended with ``verdict`` (refused, or after shutdown)."""
    done: Future[JobOutcome] = Future()
    done.set_result(JobOutcome(job, since, [(verdict, since)] * len(job.keys)))
    return done


def run_job(
    job: TransferJob,
    since: int,
    pool: ThreadPoolExecutor,
    run_key: KeyRun,
    *,
    tier_name: str,
    timeout_s: float | None = None,
) -> Future[JobOutcome]:
    """Start ``job``'s keys on ``pool``; with ``timeout_s``, a key not started that long after now fails
    without I/O."""
    failed = KeyVerdict.TRANSIENT if job.promotion else KeyVerdict.FAILED
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    verdicts: list[tuple[KeyVerdict, int]] = [(failed, since)] * len(job.keys)
    todo = list(range(len(job.keys)))
    done: Future[JobOutcome] = Future()
    if not todo:
        done.set_result(JobOutcome(job, since, verdicts))
        return done
    remaining = [len(todo)]
    guard = threading.Lock()

    def one(i: int) -> None:
        try:
            if deadline is not None and time.monotonic() > deadline:
                verdict = (failed, since)  # the job's time is up: no I/O (MGR-17)
            else:
                verdict = run_key(job.keys[i], job.slots[i])
        except Exception:  # a bug in a backend wrapper or the engine: that key fails, the job still ends
            _log.warning("BlobTier %r: job %d raised on key %d; it fails", tier_name, job.job_id, i, exc_info=True)
            verdict = (failed, since)
        with guard:
            verdicts[i] = verdict
            remaining[0] -= 1
            last = remaining[0] == 0
        if last:
            done.set_result(JobOutcome(job, since, verdicts))

    for i in todo:  # the tier never calls this after shutting its pools down
        pool.submit(one, i)
    return done


def run_job_on_loop(
    job: TransferJob,
    since: int,
    io: LoopBackend,
    run_key: AsyncKeyRun,
    bound: asyncio.Semaphore,
    *,
    tier_name: str,
    timeout_s: float | None = None,
) -> Future[JobOutcome]:
    """Start ``job``'s keys as one task on ``io``'s loop, ``bound`` operations at a time.

    The future is completed from the loop when the last key ends; a key whose
    operation raised (a bug: backend errors are verdicts) fails alone. With
    ``timeout_s``, the keys still running then are cancelled and fail; the
    future completes after they unwound. ``ConnectionError`` if the loop is closed.
    """
    failed = KeyVerdict.TRANSIENT if job.promotion else KeyVerdict.FAILED
    verdicts: list[tuple[KeyVerdict, int]] = [(failed, since)] * len(job.keys)  # kept by a key the timeout cancels
    todo = list(range(len(job.keys)))
    if not todo:
        done: Future[JobOutcome] = Future()
        done.set_result(JobOutcome(job, since, verdicts))
        return done

    async def one(i: int) -> None:
        async with bound:
            try:
                verdicts[i] = await run_key(io, job.keys[i], job.slots[i])
            except Exception:
                _log.warning("BlobTier %r: job %d raised on key %d; it fails", tier_name, job.job_id, i,
                             exc_info=True)
                verdicts[i] = (failed, since)

    async def whole() -> JobOutcome:
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.gather(*(one(i) for i in todo))
        except TimeoutError:
            _log.warning("BlobTier %r: job %d ran past its %g s timeout; its unfinished keys fail", tier_name,
                         job.job_id, timeout_s)
        return JobOutcome(job, since, verdicts)

    return io.submit(whole())
