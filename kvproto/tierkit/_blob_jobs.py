"""Jobs of :class:`~kvproto.tierkit.BlobTier`: a job's keys fan out over a bounded worker pool, or a loop.

A job of many blocks uses every thread of its pool (the manager sends one
job per request and step); it ends when its last key does. Over an
asynchronous backend (not wrapped) a job is one task on the backend's event
loop instead: its keys' operations are gathered there, at most a
semaphore's worth in flight (:func:`run_job_on_loop`): no thread hand-off
per operation. A store over a backend offering
:class:`~kvproto.tierkit.PublishBatches` goes in runs of keys instead, each
run one pool task and one request (TIERKIT-11). The result is a
:class:`JobOutcome` the scheduler's thread applies when it reports the job.

With a job timeout (``BlobTierConfig.job_timeout_s``) a job ends by then
(a deadline counted from its submission) whatever its storage does (MGR-17): on the pools, keys not started by the
deadline fail without I/O (keys running finish within their operation's
bound); on the loop, the operations still running are cancelled, and the
job ends once they have unwound, so nothing writes a slot after its report.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from kvproto._jobs import TransferJob
from kvproto._keys import OffloadKey
from kvproto.tierkit._blob_async import LoopBackend
from kvproto.tierkit._blob_ops import KeyVerdict

__all__ = [
    "AsyncKeyRun", "BatchRun", "JobOutcome", "KeyRun", "failed_outcome", "key_runs", "run_job", "run_job_on_loop", "start_job",
]

_log = logging.getLogger("kvproto.tierkit")

KeyRun = Callable[[OffloadKey, int], tuple[KeyVerdict, int]]
"""One key's operation: ``(key, slot) -> (verdict, tick)`` (a :class:`~kvproto.tierkit._blob_ops.BlobOps` method)."""

BatchRun = Callable[[Sequence[OffloadKey], Sequence[int]], list[tuple[KeyVerdict, int]]]
"""A run of keys' operations in one go: ``(keys, slots) -> [(verdict, tick)]``, one per key, in order (TIERKIT-11)."""

AsyncKeyRun = Callable[[LoopBackend, OffloadKey, int], Awaitable[tuple[KeyVerdict, int]]]
"""One key's operation on the loop: ``(io, key, slot) -> (verdict, tick)`` (``BlobOps.store_async``, ``load_async``)."""


@dataclass(slots=True)
class JobOutcome:
    """Each key's verdict and tick, in the job's order; ``since``: the tick when the job was submitted."""

    job: TransferJob
    since: int
    verdicts: list[tuple[KeyVerdict, int]]


def failed_outcome(job: TransferJob, since: int, verdict: KeyVerdict, done: Future[JobOutcome] | None = None
                   ) -> Future[JobOutcome]:
    """``done`` (a new future if None), completed now: every key of ``job`` ended with ``verdict``
    (refused, after shutdown, or the job could not be started)."""
    done = Future() if done is None else done
    if not done.done():
        done.set_result(JobOutcome(job, since, [(verdict, since)] * len(job.keys)))
    return done


