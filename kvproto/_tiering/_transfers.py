"""The manager's jobs: promotions and write-throughs, from staging to their end (MGR-3..MGR-7, MGR-9, MGR-17).

A promotion reserves a primary slot at lookup time and is staged; a
successful store is pinned in the primary and staged as a write-through for
every secondary. :meth:`Transfers.submit_staged` turns the staged pairs into
one job per (tier, request); :meth:`Transfers.collect` takes what the tiers
report and :meth:`Transfers.end_job` settles each job: promoted keys become
ready (and are held a few steps) or fail (a negative verdict), write-through
pins are released. :meth:`Transfers.expire` ends jobs past their deadline.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Sequence

from kvproto._jobs import JobResult, TransferJob
from kvproto._keys import OffloadKey
from kvproto._protocols import PrimaryTier
from kvproto._requests import ReqContext
from kvproto._tiering._config import TieringConfig, TieringStats
from kvproto._tiering._guard import FAILED, TierGuard
from kvproto._tiering._records import SecondaryRecord, cap_entries, mark
from kvproto.errors import ContractViolation

__all__ = ["Transfers"]

_log = logging.getLogger("kvproto.tiering")

_Pair = tuple[OffloadKey, int]  # (key, primary slot)
_StageKey = tuple[int, str]  # (secondary index, request id)


class Transfers:
    """Staged and in-flight jobs of one manager, the promotions it reserved and the blocks it holds."""

    def __init__(
        self,
        primary: PrimaryTier,
        records: tuple[SecondaryRecord, ...],
        config: TieringConfig,
        stats: TieringStats,
        guard: TierGuard,
    ) -> None:
        self.primary, self.records, self.config = primary, records, config
        self.stats, self.guard = stats, guard
        self.step = 0  # steps ended so far (on_step_end)
        self.closed = False  # shut down: no promotion starts or is held any more
        self.next_job = 0  # the last job id given
        # key -> secondary index, for every promotion reserved and not yet ended.
        self.promoting: dict[OffloadKey, int] = {}
        # Promotions, staged by the manager's lookup (reservation made), and write-throughs (pinned).
        self.staged_loads: dict[_StageKey, list[_Pair]] = {}
        self.staged_stores: dict[_StageKey, list[_Pair]] = {}
        # Blocks just promoted, pinned by the manager until a step (MGR-9): (release step, keys).
        self.held: deque[tuple[int, list[OffloadKey]]] = deque()
        # Write-through pins outlive requests: they are taken under the manager's own context.
        self.pin_context = ReqContext("kvproto.tiering:write-through")

    # ------------------------------------------------------------------ staging

    def has_work(self) -> bool:
        """True while a job is staged or in flight (TIER-15)."""
        return bool(self.staged_loads or self.staged_stores) or any(r.jobs for r in self.records)

    def stage_write_throughs(self, owners: Sequence[tuple[OffloadKey, str]]) -> None:
        """Pin each stored key once per secondary and stage its write-through there (MGR-6)."""
        by_request: dict[str, list[OffloadKey]] = {}
        for key, rid in owners:
            by_request.setdefault(rid, []).append(key)
        for rid, group in by_request.items():
            for index in range(len(self.records)):
                pinned = self.pin(group, purpose="write-through pin")
                if not pinned:
                    continue
                stage = (index, rid)
                staged = self.staged_stores.get(stage)
                if staged is None:
                    self.staged_stores[stage] = pinned
                else:
                    staged.extend(pinned)

    def pin(self, keys: list[OffloadKey], *, purpose: str | None) -> list[_Pair]:
        """Pin ``keys`` in the primary under the manager's own context: the batch, else key by key.

        A key that cannot be pinned is left out; with a ``purpose`` its failure is a logged and
        counted tier error (MGR-10), without one it is expected (a key not READY) and silent.
        """
        primary, guard, context = self.primary, self.guard, self.pin_context
        batch = guard.call(primary.name, None, _pin_batch, primary, keys, context)
        if batch is not FAILED:
            return batch
        method = None if purpose is None else f"prepare_load ({purpose})"
        pinned: list[_Pair] = []
        for key in keys:
            slot = guard.call(primary.name, method, _pin_one, primary, key, context)
            if slot is not FAILED:
                pinned.append((key, slot))
        return pinned

    def submit_staged(self, only: str | None) -> None:
        """Submit staged batches: all of them, or only request ``only``'s (MGR-3, MGR-7)."""
        for staged, promotion in ((self.staged_loads, True), (self.staged_stores, False)):
            if not staged:
                continue
            if only is None:
                batches = list(staged.items())
                staged.clear()
            else:
                batches = [(s, staged.pop(s)) for s in list(staged) if s[1] == only]
            for (index, rid), pairs in batches:
                self._submit(self.records[index], rid, pairs, promotion=promotion)

    def _submit(self, record: SecondaryRecord, rid: str, pairs: list[_Pair], *, promotion: bool) -> None:
        self.next_job += 1
        job = TransferJob(
            self.next_job,
            tuple(k for k, _ in pairs),
            tuple(s for _, s in pairs),
            promotion=promotion,
            req_id=rid,
        )
        record.jobs[job.job_id] = job
        record.job_steps[job.job_id] = self.step
        if promotion:
            self.stats.promotion_jobs += 1
            submitted = self.guard.call(record.name, "submit_load", record.tier.submit_load, job)
        else:
            self.stats.write_through_jobs += 1
            submitted = self.guard.call(record.name, "submit_store", record.tier.submit_store, job)
        if submitted is FAILED and record.jobs.pop(job.job_id, None) is not None:
            record.job_steps.pop(job.job_id, None)
            self.end_job(record, job, frozenset())

    def drop_staged(self) -> None:
        """Fail every staged promotion (its reservation too) and release every staged write-through pin."""
        primary, guard = self.primary, self.guard
        loads = [pair for pairs in self.staged_loads.values() for pair in pairs]
        stores = [pair for pairs in self.staged_stores.values() for pair in pairs]
        self.staged_loads.clear()
        self.staged_stores.clear()
        if loads:
            keys = [k for k, _ in loads]
            guard.call(primary.name, "complete_store (dropped promotion)", primary.complete_store, keys, False)
            for key in keys:
                self.promoting.pop(key, None)
        if stores:
            guard.call(
                primary.name, "complete_load (dropped write-through)", primary.complete_load, [k for k, _ in stores]
            )

    # ------------------------------------------------------------------ reports

    def collect(self) -> None:
        """Take every tier's finished jobs and settle them; violations are raised (strict) only
        after every result of every tier was settled, so nothing taken from a tier is lost (MGR-4)."""
        violations: list[ContractViolation] = []
        for record in self.records:
            jobs = record.jobs
            if not jobs and not record.abandoned:
                continue
            # Typed as objects: a third-party tier may report anything (checked below). A
            # generator that raises midway keeps what it yielded before.
            results: list[object] = []
            self.guard.call(record.name, "get_finished_jobs", _take_into, results, record.tier.get_finished_jobs)
            for result in results:
                if not isinstance(result, JobResult):
                    violations.append(
                        ContractViolation(
                            f"secondary tier {record.name!r} reported {result!r}, not a JobResult (TIER-11)"
                        )
                    )
                    continue
                job = jobs.pop(result.job_id, None)
                record.job_steps.pop(result.job_id, None)
                if job is None:
                    if record.abandoned.pop(result.job_id, None) is not None:
                        self.stats.late_reports += 1  # a job ended by its deadline reports after all
                        continue
                    violations.append(
                        ContractViolation(
                            f"secondary tier {record.name!r} reported job "
                            f"{result.job_id}, which is not in flight (TIER-11)"
                        )
                    )
                    continue
                self.end_job(record, job, result.succeeded_keys(job))
        for violation in violations:
            self.guard.violation(violation)

    def end_job(self, record: SecondaryRecord, job: TransferJob, ok: frozenset[OffloadKey]) -> None:
        """Settle one ended job: ready or fail promoted keys; release write-through pins (MGR-4, MGR-6)."""
        primary = self.primary
        if job.promotion:
            done = [k for k in job.keys if k in ok]
            failed = [k for k in job.keys if k not in ok]
            for keys, success in ((done, True), (failed, False)):
                if keys:
                    self._settle_reservations(keys, success)
            if failed:
                self.stats.promotions_failed += len(failed)
                self._add_negative(record, failed)
            if done and self.config.promotion_hold_steps and not self.closed:
                self._hold(done)
            promoting = self.promoting
            for key in job.keys:
                promoting.pop(key, None)
            return
        self.guard.call(primary.name, "complete_load (write-through pin)", primary.complete_load, job.keys)
        negative = record.negative
        distrusted = record.distrusted
        failed_count = 0
        for key in job.keys:
            if key in ok:
                negative.pop(key, None)
                distrusted.pop(key, None)
            else:
                failed_count += 1
        self.stats.write_throughs_failed += failed_count

    def end_unreported(self) -> None:
        """Settle as failed every job a tier did not report after its shutdown (MGR-14)."""
        for record in self.records:
            jobs = record.jobs
            if jobs:
                _log.warning(
                    "tier %r: %d jobs unreported after shutdown are settled as failed", record.name, len(jobs)
                )
            for job in list(jobs.values()):
                del jobs[job.job_id]
                self.end_job(record, job, frozenset())
            record.job_steps.clear()

    def _settle_reservations(self, keys: list[OffloadKey], success: bool) -> None:
        """Complete promotion reservations in the primary; key by key if the batch is refused."""
        primary, guard = self.primary, self.guard
        # A batch refused (e.g. one reservation expired and was forgotten) is retried key by key.
        method = None if len(keys) > 1 else "complete_store (promotion)"
        if guard.call(primary.name, method, primary.complete_store, keys, success) is not FAILED:
            return
        if len(keys) > 1:
            for key in keys:
                self._settle_reservations([key], success)
            return
        if success:  # at least free the slot
            guard.call(primary.name, "complete_store (failed promotion)", primary.complete_store, keys, False)

    # ------------------------------------------------------------------ verdicts, holds and deadlines

    def _add_negative(self, record: SecondaryRecord, keys: Iterable[OffloadKey]) -> None:
        """Negative verdicts for ``keys`` in ``record``'s tier until ``negative_verdict_steps`` from now (MGR-9)."""
        mark(record.negative, keys, self.step + self.config.negative_verdict_steps)  # the map stays in expiry order
        cap_entries(record.negative, self.config.max_tracked_keys, self.stats)

    def _hold(self, keys: list[OffloadKey]) -> None:
        """Pin just-promoted blocks for ``promotion_hold_steps`` steps (MGR-9); a key the primary
        does not hold READY (its completion was refused) is simply not held."""
        held = [key for key, _ in self.pin(keys, purpose=None)]
        if held:
            self.held.append((self.step + self.config.promotion_hold_steps, held))

    def release_held(self, *, until: int | None = None) -> None:
        """Release the manager's pins on promoted blocks due by step ``until`` (all if None) (MGR-9)."""
        held, primary = self.held, self.primary
        while held and (until is None or held[0][0] <= until):
            _, keys = held.popleft()
            self.guard.call(primary.name, "complete_load (promotion hold)", primary.complete_load, keys)

    def expire(self) -> None:
        """Release promotion holds, prune expired negative verdicts and end jobs past their deadline
        (MGR-9, MGR-17, MGR-18)."""
        step = self.step
        self.release_held(until=step)
        for record in self.records:
            record.expire_negatives(step)
        oldest = step - self.config.job_deadline_steps
        for record in self.records:
            for job in record.overdue(oldest):
                self._end_by_deadline(record, job)

    def _end_by_deadline(self, record: SecondaryRecord, job: TransferJob) -> None:
        """End a job its tier has not reported within ``job_deadline_steps`` (MGR-17)."""
        _log.warning(
            "tier %r: job %d (%s of %d keys) not reported in %d steps; ended by the manager",
            record.name, job.job_id, "promotion" if job.promotion else "write-through",
            len(job.keys), self.config.job_deadline_steps,
        )
        record.abandoned[job.job_id] = job
        cap_entries(record.abandoned, self.config.max_tracked_keys, self.stats)
        if job.promotion:
            # The load may still land in its slots: they stay reserved in the primary, never
            # completed by us; the keys may be stored and promoted again.
            self.stats.promotions_timed_out += len(job.keys)
            for key in job.keys:
                self.promoting.pop(key, None)
            self._add_negative(record, job.keys)
            return
        self.stats.write_throughs_timed_out += len(job.keys)
        mark(record.distrusted, job.keys, None)
        cap_entries(record.distrusted, self.config.max_tracked_keys, self.stats)
        primary = self.primary
        self.guard.call(
            primary.name, "complete_load (write-through past its deadline)", primary.complete_load, job.keys
        )


def _take_into(out: list[object], get_finished_jobs: Callable[[], Iterable[object]]) -> None:
    """Append what ``get_finished_jobs()`` yields to ``out``: what came before a raise is kept."""
    for reported in get_finished_jobs():
        out.append(reported)


def _pin_batch(primary: PrimaryTier, keys: list[OffloadKey], context: ReqContext) -> list[_Pair]:
    # Not strict: a primary answering fewer slots than keys pins only those (behaviour kept as it was).
    return list(zip(keys, primary.prepare_load(keys, context), strict=False))


def _pin_one(primary: PrimaryTier, key: OffloadKey, context: ReqContext) -> int:
    (slot,) = primary.prepare_load((key,), context)
    return slot
