"""Hypothesis state machines that drive any tier against a model (TIER-7..TIER-10, KIT-8).

* :class:`TierStateMachine` drives a secondary tier against a dict model of
  what must be readable.
* :class:`DifferentialStateMachine` also runs :class:`~kvproto.MemoryTier`
  beside it on the same operations and compares what each holds once both settle.
* :class:`PrimaryStateMachine` drives a primary tier against a model of block
  states (ABSENT, WRITING, READY with a pin count).

The kit runs them as ``test_state_machine_against_model`` and
``test_differential_against_memory_tier``; an author can run them directly::

    Machine = TierStateMachine.configure(lambda buffer: MyTier(buffer))
    TestMyTierMachine = Machine.TestCase

Every call goes through the kit's drivers, so it is also checked against the
per-call rules (LR-1, LR-3, LR-4, TIER-4, TIER-11).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Container, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from kvproto import members as lr
from kvproto._capabilities import Capabilities
from kvproto._keys import OffloadKey
from kvproto._protocols import PrimaryTier, SecondaryTier
from kvproto._results import unreachable
from kvproto.testing._harness.data import key_pool, make_buffer
from kvproto.testing._harness.driver import resolve_capabilities, short_key
from kvproto.testing._harness.failures import ConformanceFailure
from kvproto.testing._harness.primary_driver import PrimaryDriver
from kvproto.testing._harness.secondary_driver import SecondaryDriver
from kvproto.testing._harness.settings import KitLimits
from kvproto.testing.strategies import key_lists

if TYPE_CHECKING:
    from kvproto.testing._harness.base import KitBase

__all__ = ["DifferentialStateMachine", "FullPrimaryStateMachine", "PrimaryStateMachine", "TierStateMachine"]

_M = TypeVar("_M", bound=RuleBasedStateMachine)

_POOL: tuple[OffloadKey, ...] = tuple(key_pool("machine", 8))
_PPOOL: tuple[OffloadKey, ...] = tuple(key_pool("p-machine", 12))
_FILL_MOST = 64
_PFILL: tuple[OffloadKey, ...] = tuple(key_pool("p-machine-fill", _FILL_MOST))
"""Blocks stored before an example's operations begin, up to the tier's slots: a tier with more slots than
the machine's 12 keys is still driven into eviction, refused stores and pins over most of its blocks."""
_KEYS = key_lists(_POOL, max_size=3, unique=True)


def _bound(cls: type[_M], **attrs: Any) -> type[_M]:
    """A subclass of machine ``cls`` with ``attrs`` set and fresh run counters."""
    return type(f"{cls.__name__}ForTier", (cls,), {**attrs, "runs": [0, 0]})


