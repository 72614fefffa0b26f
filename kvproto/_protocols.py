"""Structural protocols for tiers and the offloading manager (TIER-1..TIER-16).

A tier needs no kvproto base class: any class with these methods and these
signatures satisfies the protocol, and strict mypy checks it.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Sequence
from typing import Protocol, runtime_checkable

from kvproto._events import OffloadingEvent
from kvproto._jobs import JobResult, PrepareStoreOutput, TransferJob
from kvproto._keys import OffloadKey
from kvproto._requests import ReqContext
from kvproto._results import LookupResult

__all__ = [
    "BatchLookup",
    "JobTimeBound",
    "OffloadingManager",
    "PrimaryTier",
    "ReadyKeys",
    "SecondaryTier",
    "SlotQuarantine",
    "TierLifecycle",
]


@runtime_checkable
class TierLifecycle(Protocol):
    """Methods every tier and the manager share (TIER-12..TIER-16)."""

    def on_request_finished(self, req_context: ReqContext) -> None:
        """Drop every piece of per-request state held for ``req_context`` (TIER-12)."""
        ...

    def on_step_end(self) -> None:
        """End-of-step hook: submit batched work, expire deadlines (TIER-13). Non-blocking."""
        ...

    def take_events(self) -> Sequence[OffloadingEvent]:
        """Return and forget the events since the last call (TIER-14)."""
        ...

    def has_pending_work(self) -> bool:
        """True while any job submitted to this component has not been reported finished (TIER-15)."""
        ...

    def reset_cache(self) -> bool:
        """Forget every stored block; False if it cannot now (work in flight) (TIER-16)."""
        ...

    def shutdown(self) -> None:
        """Finish or fail every job in flight, report it, and join worker threads (TIER-16)."""
        ...


@runtime_checkable
class PrimaryTier(TierLifecycle, Protocol):
    """The CPU tier: every block moving between the device and any tier passes through it.

    It owns ``buffer``, a writable 2-D ``memoryview`` of shape
    ``(num_slots, block_bytes)``, format ``"B"``; secondary tiers read and
    write its rows (TIER-3).
    """

    @property
    def name(self) -> str:
        """A short, stable name used in events and logs."""
        ...

    @property
    def buffer(self) -> memoryview:
        """The slot buffer, one row per slot, writable, shared without copying (TIER-3)."""
        ...

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """MISS, HIT or HIT_PENDING for ``key``; never RETRY (LR-4, TIER-4). Non-blocking."""
        ...

    def touch(self, keys: Iterable[OffloadKey]) -> None:
        """Mark ``keys`` as recently used for the eviction policy (TIER-5)."""
        ...

    def prepare_store(
        self, keys: Sequence[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        """Reserve slots for the keys not yet present, evicting if needed (TIER-6).

        All or nothing: ``None`` when not enough unpinned ready blocks can be
        evicted. Reserved keys answer HIT_PENDING until ``complete_store``.
        """
        ...

    def complete_store(self, keys: Iterable[OffloadKey], success: bool) -> None:
        """Finish a store: success makes the keys HIT; failure removes the keys still in flight (TIER-7)."""
        ...

    def prepare_load(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> tuple[int, ...]:
        """Pin the READY ``keys`` (counted) and return their slots, in order (TIER-8)."""
        ...

    def complete_load(self, keys: Iterable[OffloadKey]) -> None:
        """Release one pin on each of ``keys`` (TIER-9)."""
        ...


@runtime_checkable
class SecondaryTier(TierLifecycle, Protocol):
    """A tier below the primary: filesystem, object store, remote store...

    It never touches the device; it moves bytes between its storage and rows
    of the primary tier's buffer through non-blocking jobs (TIER-10, TIER-11).
    """

    @property
    def name(self) -> str:
        """A short, stable name used in events and logs."""
        ...

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """MISS, HIT or RETRY for ``key``; never HIT_PENDING (LR-3, TIER-4). Non-blocking."""
        ...

    def touch(self, keys: Iterable[OffloadKey]) -> None:
        """Mark ``keys`` as recently used, where the tier keeps recency (TIER-5)."""
        ...

    def submit_store(self, job: TransferJob) -> None:
        """Start copying ``job.slots`` rows of the primary buffer into storage (TIER-10)."""
        ...

    def submit_load(self, job: TransferJob) -> None:
        """Start copying stored ``job.keys`` into rows ``job.slots`` of the primary buffer (TIER-10)."""
        ...

    def get_finished_jobs(self) -> Sequence[JobResult]:
        """Results of jobs finished since the last call; each job reported exactly once (TIER-11)."""
        ...


@runtime_checkable
class OffloadingManager(TierLifecycle, Protocol):
    """What the scheduler talks to: one lookup surface over all tiers (MGR-1..MGR-8)."""

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """Any of the four results for ``key`` (LR-2, MGR-1). Non-blocking."""
        ...

    def touch(self, keys: Iterable[OffloadKey]) -> None:
        """Mark ``keys`` as recently used (TIER-5)."""
        ...

    def prepare_store(
        self, keys: Sequence[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        """Reserve primary slots for a device -> CPU store (TIER-6)."""
        ...

    def complete_store(self, keys: Iterable[OffloadKey], success: bool) -> None:
        """Finish a device -> CPU store; on success write through to every secondary (MGR-5)."""
        ...

    def prepare_load(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> tuple[int, ...]:
        """Pin HIT ``keys`` in the primary and return their slots (TIER-8)."""
        ...

    def complete_load(self, keys: Iterable[OffloadKey]) -> None:
        """Release the pins taken by ``prepare_load`` (TIER-9)."""
        ...


@runtime_checkable
class BatchLookup(Protocol):
    """Optional ability: answer many lookups in one call (TIER-17)."""

    def lookup_many(
        self, keys: Sequence[OffloadKey], req_context: ReqContext
    ) -> list[LookupResult]:
        """``[self.lookup(k, req_context) for k in keys]``, possibly faster."""
        ...


@runtime_checkable
class ReadyKeys(Protocol):
    """Optional primary-tier ability: a live view of the keys it answers HIT for (MGR-15).

    ``ready_keys`` must be one container, kept up to date in place for the
    tier's lifetime (e.g. ``self._ready.keys()`` of the dict behind
    ``lookup``), such that ``key in ready_keys`` is True exactly when
    ``lookup(key, ...)`` would answer HIT. The manager then answers a
    primary HIT with one C-level membership test instead of a call.
    """

    @property
    def ready_keys(self) -> Container[OffloadKey]:
        """The live container of the keys that are HIT now."""
        ...


@runtime_checkable
class SlotQuarantine(Protocol):
    """Optional primary-tier ability: end a store its caller abandoned while keeping its slot (MGR-17).

    The manager ends a promotion its secondary did not report in time, but
    the load may still land in the reserved slot. With this ability the key
    is free again at once (it can be stored and promoted again) while the
    slot stays out of the pool until the manager can prove the transfer is
    over (the tier reported the job late, said it has no pending work, or
    was shut down). Without it, the reservation stays WRITING until then.
    """

    def quarantine_stores(self, keys: Sequence[OffloadKey]) -> tuple[int, ...]:
        """End the stores of the WRITING (or expired) ``keys``: each becomes ABSENT, its slot held; returns them."""
        ...

    def release_slots(self, slots: Iterable[int]) -> None:
        """The transfers into ``slots`` (each returned by ``quarantine_stores``) are over: back to the pool."""
        ...


@runtime_checkable
class JobTimeBound(Protocol):
    """Optional secondary-tier declaration: every job is reported within ``job_time_bound_s`` (MGR-17).

    ``job_time_bound_s`` is a number of seconds > 0 such that every job the
    tier accepts (``submit_load``/``submit_store``) is returned by
    ``get_finished_jobs`` (succeeded or failed) at most that long after its
    submission, whatever its storage does (a brown-out ends in failed jobs,
    never in jobs that run on); ``None``: no promise. The manager never ends
    such a tier's job before that bound (plus ``TieringConfig.job_bound_grace_s``),
    so its own deadline and the tier's agree by construction.
    """

    @property
    def job_time_bound_s(self) -> float | None:
        """Seconds within which every job is reported; None: no promise."""
        ...
