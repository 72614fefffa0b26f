"""Fault-injection and latency wrappers over any secondary or primary tier.

Each wrapper holds an ``inner`` tier, satisfies the same structural protocol
(:class:`~kvproto.SecondaryTier` or :class:`~kvproto.PrimaryTier`) and
forwards every call to ``inner`` except where one of its knobs says
otherwise, so the knobs work over MemoryTier, a file tier, an object-store
tier or any out-of-tree tier alike:

* :class:`LatencySecondary`: jobs that take N end-of-step hooks and/or
  ``job_latency_s`` seconds, lookups that answer RETRY for N hooks. A
  truthful tier stays truthful under it (it passes the conformance kit).
* :class:`FaultySecondary`: failing jobs and keys, damaged reads (broken and
  honest variants), exceptions from chosen methods, job reports that come
  late, twice or never.
* :class:`FaultyPrimary`: exceptions from chosen methods and
  ``complete_store`` calls that land late or never. There is no lookup
  latency for a primary: a primary never answers RETRY (LR-4), so a primary
  that "has not found out yet" is a contract break, not a fault to inject.

They compose, the outer wrapper seeing the inner one as its tier::

    tier = FaultySecondary(LatencySecondary(MemoryTier(buffer), job_steps=2), buffer=buffer)

Order matters: a job :class:`FaultySecondary` fails itself (``fail_next_jobs``,
or every key failed by ``fail_keys``) never reaches the tier inside it, so it
is reported at the next ``get_finished_jobs`` whatever latency lies inside;
put the :class:`LatencySecondary` outside to give failed jobs the same latency.

Every wrapper is driven from the scheduler's thread, like the tier it wraps,
and starts no thread of its own: wall-clock latency is checked when
``on_step_end`` or ``get_finished_jobs`` is called. Its state is bounded by
the jobs in flight and by what a test arms (keys, counts); lookup latency
keeps its verdicts in an :class:`~kvproto.async_lookup.AsyncProbe`, whose
entries go when the last request that asked for them finishes (AP-4).

This module imports neither pytest nor Hypothesis.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Generic, TypeAlias, TypeVar

import kvproto.members as lr
from kvproto._capabilities import Capabilities
from kvproto._async_probe import AsyncProbe
from kvproto._events import OffloadingEvent
from kvproto._jobs import JobResult, PrepareStoreOutput, TransferJob
from kvproto._requests import ReqContext
from kvproto._keys import OffloadKey
from kvproto._protocols import BatchLookup, PrimaryTier, SecondaryTier
from kvproto._results import LookupResult, unreachable
from kvproto.errors import ConfigurationError, ContractViolation, InvalidArgumentError

__all__ = [
    "PRIMARY_METHODS",
    "SECONDARY_METHODS",
    "FaultyPrimary",
    "FaultySecondary",
    "LatencySecondary",
    "RaiseRule",
]

_log = logging.getLogger("kvproto.testing.faults")

_S = TypeVar("_S", bound=SecondaryTier)
_P = TypeVar("_P", bound=PrimaryTier)

RaiseRule: TypeAlias = BaseException | Callable[..., BaseException | None]
"""What a wrapper raises from a chosen method.

An exception instance is raised on every call (its traceback reset each
time). A callable (an exception class qualifies) is called with the method's
arguments, e.g. ``(key, req_context)`` for ``lookup``; it may raise, return
an exception for the wrapper to raise, or return ``None`` to let the call
through to the inner tier.
"""

_LIFECYCLE = (
    "on_request_finished",
    "on_step_end",
    "take_events",
    "has_pending_work",
    "reset_cache",
    "shutdown",
)
SECONDARY_METHODS: frozenset[str] = frozenset(
    ("lookup", "lookup_many", "touch", "submit_store", "submit_load", "get_finished_jobs", *_LIFECYCLE)
)
"""The methods of a secondary tier a :class:`FaultySecondary` can raise from."""

PRIMARY_METHODS: frozenset[str] = frozenset(
    (
        "lookup",
        "lookup_many",
        "touch",
        "prepare_store",
        "complete_store",
        "prepare_load",
        "complete_load",
        *_LIFECYCLE,
    )
)
"""The methods of a primary tier a :class:`FaultyPrimary` can raise from."""

_FLIP = bytes(b ^ 0xFF for b in range(256))  # bytes.translate table: every bit of a block inverted


def _capabilities_of(tier: object) -> Capabilities:
    """The tier's own ``capabilities`` attribute, else none declared (as the kit reads it, KIT-4)."""
    found = getattr(tier, "capabilities", None)
    return found if isinstance(found, Capabilities) else Capabilities()


