"""The manager's jobs: promotions and write-throughs, from staging to their end (MGR-3..MGR-7, MGR-9, MGR-17).

A promotion reserves a primary slot at lookup time and is staged; a
successful store is pinned in the primary and staged as a write-through for
every secondary. :meth:`Transfers.submit_staged` turns the staged pairs into
one job per (tier, request); :meth:`Transfers.collect` takes what the tiers
report and :meth:`Transfers.end_job` settles each job: promoted keys become
ready (and are held a few steps) or fail (a negative verdict), write-through
pins are released. :meth:`Transfers.expire` ends jobs past their deadline:
their keys are free at once, the primary slots they used stay held
(quarantined) until the transfer is provably over (MGR-17).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence

from kvproto._jobs import JobResult, TransferJob
from kvproto._keys import OffloadKey
from kvproto._protocols import PrimaryTier, SlotQuarantine
from kvproto._requests import ReqContext
from kvproto._tiering._config import TieringConfig, TieringStats
from kvproto._tiering._guard import FAILED, TierGuard
from kvproto._tiering._records import Abandoned, SecondaryRecord, cap_entries, mark
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
        clock: Callable[[], float],
    ) -> None:
        self.primary, self.records, self.config = primary, records, config
        self.stats, self.guard, self.clock = stats, guard, clock
        # Abandoned jobs of one tier hold at most this many primary slots before it is paused (MGR-17).
        shape = getattr(primary.buffer, "shape", None) or (1,)
        self.quarantine_limit = max(1, int(int(shape[0]) * config.quarantine_share))
        self.quarantine: SlotQuarantine | None = primary if isinstance(primary, SlotQuarantine) else None
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
            for index, record in enumerate(self.records):
                if record.paused:
                    self.stats.quarantine_skips += len(group)  # a tier that stopped answering gets no more
                    continue
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
        record.job_steps[job.job_id] = (self.step, self.clock() if record.bound_s is not None else 0.0)
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
                    abandoned = record.abandoned.pop(result.job_id, None)
                    if abandoned is not None:
                        self.stats.late_reports += 1  # a job ended by its deadline reports after all
                        self._give_back(record, abandoned, result.succeeded_keys(abandoned.job))
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
        self._stored(record, job, ok)

    def _stored(self, record: SecondaryRecord, job: TransferJob, ok: frozenset[OffloadKey]) -> None:
        """A write-through ended: its stored keys lose their negative verdicts; the others are counted."""
        negative = record.negative
        failed_count = 0
        for key in job.keys:
            if key in ok:
                negative.pop(key, None)
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
            self._give_back_all(record)  # the tier joined its workers: no transfer of it runs any more

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
        """Release promotion holds, prune expired negative verdicts, end jobs past their deadline and give
        back the slots of abandoned jobs whose tier has no pending work any more (MGR-9, MGR-17, MGR-18)."""
        step = self.step
        self.release_held(until=step)
        for record in self.records:
            record.expire_negatives(step)
        oldest = step - self.config.job_deadline_steps
        now: float | None = None
        for record in self.records:
            if not record.job_steps:
                continue
            before = math.inf
            if record.bound_s is not None:
                # Never before the tier's own bound: the two deadlines agree by construction (MGR-17).
                now = self.clock() if now is None else now
                before = now - record.bound_s - self.config.job_bound_grace_s
            for job in record.overdue(oldest, before):
                self._end_by_deadline(record, job)
        for record in self.records:
            if record.abandoned:
                # TIER-15: no pending work means no job of the tier runs: the abandoned transfers are over.
                pending = self.guard.call(record.name, "has_pending_work", record.tier.has_pending_work)
                if pending is not FAILED and not pending:
                    self._give_back_all(record)

    def _end_by_deadline(self, record: SecondaryRecord, job: TransferJob) -> None:
        """End a job its tier has not reported by its deadline; its slots stay held (MGR-17)."""
        _log.warning(
            "tier %r: job %d (%s of %d keys) not reported in %d steps%s; ended by the manager, its slots held "
            "until it reports", record.name, job.job_id, "promotion" if job.promotion else "write-through",
            len(job.keys), self.config.job_deadline_steps,
            "" if record.bound_s is None else f" and {record.bound_s:g} s (its declared bound)",
        )
        held: tuple[int, ...] | None = None
        if job.promotion:
            # The load may still land in its slots: with SlotQuarantine the keys are free at once and the
            # slots held; otherwise the reservations stay WRITING until the transfer is over.
            self.stats.promotions_timed_out += len(job.keys)
            quarantine = self.quarantine
            if quarantine is not None:
                got = self.guard.call(
                    self.primary.name, "quarantine_stores", quarantine.quarantine_stores, job.keys
                )
                held = None if got is FAILED else got
            for key in job.keys:
                self.promoting.pop(key, None)
            self._add_negative(record, job.keys)
        else:
            # Its pins stay: the tier may still read the rows, which must not be reused meanwhile.
            self.stats.write_throughs_timed_out += len(job.keys)
        record.abandoned[job.job_id] = Abandoned(job, held)
        self._count_held(record, len(job.keys))

    def _count_held(self, record: SecondaryRecord, change: int) -> None:
        record.held_slots += change
        self.stats.quarantined_slots += change
        record.paused = record.held_slots >= self.quarantine_limit

    def _give_back(self, record: SecondaryRecord, abandoned: Abandoned, ok: frozenset[OffloadKey]) -> None:
        """The transfer of an abandoned job is over: its slots go back to the primary (MGR-17).

        ``ok``: its keys that a late report names done. A write-through's pins
        are released (its stored keys count, as the rows were never reused); a
        promotion's quarantined slots are released, or its reservations, still
        WRITING, completed as the report says.
        """
        job, primary, guard = abandoned.job, self.primary, self.guard
        if not job.promotion:
            guard.call(primary.name, "complete_load (write-through ended late)", primary.complete_load, job.keys)
            self._stored(record, job, ok)
        elif abandoned.held is not None:
            if abandoned.held and self.quarantine is not None:
                guard.call(primary.name, "release_slots", self.quarantine.release_slots, abandoned.held)
        else:
            done = [k for k in job.keys if k in ok]
            failed = [k for k in job.keys if k not in ok]
            for keys, success in ((done, True), (failed, False)):
                if keys:
                    self._settle_reservations(keys, success)
        self.stats.quarantine_released += len(job.keys)
        self._count_held(record, -len(job.keys))

    def _give_back_all(self, record: SecondaryRecord) -> None:
        """Every abandoned job of ``record``'s tier is provably over (it has no pending work, or shut down)."""
        abandoned = record.abandoned
        while abandoned:
            _, entry = abandoned.popitem(last=False)
            self._give_back(record, entry, frozenset())


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
