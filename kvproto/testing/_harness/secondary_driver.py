"""``SecondaryDriver``: the kit drives one secondary tier, bound to one primary buffer, step by
step, as a scheduler would (KIT-2)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from kvproto import members as lr
from kvproto._capabilities import Capabilities
from kvproto._jobs import JobResult, TransferJob
from kvproto._keys import OffloadKey
from kvproto._protocols import SecondaryTier
from kvproto._requests import ReqContext
from kvproto._results import LookupResult, unreachable
from kvproto.testing._harness.data import block_for, differing_bytes, row, sentinel_for
from kvproto.testing._harness.driver import SlowCalls, TierDriver, TrackedContext, expect_answers, short_key, voluntary_switches
from kvproto.testing._harness.failures import ConformanceFailure
from kvproto.testing._harness.settings import KitLimits
from kvproto.testing._harness.thread_ledger import ThreadLedger

__all__ = ["IDLE_PAUSES_S", "STARTUP_BOUND_S", "SecondaryDriver"]

IDLE_PAUSES_S = (0.0, 0.0001, 0.0002, 0.0005, 0.001)
"""The pause after each step in a row that reported none of the jobs waited for (the last one
repeats). A job done by the next hook costs no pause; a job on a worker thread gets the CPU and the
interpreter instead of a kit spinning on ``on_step_end``; the pause stays far below the kit's bounds
(``KitLimits``), which count hooks and seconds and are unchanged."""

STARTUP_BOUND_S = 30.0
"""How long the kit waits for a tier offering ``wait_ready`` to start (KIT-19): a bound on a
condition, met at once by a healthy tier, never a wait for luck."""


class SecondaryDriver(TierDriver[SecondaryTier]):
    """One secondary tier bound to one primary buffer, driven step by step."""

    _advice = "a lookup must answer at once and answer RETRY while it finds out"

    def __init__(
        self,
        tier: SecondaryTier,
        buffer: memoryview,
        capabilities: Capabilities,
        limits: KitLimits,
        *,
        first_job_id: int = 7001,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        if buffer.ndim != 2 or buffer.shape is None:
            raise ConformanceFailure("TIER-3", "the primary buffer handed to the kit is not 2-D")
        super().__init__(tier, capabilities, limits, on_close=on_close)
        self.buffer = buffer
        self.num_slots, self.block_bytes = buffer.shape[0], buffer.shape[1]
        self.jobs: dict[int, TransferJob] = {}
        self.results: dict[int, JobResult] = {}
        self.steps = 0
        self.slow_steps = SlowCalls(limits)
        self._last_step = 0.0
        self._idle_steps = 0  # steps in a row that reported none of the jobs waited for
        self._next_job_id = first_job_id
        self._submitted_at: dict[int, tuple[int, float]] = {}
        # KIT-5: the next ``_armed_left`` jobs submitted must fail whole (the kit armed fail_next_jobs).
        self._armed_left = 0
        self.armed_jobs: dict[int, str] = {}  # job id -> the hook armed for it
        # KIT-17: stores reported failed while no fault hook had run: the check's set-up failed.
        self.setup_failures: list[str] = []
        self.faults_injected = False
        # TIER-16: the threads the tier started and which were joined (set by the kit's fixture).
        self.threads: ThreadLedger | None = None
        # KIT-26: builds another instance of the tier (set by the kit's fixture with the ledger above).
        self.another_build: Callable[[memoryview], SecondaryTier] | None = None
        # The keys the last resolve saw answer MISS only once the declared max_retry_steps had passed.
        self.deadline_misses: set[OffloadKey] = set()
        # TIER-16: keys stored again with new bytes after a reset (new_era); absent: era 0.
        self.eras: dict[OffloadKey, int] = {}
        # What each slot must hold; None while a load job targets it or after a failed load.
        self._shadow: list[bytes | None] = []
        for slot in range(self.num_slots):
            filler = sentinel_for(slot, self.block_bytes)
            row(buffer, slot)[:] = filler
            self._shadow.append(filler)

    # ---- the primary buffer -------------------------------------------------------------
    def slot_bytes(self, slot: int) -> bytes:
        """What primary slot ``slot`` holds now."""
        return bytes(row(self.buffer, slot))

    def put_block(self, slot: int, key: OffloadKey) -> None:
        """Write ``key``'s bytes into ``slot``, as the device -> CPU copy would."""
        data = self.block_of(key)
        row(self.buffer, slot)[:] = data
        self._shadow[slot] = data

    def clear_slot(self, slot: int) -> None:
        """Refill ``slot`` with its sentinel, so a later load into it is visible."""
        filler = sentinel_for(slot, self.block_bytes)
        row(self.buffer, slot)[:] = filler
        self._shadow[slot] = filler

    def _busy_load_slots(self) -> set[int]:
        busy: set[int] = set()
        for job_id, job in self.jobs.items():
            if job.promotion and job_id not in self.results:
                busy.update(job.slots)
        return busy

    def check_untouched_slots(self) -> None:
        """Every slot no unfinished load job targets still holds what the kit put there (TIER-10)."""
        busy = self._busy_load_slots()
        for slot in range(self.num_slots):
            want = self._shadow[slot]
            if slot in busy or want is None:
                continue
            if self.slot_bytes(slot) != want:
                raise ConformanceFailure(
                    "TIER-10",
                    f"primary slot {slot} changed although no load job targeted it "
                    "(a store must only read the buffer; a load must only write its own slots)",
                )

    # ---- jobs -----------------------------------------------------------------------------
    def _job(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], promotion: bool, context: ReqContext | None
    ) -> TransferJob:
        req_id = (self.context if context is None else context).req_id
        job = TransferJob(self._next_job_id, tuple(keys), tuple(slots), promotion, req_id=req_id)
        self._next_job_id += 1
        self.jobs[job.job_id] = job
        self._submitted_at[job.job_id] = (self.steps, time.monotonic())
        if self._armed_left > 0:
            self._armed_left -= 1
            self.armed_jobs[job.job_id] = "fail_next_jobs"
        return job

    def restart_bounds(self, job_ids: Iterable[int]) -> None:
        """Count the job bounds (TIER-11) of ``job_ids`` from now: the kit held the tier's thread doing
        them (a storage-call gate), so the steps and seconds that took are the kit's, not the tier's."""
        for job_id in job_ids:
            if job_id in self._submitted_at:
                self._submitted_at[job_id] = (self.steps, time.monotonic())

    # ---- what the kit armed a backdoor hook for (KIT-5) ------------------------------------
    def arm_failing_jobs(self, n: int) -> None:
        """The kit called ``fail_next_jobs(tier, n)``: the next ``n`` jobs submitted must fail whole
        (the count is set, not added). An armed job reported successful is the hook's fault, and
        fails KIT-5 naming the hook (and any other job that failed instead), never a tier clause."""
        self._armed_left = n

    def _hook_misfired(self, job: TransferJob, result: JobResult) -> ConformanceFailure | None:
        """KIT-5 where a hook armed for ``job`` had no effect on it (its fault landed elsewhere, or nowhere)."""
        hook = self.armed_jobs.get(job.job_id)
        if hook is not None and result.success:
            elsewhere = [
                j for j, r in self.results.items() if j > job.job_id and j not in self.armed_jobs and not r.success
            ]
            landed = (
                f"job {elsewhere[0]}, which it was not armed for, failed instead"
                if elsewhere
                else "no job failed"
            )
            return ConformanceFailure(
                "KIT-5",
                f"the {hook} hook was armed for job {job.job_id} (the next job submitted), but that job succeeded "
                f"and {landed}: the hook's fault missed its job (a hook that arms late, or fails another job, is "
                "the hook's fault, not the tier's)",
            )
        return None

    def submit_store(
        self, keys: Sequence[OffloadKey], slots: Sequence[int] | None = None, *, context: ReqContext | None = None
    ) -> TransferJob:
        """Put each key's bytes in its slot, then ``submit_store`` them (TIER-10); the job serves
        ``context``'s request (the kit's own by default)."""
        chosen = list(range(len(keys))) if slots is None else list(slots)
        for slot, key in zip(chosen, keys, strict=True):
            self.put_block(slot, key)
        job = self._job(keys, chosen, False, context)
        self.tier.submit_store(job)
        return job

    def submit_load(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], *, context: ReqContext | None = None
    ) -> TransferJob:
        """Clear the target slots, then ``submit_load`` ``keys`` into them (TIER-10)."""
        for slot in slots:
            self.clear_slot(slot)
        job = self._job(keys, slots, True, context)
        self.tier.submit_load(job)
        return job

    def step(self) -> list[JobResult]:
        """One scheduler step: ``on_step_end`` then ``get_finished_jobs``; validates each result."""
        switches = voluntary_switches()
        started = time.perf_counter()
        self.tier.on_step_end()
        took = time.perf_counter() - started
        after = voluntary_switches()
        self._last_step = time.perf_counter()
        self.steps += 1
        waited = switches is None or after is None or after > switches
        if self.slow_steps.too_slow(took, waited):
            raise ConformanceFailure(
                "TIER-13",
                f"on_step_end blocked for {took:.3f} s (budget {self.limits.lookup_budget_s:g} s; "
                f"{self.slow_steps.count} of {self.slow_steps.calls} steps slow); the end-of-step hook "
                "must not wait for jobs",
            )
        return self.collect()

    def collect(self) -> list[JobResult]:
        """``get_finished_jobs`` once, validating each result (TIER-11) and each finished load.

        Every result of the batch is recorded before a violation is raised, so one bad result
        never hides the others (a job the tier did report is never blamed as unreported)."""
        fresh = list(self.tier.get_finished_jobs())
        problems: list[ConformanceFailure] = []
        loads: list[tuple[TransferJob, JobResult]] = []
        for result in fresh:
            problem = self._record(result)
            if problem is not None:
                problems.append(problem)
            elif self.jobs[result.job_id].promotion:
                loads.append((self.jobs[result.job_id], result))
        # A hook that missed its job is judged once the whole batch is recorded (the job its fault
        # landed on may come later in it), and is reported first: it is the hook's fault (KIT-5).
        reported: list[object] = list(fresh)  # the tier may report anything: _record said what
        misfires = [
            m
            for r in reported
            if isinstance(r, JobResult) and r.job_id in self.jobs
            for m in [self._hook_misfired(self.jobs[r.job_id], r)]
            if m is not None
        ]
        problems[:0] = misfires
        for job, result in loads:
            try:
                self._verify_load(job, result)
            except ConformanceFailure as failure:
                problems.append(failure)
        if problems:
            raise problems[0]
        self.check_untouched_slots()
        return fresh

    def _record(self, result: object) -> ConformanceFailure | None:
        """Record one reported result; the TIER-11/CAP-4 violation it shows, if any (a hook misfire is judged in collect)."""
        if not isinstance(result, JobResult):
            return ConformanceFailure("TIER-11", f"get_finished_jobs returned {result!r}, which is not a JobResult")
        job = self.jobs.get(result.job_id)
        if job is None:
            return ConformanceFailure(
                "TIER-11", f"get_finished_jobs reported job {result.job_id}, which was never submitted"
            )
        if result.job_id in self.results:
            return ConformanceFailure(
                "TIER-11",
                f"job {result.job_id} was reported finished twice (first {self.results[result.job_id]}, then {result})",
            )
        self.results[result.job_id] = result
        if result.succeeded is not None and not result.succeeded <= frozenset(job.keys):
            if job.promotion:
                for slot in job.slots:
                    self._shadow[slot] = None  # nothing trustworthy was reported about its slots
            return ConformanceFailure("TIER-11", f"job {result.job_id} reports succeeded keys that are not in the job")
        if result.succeeded and not result.success and not self.capabilities.partial_jobs:
            if job.promotion:
                for slot in job.slots:
                    self._shadow[slot] = None
            return ConformanceFailure(
                "CAP-4",
                f"job {result.job_id} finished partly ({len(result.succeeded)} of {len(job.keys)} keys) but the tier "
                "does not declare partial_jobs: an undeclared capability is a promise that jobs finish whole",
            )
        return None

    def _verify_load(self, job: TransferJob, result: JobResult) -> None:
        done = result.succeeded_keys(job)
        wrong: tuple[OffloadKey, int, bytes] | None = None
        for key, slot in zip(job.keys, job.slots, strict=True):
            if key not in done:
                self._shadow[slot] = None  # a failed load may leave anything in its slot
                continue
            want = self.block_of(key)
            got = self.slot_bytes(slot)
            self._shadow[slot] = got  # what it holds now; judged below
            if got != want and wrong is None:
                wrong = (key, slot, got)
        if wrong is not None:
            key, slot, got = wrong
            raise ConformanceFailure("TIER-10", self._diagnose(job, key, slot, got))

    def block_of(self, key: OffloadKey) -> bytes:
        """The bytes the kit stores under ``key`` now: :func:`block_for` of its era (:meth:`new_era`)."""
        return block_for(key, self.block_bytes, self.eras.get(key, 0))

    def new_era(self, keys: Sequence[OffloadKey]) -> None:
        """From now on ``keys`` are stored (and must load) with other bytes than before: the same keys
        stored again after a ``reset_cache``, as after a weight update (TIER-16)."""
        for key in keys:
            self.eras[key] = self.eras.get(key, 0) + 1

    def _diagnose(self, job: TransferJob, key: OffloadKey, slot: int, got: bytes) -> str:
        want = self.block_of(key)
        head = f"load job {job.job_id} reported key {short_key(key)} done, but slot {slot}"
        era = self.eras.get(key, 0)
        if era and any(got == block_for(key, self.block_bytes, before) for before in range(era)):
            return (f"{head} holds the bytes stored under that key before a reset_cache; the key was stored "
                    "again with new bytes since")
        # A slot holding the key's bytes counts only where the kit did not put them itself.
        elsewhere = next(
            (
                other
                for other in range(self.num_slots)
                if other != slot and self._shadow[other] != want and self.slot_bytes(other) == want
            ),
            None,
        )
        moved = "" if elsewhere is None else f"; its bytes were written into slot {elsewhere} instead"
        known = {k for j in self.jobs.values() for k in j.keys}
        for other_key in known:
            if other_key != key and block_for(other_key, self.block_bytes) == got:
                return f"{head} holds the bytes of another key, {short_key(other_key)}{moved}"
        if got == sentinel_for(slot, self.block_bytes):
            return f"{head} was never written{moved}"
        return f"{head} holds bytes that were never stored under any key ({differing_bytes(want, got)}){moved}"

    def reported_since(self, seen: int) -> list[tuple[TransferJob, frozenset[OffloadKey]]]:
        """The jobs reported after the first ``seen`` reports, in report order, each with the keys it moved."""
        fresh = list(self.results.items())[seen:]
        return [(self.jobs[job_id], result.succeeded_keys(self.jobs[job_id])) for job_id, result in fresh]

    def pending(self) -> list[int]:
        """Ids of submitted jobs not reported yet, oldest first."""
        return [job_id for job_id in self.jobs if job_id not in self.results]

    def wait_step(self, jobs: Iterable[TransferJob]) -> None:
        """One step while waiting for ``jobs``; a job past both bounds fails TIER-11 (see KitLimits).

        A step that reported none of ``jobs`` is followed by a short pause (:data:`IDLE_PAUSES_S`,
        growing while nothing lands), so the kit waits for the tier's workers instead of spinning
        on ``on_step_end`` and holding the interpreter they need (KIT-19: the condition waited for
        is the job reported; the pause only decides how often it is asked)."""
        wanted = list(jobs)
        before = sum(1 for job in wanted if job.job_id in self.results)
        self.step()
        now = time.monotonic()
        lost: list[int] = []
        overdue = False
        waiting = 0
        for job in wanted:
            if job.job_id in self.results:
                continue
            waiting += 1
            steps_then, time_then = self._submitted_at[job.job_id]
            if self.steps - steps_then >= self.limits.max_job_steps:
                overdue = True
                if now - time_then >= self.limits.job_timeout_s:
                    lost.append(job.job_id)
        if lost:
            raise ConformanceFailure(
                "TIER-11",
                f"job(s) {lost} never reported finished after {self.limits.max_job_steps} steps "
                f"and {self.limits.job_timeout_s:g} s",
            )
        if overdue:
            time.sleep(0.001)
        elif waiting and len(wanted) - waiting == before:
            time.sleep(IDLE_PAUSES_S[min(self._idle_steps, len(IDLE_PAUSES_S) - 1)])
            self._idle_steps += 1
        else:
            self._idle_steps = 0

    def wait(self, jobs: Iterable[TransferJob]) -> dict[int, JobResult]:
        """Step until every job in ``jobs`` is reported; a job never reported fails TIER-11."""
        wanted = list(jobs)
        while any(job.job_id not in self.results for job in wanted):
            self.wait_step(wanted)
        return {job.job_id: self.results[job.job_id] for job in wanted}

    def store(
        self, keys: Sequence[OffloadKey], slots: Sequence[int] | None = None, *, context: ReqContext | None = None
    ) -> JobResult:
        """Submit a store and wait for its result. A store reported failed with no fault injected
        (no hook armed or run) is recorded as a failed set-up step (KIT-17)."""
        job = self.submit_store(keys, slots, context=context)
        result = self.wait([job])[job.job_id]
        if not result.success and job.job_id not in self.armed_jobs and not self.faults_injected:
            self.setup_failures.append(
                f"the tier reported store job {job.job_id} ({len(job.keys)} block(s)) failed, with no fault injected"
            )
        return result

    def load(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], *, context: ReqContext | None = None
    ) -> JobResult:
        """Submit a load and wait for its result (bytes are verified as it finishes)."""
        job = self.submit_load(keys, slots, context=context)
        return self.wait([job])[job.job_id]

    def settle(self) -> None:
        """Wait for every job in flight."""
        self.wait([self.jobs[j] for j in self.pending()])

    def quiet_steps(self, steps: int = 8) -> None:
        """Run a few steps with nothing to report, so late duplicates show up (TIER-11)."""
        for _ in range(steps):
            self.step()
        time.sleep(0.005)
        self.collect()

    def wait_started(self) -> None:
        """Wait until the tier has started, where it can say so: a tier starting in the background
        (a reopened instance scanning its storage) may offer ``wait_ready(timeout) -> bool``, as
        :class:`~kvproto.tierkit.BlobTier` does. The kit then asks it only once started, on that
        condition, instead of racing its start-up against the kit's clock (KIT-19). A tier still
        not started after ``STARTUP_BOUND_S`` fails TIER-18 (its instances must come up)."""
        ready = getattr(self.tier, "wait_ready", None)
        if callable(ready) and ready(STARTUP_BOUND_S) is False:
            raise ConformanceFailure(
                "TIER-18", f"a new instance over the same storage had not started after {STARTUP_BOUND_S:g} s (wait_ready)"
            )

    # ---- lookups --------------------------------------------------------------------------
    def _vet(self, key: OffloadKey, answer: LookupResult) -> LookupResult:
        """Never HIT_PENDING (LR-3); RETRY only if declared (CAP-3)."""
        match answer:
            case lr.HIT_PENDING:
                raise ConformanceFailure(
                    "LR-3",
                    f"lookup({short_key(key)}) answered HIT_PENDING; a secondary tier never does "
                    "(it answers RETRY while it finds out, HIT once readable)",
                )
            case lr.RETRY:
                if not self.capabilities.async_lookup:
                    raise ConformanceFailure(
                        "CAP-3",
                        f"lookup({short_key(key)}) answered RETRY but the tier does not declare "
                        "the async_lookup capability (an undeclared capability is a promise never to do it)",
                    )
            case lr.HIT | lr.MISS:
                pass
            case _ as other:
                unreachable(other, where="SecondaryDriver.lookup")
        return answer

    def wait_checks_back(self) -> bool:
        """Wait until the tier's background work is back, where it can say so: a tier may offer
        ``wait_idle(timeout) -> bool``, as :class:`~kvproto.tierkit.BlobTier` does (jobs, posted
        existence batches). True once idle; False if it cannot say, or was not idle within the kit's
        ``job_timeout_s`` (KIT-19: a check that counts storage requests waits for this condition,
        not for time)."""
        idle = getattr(self.tier, "wait_idle", None)
        return callable(idle) and idle(self.limits.job_timeout_s) is True

    def resolve(
        self, keys: Sequence[OffloadKey], context: ReqContext | None = None, *, patient: bool = False
    ) -> dict[OffloadKey, LookupResult]:
        """Ask until every key answers HIT or MISS; RETRY must end within the declared
        ``max_retry_steps`` end-of-step hooks (and the kit's wall-time bound) (TIER-18).

        ``patient``: before each end-of-step hook, :meth:`wait_checks_back` (a step then applies what came
        back): the answers rest on the tier's existence checks, never on whether they beat the
        tier's own step deadline on a loaded machine, and the storage requests they made are all
        made when this returns (KIT-19, TIER-33)."""
        answers: dict[OffloadKey, LookupResult] = {}
        waiting = list(keys)
        start = time.monotonic()
        steps = 0
        budget = max(self.capabilities.max_retry_steps, 0)
        self.deadline_misses = set()
        while True:
            still: list[OffloadKey] = []
            for key in waiting:
                answer = self.lookup(key, context)
                match answer:
                    case lr.RETRY:
                        still.append(key)
                    case lr.MISS if 0 < steps and budget <= steps:
                        answers[key] = answer  # RETRY until its declared deadline, then MISS (AP-3's expiry)
                        self.deadline_misses.add(key)
                    case lr.HIT | lr.MISS | lr.HIT_PENDING:
                        answers[key] = answer
                    case _ as other:
                        unreachable(other, where="SecondaryDriver.resolve")
            if not still:
                return answers
            waiting = still
            if steps >= budget:
                # Out of steps: give background work time to land without a hook; the RETRY must
                # then be gone (a bound in steps holds however fast the steps are).
                if time.monotonic() - start >= self.limits.job_timeout_s:
                    raise ConformanceFailure(
                        "TIER-18",
                        f"lookup({short_key(waiting[0])}) still answers RETRY after {steps} end-of-step "
                        f"hooks and {time.monotonic() - start:.1f} s; the tier declares "
                        f"max_retry_steps={self.capabilities.max_retry_steps}",
                    )
                time.sleep(0.002)
                continue
            wait = self.limits.retry_step_interval_s - (time.perf_counter() - self._last_step)
            if wait > 0:
                time.sleep(wait)
            if patient:
                self.wait_checks_back()
            self.step()
            steps += 1

    def answers(
        self, keys: Sequence[OffloadKey], context: ReqContext | None = None
    ) -> Iterable[tuple[OffloadKey, LookupResult]]:
        """Each key with its answer once every RETRY has resolved (see :meth:`resolve`)."""
        return self.resolve(keys, context).items()

    def expect_seen(
        self, keys: Sequence[OffloadKey], clause: str, why: str, *, requests: int = 3, patient: bool = False
    ) -> None:
        """Fail ``clause`` unless each of ``keys`` (stored, by this or another instance) answers HIT.

        A key that answered RETRY until the tier's declared ``max_retry_steps`` and then MISS was not
        refused: its existence check missed the tier's own step deadline, which the contract allows
        (the answer is then MISS, AP-3) and which a loaded machine can make any tier do, since the
        kit's steps come every ``retry_step_interval_s``. Only such keys are asked again, in a new
        request (this request finished, :meth:`next_request`), up to ``requests`` requests in all; a
        MISS without the deadline fails at once. The verdict then rests on the tier's answers, not on
        the kit's pace (issue 17, section 3); the loads that follow run in the request that saw HIT.
        ``patient``: each step once the tier's checks are back (:meth:`resolve`), for many keys at once."""
        answers = self.resolve(keys, patient=patient)
        for _ in range(1, requests):
            refused = [k for k in keys if answers[k] is not lr.HIT]
            if not refused or not set(refused) <= self.deadline_misses:
                break
            self.next_request()
            answers.update(self.resolve(refused, patient=patient))
        self.expect(answers, lr.HIT, clause, why)

    def next_request(self) -> None:
        """End the kit's current request (``on_request_finished``) and start a new one."""
        self.tier.on_request_finished(self.context)
        self.context = TrackedContext("kvproto-kit-next-request")

    def resolve_one(self, key: OffloadKey, context: ReqContext | None = None) -> LookupResult:
        """:meth:`resolve` for one key."""
        return self.resolve([key], context)[key]

    def expect(self, answers: Mapping[OffloadKey, LookupResult], want: LookupResult, clause: str, why: str) -> None:
        """Fail ``clause`` naming the first key whose answer is not ``want``."""
        expect_answers(answers.items(), want, clause, why)
