"""A secondary tier that counts what passes through it: :class:`MeteredSecondary` (feeds ``kvproto.metrics``).

It is a :class:`~kvproto.tierkit.ForwardingSecondary`: every call goes to the
inner tier unchanged; answers and job results are counted in a
:class:`~kvproto.metrics.TierFigures`. The manager's own lookup path is not
touched: a primary HIT never reaches a secondary, so a stack whose blocks sit
in the primary runs at the same speed with or without metrics (``kvproto bench
tiering`` measures both side by side).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from kvproto import members as lr
from kvproto._events import EventKind, OffloadingEvent
from kvproto._jobs import JobResult, TransferJob
from kvproto._keys import OffloadKey
from kvproto._protocols import SecondaryTier
from kvproto._requests import ReqContext
from kvproto._results import LookupResult
from kvproto.metrics._figures import TierFigures
from kvproto.tierkit import ForwardingSecondary

__all__ = ["MeteredSecondary"]

# job id -> (monotonic time submitted, step submitted, promotion, keys)
_Started = tuple[float, int, bool, int]


class MeteredSecondary(ForwardingSecondary[SecondaryTier]):
    """``inner`` with its lookups, jobs and evictions counted in :attr:`figures` (TIER-4, TIER-10, TIER-11).

    ``block_bytes`` turns keys into bytes; ``deadline_steps`` is the manager's
    ``job_deadline_steps`` (a job reported that late, or unreported that long,
    counts as timed out). Its state is bounded by the jobs in flight, and by
    ``max_jobs`` for a tier that never reports (the oldest are then counted
    timed out and forgotten). Answers, jobs and results are never changed.
    """

    def __init__(
        self,
        inner: SecondaryTier,
        *,
        block_bytes: int,
        deadline_steps: int,
        figures: TierFigures | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_jobs: int = 65_536,
    ) -> None:
        super().__init__(inner)
        self.figures = figures if figures is not None else TierFigures(inner.name)
        self._inner_lookup = inner.lookup  # bound once: the lookup path is hot
        self._block_bytes = block_bytes
        self._deadline = deadline_steps
        self._clock = clock
        self._max_jobs = max_jobs
        self._step = 0
        self._started: OrderedDict[int, _Started] = OrderedDict()
        self._error: BaseException | None = None

    # ------------------------------------------------------------------ lookups

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """``inner.lookup``, its answer counted (TIER-4)."""
        result = self._inner_lookup(key, req_context)
        figures = self.figures
        if result is lr.MISS:
            figures.lookups_miss += 1
        elif result is lr.HIT:
            figures.lookups_hit += 1
        elif result is lr.RETRY:
            figures.lookups_retry += 1
        return result

    def _lookup_many(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> list[LookupResult]:
        """``inner.lookup_many``, each answer counted (TIER-17)."""
        results = super()._lookup_many(keys, req_context)
        figures = self.figures
        figures.lookups_hit += results.count(lr.HIT)
        figures.lookups_miss += results.count(lr.MISS)
        figures.lookups_retry += results.count(lr.RETRY)
        return results

    # ------------------------------------------------------------------ jobs

    def submit_store(self, job: TransferJob) -> None:
        """``inner.submit_store``; the job is timed from now (TIER-10)."""
        self._submit(job, super().submit_store)

    def submit_load(self, job: TransferJob) -> None:
        """``inner.submit_load``; the job is timed from now (TIER-10)."""
        self._submit(job, super().submit_load)

    def _submit(self, job: TransferJob, submit: Callable[[TransferJob], None]) -> None:
        """Time ``job`` from now and submit it; a submission that raises is forgotten (the manager fails it)."""
        self._begin(job)
        try:
            submit(job)
        except BaseException:
            self._forget(job)
            raise

    def get_finished_jobs(self) -> Sequence[JobResult]:
        """``inner.get_finished_jobs``, each result counted (TIER-11).

        A tier whose results come from an iterator that raises midway: the
        results taken before the raise are returned now and the error is
        raised on the next call, so nothing the tier reported is lost (MGR-4).
        """
        error, self._error = self._error, None
        if error is not None:
            raise error
        taken: list[JobResult] = []
        try:
            for result in super().get_finished_jobs():
                taken.append(result)
        except Exception as exc:
            if not taken:
                raise
            self._error = exc
        now = self._clock()
        for result in taken:
            if isinstance(result, JobResult):
                self._end(result, now)
        return taken

    def _begin(self, job: TransferJob) -> None:
        figures = self.figures
        (figures.load if job.promotion else figures.store).begin(len(job.keys))
        started = self._started
        started[job.job_id] = (self._clock(), self._step, job.promotion, len(job.keys))
        while len(started) > self._max_jobs:
            _, (_, _, promotion, keys) = started.popitem(last=False)
            direction = figures.load if promotion else figures.store
            direction.inactive(keys)
            direction.timed_out += 1

    def _forget(self, job: TransferJob) -> None:
        begun = self._started.pop(job.job_id, None)
        if begun is not None:
            figures = self.figures
            (figures.load if begun[2] else figures.store).inactive(begun[3])

    def _end(self, result: JobResult, now: float) -> None:
        begun = self._started.pop(result.job_id, None)
        if begun is None:
            return  # not a job we saw submitted (the manager judges it, TIER-11)
        since, step, promotion, keys = begun
        figures = self.figures
        direction = figures.load if promotion else figures.store
        direction.inactive(keys)
        ok = keys if result.success else (len(result.succeeded) if result.succeeded is not None else 0)
        elapsed = now - since
        direction.end(ok, self._block_bytes, elapsed, success=result.success, late=self._step - step >= self._deadline)
        if promotion:
            (figures.promotion_latency_ok if result.success else figures.promotion_latency_failed).observe(elapsed)

    # ------------------------------------------------------------------ steps and events

    def on_step_end(self) -> None:
        """``inner.on_step_end``; counts the step (TIER-13)."""
        self._step += 1
        super().on_step_end()

    def take_events(self) -> Sequence[OffloadingEvent]:
        """``inner.take_events``; REMOVED keys counted as evictions (TIER-14)."""
        events = super().take_events()
        for event in events:
            if event.kind is EventKind.REMOVED:
                self.figures.evicted_blocks += len(event.keys)
        return events

    def unreported_past_deadline(self) -> tuple[int, int]:
        """(store jobs, load jobs) submitted ``deadline_steps`` or more steps ago and not yet reported."""
        oldest = self._step - self._deadline
        stores = loads = 0
        for _, step, promotion, _ in list(self._started.values()):
            if step > oldest:
                break
            if promotion:
                loads += 1
            else:
                stores += 1
        return stores, loads