class TierStateMachine(RuleBasedStateMachine):
    """Drives one secondary tier against a dict model.

    Configure it with :meth:`configure` (or set the class attributes in a
    subclass), then run it as any Hypothesis state machine::

        Machine = TierStateMachine.configure(lambda buffer: MyTier(buffer))
        TestMyTierMachine = Machine.TestCase

    The model knows, per key: stored for certain (a store of it reported
    success), maybe stored (a later store of it failed), or not stored. The
    machine fails when a HIT names a key neither stored nor being stored, a
    HIT seen while a store was in flight belongs to a store that then failed,
    a certainly stored key answers MISS or fails to load (unless the tier
    declares eviction), a load returns wrong bytes, or a job is lost.
    """

    tier_factory: ClassVar[Callable[[memoryview], SecondaryTier]]
    tests: ClassVar[KitBase | None] = None
    num_slots: ClassVar[int] = 16
    block_bytes: ClassVar[int] = 32
    limits: ClassVar[KitLimits] = KitLimits()
    capabilities: ClassVar[Capabilities | None] = None
    runs: ClassVar[list[int]]

    @classmethod
    def configure(
        cls,
        tier_factory: Callable[[memoryview], SecondaryTier],
        *,
        capabilities: Capabilities | None = None,
        limits: KitLimits | None = None,
        tests: KitBase | None = None,
    ) -> type[TierStateMachine]:
        """A subclass of this machine bound to ``tier_factory``."""
        return _bound(
            cls,
            tier_factory=staticmethod(tier_factory),
            capabilities=capabilities,
            limits=limits or KitLimits(),
            tests=tests,
        )

    def __init__(self) -> None:
        super().__init__()
        self.buffer = make_buffer(self.num_slots, self.block_bytes)
        tier = type(self).tier_factory(self.buffer)
        self.caps = resolve_capabilities(self.capabilities, tier)
        self.driver = SecondaryDriver(tier, self.buffer, self.caps, self.limits)
        self.certain: set[OffloadKey] = set()
        self.maybe: set[OffloadKey] = set()
        self.inflight: dict[int, tuple[OffloadKey, ...]] = {}  # unreported store jobs
        self.early_hits: dict[OffloadKey, set[int]] = {}  # key -> store jobs in flight at a HIT
        self.must_load: set[int] = set()  # load jobs submitted right after a HIT
        self.certain_at_load: dict[int, frozenset[OffloadKey]] = {}
        self.fail_armed = False
        self.injected: set[int] = set()  # jobs submitted while a fault was armed
        self.seen_results = 0
        if hasattr(type(self), "runs"):
            type(self).runs[0] += 1

    # ---- helpers ------------------------------------------------------------------------
    def _free_slots(self, n: int) -> list[int] | None:
        busy = {s for j in self.driver.pending() for s in self.driver.jobs[j].slots}
        free = [s for s in range(self.num_slots) if s not in busy]
        return free[:n] if len(free) >= n else None

    def _absorb(self) -> None:
        """Fold newly reported results into the model."""
        done = self.driver.reported_since(self.seen_results)
        self.seen_results += len(done)
        for job, ok in done:
            job_id = job.job_id
            if not job.promotion:
                self.inflight.pop(job_id, None)
                for key in job.keys:
                    if key in ok:
                        self.certain.add(key)
                        self.maybe.discard(key)
                    elif key in self.certain:
                        self.certain.discard(key)
                        self.maybe.add(key)
                for key, jobs in list(self.early_hits.items()):
                    if job_id in jobs:
                        jobs.discard(job_id)
                        if key in ok:
                            del self.early_hits[key]
                        elif not jobs and key not in self.certain and key not in self.maybe:
                            raise ConformanceFailure(
                                "TIER-4",
                                f"lookup({short_key(key)}) answered HIT while its store job was in "
                                "flight, and the job then failed it: a HIT came before the store finished",
                            )
                        elif not jobs:
                            del self.early_hits[key]
            else:
                if job_id in self.injected:
                    self.certain_at_load.pop(job_id, None)
                    continue
                if job_id in self.must_load and set(job.keys) - ok:
                    raise ConformanceFailure(
                        "TIER-4", "a load submitted right after a HIT failed (the HIT was not readable)"
                    )
                sure = self.certain_at_load.pop(job_id, frozenset())
                # A job holding a key not surely stored may fail whole (CAP-4, declared partial_jobs or
                # not), or, reporting some keys done (partial_jobs), from its first such key on (a load
                # may stop at its first missing key, the rest untried). Those keys stay certain: a later
                # load must deliver them.
                first_unsure = next((i for i, k in enumerate(job.keys) if k not in sure), len(job.keys))
                whole = first_unsure == len(job.keys)
                tried = job.keys if whole else job.keys[:first_unsure] if ok else ()
                lost = [k for k in tried if k in self.certain and k not in ok]
                if lost:
                    self._lost_write(f"key {short_key(lost[0])} was stored successfully but its load failed")

    def _lost_write(self, what: str) -> None:
        """A key stored successfully is gone: ``what`` breaks TIER-10, unless the tier declares eviction."""
        if not self.caps.eviction:
            raise ConformanceFailure("TIER-10", f"{what} (the tier does not declare eviction): a lost write")

    def _armed(self, job_id: int) -> None:
        if self.fail_armed:
            self.injected.add(job_id)
            self.fail_armed = False

    def _step(self) -> None:
        self.driver.step()
        self._absorb()

    def _slots_or_step(self, n: int) -> list[int] | None:
        """``n`` slots no job in flight uses; with fewer free, one step instead, and None."""
        slots = self._free_slots(n)
        if slots is None:
            self._step()
        return slots

    def _submit_load(self, keys: tuple[OffloadKey, ...] | list[OffloadKey], slots: list[int]) -> int:
        job = self.driver.submit_load(keys, slots)
        self.certain_at_load[job.job_id] = frozenset(k for k in keys if k in self.certain)
        return job.job_id

    def _mirror_store(self, keys: list[OffloadKey], slots: list[int]) -> None:
        """Repeat a store on a second tier; none here (see DifferentialStateMachine)."""

    def _mirror_load(self, keys: list[OffloadKey], slots: list[int]) -> None:
        """Repeat a load on a second tier; none here (see DifferentialStateMachine)."""

    def _mirror_reset(self) -> None:
        """Repeat a successful reset_cache on a second tier; none here (see DifferentialStateMachine)."""

    # ---- rules ---------------------------------------------------------------------------
    @rule(keys=_KEYS)
    def store(self, keys: list[OffloadKey]) -> None:
        slots = self._slots_or_step(len(keys))
        if slots is None:
            return
        job = self.driver.submit_store(keys, slots)
        self.inflight[job.job_id] = tuple(keys)
        self._armed(job.job_id)
        self._mirror_store(keys, slots)
        self._absorb()

    @rule(keys=_KEYS)
    def load(self, keys: list[OffloadKey]) -> None:
        slots = self._slots_or_step(len(keys))
        if slots is None:
            return
        self._armed(self._submit_load(keys, slots))
        self._mirror_load(keys, slots)
        self._absorb()

    @rule(key=st.sampled_from(_POOL), then_load=st.booleans())
    def lookup(self, key: OffloadKey, then_load: bool) -> None:
        answer = self.driver.lookup(key)
        self._absorb()
        match answer:
            case lr.HIT:
                if key not in self.certain and key not in self.maybe:
                    flying = {j for j, ks in self.inflight.items() if key in ks}
                    if not flying:
                        raise ConformanceFailure(
                            "TIER-4", f"lookup({short_key(key)}) answered HIT for a key that was never stored"
                        )
                    self.early_hits.setdefault(key, set()).update(flying)
                if then_load and not self.fail_armed:
                    slots = self._free_slots(1)
                    if slots is not None:
                        self.must_load.add(self._submit_load([key], slots))
            case lr.MISS:
                if key in self.certain:
                    self._lost_write(f"lookup({short_key(key)}) answered MISS although its store reported success")
            case lr.RETRY | lr.HIT_PENDING:
                pass
            case _ as other:
                unreachable(other, where="TierStateMachine.lookup")

    @rule()
    def step(self) -> None:
        self._step()

    @rule(keys=_KEYS)
    def touch(self, keys: list[OffloadKey]) -> None:
        self.driver.tier.touch(keys)

    @precondition(
        lambda self: not self.fail_armed and self.tests is not None and self.tests.has_hook("fail_next_jobs")
    )
    @rule()
    def fail_next_job(self) -> None:
        """Arm one failure: ``fail_next_jobs(1)`` SETS the count, and the machine arms only once every
        job in flight was reported (a tier or wrapper holding jobs may hand an earlier one over
        first), and never again before the armed job was submitted: exactly the next job fails (KIT-5)."""
        tests = self.tests
        if tests is not None and not self.fail_armed:
            # Settle first (no draw depends on it, so Hypothesis replays the same choices).
            self.driver.settle()
            self._absorb()
            hook: Callable[[SecondaryTier, int], None] = getattr(tests, "fail_next_jobs")  # noqa: B009 - optional hook, checked by has_hook
            hook(self.driver.tier, 1)
            self.driver.arm_failing_jobs(1)
            self.fail_armed = True

    @rule()
    def reset(self) -> None:
        if self.driver.pending():
            return
        answer: object = self.driver.tier.reset_cache()
        if answer is True:
            self._mirror_reset()
            self.certain.clear()
            self.maybe.clear()
            self.early_hits.clear()
        elif answer is not False:
            raise ConformanceFailure("TIER-16", f"reset_cache answered {answer!r}, not a bool")

    @rule()
    def settle(self) -> None:
        self.driver.settle()
        self._absorb()
        self.compare()

    def compare(self) -> None:
        """With nothing in flight: certainly stored keys HIT, never-stored keys MISS."""
        answers = self.driver.resolve(list(_POOL))
        self._absorb()
        for key, answer in answers.items():
            if key in self.certain and answer is not lr.HIT and not self.caps.eviction:
                raise ConformanceFailure(
                    "TIER-10", f"key {short_key(key)} was stored successfully but answers {answer.name}: a lost write"
                )
            if key not in self.certain and key not in self.maybe and answer is lr.HIT:
                raise ConformanceFailure(
                    "TIER-4", f"key {short_key(key)} answers HIT but no store of it succeeded"
                )

    def teardown(self) -> None:
        if hasattr(type(self), "runs"):
            type(self).runs[1] += self.driver.steps
        driver = self.driver
        failing = sys.exc_info()[1] is not None  # a step failed: its failure is the one to report
        try:
            driver.settle()
            self._absorb()
        except ConformanceFailure:
            if not failing:
                raise
        finally:
            driver.shutdown()


