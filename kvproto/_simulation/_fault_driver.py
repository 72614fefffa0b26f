"""Faults for a simulated run: a driver between a :class:`~kvproto.testing.faults.FaultySecondary` and the manager.

The simulator arms the driver's knobs per step with the run's seeded
:class:`random.Random`; the driver sees which faults took effect and counts
them in the report's :class:`FaultCounts`. A brown-out (``--faults
brownout=S``) is the driver's own: for S seconds once every 4 S of run time
(the first starting S after the run), jobs submitted to the tier are held and
no job is reported; then the held jobs go to the tier and its reports flow again.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from kvproto._jobs import JobResult, TransferJob
from kvproto._keys import OffloadKey
from kvproto._protocols import SecondaryTier
from kvproto._simulation._report import FaultCounts
from kvproto._simulation._workload import FLIP
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
        driver.fired += 1
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
        brownout_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(faulty)
        self._brownout_s = brownout_s
        self._brownout_limit = brownout_s  # what the bound declares, kept after disarm
        self._clock = clock
        self._started = clock()
        self._held: list[tuple[TransferJob, bool]] = []  # (job, promotion) submitted during a brown-out
        self._unsent: list[JobResult] = []  # held jobs failed at shutdown (they never reached the tier)
        self._was_out = False
        self._closed = False  # shut down: nothing is held or withheld any more
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
        self.fired = 0  # jobs this driver's faults failed or held, and methods it made raise (not the tier's doing)

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
        self._brownout_s = 0.0  # the brown-out ends: held jobs go out at the next step
        self.faulty.clear_faults()
        self.fail_pending = False
        self.raise_armed.clear()
        self._armed.clear()

    # -- SecondaryTier: what the driver sees; everything else forwards (ForwardingSecondary) ----

    @property
    def faulty(self) -> FaultySecondary[SecondaryTier]:
        """The fault wrapper the driver arms (its ``inner``)."""
        return self.inner

    # -- brown-out ---------------------------------------------------------------------------

    def browned_out(self) -> bool:
        """True while the tier stops answering: S seconds once every 4 S, the first S after the start."""
        span = self._brownout_s
        if span <= 0.0 or self._closed:
            return False
        phase = (self._clock() - self._started) % (4.0 * span)
        out = span <= phase < 2.0 * span
        if out and not self._was_out:
            self.counts.brownouts += 1
        self._was_out = out
        return out

    def _send_held(self) -> None:
        held, self._held = self._held, []
        for job, promotion in held:
            try:
                self._submit(job, self.inner.submit_load if promotion else self.inner.submit_store)
            except Exception:  # a raise fault hit the held submit: the job fails, reported next
                self._unsent.append(JobResult(job.job_id, False))

    @property
    def job_time_bound_s(self) -> float | None:
        """The inner tier's bound plus the longest a brown-out holds a job (MGR-17)."""
        bound = super().job_time_bound_s
        return None if bound is None else bound + self._brownout_limit

    def on_step_end(self) -> None:
        if self._held and not self.browned_out():
            self._send_held()
        super().on_step_end()

    def has_pending_work(self) -> bool:
        return bool(self._held) or bool(self._unsent) or super().has_pending_work()

    def shutdown(self) -> None:
        # Held jobs never reached the tier: they fail, reported by the next get_finished_jobs.
        self._closed = True
        self._unsent.extend(JobResult(job.job_id, False) for job, _ in self._held)
        self._held.clear()
        super().shutdown()

    # -- jobs ----------------------------------------------------------------------------------

    def submit_store(self, job: TransferJob) -> None:
        self._submit_or_hold(job, load=False)

    def submit_load(self, job: TransferJob) -> None:
        self._submit_or_hold(job, load=True)

    def _submit_or_hold(self, job: TransferJob, *, load: bool) -> None:
        """Hold the job while the tier is browned out (sent by the step end that finds it back);
        else submit it to the inner tier."""
        if self.browned_out():
            self._held.append((job, load))
            self.counts.brownout_jobs_held += 1
            self.fired += 1
            return
        self._submit(job, self.inner.submit_load if load else self.inner.submit_store)

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
        if self._unsent:
            unsent, self._unsent = self._unsent, []
            return [*unsent, *self.get_finished_jobs()]
        if self.browned_out():
            return []  # the tier's reports wait: it stops answering
        if self._held:
            self._send_held()
        results = self.inner.get_finished_jobs()
        for result in results:
            if result.job_id in self._fail_jobs:
                self._fail_jobs.discard(result.job_id)
                if not result.success and result.succeeded is None:
                    self.counts.fail_fired += 1
                    self.fired += 1
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
                self.fired += 1
