"""Job values exchanged between the manager and the tiers: transfer jobs, their results, store plans."""

from __future__ import annotations

from dataclasses import dataclass

from kvproto._keys import OffloadKey
from kvproto.errors import InvalidArgumentError

__all__ = ["JobResult", "PrepareStoreOutput", "TransferJob"]


def _check_job_id(what: str, job_id: object) -> None:
    if type(job_id) is not int:
        raise InvalidArgumentError(f"{what}: job_id must be an int, got {job_id!r}")


@dataclass(frozen=True, slots=True)
class TransferJob:
    """One batch of blocks moving between a secondary tier and primary slots (TIER-10).

    ``keys[i]`` lives in primary slot ``slots[i]``. ``promotion`` is True for a
    load (secondary -> primary), False for a write-through store (primary ->
    secondary). ``req_id`` names the request the job serves, if any. Every
    field is checked at construction: a wrong type is an
    :class:`~kvproto.errors.InvalidArgumentError` naming it (MGR-11).
    """

    job_id: int
    keys: tuple[OffloadKey, ...]
    slots: tuple[int, ...]
    promotion: bool
    req_id: str | None = None

    def __post_init__(self) -> None:
        _check_job_id("TransferJob", self.job_id)
        # Checked as objects: a third-party tier or engine may pass anything.
        keys: object = self.keys
        slots: object = self.slots
        if not isinstance(keys, tuple) or not all(isinstance(k, bytes) for k in keys):
            raise InvalidArgumentError(f"TransferJob {self.job_id}: keys must be a tuple of bytes, got {keys!r}")
        if not isinstance(slots, tuple) or not all(type(s) is int and s >= 0 for s in slots):
            raise InvalidArgumentError(f"TransferJob {self.job_id}: slots must be a tuple of ints >= 0, got {slots!r}")
        if len(keys) != len(slots):
            raise InvalidArgumentError(
                f"job {self.job_id}: {len(self.keys)} keys but {len(slots)} slots"
            )
        if type(self.promotion) is not bool:
            raise InvalidArgumentError(f"TransferJob {self.job_id}: promotion must be a bool, got {self.promotion!r}")
        req_id: object = self.req_id
        if req_id is not None and not isinstance(req_id, str):
            raise InvalidArgumentError(f"TransferJob {self.job_id}: req_id must be a str or None, got {req_id!r}")


@dataclass(frozen=True, slots=True)
class JobResult:
    """The outcome of one :class:`TransferJob`, reported exactly once (TIER-11).

    ``success`` True means every key of the job succeeded. When ``success`` is
    False, ``succeeded`` may name the subset of the job's keys that did
    succeed (a partial job); ``None`` means none did. Every field is checked
    at construction (an int ``job_id``, a bool ``success``, a frozenset of
    keys or None): a wrong type is an
    :class:`~kvproto.errors.InvalidArgumentError` naming it (MGR-11).
    """

    job_id: int
    success: bool
    succeeded: frozenset[OffloadKey] | None = None

    def __post_init__(self) -> None:
        _check_job_id("JobResult", self.job_id)
        if type(self.success) is not bool:
            raise InvalidArgumentError(f"JobResult {self.job_id}: success must be a bool, got {self.success!r}")
        succeeded: object = self.succeeded
        if succeeded is not None and (
            not isinstance(succeeded, frozenset) or not all(isinstance(k, bytes) for k in succeeded)
        ):
            raise InvalidArgumentError(
                f"JobResult {self.job_id}: succeeded must be None or a frozenset of keys, got {succeeded!r}"
            )

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