class DifferentialStateMachine(TierStateMachine):
    """Runs the tier and :class:`~kvproto.MemoryTier` side by side on the same operations.

    After each ``settle`` both must hold the same readable keys (the tier may
    hold fewer if it declares eviction), and each load reads the same bytes.
    """

    def __init__(self) -> None:
        super().__init__()
        from kvproto._memory_tier import MemoryTier

        self.ref_buffer = make_buffer(self.num_slots, self.block_bytes)
        reference = MemoryTier(self.ref_buffer, name="reference")
        self.ref = SecondaryDriver(
            reference, self.ref_buffer, reference.capabilities, self.limits,
            first_job_id=self.driver._next_job_id,
        )

    def _mirror_store(self, keys: list[OffloadKey], slots: list[int]) -> None:
        """The same store on MemoryTier, waited for."""
        self.ref.wait([self.ref.submit_store(keys, slots)])

    def _mirror_load(self, keys: list[OffloadKey], slots: list[int]) -> None:
        """The same load on MemoryTier, waited for (its bytes are checked as it finishes)."""
        self.ref.wait([self.ref.submit_load(keys, slots)])

    def _mirror_reset(self) -> None:
        """Reset MemoryTier too, so both start again from empty."""
        self.ref.tier.reset_cache()

    @precondition(lambda self: False)
    @rule()
    def fail_next_job(self) -> None:
        """Not used: faults would make the two tiers differ by design."""

    def compare(self) -> None:
        super().compare()
        mine = self.driver.resolve(list(_POOL))
        theirs = self.ref.resolve(list(_POOL))
        for key in _POOL:
            a, b = mine[key], theirs[key]
            if a is b:
                continue
            if self.caps.eviction and a is lr.MISS:
                continue
            raise ConformanceFailure(
                "TIER-10",
                f"after the same operations, key {short_key(key)} answers {a.name} from the tier "
                f"but {b.name} from MemoryTier",
            )

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            self.ref.shutdown()


