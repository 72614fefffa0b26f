"""What the manager keeps per secondary tier and per request (MGR-3, MGR-5, MGR-7, MGR-9, MGR-17, MGR-18)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from kvproto._jobs import TransferJob
from kvproto._keys import OffloadKey
from kvproto._protocols import SecondaryTier
from kvproto._requests import ReqContext
from kvproto._results import LookupResult
from kvproto._tiering._config import TieringStats

__all__ = ["RequestRecord", "SecondaryRecord", "cap_entries", "mark"]

_K = TypeVar("_K")
_V = TypeVar("_V")


@dataclass(slots=True, eq=False)
class SecondaryRecord:
    """One secondary tier as the manager sees it: the tier, its name, and the manager's maps about it.

    Every map is bounded: the jobs by what the manager submitted and the
    deadline (MGR-17), the others by ``max_tracked_keys`` (MGR-18).
    """

    index: int  # the tier's place in lookup order
    tier: SecondaryTier
    name: str
    lookup: Callable[[OffloadKey, ReqContext], LookupResult]  # bound once: the lookup path is hot
    # Job id -> job in flight (submitted, not yet reported), in submission order.
    jobs: dict[int, TransferJob] = field(default_factory=dict)
    # Job id -> the step it was submitted at, in submission order (MGR-17). (OrderedDicts: their
    # oldest entry is found in O(1) however many were deleted before it.)
    job_steps: OrderedDict[int, int] = field(default_factory=OrderedDict)
    # Jobs ended by their deadline, kept (bounded) to recognise a late report (MGR-17).
    abandoned: OrderedDict[int, TransferJob] = field(default_factory=OrderedDict)
    # Key -> first step at which its negative verdict no longer applies, in expiry order (an
    # update moves the key to the end), pruned every step (MGR-9, MGR-18).
    negative: OrderedDict[OffloadKey, int] = field(default_factory=OrderedDict)
    # Keys whose write-through was ended by its deadline: never promoted from this tier until a
    # write-through of the key succeeds here again (MGR-17).
    distrusted: OrderedDict[OffloadKey, None] = field(default_factory=OrderedDict)

    @classmethod
    def of(cls, index: int, tier: SecondaryTier) -> SecondaryRecord:
        return cls(index, tier, tier.name, tier.lookup)

    def expire_negatives(self, step: int) -> None:
        """Forget the negative verdicts that no longer apply at ``step`` (MGR-9)."""
        negative = self.negative
        while negative:
            key = next(iter(negative))
            if negative[key] > step:
                break
            negative.popitem(last=False)

    def overdue(self, oldest: int) -> list[TransferJob]:
        """Take the jobs in flight submitted at step ``oldest`` or before (MGR-17)."""
        started = self.job_steps
        due: list[TransferJob] = []
        while started:
            job_id = next(iter(started))
            if started[job_id] > oldest:
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
