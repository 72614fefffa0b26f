"""Job values exchanged between the manager and the tiers: transfer jobs, their results, store plans."""

from __future__ import annotations

from dataclasses import dataclass

from kvproto._keys import OffloadKey
from kvproto.errors import InvalidArgumentError

__all__ = ["JobResult", "PrepareStoreOutput", "TransferJob"]


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