class PrimaryStateMachine(RuleBasedStateMachine):
    """Drives a primary tier against a model: each key ABSENT, WRITING, or READY with a pin count."""

    tier_factory: ClassVar[Callable[[], PrimaryTier]]
    capabilities: ClassVar[Capabilities | None] = None
    limits: ClassVar[KitLimits] = KitLimits()
    runs: ClassVar[list[int]]

    @classmethod
    def configure(
        cls,
        tier_factory: Callable[[], PrimaryTier],
        *,
        capabilities: Capabilities | None = None,
        limits: KitLimits | None = None,
    ) -> type[PrimaryStateMachine]:
        """A subclass of this machine bound to ``tier_factory`` (which builds an EMPTY primary tier)."""
        return _bound(
            cls, tier_factory=staticmethod(tier_factory), capabilities=capabilities, limits=limits or KitLimits()
        )

    def __init__(self) -> None:
        super().__init__()
        tier = type(self).tier_factory()
        self.kit = PrimaryDriver(tier, resolve_capabilities(self.capabilities, tier), self.limits)
        self.writing: set[OffloadKey] = set()
        self.ready: set[OffloadKey] = set()
        self.pins: dict[OffloadKey, int] = {}
        self.seen_hit: set[OffloadKey] = set()  # READY keys a lookup found (HIT, or HIT_PENDING while written)
        self.seen_pending: set[OffloadKey] = set()  # WRITING keys that answered HIT_PENDING: found, once READY
        self.most_held = 0  # the most blocks (READY or being written) the tier has held at once
        self.settled = True  # no failed store or reset since the last step end (their slots may free there)
        self.steps = 0
        if hasattr(type(self), "runs"):
            type(self).runs[0] += 1

    @rule(keys=key_lists(_PPOOL, max_size=4, unique=False))
    def prepare(self, keys: list[OffloadKey]) -> None:
        self.steps += 1
        out = self.kit.prepare(keys)
        fresh = set(keys) - self.writing - self.ready
        if out is None:
            self.judge_refusal(keys, fresh)
            return
        if set(out.keys_to_store) != fresh:
            raise ConformanceFailure("TIER-6", "prepare_store reserved other keys than the absent ones asked for")
        for key in out.evicted:
            if key not in self.ready or self.pins.get(key):
                raise ConformanceFailure("TIER-8", f"prepare_store evicted {short_key(key)}, which was pinned or not ready")
            self.ready.discard(key)
            self.seen_hit.discard(key)
        self.writing |= fresh
        self.most_held = max(self.most_held, len(self.ready) + len(self.writing))

    def judge_refusal(self, keys: Sequence[OffloadKey], fresh: set[OffloadKey]) -> None:
        """A refused ``prepare_store`` must mean not enough could be evicted (TIER-6). Blamed only where nothing
        the contract allows explains it: the blocks it would have to keep (being written; READY and pinned,
        asked for in this call, or found by a lookup since their store began, which a policy may protect;
        every READY block where the tier declares no eviction) plus the new ones are no more than the tier
        already held at once, and a step has ended since the last failed store or reset (a tier may free
        their slots there, once no copy can still be writing them). Held-out round 10: an LFU primary that lost its heap
        entries on a refused store refused every later one with all its blocks unpinned."""
        if not fresh or not self.settled:
            return
        asked = set(keys)
        evicts = self.kit.evicts
        kept = [k for k in self.ready if not evicts or self.pins.get(k) or k in self.seen_hit or k in asked]
        need = len(self.writing) + len(kept) + len(fresh)
        if need <= self.most_held:
            raise ConformanceFailure(
                "TIER-6",
                f"prepare_store of {len(fresh)} new key(s) refused: the tier held {self.most_held} blocks at once "
                f"before, and storing them would hold {need}"
                + (f" after evicting {len(self.ready) - len(kept)} READY block(s) that are unpinned, not asked for "
                   "and not found by a lookup since their store began" if evicts else "")
                + " (a refusal must mean not enough can be evicted)",
            )

    @rule(data=st.data(), success=st.booleans())
    def complete(self, data: st.DataObject, success: bool) -> None:
        self.steps += 1
        if not self.writing:
            return
        keys = data.draw(key_lists(sorted(self.writing), max_size=None))
        self.kit.tier.complete_store(keys, success)
        self.writing -= set(keys)
        found = self.seen_pending & set(keys)
        self.seen_pending -= found
        if success:
            self.ready |= set(keys)
            self.seen_hit |= found  # a request told HIT_PENDING will load it: a policy may protect it
        else:
            self.settled = False

    @rule(data=st.data())
    def load(self, data: st.DataObject) -> None:
        self.steps += 1
        if not self.ready:
            return
        keys = data.draw(key_lists(sorted(self.ready), unique=False))
        self.kit.load(keys)
        for key in keys:
            self.pins[key] = self.pins.get(key, 0) + 1

    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        self.steps += 1
        held = sorted(k for k, n in self.pins.items() if n)
        if not held:
            return
        key = data.draw(st.sampled_from(held))
        self.kit.tier.complete_load([key])
        self.pins[key] -= 1

    @rule()
    def step_end(self) -> None:
        """The scheduler's end of a step (TIER-13), between any two operations: what a tier does there
        (expire deadlines, give memory back) leaves every READY block's bytes as they were (TIER-8): each
        is loaded (its row checked) and released right after."""
        self.steps += 1
        self.kit.tier.on_step_end()
        self.settled = True
        ready = sorted(self.ready)
        if ready:
            self.kit.load(ready)
            self.kit.tier.complete_load(ready)

    @rule(key=st.sampled_from(_PPOOL))
    def lookup(self, key: OffloadKey) -> None:
        self.steps += 1
        got = self.kit.lookup(key)
        ready: object = getattr(self.kit.tier, "ready_keys", None)
        if isinstance(ready, Container) and (key in ready) != (got is lr.HIT):
            raise ConformanceFailure(
                "TIER-17", f"lookup({short_key(key)}) answered {got.name} but ready_keys disagrees (MGR-15)"
            )
        want = lr.HIT if key in self.ready else lr.HIT_PENDING if key in self.writing else lr.MISS
        if got is lr.HIT and want is lr.HIT:
            self.seen_hit.add(key)
        elif got is lr.HIT_PENDING and want is lr.HIT_PENDING:
            self.seen_pending.add(key)
        if got is not want:
            clause = "TIER-9" if want is lr.HIT and self.kit.capabilities.eviction else "TIER-7"
            if want is lr.HIT and key in self.seen_hit and not self.kit.capabilities.eviction:
                clause = "CAP-2"  # it answered HIT before and nothing reset it: dropped, undeclared
            raise ConformanceFailure(clause, f"lookup({short_key(key)}) answered {got.name}; the model says {want.name}")

    @rule()
    def reset(self) -> None:
        self.steps += 1
        if self.writing or any(self.pins.values()):
            return  # a tier may refuse while work is in flight; only the idle case is pinned down
        answer: object = self.kit.tier.reset_cache()
        if answer is not True:
            raise ConformanceFailure("TIER-16", f"reset_cache with no work in flight answered {answer!r}")
        self.ready.clear()
        self.seen_hit.clear()
        self.seen_pending.clear()
        self.settled = False

    def teardown(self) -> None:
        if hasattr(type(self), "runs"):
            type(self).runs[1] += self.steps
        self.kit.shutdown()


