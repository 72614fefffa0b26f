"""The kit's drivers: each drives one tier the way a scheduler (and, for a primary, the manager)
would, checking every answer on the way (KIT-2).

Every kit check goes through a :class:`PrimaryDriver` or a :class:`SecondaryDriver`,
so rules that hold for every call (answers are LookupResult members of the
role's kind, lookups do not block, each job is reported once, no slot outside a
load job changes, prepared and loaded slots hold the right bytes) are enforced
everywhere, not only in the check named after them. What both drivers share
lives in :class:`TierDriver`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import ClassVar, Generic, TypeVar

from kvproto import members as lr
from kvproto._capabilities import Capabilities
from kvproto._jobs import JobResult, PrepareStoreOutput, TransferJob
from kvproto._requests import ReqContext
from kvproto._keys import OffloadKey
from kvproto._protocols import PrimaryTier, SecondaryTier
from kvproto._results import LookupResult, unreachable
from kvproto.testing._data import block_for, row, sentinel_for
from kvproto.testing._failures import ConformanceFailure
from kvproto.testing._settings import KitLimits

__all__ = [
    "PrimaryDriver",
    "SecondaryDriver",
    "SlowCalls",
    "TierDriver",
    "TrackedContext",
    "checked_lookup",
    "expect_answers",
    "resolve_capabilities",
    "short_key",
]

_T = TypeVar("_T", PrimaryTier, SecondaryTier)

try:
    import resource

    _RUSAGE_THREAD: int | None = getattr(resource, "RUSAGE_THREAD", None)
except ImportError:  # pragma: no cover - not on Windows
    _RUSAGE_THREAD = None


class TrackedContext(ReqContext):
    """A :class:`~kvproto.ReqContext` that can be weakly referenced, so the kit can
    tell whether a tier still holds a request after ``on_request_finished`` (TIER-12)."""


def short_key(key: bytes) -> str:
    """A key in hex, shortened for messages."""
    text = key.hex()
    return text if len(text) <= 20 else f"{text[:12]}..{text[-8:]}"


def resolve_capabilities(declared: Capabilities | None, tier: object) -> Capabilities:
    """``declared`` if given, else the tier's own ``capabilities`` attribute, else none (KIT-4)."""
    if declared is not None:
        return declared
    found = getattr(tier, "capabilities", None)
    return found if isinstance(found, Capabilities) else Capabilities()


def _voluntary_switches() -> int | None:
    """Voluntary context switches of the calling thread so far (Linux), else None."""
    if _RUSAGE_THREAD is None:
        return None
    return resource.getrusage(_RUSAGE_THREAD).ru_nvcsw


class SlowCalls:
    """Counts calls slower than ``KitLimits.lookup_budget_s`` that waited (gave up the CPU of their
    own accord, where the OS says). A slow call is a contract break (TIER-13) once more than
    ``slow_calls_forgiven`` of them were seen in one check AND at least 12 calls were timed AND
    two thirds of them were slow: a hook that waits for I/O is slow every time it has work, while
    a loaded machine, or a tier's worker threads being scheduled, make only some calls slow."""

    def __init__(self, limits: KitLimits) -> None:
        self.limits = limits
        self.count = 0
        self.calls = 0

    def too_slow(self, took: float, waited: bool = True) -> bool:
        """Note a call that took ``took`` seconds (``waited``: its thread gave up the CPU);
        True if it was slow and is no longer forgiven."""
        self.calls += 1
        if took <= self.limits.lookup_budget_s or not waited:
            return False
        self.count += 1
        return self.count > self.limits.slow_calls_forgiven and self.calls >= 12 and 3 * self.count >= 2 * self.calls


