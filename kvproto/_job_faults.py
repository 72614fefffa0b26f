"""Armed job failures: the state behind :class:`~kvproto.MemoryTier`'s public ``fail_next_jobs`` / ``fail_keys`` (MEM-7).

Core because MemoryTier is: the core never imports the kit (tests/test_layering.py). The kit's
``FaultyBackend`` reuses this bookkeeping (the same KIT-5 semantics: the count is SET, keys are
ADDED); nothing here knows of the kit, of BlobTier or of any job path but MemoryTier's.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager

from kvproto._keys import OffloadKey
from kvproto.errors import InvalidArgumentError

__all__ = ["JobFaultHooks", "JobFaults"]


class JobFaults:
    """A count of whole jobs to fail next and a set of keys to fail in every job.

    Not locked: its owner calls every method under the owner's own lock.
    """

    __slots__ = ("fail_next", "keys")

    def __init__(self) -> None:
        self.fail_next = 0
        self.keys: set[OffloadKey] = set()

    def set_fail_next(self, n: object) -> None:
        """SET the count of next jobs to fail whole (0 disarms); ``n`` must be an int >= 0, else
        :class:`~kvproto.errors.InvalidArgumentError` and nothing changes (MEM-7, KIT-5)."""
        if type(n) is not int or n < 0:
            raise InvalidArgumentError(f"fail_next_jobs: n must be an int >= 0, got {n!r}")
        self.fail_next = n

    def take_next(self) -> bool:
        """Whether the job being submitted fails whole; uses up one of the count if so."""
        if self.fail_next > 0:
            self.fail_next -= 1
            return True
        return False

    def clear(self) -> None:
        """Disarm: no job and no key fails any more."""
        self.fail_next = 0
        self.keys.clear()


class JobFaultHooks:
    """The two arming hooks, for a class that holds ``_lock`` and ``_job_faults`` (MEM-7, KIT-5).

    Thread-safe: the hooks arm under the owner's lock, so a test may arm while workers run.
    """

    _lock: AbstractContextManager[bool]
    _job_faults: JobFaults

    def fail_next_jobs(self, n: int) -> None:
        """The next ``n`` jobs submitted fail whole and move no bytes; SETS the count (0 disarms).

        ``n`` must be an int >= 0, else :class:`~kvproto.errors.InvalidArgumentError` (MEM-7, KIT-5).
        """
        with self._lock:
            self._job_faults.set_fail_next(n)

    def fail_keys(self, keys: Iterable[OffloadKey]) -> None:
        """Every later job touching ``keys`` fails for those keys, and only those (a partial
        JobResult; a tier that writes whole jobs fails the job); ADDS to the set (MEM-7, KIT-5)."""
        with self._lock:
            self._job_faults.keys.update(keys)
