"""``LatencySecondary``: a secondary tier whose jobs and lookups take longer, truthfully (KIT-15).

Re-exported by :mod:`kvproto.testing.faults`; built on :class:`kvproto.tierkit.ForwardingSecondary`.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TypeVar

import kvproto.members as lr
from kvproto._async_probe import AsyncProbe
from kvproto._capabilities import Capabilities
from kvproto._jobs import JobResult, TransferJob
from kvproto._keys import OffloadKey
from kvproto._protocols import SecondaryTier
from kvproto._requests import ReqContext
from kvproto._results import LookupResult, unreachable
from kvproto.errors import ConfigurationError, ContractViolation, InvalidArgumentError
from kvproto.testing._faults.rules import check_count, check_job, fault_log
from kvproto.tierkit._forwarding import ForwardingSecondary

__all__ = ["LatencySecondary"]

_S = TypeVar("_S", bound=SecondaryTier)


class LatencySecondary(ForwardingSecondary[_S]):
    """A secondary tier whose jobs and lookups take longer: ``inner``, slowed down, truthfully.

    * ``job_steps`` (int >= 0): a submitted job is handed to ``inner`` at the
      ``job_steps``-th :meth:`on_step_end` after its submission (0: at once),
      then reported whenever ``inner`` reports it. A store's rows are
      therefore read, and a load's rows written, no earlier than that hook.
      Jobs are handed over in submission order.
    * ``job_latency_s`` (float >= 0): once a job is due (above), it is handed
      to ``inner`` by the first :meth:`on_step_end` or
      :meth:`get_finished_jobs` at least ``job_latency_s`` seconds later, by
      ``clock`` (no thread: a job waiting on the clock is handed over, and a
      synchronous ``inner``'s result reported, when the caller polls).
    * ``lookup_steps`` (int >= 0): a key asked for the first time answers
      RETRY until ``lookup_steps`` :meth:`on_step_end` calls later, then
      ``inner``'s own answer, asked afresh on every lookup (never a cached
      verdict, so an eviction or a failed store shows at once). ``inner`` is
      asked on every lookup, RETRY or not, so its own asynchronous checks
      start at once. The gate is an :class:`~kvproto.async_lookup.AsyncProbe`
      run inline: a key is gated again once every request that asked for it
      has finished (``on_request_finished``, AP-4), after a successful
      ``reset_cache``, and after :meth:`shutdown` a key never asked answers
      MISS (AP-8).
    * ``clock``: the time source of ``job_latency_s`` (tests inject one).

    ``capabilities`` are ``inner``'s (absent where ``inner`` declares none), with
    ``async_lookup=True`` and ``max_retry_steps = lookup_steps + inner's
    max_retry_steps`` when ``lookup_steps > 0`` (a bound that holds whatever
    ``inner`` does; then declared over any ``inner``).
    ``lookup_many`` exists only when ``inner`` offers it (TIER-17), and answers
    as :meth:`lookup` does, key by key. ``name``, ``touch`` and
    ``take_events`` are ``inner``'s.

    A job held by the wrapper is pending work (TIER-15): ``reset_cache``
    answers False while one is. :meth:`shutdown` fails every job still held
    (reported by the next :meth:`get_finished_jobs`) and shuts ``inner`` down;
    jobs submitted afterwards go straight to ``inner``. If ``inner`` raises
    when a held job is handed to it, that job fails (logged at WARNING).
    """

    def __init__(
        self,
        inner: _S,
        *,
        job_steps: int = 0,
        job_latency_s: float = 0.0,
        lookup_steps: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        owner = f"LatencySecondary({inner.name!r})"
        self._owner = owner
        self._job_steps = check_count(owner, "job_steps", job_steps, low=0)
        self._lookup_steps = check_count(owner, "lookup_steps", lookup_steps, low=0)
        if type(job_latency_s) not in (int, float) or not (
            math.isfinite(job_latency_s) and job_latency_s >= 0
        ):
            raise ConfigurationError(f"{owner}: job_latency_s must be a finite number >= 0, got {job_latency_s!r}")
        self._latency_s = float(job_latency_s)
        self._clock = clock
        self._step = 0
        self._closed = False
        self._waiting: deque[tuple[int, TransferJob]] = deque()  # (due step, job), submission order
        self._timed: deque[tuple[float, TransferJob]] = deque()  # (ready at, job), due order
        self._held_ids: set[int] = set()
        self._failed: list[JobResult] = []  # held jobs failed by the wrapper, not yet reported
        self._probe: AsyncProbe | None = None
        if self._lookup_steps > 0:
            self._probe = AsyncProbe(
                _everything,
                name=f"{inner.name}/latency",
                deadline_steps=self._lookup_steps,
                resolve_after_steps=self._lookup_steps,
                background=False,
            )
        super().__init__(inner)

    def _wrap_capabilities(self, inner: Capabilities | None) -> Capabilities | None:
        """``inner``'s, with ``async_lookup`` and a ``max_retry_steps`` that adds ``lookup_steps``
        when ``lookup_steps > 0`` (TIER-18)."""
        steps = self._lookup_steps
        if steps == 0:
            return inner
        base = inner if inner is not None else Capabilities()
        return replace(
            base,
            async_lookup=True,
            max_retry_steps=steps + (base.max_retry_steps if base.async_lookup else 0),
            reasons={k: v for k, v in base.reasons.items() if k != "async_lookup"},
        )

    @property
    def step_driven(self) -> bool:
        """``inner``'s declaration, and no ``job_latency_s``: the steps it adds wait on no clock (MGR-22)."""
        return self._latency_s == 0.0 and super().step_driven

    # -- SecondaryTier -------------------------------------------------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """RETRY while the key's gate is closed, else ``inner``'s answer (see ``lookup_steps``)."""
        return self._gate(key, req_context, self._inner.lookup(key, req_context))

    def _lookup_many(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> list[LookupResult]:
        """``inner.lookup_many``, each answer through the key's gate (TIER-17); offered only when
        ``inner`` offers ``lookup_many``."""
        keys = list(keys)
        answers = super()._lookup_many(keys, req_context)
        gate = self._gate
        return [gate(k, req_context, a) for k, a in zip(keys, answers, strict=True)]

    def submit_store(self, job: TransferJob) -> None:
        """Hold the job until it is due (``job_steps``, ``job_latency_s``), then ``inner.submit_store``."""
        self._submit(check_job(self._owner, job, promotion=False))

    def submit_load(self, job: TransferJob) -> None:
        """Hold the job until it is due (``job_steps``, ``job_latency_s``), then ``inner.submit_load``."""
        self._submit(check_job(self._owner, job, promotion=True))

    def get_finished_jobs(self) -> Sequence[JobResult]:
        """Hand over the jobs whose wall-clock wait is over, then report the wrapper's failed jobs and ``inner``'s."""
        self._hand_over_timed()
        inner = self._inner.get_finished_jobs()  # if this raises, the wrapper's own results stay for next time
        failed, self._failed = self._failed, []
        return [*failed, *inner]

    # -- TierLifecycle -------------------------------------------------------------------

    def on_request_finished(self, req_context: ReqContext) -> None:
        """``inner.on_request_finished``; the request's lookup gates are dropped (AP-4)."""
        self._inner.on_request_finished(req_context)
        if self._probe is not None:
            self._probe.on_request_finished(req_context)

    def on_step_end(self) -> None:
        """``inner.on_step_end``, then advance the lookup gates and hand over the jobs now due."""
        self._step += 1
        self._inner.on_step_end()
        if self._probe is not None:
            self._probe.on_step_end()
        waiting = self._waiting
        while waiting and waiting[0][0] <= self._step:
            _, job = waiting.popleft()
            if self._latency_s > 0.0:
                self._timed.append((self._clock() + self._latency_s, job))
            else:
                self._hand_over(job)
        self._hand_over_timed()

    def has_pending_work(self) -> bool:
        """True while the wrapper holds or owes a report for a job, or ``inner`` has pending work."""
        return bool(self._held_ids) or bool(self._failed) or self._inner.has_pending_work()

    def reset_cache(self) -> bool:
        """False while the wrapper holds a job; else ``inner.reset_cache``, and on True the gates are reset."""
        if self._held_ids or self._failed:
            return False
        done = self._inner.reset_cache()
        if done is True and self._probe is not None:
            self._probe.reset()
        return done

    def shutdown(self) -> None:
        """Fail every held job (reported by the next ``get_finished_jobs``), then shut ``inner`` down. Idempotent."""
        self._closed = True
        for _, job in (*self._waiting, *self._timed):
            self._failed.append(JobResult(job.job_id, False))
        self._waiting.clear()
        self._timed.clear()
        self._held_ids.clear()
        self._inner.shutdown()
        if self._probe is not None:
            self._probe.shutdown()

    # -- internals -----------------------------------------------------------------------

    def _gate(self, key: OffloadKey, req_context: ReqContext, answer: LookupResult) -> LookupResult:
        probe = self._probe
        if probe is None:
            return answer
        match probe.lookup(key, req_context):
            case lr.RETRY:
                return lr.RETRY
            case lr.HIT:  # the gate is open: the inner tier's live answer
                return answer
            case lr.MISS:  # closed for good (after shutdown): MISS is always safe
                return lr.MISS
            case lr.HIT_PENDING:
                raise ContractViolation(f"{self._owner}: its lookup gate answered HIT_PENDING for {key!r}")
            case _ as other:
                unreachable(other, where=f"{self._owner}.lookup gate")

    def _submit(self, job: TransferJob) -> None:
        if self._closed or (self._job_steps == 0 and self._latency_s == 0.0):
            self._send(job)
            return
        if job.job_id in self._held_ids:
            raise InvalidArgumentError(f"{self._owner}: job id {job.job_id} is already in flight")
        self._held_ids.add(job.job_id)
        if self._job_steps > 0:
            self._waiting.append((self._step + self._job_steps, job))
        else:
            self._timed.append((self._clock() + self._latency_s, job))

    def _send(self, job: TransferJob) -> None:
        if job.promotion:
            self._inner.submit_load(job)
        else:
            self._inner.submit_store(job)

    def _hand_over_timed(self) -> None:
        timed = self._timed
        if not timed:
            return
        now = self._clock()
        while timed and timed[0][0] <= now:
            _, job = timed.popleft()
            self._hand_over(job)

    def _hand_over(self, job: TransferJob) -> None:
        self._held_ids.discard(job.job_id)
        try:
            self._send(job)
        except Exception:
            fault_log.warning(
                "%s: the inner tier raised when job %d was handed to it; the job fails",
                self._owner,
                job.job_id,
                exc_info=True,
            )
            self._failed.append(JobResult(job.job_id, False))


def _everything(keys: Sequence[OffloadKey]) -> Sequence[OffloadKey]:
    """The lookup gate's check: every key 'exists', so a resolved gate means 'open'."""
    return keys
