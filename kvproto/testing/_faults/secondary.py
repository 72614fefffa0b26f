"""``FaultySecondary``: a secondary tier that misbehaves on demand (KIT-15).

Re-exported by :mod:`kvproto.testing.faults`; built on :class:`kvproto.tierkit.ForwardingSecondary`
and the raise rules of :class:`~kvproto.testing._faults.rules.RaisingWrapper`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from kvproto._jobs import JobResult, TransferJob
from kvproto._keys import OffloadKey
from kvproto._protocols import SecondaryTier
from kvproto._slot_buffer import slot_buffer_shape
from kvproto.errors import ConfigurationError, ContractViolation
from kvproto.testing._faults.rules import SECONDARY_METHODS, RaiseRule, RaisingWrapper, check_count, check_job
from kvproto.tierkit._forwarding import ForwardingSecondary

__all__ = ["FaultySecondary"]

_S = TypeVar("_S", bound=SecondaryTier)

_FLIP = bytes(b ^ 0xFF for b in range(256))  # bytes.translate table: every bit of a block inverted


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


class FaultySecondary(RaisingWrapper[_S], ForwardingSecondary[_S]):
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

    ``capabilities`` are ``inner``'s, absent where it declares none (no knob changes what the tier declares:
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
        self._flat: memoryview | None = None
        self._block_bytes = 0
        if buffer is not None:
            _, self._block_bytes = slot_buffer_shape(owner, buffer)
            self._flat = buffer.cast("B")
        super().__init__(inner, owner=owner, methods=SECONDARY_METHODS, raise_from=raise_from)
        declared = self._capabilities
        self._partial = declared is not None and declared.partial_jobs
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

    # -- knobs -----------------------------------------------------------------------------

    def fail_next_jobs(self, n: int) -> None:
        """The next ``n`` submitted jobs fail whole without reaching ``inner``; SETS the count (0 disarms)."""
        self._fail_next = check_count(self._owner, "fail_next_jobs(n)", n, low=0)

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

    def report_late(self, n: int, steps: int) -> None:
        """The next ``n`` submitted jobs are reported ``steps`` (>= 1) hooks after ``inner`` reports them; SETS n."""
        self._late_steps = check_count(self._owner, "report_late(steps)", steps, low=1)
        self._late_next = check_count(self._owner, "report_late(n)", n, low=0)

    def report_twice(self, n: int) -> None:
        """The next ``n`` submitted jobs are reported again by the following ``get_finished_jobs``; SETS n."""
        self._twice_next = check_count(self._owner, "report_twice(n)", n, low=0)

    def drop_reports(self, n: int) -> None:
        """The next ``n`` submitted jobs are never reported (and forgotten); SETS n."""
        self._drop_next = check_count(self._owner, "drop_reports(n)", n, low=0)

    def clear_faults(self) -> None:
        """Disarm every knob: counts to 0, no failing or corrupt keys, no raise rules.

        Jobs already in flight keep the faults they were submitted with.
        """
        self._fail_next = self._late_next = self._twice_next = self._drop_next = 0
        self._fail_keys.clear()
        self._corrupt.clear()
        self._rules.clear()

    # -- SecondaryTier -------------------------------------------------------------------

    def submit_store(self, job: TransferJob) -> None:
        """``inner.submit_store`` of the job, less its failing keys, unless a fault fails it first."""
        self._rules.check("submit_store", job)
        self._submit(check_job(self._owner, job, promotion=False))

    def submit_load(self, job: TransferJob) -> None:
        """``inner.submit_load`` of the job, less its failing keys, unless a fault fails it first."""
        self._rules.check("submit_load", job)
        self._submit(check_job(self._owner, job, promotion=True))

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

    # -- what the wrapper owes (RaisingWrapper's hooks) ------------------------------------

    def _owes(self) -> bool:
        """A job failed by the wrapper or held late is unreported (pending work, TIER-15)."""
        return bool(self._local) or bool(self._late)

    def _after_reset(self) -> None:
        """Pending corruptions go with the blocks."""
        self._corrupt.clear()

    def _before_shutdown(self) -> None:
        """Late reports are due at once from now on."""
        self._closed = True
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
        whole = bool(failed) and (not self._partial or failed >= set(job.keys))
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
        if bad and not self._partial:
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