def _count(owner: str, what: str, value: object, *, low: int) -> int:
    if type(value) is not int or value < low:
        raise ConfigurationError(f"{owner}: {what} must be an int >= {low}, got {value!r}")
    return value


def _check_job(owner: str, job: object, *, promotion: bool) -> TransferJob:
    if not isinstance(job, TransferJob):
        raise InvalidArgumentError(f"{owner}: expected a TransferJob, got {type(job).__name__}")
    if job.promotion is not promotion:
        method = "submit_load" if promotion else "submit_store"
        raise InvalidArgumentError(f"{owner}: {method} got job {job.job_id} with promotion={job.promotion}")
    return job


class _RaiseRules:
    """The armed :data:`RaiseRule` per method name, checked before a call is forwarded."""

    def __init__(self, owner: str, allowed: frozenset[str], offered: Callable[[str], bool]) -> None:
        self._owner = owner
        self._allowed = allowed
        self._offered = offered
        self._rules: dict[str, RaiseRule] = {}

    def set(self, method: str, rule: RaiseRule | None) -> None:
        if method not in self._allowed:
            raise ConfigurationError(
                f"{self._owner}: cannot raise from {method!r}; choose one of {', '.join(sorted(self._allowed))}"
            )
        if not self._offered(method):
            raise ConfigurationError(f"{self._owner}: cannot raise from {method!r}: the inner tier has no such method")
        if rule is None:
            self._rules.pop(method, None)
            return
        if not isinstance(rule, BaseException) and not callable(rule):
            raise ConfigurationError(
                f"{self._owner}: the rule for {method!r} must be an exception or a callable, got {rule!r}"
            )
        self._rules[method] = rule

    def clear(self) -> None:
        self._rules.clear()

    def check(self, method: str, *args: object) -> None:
        rule = self._rules.get(method)
        if rule is None:
            return
        if isinstance(rule, BaseException):
            raise rule.with_traceback(None)
        made = rule(*args)
        if made is not None:
            raise made


# ---------------------------------------------------------------------------------------------
# LatencySecondary
# ---------------------------------------------------------------------------------------------


class LatencySecondary(Generic[_S]):
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

    ``capabilities`` are ``inner``'s, with ``async_lookup=True`` and
    ``max_retry_steps = lookup_steps + inner's max_retry_steps`` when
    ``lookup_steps > 0`` (a bound that holds whatever ``inner`` does).
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
        self._job_steps = _count(owner, "job_steps", job_steps, low=0)
        lookup_steps = _count(owner, "lookup_steps", lookup_steps, low=0)
        if type(job_latency_s) not in (int, float) or not (
            math.isfinite(job_latency_s) and job_latency_s >= 0
        ):
            raise ConfigurationError(f"{owner}: job_latency_s must be a finite number >= 0, got {job_latency_s!r}")
        self._latency_s = float(job_latency_s)
        self._inner = inner
        self._clock = clock
        self._step = 0
        self._closed = False
        self._waiting: deque[tuple[int, TransferJob]] = deque()  # (due step, job), submission order
        self._timed: deque[tuple[float, TransferJob]] = deque()  # (ready at, job), due order
        self._held_ids: set[int] = set()
        self._failed: list[JobResult] = []  # held jobs failed by the wrapper, not yet reported
        self._probe: AsyncProbe | None = None
        base = _capabilities_of(inner)
        if lookup_steps > 0:
            self._probe = AsyncProbe(
                _everything,
                name=f"{inner.name}/latency",
                deadline_steps=lookup_steps,
                resolve_after_steps=lookup_steps,
                background=False,
            )
            base = replace(
                base,
                async_lookup=True,
                max_retry_steps=lookup_steps + (base.max_retry_steps if base.async_lookup else 0),
                reasons={k: v for k, v in base.reasons.items() if k != "async_lookup"},
            )
        self.capabilities: Capabilities = base
        """``inner``'s capabilities, adjusted for ``lookup_steps`` (TIER-18)."""
        offered: object = inner  # a TypeVar does not narrow to a protocol intersection
        if isinstance(offered, BatchLookup):
            setattr(self, "lookup_many", _GatedLookupMany(self, offered))

    @property
    def inner(self) -> _S:
        """The wrapped tier."""
        return self._inner

    # -- SecondaryTier -------------------------------------------------------------------

    @property
    def name(self) -> str:
        """``inner``'s name (events carry it)."""
        return self._inner.name

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """RETRY while the key's gate is closed, else ``inner``'s answer (see ``lookup_steps``)."""
        return self._gate(key, req_context, self._inner.lookup(key, req_context))

    def touch(self, keys: Iterable[OffloadKey]) -> None:
        """``inner.touch``."""
        self._inner.touch(keys)

    def submit_store(self, job: TransferJob) -> None:
        """Hold the job until it is due (``job_steps``, ``job_latency_s``), then ``inner.submit_store``."""
        self._submit(_check_job(self._owner, job, promotion=False))

    def submit_load(self, job: TransferJob) -> None:
        """Hold the job until it is due (``job_steps``, ``job_latency_s``), then ``inner.submit_load``."""
        self._submit(_check_job(self._owner, job, promotion=True))

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

    def take_events(self) -> Sequence[OffloadingEvent]:
        """``inner.take_events`` (the wrapper invents none)."""
        return self._inner.take_events()

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
            _log.warning(
                "%s: the inner tier raised when job %d was handed to it; the job fails",
                self._owner,
                job.job_id,
                exc_info=True,
            )
            self._failed.append(JobResult(job.job_id, False))