def checked_lookup(
    tier: PrimaryTier | SecondaryTier, key: OffloadKey, context: ReqContext, slow: SlowCalls, *, advice: str
) -> LookupResult:
    """One timed ``lookup``: it answers a LookupResult member (LR-1) within the kit's budget
    (TIER-4); ``advice`` ends the TIER-4 message. A slow lookup is asked again
    ``confirm_repeats`` times: only a median over budget is a break (a hiccup of a loaded
    machine does not repeat; a lookup waiting for I/O does)."""
    started = time.perf_counter()
    answer: object = tier.lookup(key, context)
    took = time.perf_counter() - started
    if not isinstance(answer, LookupResult):
        raise ConformanceFailure(
            "LR-1",
            f"lookup({short_key(key)}) answered {answer!r} of type {type(answer).__name__}; "
            "the contract requires a LookupResult member (MISS, HIT, HIT_PENDING or RETRY)",
        )
    budget = slow.limits.lookup_budget_s
    if took > budget:
        again: list[float] = []
        for _ in range(max(slow.limits.confirm_repeats, 1)):
            started = time.perf_counter()
            tier.lookup(key, context)
            again.append(time.perf_counter() - started)
        median = statistics.median(again)
        if median > budget:
            slow.count += 1
            raise ConformanceFailure(
                "TIER-4",
                f"lookup({short_key(key)}) blocked for {took:.3f} s, and for a median of {median:.3f} s "
                f"over {len(again)} repeats (budget {budget:g} s); {advice}",
            )
    return answer


def expect_answers(
    answers: Iterable[tuple[OffloadKey, LookupResult]], want: LookupResult, clause: str, why: str
) -> None:
    """Fail ``clause`` naming the first key whose answer is not ``want``; ``answers`` may be
    lazy, so a driver can stop looking up at the first wrong answer."""
    for key, got in answers:
        if got is not want:
            raise ConformanceFailure(
                clause, f"lookup({short_key(key)}) answered {got.name} {why}; expected {want.name}"
            )