class FullPrimaryStateMachine(PrimaryStateMachine):
    """:class:`PrimaryStateMachine` on a tier filled first: up to 64 filler blocks stored before the operations
    begin (0, 1 or 3 slots left), most of them pinned by loads or none, and READY blocks asked for too. A
    tier with more slots than the machine's 12 keys is driven into eviction, into stores refused while most
    blocks are pinned, and into evictions among blocks a lookup just found (held-out round 9: a primary
    whose refused store left its victims' slots free, and one whose eviction among protected blocks chose a
    victim twice, passed the machine, which never filled them)."""

    @initialize(room=st.sampled_from((0, 1, 3)), unpinned=st.sampled_from((None, 0, 1, 2)))
    def fill(self, room: int, unpinned: int | None) -> None:
        """Store filler blocks (READY, then driven like any other) until ``room`` slots are left, then pin all
        but ``unpinned`` of them with loads (None: no pin; the machine's ``release`` lets them go one at a
        time): with the tier full or nearly, the machine's stores evict, or are refused while most blocks
        are pinned (TIER-6: a refused store changes nothing, its slots included)."""
        count = max(0, min(self.kit.num_slots, _FILL_MOST) - room)
        for at in range(0, count, 4):
            keys = list(_PFILL[at : min(at + 4, count)])
            out = self.kit.prepare(keys)
            if out is None:
                return  # refused: the tier is full before its slots say so (a byte budget)
            for key in out.evicted:
                self.ready.discard(key)
            self.kit.tier.complete_store(list(out.keys_to_store), True)
            self.ready |= set(out.keys_to_store)
            self.most_held = max(self.most_held, len(self.ready))
        if unpinned is None:
            return
        pinned = sorted(k for k in _PFILL if k in self.ready)[unpinned:]
        if pinned:
            self.kit.load(pinned)
            for key in pinned:
                self.pins[key] = self.pins.get(key, 0) + 1

    @rule()
    def release_all(self) -> None:
        """Every pin let go at once, as a long prefill that pinned its prefix ends (held-out round 10: an LFU
        primary whose store refused while its blocks were pinned never evicted them again)."""
        self.steps += 1
        held = [k for k, n in self.pins.items() for _ in range(n)]
        if held:
            self.kit.tier.complete_load(held)
            self.pins.clear()

    @rule(data=st.data())
    def lookup_ready(self, data: st.DataObject) -> None:
        """A READY block asked for, as :meth:`lookup` (HIT: a tier may protect what a lookup just found)."""
        if not self.ready:
            return
        self.lookup(data.draw(st.sampled_from(sorted(self.ready))))

