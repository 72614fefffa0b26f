"""Job faults over a :class:`~kvproto.tierkit.BlobTier`, in the kit, out of the tier's job path (KIT-5, TIERKIT-4).

BlobTier has no job-admission seam: it runs every job it is given. A tier the
kit (or a test) arms job faults on is built from :func:`faulty_jobs` of its
class: a subclass with :class:`FaultyJobs` first, over a
:class:`~kvproto.testing.FaultyBackend` (the backend itself, ``wrap=FaultyBackend``,
or found through an asynchronous backend's ``inner`` chain). The faults are
armed on that FaultyBackend (``fail_next_jobs``, ``fail_keys``) with the
kit's exact semantics (KIT-5), and applied in two places, both kit code:

* :class:`FaultyJobs`, at submission: a job ``fail_next_jobs`` armed fails
  whole without reaching the tier (no bytes move; a load's keys keep what
  the index knew). A store touching keys ``fail_keys`` named goes to the
  tier without them (same id; the other keys and their slots) and its
  result names them failed, where the tier declares ``partial_jobs``; a
  tier reporting jobs whole fails such a store whole without sending it
  (a partial result would break its own declaration). A store of failing
  keys only fails whole without reaching the tier. Either way a failed key
  is never stored.
* the FaultyBackend, below: a load goes to the tier whole, and every read
  of a failing key's blob raises ``OSError(EIO)``, so the engine fails that
  key as it does any transient read error (TIERKIT-3: it stops answering
  HIT, no REMOVED is emitted) and releases whatever it held for it
  (TIERKIT-6); partial results only where the tier declares
  ``partial_jobs`` (the engine's own reporting).

A job failed whole here is pending work until reported (``has_pending_work``,
``reset_cache`` refuses meanwhile, TIER-15, TIER-16), reported once, before
the tier's own results.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, TypeVar

from kvproto._jobs import JobResult, TransferJob
from kvproto._keys import OffloadKey
from kvproto.errors import InvalidArgumentError
from kvproto.testing._faults.backend import FaultyBackend
from kvproto.tierkit import BlobTier

__all__ = ["FaultyJobs", "faulty_jobs"]

_T = TypeVar("_T", bound=BlobTier)

_INNER_DEPTH = 8
"""How far :func:`_faulty_below` follows ``inner`` attributes looking for the FaultyBackend."""


def _faulty_below(backend: object) -> FaultyBackend | None:
    """The FaultyBackend ``backend`` is, or wraps through its ``inner`` chain (an asynchronous backend's
    synchronous face, a test's coroutine adapter); None if there is none."""
    for _ in range(_INNER_DEPTH):
        if isinstance(backend, FaultyBackend):
            return backend
        backend = getattr(backend, "inner", None)
        if backend is None:
            return None
    return None


class FaultyJobs(BlobTier):
    """A BlobTier whose jobs the FaultyBackend below it can fail (KIT-5); put first in a subclass's bases.

    Use :func:`faulty_jobs` (``faulty_jobs(FsTier)(buffer, config, wrap=FaultyBackend)``), or this
    class itself as a plain BlobTier (``FaultyJobs(FaultyBackend(MemoryBackend()), buffer, config)``).
    The constructor's arguments are the tier class's. Without a FaultyBackend below, it is the
    tier class unchanged.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._kit_lock = threading.Lock()
        self._kit_failed: list[JobResult] = []  # jobs failed whole here, not yet reported
        self._kit_failed_ids: set[int] = set()
        self._kit_stripped: dict[int, tuple[TransferJob, frozenset[OffloadKey]]] = {}  # id -> (sent, failed keys)
        super().__init__(*args, **kwargs)
        self._kit_faults = _faulty_below(self.backend)
        if self._kit_faults is not None:
            self._kit_faults.attach_jobs()

    # -- SecondaryTier -------------------------------------------------------------------

    def submit_store(self, job: TransferJob) -> None:
        """The tier's ``submit_store``, of the job less its failing keys, unless a job fault fails it whole."""
        whole, failing = self._kit_take(job, promotion=False)
        if not failing:
            super().submit_store(job)
        elif whole or not self.capabilities.partial_jobs or failing >= set(job.keys):
            self._kit_fail(job)
        else:
            kept = [(k, s) for k, s in zip(job.keys, job.slots, strict=True) if k not in failing]
            sent = TransferJob(job.job_id, tuple(k for k, _ in kept), tuple(s for _, s in kept), False, job.req_id)
            super().submit_store(sent)
            with self._kit_lock:
                self._kit_stripped[job.job_id] = (sent, failing)

    def submit_load(self, job: TransferJob) -> None:
        """The tier's ``submit_load`` of the whole job (the FaultyBackend fails the failing keys' reads),
        unless ``fail_next_jobs`` fails it whole here."""
        whole, _ = self._kit_take(job, promotion=True)
        if whole:
            self._kit_fail(job)
        else:
            super().submit_load(job)

    def get_finished_jobs(self) -> Sequence[JobResult]:
        """Jobs failed whole here, then the tier's results, a store sent without its failing keys
        reported failed for them (TIER-11)."""
        with self._kit_lock:
            failed, self._kit_failed = self._kit_failed, []
            self._kit_failed_ids.difference_update(r.job_id for r in failed)
        results = list(failed)
        for result in super().get_finished_jobs():
            with self._kit_lock:
                stripped = self._kit_stripped.pop(result.job_id, None)
            if stripped is None:
                results.append(result)
                continue
            sent, _ = stripped
            done = result.succeeded_keys(sent)
            results.append(JobResult(result.job_id, False, frozenset(done) if done else None))
        return results

    def has_pending_work(self) -> bool:
        """True while a job is unreported, the ones failed whole here included (TIER-15)."""
        with self._kit_lock:
            if self._kit_failed:
                return True
        return super().has_pending_work()

    def reset_cache(self) -> bool:
        """False while a job failed whole here is unreported (TIER-16); else the tier's ``reset_cache``."""
        with self._kit_lock:
            if self._kit_failed:
                return False
        return super().reset_cache()

    # -- internals -----------------------------------------------------------------------

    def _kit_take(self, job: TransferJob, *, promotion: bool) -> tuple[bool, frozenset[OffloadKey]]:
        """``(whole, failing)``: whether an armed ``fail_next_jobs`` fails ``job`` whole, and its keys an armed
        ``fail_keys`` fails (KIT-5); nothing without a FaultyBackend below. A misused job is refused first."""
        faults = self._kit_faults
        if faults is None:
            return False, frozenset()
        self._kit_check(job, promotion=promotion)
        return faults.take_job(job.keys)

    def _kit_check(self, job: TransferJob, *, promotion: bool) -> None:
        """Refuse a job the tier would refuse (TIER-10, TIER-11), before any fault is used up."""
        self._validate(job, promotion=promotion)  # BlobTier's own check: same errors as without faults
        with self._kit_lock:
            if job.job_id in self._kit_failed_ids:
                raise InvalidArgumentError(f"BlobTier {self.name!r}: job id {job.job_id} is already in flight")

    def _kit_fail(self, job: TransferJob) -> None:
        with self._kit_lock:
            self._kit_failed.append(JobResult(job.job_id, False))
            self._kit_failed_ids.add(job.job_id)


_CLASSES: dict[type[BlobTier], type[BlobTier]] = {FaultyJobs: FaultyJobs, BlobTier: FaultyJobs}
_CLASSES_LOCK = threading.Lock()


def faulty_jobs(cls: type[_T]) -> type[_T]:
    """``cls`` (a BlobTier subclass: FsTier, ObjTier, ...) with :class:`FaultyJobs` first: the class the
    kit builds a tier from to arm job faults on it (KIT-5). One class per ``cls``, named
    ``Faulty<cls name>``; ``faulty_jobs(BlobTier)`` is :class:`FaultyJobs`."""
    with _CLASSES_LOCK:
        made = _CLASSES.get(cls)
        if made is None:
            if issubclass(cls, FaultyJobs):
                made = cls
            else:
                made = type(f"Faulty{cls.__name__}", (FaultyJobs, cls), {"__module__": __name__,
                                                                     "__doc__": FaultyJobs.__doc__})
            _CLASSES[cls] = made
    return made  # type: ignore[return-value]  # a subclass of cls, made (or kept) just above