def _everything(keys: Sequence[OffloadKey]) -> Sequence[OffloadKey]:
    """The lookup gate's check: every key 'exists', so a resolved gate means 'open'."""
    return keys


class _GatedLookupMany:
    """``LatencySecondary.lookup_many``: ``inner.lookup_many``, each answer through the gate."""

    def __init__(self, outer: LatencySecondary[_S], inner: BatchLookup) -> None:
        self._outer = outer
        self._inner = inner

    def __call__(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> list[LookupResult]:
        keys = list(keys)
        answers = self._inner.lookup_many(keys, req_context)
        gate = self._outer._gate
        return [gate(k, req_context, a) for k, a in zip(keys, answers, strict=True)]


# ---------------------------------------------------------------------------------------------
# FaultySecondary
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Report:
    """How a job's result reaches the caller: late by ``steps``, twice, or never (``dropped``)."""

    late_steps: int = 0
    twice: bool = False
    dropped: bool = False


@dataclass(frozen=True, slots=True)
class _Tracked:
    """What the wrapper must do with one job's result; kept only for jobs a fault touches."""

    job: TransferJob
    sent: TransferJob | None  # what went to the inner tier; None: failed by the wrapper
    failed: frozenset[OffloadKey]  # keys failed by fail_keys
    reads: tuple[tuple[OffloadKey, int], ...]  # (key, slot) of a load armed for corruption
    report: _Report | None


class FaultySecondary(Generic[_S]):
    """A secondary tier that misbehaves on demand: ``inner`` with faults armed by its methods.

    Unarmed, it is ``inner`` (every call forwarded). Knobs, each armed for
    jobs *submitted* after the call (a job in flight keeps what it had):

    * :meth:`fail_next_jobs` ``(n)``: the next ``n`` submitted jobs fail
      whole (``JobResult(id, False)``), never reaching ``inner``: no bytes
      move. ``n`` SETS the count (0 disarms); it does not add.
    * :meth:`fail_keys` ``(keys)``: ADDS ``keys`` to the failing keys. When
      ``inner`` declares ``partial_jobs``, a job touching them goes to
      ``inner`` without them (same id; the other keys and their slots) and
      its result names them failed and the others as ``inner`` reported them
      (a partial ``JobResult``). When ``inner`` reports jobs whole, such a
      job fails whole without reaching ``inner`` (a partial result would
      break the whole-job tier's own declaration, TIER-18). A job of failing
      keys only always fails whole without reaching ``inner``.
    * :meth:`corrupt_on_read` ``(keys, detect=False)``: the next load of each
      key that ``inner`` reports done has every bit of its slot inverted.
      ``detect=False`` is the broken tier: the load still reports the key
      done, serving wrong bytes (what the kit must catch, TIER-10).
      ``detect=True`` is an honest tier: the key is reported failed (the
      whole job, where ``inner`` does not declare ``partial_jobs``), its slot
      holding the damaged bytes, as a failed read may leave it. One shot per
      key; ``inner``'s copy is untouched, so a later load is right. Needs
      ``buffer``.
    * :meth:`raise_in` ``(method, rule)`` and ``raise_from={method: rule}``:
      ``method`` raises per :data:`RaiseRule` instead of reaching ``inner``
      (for ``lookup_many``, the rule of ``lookup`` applies too, key by key).
    * :meth:`report_late` ``(n, steps)``: the next ``n`` submitted jobs are
      reported ``steps`` :meth:`on_step_end` calls after ``inner`` reported
      them (at once after :meth:`shutdown`). Still pending work meanwhile.
    * :meth:`report_twice` ``(n)``: the next ``n`` submitted jobs are reported
      again, as the same ``JobResult``, by the next ``get_finished_jobs``.
    * :meth:`drop_reports` ``(n)``: the next ``n`` submitted jobs are never
      reported; the wrapper forgets them (no longer pending work), as a tier
      that lost track of a job would.
    * :meth:`clear_faults`: disarm everything.

    One report fault per job: dropped before late before twice; only the
    counter used is decremented. Counts SET (0 disarms).

    ``capabilities`` are ``inner``'s (no knob changes what the tier declares:
    ``fail_keys`` gives partial results only where ``inner`` declares
    ``partial_jobs``). ``lookup_many`` exists only when ``inner`` offers it.
    ``name``, ``take_events`` and the rest are ``inner``'s. State is kept only
    for jobs a fault touches, and is bounded by what is armed.
    """

    def __init__(
        self,
        inner: _S,
        *,
        buffer: memoryview | None = None,
        raise_from: Mapping[str, RaiseRule] | None = None,
    ) -> None:
        owner = f"FaultySecondary({inner.name!r})"
        self._owner = owner
        self._inner = inner
        self._flat: memoryview | None = None
        self._block_bytes = 0
        if buffer is not None:
            shape = buffer.shape or ()
            if len(shape) != 2 or buffer.format != "B" or buffer.readonly or not buffer.c_contiguous:
                raise ConfigurationError(
                    f"{owner}: buffer must be the primary's writable, C-contiguous 2-D memoryview of format 'B', "
                    f"got shape={shape} format={buffer.format!r} readonly={buffer.readonly}"
                )
            self._flat = buffer.cast("B")
            self._block_bytes = shape[1]
        offered: object = inner  # a TypeVar does not narrow to a protocol intersection
        batch = offered if isinstance(offered, BatchLookup) else None
        self._rules = _RaiseRules(
            owner, SECONDARY_METHODS, lambda m: m != "lookup_many" or batch is not None
        )
        for method, rule in (raise_from or {}).items():
            self._rules.set(method, rule)
        self._step = 0
        self._closed = False
        self._fail_next = 0
        self._fail_keys: set[OffloadKey] = set()
        self._corrupt: dict[OffloadKey, bool] = {}  # key -> detect
        self._late_next = 0
        self._late_steps = 0
        self._twice_next = 0
        self._drop_next = 0
        self._tracked: dict[int, _Tracked] = {}
        self._local: list[JobResult] = []  # jobs failed by the wrapper, not yet through _finish
        self._late: list[tuple[int, JobResult]] = []  # (release step, result)
        self._dupes: list[JobResult] = []  # reported once; again at the next get_finished_jobs
        self.capabilities: Capabilities = _capabilities_of(inner)
        """``inner``'s capabilities (TIER-18)."""
        if batch is not None:
            setattr(self, "lookup_many", _RaisingLookupMany(self._rules, batch))

    @property
    def inner(self) -> _S:
        """The wrapped tier."""
        return self._inner

    # -- knobs -----------------------------------------------------------------------------

    def fail_next_jobs(self, n: int) -> None:
        """The next ``n`` submitted jobs fail whole without reaching ``inner``; SETS the count (0 disarms)."""
        self._fail_next = _count(self._owner, "fail_next_jobs(n)", n, low=0)

    def fail_keys(self, keys: Iterable[OffloadKey]) -> None:
        """ADD ``keys`` to the keys every later job fails for: a partial result names the others where
        ``inner`` declares ``partial_jobs``; elsewhere the job fails whole."""
        self._fail_keys.update(keys)

    def corrupt_on_read(self, keys: Iterable[OffloadKey], *, detect: bool = False) -> None:
        """The next successful load of each of ``keys`` inverts its slot's bits; ``detect`` fails the key, else
        the load reports it done (a broken tier). Needs ``buffer``."""
        if self._flat is None:
            raise ConfigurationError(f"{self._owner}: corrupt_on_read needs the primary buffer (buffer=...)")
        for key in keys:
            self._corrupt[key] = detect

    def raise_in(self, method: str, rule: RaiseRule | None) -> None:
        """Make ``method`` raise per ``rule`` (a :data:`RaiseRule`) instead of reaching ``inner``; None clears it."""
        self._rules.set(method, rule)

    def report_late(self, n: int, steps: int) -> None:
        """The next ``n`` submitted jobs are reported ``steps`` (>= 1) hooks after ``inner`` reports them; SETS n."""
        self._late_steps = _count(self._owner, "report_late(steps)", steps, low=1)
        self._late_next = _count(self._owner, "report_late(n)", n, low=0)

    def report_twice(self, n: int) -> None:
        """The next ``n`` submitted jobs are reported again by the following ``get_finished_jobs``; SETS n."""
        self._twice_next = _count(self._owner, "report_twice(n)", n, low=0)

    def drop_reports(self, n: int) -> None:
        """The next ``n`` submitted jobs are never reported (and forgotten); SETS n."""
        self._drop_next = _count(self._owner, "drop_reports(n)", n, low=0)

    def clear_faults(self) -> None:
        """Disarm every knob: counts to 0, no failing or corrupt keys, no raise rules.

        Jobs already in flight keep the faults they were submitted with.
        """
        self._fail_next = self._late_next = self._twice_next = self._drop_next = 0
        self._fail_keys.clear()
        self._corrupt.clear()
        self._rules.clear()

    # -- SecondaryTier -------------------------------------------------------------------

    @property
    def name(self) -> str:
        """``inner``'s name (events carry it)."""
        return self._inner.name

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """``inner.lookup`` unless a rule raises."""
        self._rules.check("lookup", key, req_context)
        return self._inner.lookup(key, req_context)

    def touch(self, keys: Iterable[OffloadKey]) -> None:
        """``inner.touch`` unless a rule raises."""
        keys = tuple(keys)  # a rule may read them too
        self._rules.check("touch", keys)
        self._inner.touch(keys)

    def submit_store(self, job: TransferJob) -> None:
        """``inner.submit_store`` of the job, less its failing keys, unless a fault fails it first."""
        self._rules.check("submit_store", job)
        self._submit(_check_job(self._owner, job, promotion=False))

    def submit_load(self, job: TransferJob) -> None:
        """``inner.submit_load`` of the job, less its failing keys, unless a fault fails it first."""
        self._rules.check("submit_load", job)
        self._submit(_check_job(self._owner, job, promotion=True))

    def get_finished_jobs(self) -> Sequence[JobResult]:
        """Last call's duplicates, results whose lateness is over, then this call's results, faults applied."""
        self._rules.check("get_finished_jobs")
        out, self._dupes = self._dupes, []
        if self._late:
            due = [r for step, r in self._late if step <= self._step]
            self._late = [(step, r) for step, r in self._late if step > self._step]
            out.extend(due)
        local, self._local = self._local, []
        for result in (*local, *self._inner.get_finished_jobs()):
            out.extend(self._finish(result))
        return out

    # -- TierLifecycle -------------------------------------------------------------------

    def on_request_finished(self, req_context: ReqContext) -> None:
        """``inner.on_request_finished`` unless a rule raises."""
        self._rules.check("on_request_finished", req_context)
        self._inner.on_request_finished(req_context)

    def on_step_end(self) -> None:
        """Count the hook (for :meth:`report_late`), then ``inner.on_step_end``."""
        self._rules.check("on_step_end")
        self._step += 1
        self._inner.on_step_end()

    def take_events(self) -> Sequence[OffloadingEvent]:
        """``inner.take_events`` unless a rule raises."""
        self._rules.check("take_events")
        return self._inner.take_events()

    def has_pending_work(self) -> bool:
        """True while a job failed by the wrapper or held late is unreported, or ``inner`` has pending work."""
        self._rules.check("has_pending_work")
        return bool(self._local) or bool(self._late) or self._inner.has_pending_work()

    def reset_cache(self) -> bool:
        """False while the wrapper owes a report; else ``inner.reset_cache`` (on True, pending corruptions go)."""
        self._rules.check("reset_cache")
        if self._local or self._late:
            return False
        done = self._inner.reset_cache()
        if done is True:
            self._corrupt.clear()
        return done

    def shutdown(self) -> None:
        """``inner.shutdown``; late reports are due at once from now on. Idempotent (as ``inner`` is)."""
        self._rules.check("shutdown")
        self._closed = True
        self._inner.shutdown()
        self._late = [(0, r) for _, r in self._late]

    # -- internals -----------------------------------------------------------------------

    def _next_report(self) -> _Report | None:
        if self._drop_next > 0:
            self._drop_next -= 1
            return _Report(dropped=True)
        if self._late_next > 0:
            self._late_next -= 1
            return _Report(late_steps=self._late_steps)
        if self._twice_next > 0:
            self._twice_next -= 1
            return _Report(twice=True)
        return None

    def _submit(self, job: TransferJob) -> None:
        fail_all = self._fail_next > 0
        failing = self._fail_keys
        failed = frozenset(k for k in job.keys if k in failing) if failing else frozenset[OffloadKey]()
        sent: TransferJob | None = None
        reads: tuple[tuple[OffloadKey, int], ...] = ()
        whole = bool(failed) and (not self.capabilities.partial_jobs or failed >= set(job.keys))
        if not fail_all and not whole:
            sent = job
            if failed:
                kept = [(k, s) for k, s in zip(job.keys, job.slots, strict=True) if k not in failed]
                sent = TransferJob(
                    job.job_id, tuple(k for k, _ in kept), tuple(s for _, s in kept), job.promotion, job.req_id
                )
            if job.promotion and self._corrupt:
                reads = tuple((k, s) for k, s in zip(sent.keys, sent.slots, strict=True) if k in self._corrupt)
            # The inner tier may reject the job (it raises): then no fault is used up.
            if job.promotion:
                self._inner.submit_load(sent)
            else:
                self._inner.submit_store(sent)
        if fail_all:
            self._fail_next -= 1
        report = self._next_report()
        if sent is None:
            self._local.append(JobResult(job.job_id, False))
        if sent is None or failed or reads or report is not None:
            self._tracked[job.job_id] = _Tracked(job, sent, failed, reads, report)

    def _finish(self, result: JobResult) -> list[JobResult]:
        tracked = self._tracked.pop(result.job_id, None)
        if tracked is None:
            return [result]
        result = self._rewrite(tracked, result)
        report = tracked.report
        if report is None:
            return [result]
        if report.dropped:
            return []
        if report.late_steps and not self._closed:
            self._late.append((self._step + report.late_steps, result))
            return []
        if report.twice:
            self._dupes.append(result)
        return [result]

    def _rewrite(self, tracked: _Tracked, result: JobResult) -> JobResult:
        sent = tracked.sent
        if sent is None:
            return result  # failed by the wrapper
        done = set(result.succeeded_keys(sent))
        bad: set[OffloadKey] = set()
        for key, slot in tracked.reads:
            if key in done:
                detect = self._corrupt.pop(key, None)
                if detect is None:
                    continue  # consumed by an earlier load, or disarmed
                self._damage(slot)
                if detect:
                    bad.add(key)
        if not tracked.failed and not bad:
            return result
        done -= bad
        job = tracked.job
        if bad and not self.capabilities.partial_jobs:
            return JobResult(job.job_id, False)  # a whole-job tier fails the whole job
        if done >= set(job.keys):
            return JobResult(job.job_id, True)
        return JobResult(job.job_id, False, frozenset(done) if done else None)

    def _damage(self, slot: int) -> None:
        flat = self._flat
        if flat is None:  # corrupt_on_read refuses to arm without a buffer
            raise ContractViolation(f"{self._owner}: a corruption was armed without a buffer")
        size = self._block_bytes
        row = flat[slot * size : (slot + 1) * size]
        row[:] = bytes(row).translate(_FLIP)


class _RaisingLookupMany:
    """``FaultySecondary.lookup_many``/``FaultyPrimary.lookup_many``: the rules, then ``inner.lookup_many``."""

    def __init__(self, rules: _RaiseRules, inner: BatchLookup) -> None:
        self._rules = rules
        self._inner = inner

    def __call__(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> list[LookupResult]:
        keys = list(keys)
        rules = self._rules
        rules.check("lookup_many", keys, req_context)
        for key in keys:  # lookup_many answers as lookup does, key by key (TIER-17)
            rules.check("lookup", key, req_context)
        return self._inner.lookup_many(keys, req_context)


# ---------------------------------------------------------------------------------------------
# FaultyPrimary
# ---------------------------------------------------------------------------------------------


class FaultyPrimary(Generic[_P]):
    """A primary tier that misbehaves on demand: ``inner`` with faults armed by its methods.

    Unarmed, it is ``inner`` (every call forwarded), except that it never
    offers :class:`~kvproto.ReadyKeys` (``ready_keys``): every lookup goes
    through the wrapper, so a raising ``lookup`` is seen (answers are the
    same; only the manager's fast path, MGR-15, is off). Knobs:

    * :meth:`raise_in` ``(method, rule)`` and ``raise_from={method: rule}``:
      ``method`` raises per :data:`RaiseRule` instead of reaching ``inner``
      (for ``lookup_many``, the rule of ``lookup`` applies too, key by key).
    * :meth:`delay_complete_store` ``(n, steps)``: the next ``n``
      ``complete_store`` calls reach ``inner`` only at the ``steps``-th
      :meth:`on_step_end` after the call (before ``inner.on_step_end``), so
      their keys stay HIT_PENDING that long; ``steps=None``: they never do,
      as a write whose completion is lost (``inner``'s own pending deadline
      must end it, CPU-7; the wrapper forgets the call). ``n`` SETS the
      count. A held call is pending work (``reset_cache`` answers False);
      :meth:`shutdown` delivers held calls before shutting ``inner`` down. A
      held call that ``inner`` rejects when delivered is logged at WARNING.
    * :meth:`clear_faults`: disarm everything (held calls stay held).

    There is no lookup latency for a primary: a primary never answers RETRY
    (LR-4), so it cannot "find out later"; delaying ``complete_store``
    (HIT_PENDING for longer) is the primary's kind of latency.

    ``capabilities`` are ``inner``'s; ``lookup_many`` exists only when
    ``inner`` offers it.
    """

    def __init__(self, inner: _P, *, raise_from: Mapping[str, RaiseRule] | None = None) -> None:
        owner = f"FaultyPrimary({inner.name!r})"
        self._owner = owner
        self._inner = inner
        offered: object = inner  # a TypeVar does not narrow to a protocol intersection
        batch = offered if isinstance(offered, BatchLookup) else None
        self._rules = _RaiseRules(owner, PRIMARY_METHODS, lambda m: m != "lookup_many" or batch is not None)
        for method, rule in (raise_from or {}).items():
            self._rules.set(method, rule)
        self._step = 0
        self._delay_next = 0
        self._delay_steps: int | None = None
        self._held: deque[tuple[int, tuple[OffloadKey, ...], bool]] = deque()  # (due step, keys, success)
        self.capabilities: Capabilities = _capabilities_of(inner)
        """``inner``'s capabilities."""
        if batch is not None:
            setattr(self, "lookup_many", _RaisingLookupMany(self._rules, batch))

    @property
    def inner(self) -> _P:
        """The wrapped tier."""
        return self._inner

    # -- knobs -----------------------------------------------------------------------------

    def raise_in(self, method: str, rule: RaiseRule | None) -> None:
        """Make ``method`` raise per ``rule`` (a :data:`RaiseRule`) instead of reaching ``inner``; None clears it."""
        self._rules.set(method, rule)

    def delay_complete_store(self, n: int, steps: int | None) -> None:
        """The next ``n`` ``complete_store`` calls land ``steps`` (>= 1) hooks later, or never (None); SETS n."""
        if steps is not None:
            _count(self._owner, "delay_complete_store(steps)", steps, low=1)
        self._delay_next = _count(self._owner, "delay_complete_store(n)", n, low=0)
        self._delay_steps = steps

    def clear_faults(self) -> None:
        """Disarm every knob (complete_store calls already held stay held)."""
        self._delay_next = 0
        self._rules.clear()

    # -- PrimaryTier ---------------------------------------------------------------------

    @property
    def name(self) -> str:
        """``inner``'s name."""
        return self._inner.name

    @property
    def buffer(self) -> memoryview:
        """``inner``'s slot buffer (TIER-3)."""
        return self._inner.buffer

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """``inner.lookup`` unless a rule raises."""
        self._rules.check("lookup", key, req_context)
        return self._inner.lookup(key, req_context)

    def touch(self, keys: Iterable[OffloadKey]) -> None:
        """``inner.touch`` unless a rule raises."""
        keys = tuple(keys)  # a rule may read them too
        self._rules.check("touch", keys)
        self._inner.touch(keys)

    def prepare_store(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        """``inner.prepare_store`` unless a rule raises."""
        self._rules.check("prepare_store", keys, req_context)
        return self._inner.prepare_store(keys, req_context)

    def complete_store(self, keys: Iterable[OffloadKey], success: bool) -> None:
        """``inner.complete_store``, unless a rule raises or :meth:`delay_complete_store` holds (or loses) it."""
        keys = tuple(keys)  # a rule may read them too
        self._rules.check("complete_store", keys, success)
        if self._delay_next > 0:
            self._delay_next -= 1
            if self._delay_steps is not None:
                self._held.append((self._step + self._delay_steps, tuple(keys), success))
            return
        self._inner.complete_store(keys, success)

    def prepare_load(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> tuple[int, ...]:
        """``inner.prepare_load`` unless a rule raises."""
        self._rules.check("prepare_load", keys, req_context)
        return self._inner.prepare_load(keys, req_context)

    def complete_load(self, keys: Iterable[OffloadKey]) -> None:
        """``inner.complete_load`` unless a rule raises."""
        keys = tuple(keys)  # a rule may read them too
        self._rules.check("complete_load", keys)
        self._inner.complete_load(keys)

    # -- TierLifecycle -------------------------------------------------------------------

    def on_request_finished(self, req_context: ReqContext) -> None:
        """``inner.on_request_finished`` unless a rule raises."""
        self._rules.check("on_request_finished", req_context)
        self._inner.on_request_finished(req_context)

    def on_step_end(self) -> None:
        """Deliver the held ``complete_store`` calls now due, then ``inner.on_step_end``."""
        self._rules.check("on_step_end")
        self._step += 1
        held = self._held
        while held and held[0][0] <= self._step:
            self._deliver(*held.popleft()[1:])
        self._inner.on_step_end()

    def take_events(self) -> Sequence[OffloadingEvent]:
        """``inner.take_events`` unless a rule raises."""
        self._rules.check("take_events")
        return self._inner.take_events()

    def has_pending_work(self) -> bool:
        """True while a ``complete_store`` call is held, or ``inner`` has pending work."""
        self._rules.check("has_pending_work")
        return bool(self._held) or self._inner.has_pending_work()

    def reset_cache(self) -> bool:
        """False while a ``complete_store`` call is held; else ``inner.reset_cache``."""
        self._rules.check("reset_cache")
        if self._held:
            return False
        return self._inner.reset_cache()

    def shutdown(self) -> None:
        """Deliver every held ``complete_store`` call, then ``inner.shutdown``. Idempotent (as ``inner`` is)."""
        self._rules.check("shutdown")
        held = self._held
        while held:
            self._deliver(*held.popleft()[1:])
        self._inner.shutdown()

    def _deliver(self, keys: tuple[OffloadKey, ...], success: bool) -> None:
        try:
            self._inner.complete_store(keys, success)
        except Exception:
            _log.warning(
                "%s: the inner tier rejected a delayed complete_store of %d keys (success=%s)",
                self._owner,
                len(keys),
                success,
                exc_info=True,
            )
