"""What the manager keeps per secondary tier and per request (MGR-3, MGR-5, MGR-7, MGR-9, MGR-17, MGR-18)."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar, cast

from kvproto._jobs import TransferJob
from kvproto._keys import OffloadKey
from kvproto._protocols import SecondaryTier
from kvproto._requests import ReqContext
from kvproto._results import LookupResult
from kvproto._tiering._config import TieringStats
from kvproto.errors import ConfigurationError

__all__ = ["Abandoned", "RequestRecord", "SecondaryRecord", "cap_entries", "job_time_bound", "mark"]

_K = TypeVar("_K")
_V = TypeVar("_V")


@dataclass(frozen=True, slots=True)
class Abandoned:
    """A job ended by its deadline whose transfer may still run (MGR-17).

    ``held``: the primary slots a promotion's reservations were quarantined
    in (:class:`kvproto.SlotQuarantine`); ``None`` when the job still holds
    what it held (a write-through's pins, or reservations left WRITING in a
    primary without that ability). Given back when the transfer is provably over.
    """

    job: TransferJob
    held: tuple[int, ...] | None


@dataclass(slots=True, eq=False)
class SecondaryRecord:
    """One secondary tier as the manager sees it: the tier, its name, and the manager's maps about it.

    Every map is bounded: the jobs by what the manager submitted and the
    deadline (MGR-17), the abandoned jobs by the quarantine limit (no job
    goes to a tier whose quarantined slots reached it), the others by
    ``max_tracked_keys`` (MGR-18).
    """

    index: int  # the tier's place in lookup order
    tier: SecondaryTier
    name: str
    lookup: Callable[[OffloadKey, ReqContext], LookupResult]  # bound once: the lookup path is hot
    # Job id -> job in flight (submitted, not yet reported), in submission order.
    jobs: dict[int, TransferJob] = field(default_factory=dict)
    # Job id -> (step, clock time) of its submission, in submission order (MGR-17). (OrderedDicts:
    # their oldest entry is found in O(1) however many were deleted before it.)
    job_steps: OrderedDict[int, tuple[int, float]] = field(default_factory=OrderedDict)
    # Jobs ended by their deadline whose transfer may still run, until it provably ended (MGR-17).
    abandoned: OrderedDict[int, Abandoned] = field(default_factory=OrderedDict)
    # Primary slots (reservations or pins) the abandoned jobs hold; at the limit the tier is paused:
    # no promotion from it, no write-through to it, until some are given back (MGR-17).
    held_slots: int = 0
    paused: bool = False
    # The tier's declared job time bound (kvproto.JobTimeBound), read once; None: none declared.
    bound_s: float | None = None
    # Key -> first step at which its negative verdict no longer applies, in expiry order (an
    # update moves the key to the end), pruned every step (MGR-9, MGR-18).
    negative: OrderedDict[OffloadKey, int] = field(default_factory=OrderedDict)

    @classmethod
    def of(cls, index: int, tier: SecondaryTier) -> SecondaryRecord:
        return cls(index, tier, tier.name, tier.lookup, bound_s=job_time_bound(tier))

    def expire_negatives(self, step: int) -> None:
        """Forget the negative verdicts that no longer apply at ``step`` (MGR-9)."""
        negative = self.negative
        while negative:
            key = next(iter(negative))
            if negative[key] > step:
                break
            negative.popitem(last=False)

    def overdue(self, oldest: int, before: float) -> list[TransferJob]:
        """Take the jobs in flight submitted at step ``oldest`` or before and, where the tier declares
        a job time bound, at clock time ``before`` or earlier (MGR-17)."""
        started = self.job_steps
        due: list[TransferJob] = []
        while started:
            job_id = next(iter(started))
            step, at = started[job_id]
            if step > oldest or at > before:
                break
            del started[job_id]
            job = self.jobs.pop(job_id, None)
            if job is not None:
                due.append(job)
        return due


@dataclass(slots=True, eq=False)
class RequestRecord:
    """A request with stores prepared through the manager and not yet completed (MGR-5, MGR-7).

    It exists while ``stores`` is not empty. ``finishing`` is the request's
    context once the scheduler finished it: the secondaries hear
    ``on_request_finished`` when its last store completed and its
    write-throughs were submitted.
    """

    stores: set[OffloadKey] = field(default_factory=set)
    finishing: ReqContext | None = None


def job_time_bound(tier: object) -> float | None:
    """``tier.job_time_bound_s`` (:class:`kvproto.JobTimeBound`) checked: None or a finite number > 0.

    Anything else is a :class:`~kvproto.errors.ConfigurationError` naming the tier (MGR-17).
    """
    bound: object = getattr(tier, "job_time_bound_s", None)
    if bound is None:
        return None
    if type(bound) not in (int, float) or not 0 < cast(float, bound) < math.inf:
        name = getattr(tier, "name", repr(tier))
        raise ConfigurationError(f"tier {name!r}: job_time_bound_s must be None or a finite number > 0, got {bound!r}")
    return float(cast(float, bound))


def cap_entries(entries: OrderedDict[_K, _V], limit: int, stats: TieringStats) -> None:
    """Drop the oldest entries beyond ``limit`` (``max_tracked_keys``), counting them (MGR-18)."""
    excess = len(entries) - limit
    if excess > 0:
        for _ in range(excess):
            entries.popitem(last=False)
        stats.tracked_keys_dropped += excess


def mark(entries: OrderedDict[OffloadKey, _V], keys: Iterable[OffloadKey], value: _V) -> None:
    """Set ``value`` for ``keys``, each moved to the end (newest) of ``entries``."""
    for key in keys:
        entries[key] = value
        entries.move_to_end(key)