def run_job(
    job: TransferJob,
    since: int,
    pool: ThreadPoolExecutor,
    run_key: KeyRun,
    *,
    tier_name: str,
    deadline: float | None = None,
    done: Future[JobOutcome] | None = None,
    batches: tuple[BatchRun, int] | None = None,
) -> Future[JobOutcome]:
    """Start ``job``'s keys on ``pool``; ``done`` (a new future if None) completes when the last one ends.
    With ``deadline`` (a ``time.monotonic()`` value), a key not started by then fails without I/O; a key
    the pool refuses (shut down) fails without I/O too. With ``batches`` ``(run_batch, most)``, the keys
    go in runs of at most ``most`` (as even as they divide), each run one task of ``pool`` that calls
    ``run_batch`` (a run of one key calls ``run_key``) (TIERKIT-11); otherwise each key is one task."""
    failed = KeyVerdict.TRANSIENT if job.promotion else KeyVerdict.FAILED
    done = Future() if done is None else done
    verdicts: list[tuple[KeyVerdict, int]] = [(failed, since)] * len(job.keys)
    if not job.keys:
        done.set_result(JobOutcome(job, since, verdicts))
        return done
    runs = key_runs(len(job.keys), 1 if batches is None else batches[1])
    remaining = [len(job.keys)]
    guard = threading.Lock()

    def ended(run: range, results: Sequence[tuple[KeyVerdict, int]]) -> None:
        with guard:
            verdicts[run.start : run.stop] = results
            remaining[0] -= len(run)
            last = remaining[0] == 0
        if last:
            done.set_result(JobOutcome(job, since, verdicts))

    def one(run: range) -> None:
        try:
            if deadline is not None and time.monotonic() > deadline:
                results = [(failed, since)] * len(run)  # the job's time is up: no I/O (MGR-17)
            elif batches is None or len(run) == 1:
                results = [run_key(job.keys[i], job.slots[i]) for i in run]
            else:
                results = batches[0](job.keys[run.start : run.stop], job.slots[run.start : run.stop])
                if len(results) != len(run):
                    raise RuntimeError(f"a batch of {len(run)} keys answered {len(results)} verdicts")
        except Exception:  # a bug in a backend wrapper or the engine: those keys fail, the job still ends
            _log.warning("BlobTier %r: job %d raised on keys %d..%d; they fail", tier_name, job.job_id, run.start,
                         run.stop - 1, exc_info=True)
            results = [(failed, since)] * len(run)
        ended(run, results)

    for run in runs:
        try:
            pool.submit(one, run)
        except RuntimeError:  # the pool is shut down (never while the tier runs): the keys fail unread
            ended(run, [(failed, since)] * len(run))
    return done


def key_runs(keys: int, most: int) -> list[range]:
    """``range(keys)`` cut into the fewest runs of at most ``most`` keys (``most`` < 1 counts as 1), their
    lengths differing by one at most: 20 keys by 16 are runs of 10 and 10."""
    count = -(-keys // max(1, most))
    size, extra = divmod(keys, count) if count else (0, 0)
    runs: list[range] = []
    start = 0
    for n in range(count):
        stop = start + size + (1 if n < extra else 0)
        runs.append(range(start, stop))
        start = stop
    return runs


def run_job_on_loop(
    job: TransferJob,
    since: int,
    io: LoopBackend,
    run_key: AsyncKeyRun,
    bound: asyncio.Semaphore,
    *,
    tier_name: str,
    deadline: float | None = None,
    done: Future[JobOutcome] | None = None,
) -> Future[JobOutcome]:
    """Start ``job``'s keys as one task on ``io``'s loop, ``bound`` operations at a time.

    ``done`` (a new future if None) is completed from the loop when the last key ends; a key whose
    operation raised (a bug: backend errors are verdicts) fails alone. With ``deadline`` (a
    ``time.monotonic()`` value, the loop's clock), the keys still running then are cancelled and fail;
    ``done`` completes after they unwound. If the loop is closed, or the task ends without an outcome,
    every key fails.
    """
    failed = KeyVerdict.TRANSIENT if job.promotion else KeyVerdict.FAILED
    done = Future() if done is None else done
    verdicts: list[tuple[KeyVerdict, int]] = [(failed, since)] * len(job.keys)  # kept by a key the timeout cancels
    todo = list(range(len(job.keys)))
    if not todo:
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
            async with asyncio.timeout_at(deadline):
                await asyncio.gather(*(one(i) for i in todo))
        except TimeoutError:
            _log.warning("BlobTier %r: job %d ran past its timeout; its unfinished keys fail", tier_name, job.job_id)
        return JobOutcome(job, since, verdicts)

    def settle(task: Future[JobOutcome]) -> None:
        if task.cancelled() or task.exception() is not None:
            failed_outcome(job, since, failed, done)
        elif not done.done():
            done.set_result(task.result())

    try:
        io.submit(whole()).add_done_callback(settle)
    except ConnectionError:  # the loop is closed: nothing ran
        failed_outcome(job, since, failed, done)
    return done


def start_job(launch: Callable[[], object], job: TransferJob, since: int, future: Future[JobOutcome]) -> None:
    """Dispatcher thread (TIERKIT-9): start a job with ``launch``; if starting it raised (a bug), every key
    fails and the job still ends."""
    try:
        launch()
    except Exception:
        _log.warning("BlobTier: starting job %d failed; its keys fail", job.job_id, exc_info=True)
        failed_outcome(job, since, KeyVerdict.TRANSIENT if job.promotion else KeyVerdict.FAILED, future)