class TierDriver(Generic[_T]):
    """What both drivers share: the tier, the capabilities it declares, the kit's limits, the
    kit's own request, and checked lookups (LR-1, TIER-4, plus each role's own rules)."""

    #: How a too-slow lookup's TIER-4 message ends, for this kind of tier.
    _advice: ClassVar[str]

    def __init__(
        self,
        tier: _T,
        capabilities: Capabilities,
        limits: KitLimits,
        *,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self.tier: _T = tier
        self.capabilities = capabilities
        self.limits = limits
        self.context = TrackedContext("kvproto-kit")
        self.slow_lookups = SlowCalls(limits)
        self.closed = False
        self._on_close = on_close

    def lookup(self, key: OffloadKey, context: ReqContext | None = None) -> LookupResult:
        """One lookup, checked: a LookupResult member (LR-1), quick (TIER-4), and an answer
        this kind of tier may give (see :meth:`_vet`)."""
        answer = checked_lookup(
            self.tier, key, self.context if context is None else context, self.slow_lookups, advice=self._advice
        )
        return self._vet(key, answer)

    def _vet(self, key: OffloadKey, answer: LookupResult) -> LookupResult:
        """``answer``, if this kind of tier may give it; else a ConformanceFailure."""
        raise NotImplementedError

    def answers(
        self, keys: Sequence[OffloadKey], context: ReqContext | None = None
    ) -> Iterable[tuple[OffloadKey, LookupResult]]:
        """Each key with its settled answer: lazily, one lookup at a time, where the tier answers
        at once (a primary); see :meth:`SecondaryDriver.answers` for a tier that may answer RETRY."""
        return ((key, self.lookup(key, context)) for key in keys)

    def resolve(
        self, keys: Sequence[OffloadKey], context: ReqContext | None = None
    ) -> dict[OffloadKey, LookupResult]:
        """The settled answer of each key."""
        return dict(self.answers(keys, context))

    def expect_resolved(
        self,
        keys: Sequence[OffloadKey],
        want: LookupResult,
        clause: str,
        why: str,
        context: ReqContext | None = None,
    ) -> None:
        """Fail ``clause`` naming the first of ``keys`` whose settled answer is not ``want``."""
        expect_answers(self.answers(keys, context), want, clause, why)

    def shutdown(self) -> None:
        """Shut the tier down once (the fixture calls this after each check)."""
        if not self.closed:
            self.closed = True
            if self._on_close is not None:
                self._on_close()
            self.tier.shutdown()


class PrimaryDriver(TierDriver[PrimaryTier]):
    """One primary tier, driven the way the scheduler and the manager would, checking each answer."""

    _advice = "a lookup must answer at once"

    def __init__(self, tier: PrimaryTier, capabilities: Capabilities, limits: KitLimits) -> None:
        buffer: object = tier.buffer
        if not isinstance(buffer, memoryview) or buffer.ndim != 2 or buffer.shape is None:
            raise ConformanceFailure(
                "TIER-3", f"buffer is {buffer!r}; the contract requires a 2-D memoryview (slots, block bytes)"
            )
        super().__init__(tier, capabilities, limits)
        self.buffer = buffer
        self.num_slots, self.block_bytes = buffer.shape[0], buffer.shape[1]

    def _vet(self, key: OffloadKey, answer: LookupResult) -> LookupResult:
        """Never RETRY (LR-4)."""
        match answer:
            case lr.RETRY:
                raise ConformanceFailure(
                    "LR-4", f"lookup({short_key(key)}) answered RETRY; the primary tier never does"
                )
            case lr.HIT | lr.MISS | lr.HIT_PENDING:
                return answer
            case _ as other:
                unreachable(other, where="PrimaryDriver.lookup")

    def expect(self, keys: Sequence[OffloadKey], want: LookupResult, clause: str, why: str) -> None:
        """Fail ``clause`` naming the first key that does not answer ``want``."""
        self.expect_resolved(keys, want, clause, why)

    def prepare(
        self, keys: Sequence[OffloadKey], *, context: ReqContext | None = None
    ) -> PrepareStoreOutput | None:
        """``prepare_store`` and copy each reserved key's bytes into its slot, checking the output (TIER-6)."""
        out: object = self.tier.prepare_store(keys, self.context if context is None else context)
        if out is None:
            return None
        if not isinstance(out, PrepareStoreOutput):
            raise ConformanceFailure("TIER-6", f"prepare_store returned {out!r}, not a PrepareStoreOutput or None")
        if len(set(out.slots)) != len(out.slots) or any(not 0 <= s < self.num_slots for s in out.slots):
            raise ConformanceFailure("TIER-6", f"prepare_store reserved invalid or repeated slots {out.slots}")
        if not set(out.keys_to_store) <= set(keys):
            raise ConformanceFailure("TIER-6", "prepare_store reserved keys that were not asked for")
        for key, slot in zip(out.keys_to_store, out.slots, strict=True):
            row(self.buffer, slot)[:] = block_for(key, self.block_bytes)
        return out

    def store(
        self, keys: Sequence[OffloadKey], *, success: bool = True, context: ReqContext | None = None
    ) -> PrepareStoreOutput:
        """Prepare, copy and complete a store; fail TIER-6 if the tier refuses."""
        out = self.prepare(keys, context=context)
        if out is None:
            raise ConformanceFailure("TIER-6", f"prepare_store of {len(keys)} keys returned None with room to evict")
        self.tier.complete_store(out.keys_to_store, success)
        return out

    def load(self, keys: Sequence[OffloadKey], *, context: ReqContext | None = None) -> tuple[int, ...]:
        """``prepare_load`` (pins) and check each returned slot holds its key's bytes (TIER-8)."""
        slots: object = self.tier.prepare_load(keys, self.context if context is None else context)
        if not isinstance(slots, tuple) or len(slots) != len(keys):
            raise ConformanceFailure(
                "TIER-8", f"prepare_load of {len(keys)} keys returned {slots!r}, not a tuple of as many slots"
            )
        for key, slot in zip(keys, slots, strict=True):
            if not isinstance(slot, int) or not 0 <= slot < self.num_slots:
                raise ConformanceFailure("TIER-8", f"prepare_load returned slot {slot!r} for {short_key(key)}")
            if bytes(row(self.buffer, slot)) != block_for(key, self.block_bytes):
                raise ConformanceFailure(
                    "TIER-8", f"prepare_load returned slot {slot} for key {short_key(key)}, which does not hold its bytes"
                )
        return slots


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
        self._next_job_id = first_job_id
        self._submitted_at: dict[int, tuple[int, float]] = {}
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
        data = block_for(key, self.block_bytes)
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
        return job

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
        switches = _voluntary_switches()
        started = time.perf_counter()
        self.tier.on_step_end()
        took = time.perf_counter() - started
        after = _voluntary_switches()
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
        """Record one reported result; the TIER-11/TIER-18 violation it shows, if any."""
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
                "TIER-18", f"job {result.job_id} finished partly but the tier does not declare partial_jobs"
            )
        return None

    def _verify_load(self, job: TransferJob, result: JobResult) -> None:
        done = result.succeeded_keys(job)
        wrong: tuple[OffloadKey, int, bytes] | None = None
        for key, slot in zip(job.keys, job.slots, strict=True):
            if key not in done:
                self._shadow[slot] = None  # a failed load may leave anything in its slot
                continue
            want = block_for(key, self.block_bytes)
            got = self.slot_bytes(slot)
            self._shadow[slot] = got  # what it holds now; judged below
            if got != want and wrong is None:
                wrong = (key, slot, got)
        if wrong is not None:
            key, slot, got = wrong
            raise ConformanceFailure("TIER-10", self._diagnose(job, key, slot, got))

    def _diagnose(self, job: TransferJob, key: OffloadKey, slot: int, got: bytes) -> str:
        want = block_for(key, self.block_bytes)
        head = f"load job {job.job_id} reported key {short_key(key)} done, but slot {slot}"
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
        return f"{head} holds bytes that were never stored under any key{moved}"

    def pending(self) -> list[int]:
        """Ids of submitted jobs not reported yet, oldest first."""
        return [job_id for job_id in self.jobs if job_id not in self.results]

    def wait_step(self, jobs: Iterable[TransferJob]) -> None:
        """One step while waiting for ``jobs``; a job past both bounds fails TIER-11 (see KitLimits)."""
        self.step()
        now = time.monotonic()
        lost: list[int] = []
        overdue = False
        for job in jobs:
            if job.job_id in self.results:
                continue
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

    def wait(self, jobs: Iterable[TransferJob]) -> dict[int, JobResult]:
        """Step until every job in ``jobs`` is reported; a job never reported fails TIER-11."""
        wanted = list(jobs)
        while any(job.job_id not in self.results for job in wanted):
            self.wait_step(wanted)
        return {job.job_id: self.results[job.job_id] for job in wanted}

    def store(
        self, keys: Sequence[OffloadKey], slots: Sequence[int] | None = None, *, context: ReqContext | None = None
    ) -> JobResult:
        """Submit a store and wait for its result."""
        job = self.submit_store(keys, slots, context=context)
        return self.wait([job])[job.job_id]

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

    # ---- lookups --------------------------------------------------------------------------
    def _vet(self, key: OffloadKey, answer: LookupResult) -> LookupResult:
        """Never HIT_PENDING (LR-3); RETRY only if declared (TIER-18)."""
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
                        "TIER-18",
                        f"lookup({short_key(key)}) answered RETRY but the tier does not declare "
                        "the async_lookup capability",
                    )
            case lr.HIT | lr.MISS:
                pass
            case _ as other:
                unreachable(other, where="SecondaryDriver.lookup")
        return answer

    def resolve(
        self, keys: Sequence[OffloadKey], context: ReqContext | None = None
    ) -> dict[OffloadKey, LookupResult]:
        """Ask until every key answers HIT or MISS; RETRY must end within the declared
        ``max_retry_steps`` end-of-step hooks (and the kit's wall-time bound) (TIER-18)."""
        answers: dict[OffloadKey, LookupResult] = {}
        waiting = list(keys)
        start = time.monotonic()
        steps = 0
        budget = max(self.capabilities.max_retry_steps, 0)
        while True:
            still: list[OffloadKey] = []
            for key in waiting:
                answer = self.lookup(key, context)
                match answer:
                    case lr.RETRY:
                        still.append(key)
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
            self.step()
            steps += 1

    def answers(
        self, keys: Sequence[OffloadKey], context: ReqContext | None = None
    ) -> Iterable[tuple[OffloadKey, LookupResult]]:
        """Each key with its answer once every RETRY has resolved (see :meth:`resolve`)."""
        return self.resolve(keys, context).items()

    def resolve_one(self, key: OffloadKey, context: ReqContext | None = None) -> LookupResult:
        """:meth:`resolve` for one key."""
        return self.resolve([key], context)[key]

    def expect(self, answers: Mapping[OffloadKey, LookupResult], want: LookupResult, clause: str, why: str) -> None:
        """Fail ``clause`` naming the first key whose answer is not ``want``."""
        expect_answers(answers.items(), want, clause, why)
