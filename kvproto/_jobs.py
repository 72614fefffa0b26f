"""Request and job values exchanged between the scheduler, the manager and the tiers."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from kvproto._keys import OffloadKey
from kvproto.errors import InvalidArgumentError

__all__ = [
    "EventKind",
    "JobResult",
    "OffloadingEvent",
    "PrepareStoreOutput",
    "ReqContext",
    "TransferJob",
]

_T = TypeVar("_T")


@dataclass(slots=True, eq=False)
class ReqContext:
    """One scheduler request as the tiers see it (TIER-2).

    ``req_id`` identifies the request; ``transfer_params`` carries optional
    engine-specific parameters. ``state(cls, factory)`` gives each component
    its own per-request scratch object, keyed by type, so tiers can keep
    per-request bookkeeping without a global map; it is dropped with the
    context when the request finishes.
    """

    req_id: str
    transfer_params: Mapping[str, object] | None = None
    _scratch: dict[type[object], object] = field(default_factory=dict, repr=False)

    def state(self, cls: type[_T], factory: Callable[[], _T] | None = None) -> _T:
        """Return this request's scratch object of type ``cls``, creating it on first use."""
        found = self._scratch.get(cls)
        if found is None:
            made = cls() if factory is None else factory()
            self._scratch[cls] = made
            return made
        if not isinstance(found, cls):  # pragma: no cover - keyed by its own type
            raise InvalidArgumentError(f"scratch state for {cls.__name__} has type {type(found)}")
        return found

    def drop_state(self, cls: type[object]) -> None:
        """Forget this request's scratch object of type ``cls``, if any."""
        self._scratch.pop(cls, None)


@dataclass(frozen=True, slots=True)
class TransferJob:
    """One batch of blocks moving between a secondary tier and primary slots (TIER-10).

    ``keys[i]`` lives in primary slot ``slots[i]``. ``promotion`` is True for a
    load (secondary -> primary), False for a write-through store (primary ->
    secondary). ``req_id`` names the request the job serves, if any.
    """

    job_id: int
    keys: tuple[OffloadKey, ...]
    slots: tuple[int, ...]
    promotion: bool
    req_id: str | None = None

    def __post_init__(self) -> None:
        if len(self.keys) != len(self.slots):
            raise InvalidArgumentError(
                f"job {self.job_id}: {len(self.keys)} keys but {len(self.slots)} slots"
            )


@dataclass(frozen=True, slots=True)
class JobResult:
    """The outcome of one :class:`TransferJob`, reported exactly once (TIER-11).

    ``success`` True means every key of the job succeeded. When ``success`` is
    False, ``succeeded`` may name the subset of the job's keys that did
    succeed (a partial job); ``None`` means none did.
    """

    job_id: int
    success: bool
    succeeded: frozenset[OffloadKey] | None = None

    def succeeded_keys(self, job: TransferJob) -> frozenset[OffloadKey]:
        """The keys of ``job`` that this result reports as done."""
        if self.success:
            return frozenset(job.keys)
        if self.succeeded is None:
            return frozenset()
        return self.succeeded & frozenset(job.keys)


@dataclass(frozen=True, slots=True)
class PrepareStoreOutput:
    """What ``prepare_store`` decided (TIER-6).

    ``keys_to_store[i]`` is to be written into primary slot ``slots[i]``;
    ``evicted`` lists the blocks evicted to make room for them.
    """

    keys_to_store: tuple[OffloadKey, ...]
    slots: tuple[int, ...]
    evicted: tuple[OffloadKey, ...] = ()


class EventKind(enum.Enum):
    """What happened to the blocks of an :class:`OffloadingEvent`."""

    STORED = "stored"
    REMOVED = "removed"


@dataclass(frozen=True, slots=True)
class OffloadingEvent:
    """Blocks that became readable in (``STORED``) or left (``REMOVED``) a tier (TIER-14)."""

    kind: EventKind
    keys: tuple[OffloadKey, ...]
    tier: str
