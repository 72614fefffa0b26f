"""How a finished job of :class:`~kvproto.tierkit.BlobTier` is reported: its keys' verdicts applied (TIER-11).

The scheduler's thread only (``get_finished_jobs``). A load's verdicts vouch
for, lose or mark unusable its keys in the ledger, tell the probe which keys
are gone, release what held HITs the load claimed and emit REMOVED only for
blocks known gone (never for a transient failure, TIERKIT-3); in shared mode a blob
found missing that the index vouched for makes the index distrust every older stamp
(TIERKIT-10); a store's
vouch for its keys as of their ticks (TIERKIT-2) and emit STORED.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass

from kvproto._async_probe import AsyncProbe
from kvproto._events import EventKind
from kvproto._jobs import JobResult
from kvproto._keys import OffloadKey
from kvproto._results import unreachable
from kvproto.errors import InvalidArgumentError
from kvproto.tierkit._blob_config import BlobTierStats
from kvproto.tierkit._blob_holds import Holds
from kvproto.tierkit._blob_jobs import JobOutcome
from kvproto.tierkit._blob_ledger import Ledger
from kvproto.tierkit._blob_ops import KeyVerdict

__all__ = ["Outcomes"]


@dataclass(slots=True, eq=False)
class Outcomes:
    """Applies finished jobs to the tier's ledger, probe, held HITs and ``stats``.

    The job counters of ``stats`` it adds to (``loaded_blocks``, ``failed_loads``, ``transient_load_errors``,
    ``hit_load_failures``, ``stored_blocks``, ``failed_stores``, ``lost_races``) are written by the
    scheduler's thread only, here: it adds to them without the tier's stats lock, which the workers take
    to count theirs (a worker that loses the GIL while holding it would hold the scheduler, TIERKIT-9).
    """

    ledger: Ledger
    probe: AsyncProbe
    holds: Holds | None
    stats: BlobTierStats
    _: KW_ONLY
    partial_jobs: bool
    tier_name: str
    distrust: Callable[[], None] | None = None  # shared mode, where the index is a memo: distrust it (TIERKIT-10)

    def apply(self, out: JobOutcome, *, asked_by: int | None = None) -> JobResult:
        """Report ``out``: vouch, lose and mark keys by verdict, emit events, count (TIER-11, TIERKIT-2, TIERKIT-3).

        ``asked_by``: the probe's stamp when the load was submitted; its failed keys are marked MISS only
        in verdicts asked by then (a request asking later may see a block stored since its read, TIER-18)."""
        job = out.job
        ledger = self.ledger
        if job.promotion:
            ledger.end_load(job.keys)
            if self.holds is not None:
                self.holds.load_reported(job.job_id, job.keys)
            loaded: list[tuple[OffloadKey, int]] = []
            missing: list[tuple[OffloadKey, int]] = []
            gone: list[tuple[OffloadKey, int]] = []
            unusable: list[OffloadKey] = []
            transient: list[tuple[OffloadKey, int]] = []
            refused: list[OffloadKey] = []
            for key, (verdict, tick) in zip(job.keys, out.verdicts, strict=True):
                match verdict:
                    case KeyVerdict.LOADED:
                        loaded.append((key, tick))
                    case KeyVerdict.GONE:
                        missing.append((key, tick))  # a new blob may come
                    case KeyVerdict.DAMAGED:
                        gone.append((key, tick))  # damaged and deleted: a new blob may come
                    case KeyVerdict.FOREIGN:
                        gone.append((key, tick))
                        unusable.append(key)  # left alone (not ours to delete): never HIT again (TIER-4)
                    case KeyVerdict.TRANSIENT | KeyVerdict.FAILED:
                        transient.append((key, out.since))  # the blob may be there: never REMOVED (TIERKIT-3)
                    case KeyVerdict.REFUSED:
                        refused.append(key)  # no I/O was tried: what the index knows stands
                    case KeyVerdict.CREATED | KeyVerdict.EXISTED:
                        raise InvalidArgumentError(f"BlobTier {self.tier_name!r}: a load ended with {verdict}")
                    case _ as other:
                        unreachable(other, where="BlobTier: Outcomes.apply (load)")
            if loaded:
                ledger.vouch(loaded)
            ledger.mark_unusable(unusable)
            removed = ledger.lose(missing, gone=True)
            if removed and self.distrust is not None:  # the index vouched for a blob the storage lost (TIERKIT-10)
                self.distrust()
            removed += ledger.lose(gone, gone=True)
            gone += missing
            ledger.lose(transient, gone=False)
            ledger.emit(EventKind.REMOVED, removed)
            failed = [k for k, _ in gone] + [k for k, _ in transient]
            if failed:
                self.probe.mark_miss(failed, asked_by=asked_by)
            failed += refused
            ok = [k for k, _ in loaded]
            stats = self.stats  # counters only this thread writes: no lock (the class docstring)
            stats.loaded_blocks += len(ok)
            stats.failed_loads += len(failed)
            stats.transient_load_errors += len(transient)
            stats.hit_load_failures += len(failed) - len(refused)
        else:
            results = [
                (key, tick if verdict in (KeyVerdict.CREATED, KeyVerdict.EXISTED) else None)
                for key, (verdict, tick) in zip(job.keys, out.verdicts, strict=True)
            ]
            if not self.partial_jobs and any(tick is None for _, tick in results):
                results = [(key, None) for key, _ in results]  # reported whole: no key of it vouches
            created = [key for key, (verdict, _) in zip(job.keys, out.verdicts, strict=True)
                       if verdict is KeyVerdict.CREATED]
            ok, lost = ledger.end_store(results, created)
            ledger.emit(EventKind.STORED, ok)
            if ok:
                self.probe.mark_hit(ok)
            stats = self.stats  # counters only this thread writes: no lock (the class docstring)
            stats.stored_blocks += len(ok)
            stats.failed_stores += len(job.keys) - len(ok)
            stats.lost_races += lost
        if len(ok) == len(job.keys):
            return JobResult(job.job_id, True)
        if not self.partial_jobs:
            return JobResult(job.job_id, False)
        return JobResult(job.job_id, False, frozenset(ok) if ok else None)
