"""Faults for a simulated run: a driver between a :class:`~kvproto.testing.faults.FaultySecondary` and the manager.

The simulator arms the driver's knobs per step with the run's seeded
:class:`random.Random`; the driver sees which faults took effect and counts
them in the report's :class:`FaultCounts`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

from kvproto._jobs import JobResult, TransferJob
from kvproto._keys import OffloadKey
from kvproto._protocols import SecondaryTier
from kvproto.testing._simulation._report import FaultCounts
from kvproto.testing._simulation._workload import FLIP
from kvproto.testing.faults import FaultySecondary
from kvproto.tierkit import ForwardingSecondary

__all__ = ["_FaultDriver"]  # kept under its old name: the forwarding-bases rebase looks for it


class _OneShotRaise:
    """A RaiseRule that raises once, counts it, and disarms itself."""

    def __init__(self, driver: _FaultDriver, method: str) -> None:
        self._driver = driver
        self._method = method

    def __call__(self, *args: object) -> BaseException | None:
        driver = self._driver
        driver.raise_armed.discard(self._method)
        driver.faulty.raise_in(self._method, None)
        driver.counts.raise_fired += 1
        return RuntimeError(f"kvproto simulate: injected failure in {driver.name}.{self._method}")


class _FaultDriver(ForwardingSecondary[FaultySecondary[SecondaryTier]]):
    """Arms a FaultySecondary's knobs for the simulator and sees which ones took effect.

    A :class:`~kvproto.tierkit.ForwardingSecondary` over ``faulty``: it sees
    each job as the manager submits it and each result as it is reported. Its state is
    bounded by the jobs in flight and by ``_ARMED_CAP`` armed keys.
    """

    _ARMED_CAP = 4096

    def __init__(
        self,
        faulty: FaultySecondary[SecondaryTier],
        *,
        flat: memoryview,
        block_bytes: int,
        expected: Callable[[OffloadKey], bytes],
        counts: FaultCounts,
        delayed: bool,
    ) -> None:
        super().__init__(faulty)
        self._flat = flat
        self._block_bytes = block_bytes
        self._expected = expected
        self.counts = counts
        self._delayed = delayed
        self.fail_pending = False
        self._fail_jobs: set[int] = set()
        self._armed: OrderedDict[OffloadKey, None] = OrderedDict()  # keys armed for a detected corruption
        self._loads: dict[int, TransferJob] = {}  # promotion jobs holding an armed key
        self.raise_armed: set[str] = set()

    # -- arming (called by the simulator) ---------------------------------------------------

    def arm_fail(self) -> None:
        if not self.fail_pending:
            self.fail_pending = True
            self.counts.fail_armed += 1

    def arm_corrupt(self, key: OffloadKey) -> None:
        if key in self._armed:
            return
        self.faulty.corrupt_on_read([key], detect=True)
        self._armed[key] = None
        if len(self._armed) > self._ARMED_CAP:
            self._armed.popitem(last=False)
        self.counts.corrupt_armed += 1

    def arm_raise(self, method: str) -> None:
        if method in self.raise_armed:
            return
        self.raise_armed.add(method)
        self.faulty.raise_in(method, _OneShotRaise(self, method))
        self.counts.raise_armed += 1

    def disarm(self) -> None:
        self.faulty.clear_faults()
        self.fail_pending = False
        self.raise_armed.clear()
        self._armed.clear()

    # -- SecondaryTier: what the driver sees; everything else forwards (ForwardingSecondary) ----

    @property
    def faulty(self) -> FaultySecondary[SecondaryTier]:
        """The fault wrapper the driver arms (its ``inner``)."""
        return self.inner

    def submit_store(self, job: TransferJob) -> None:
        self._submit(job, self.inner.submit_store)

    def submit_load(self, job: TransferJob) -> None:
        self._submit(job, self.inner.submit_load)

    def _submit(self, job: TransferJob, submit: Callable[[TransferJob], None]) -> None:
        if self._delayed:
            self.counts.jobs_delayed += 1
        if self.fail_pending:
            self.inner.fail_next_jobs(1)
            try:
                submit(job)
            finally:
                self.inner.fail_next_jobs(0)  # unused if the submit raised: armed again next job
            self.fail_pending = False
            self._fail_jobs.add(job.job_id)
            return
        submit(job)
        if job.promotion and self._armed and any(k in self._armed for k in job.keys):
            self._loads[job.job_id] = job

    def get_finished_jobs(self) -> Sequence[JobResult]:
        results = self.inner.get_finished_jobs()
        for result in results:
            if result.job_id in self._fail_jobs:
                self._fail_jobs.discard(result.job_id)
                if not result.success and result.succeeded is None:
                    self.counts.fail_fired += 1
            job = self._loads.pop(result.job_id, None)
            if job is not None:
                self._check_reads(job, result.succeeded_keys(job))
        return results

    def _check_reads(self, job: TransferJob, done: frozenset[OffloadKey]) -> None:
        size = self._block_bytes
        for key, slot in zip(job.keys, job.slots, strict=True):
            if key not in self._armed:
                continue
            row = bytes(self._flat[slot * size : (slot + 1) * size])
            if row != self._expected(key).translate(FLIP):
                continue  # not damaged (yet): the key failed for another reason, the fault stays armed
            del self._armed[key]
            if key in done:
                self.counts.corrupt_undetected += 1
            else:
                self.counts.corrupt_detected += 1
