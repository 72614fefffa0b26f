"""The explorer: a swarm of instances over one storage, judged by one model (KIT-23, issue 40).

Each example draws which kinds of operation it may use (swarm testing: a run that never resets
reaches the states only long store sequences reach), one block size from tiny to MiB rows, and then
interleaves, over up to three instances built with the ``reopen`` hook:

* stores, loads and lookups in any instance, each lookup in a request of its own;
* the same keys stored by two live instances at once (a tier declaring ``sharing``);
* ``reset_cache`` in one instance while the others have jobs in flight (a reset racing loads);
* a restart: one instance shut down and reopened over the storage (``persistence`` then holds it to
  its blocks);
* a settle-and-compare: every instance asked, in a new request, for every key of the pool.

Every observation is judged by :class:`~kvproto.testing._explore.model.SharedStorageModel`; each
load's bytes by the instance's driver. Only the tier the kit's factory built has its calls listed
when a failure is reported; the steps of the machine are listed for all.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from kvproto import members as lr
from kvproto._capabilities import Capabilities
from kvproto._keys import OffloadKey
from kvproto._protocols import SecondaryTier
from kvproto._requests import ReqContext
from kvproto._results import unreachable
from kvproto.testing._explore.model import SharedStorageModel
from kvproto.testing._harness.data import key_pool, make_buffer
from kvproto.testing._harness.driver import TrackedContext, resolve_capabilities
from kvproto.testing._harness.failures import ConformanceFailure
from kvproto.testing._harness.secondary_driver import SecondaryDriver
from kvproto.testing._harness.settings import KitLimits

if TYPE_CHECKING:
    from kvproto.testing._harness.base import KitBase

__all__ = ["KINDS", "SIZES", "ExplorerMachine", "explorer_for", "swarm_plan"]

KINDS = ("store", "load", "lookup", "step", "reset", "restart", "second_instance", "twin_store", "compare")
"""The kinds of operation an example may enable (swarm testing)."""

SIZES = (48, 4096, 65_560, 1 << 20, 3 << 20)
"""Block sizes an example may draw, up to the profile's ``explore_max_block_bytes``: tiny rows, a page,
just past 64 KiB (a ranged read's threshold in many stores), one MiB and several."""

_ALWAYS = frozenset({"store", "compare"})
_ROWS = 8
NUM_SLOTS = 8
MAX_INSTANCES = 3
_POOL: tuple[OffloadKey, ...] = tuple(key_pool("explore", 10))
_KEYS = st.lists(st.sampled_from(_POOL), min_size=1, max_size=3, unique=True)
_WHO = st.integers(min_value=0, max_value=MAX_INSTANCES - 1)


@dataclass(slots=True)
class _Instance:
    """One live instance: its driver, how many of its results the model has seen, and the request of
    each load that follows a HIT (finished once the load is reported)."""

    index: int
    driver: SecondaryDriver
    seen: int = 0
    contexts: dict[int, ReqContext] = field(default_factory=dict)


class ExplorerMachine(RuleBasedStateMachine):
    """Drives instances of one tier over one storage against :class:`SharedStorageModel`."""

    tier_factory: ClassVar[Callable[[memoryview], SecondaryTier]]
    tests: ClassVar[KitBase]
    limits: ClassVar[KitLimits] = KitLimits()
    capabilities: ClassVar[Capabilities | None] = None
    kinds: ClassVar[frozenset[str]] = frozenset(KINDS)
    block_size: ClassVar[int] = SIZES[0]
    runs: ClassVar[list[int]]

    def __init__(self) -> None:
        super().__init__()
        self.live: list[_Instance] = []
        self.built = 0
        self.enabled: frozenset[str] = frozenset()
        self.model = SharedStorageModel(Capabilities())
        type(self).runs[0] += 1

    # ---- building and retiring instances -------------------------------------------------------
    def _new_driver(self, tier: SecondaryTier, buffer: memoryview, caps: Capabilities) -> SecondaryDriver:
        driver = SecondaryDriver(tier, buffer, caps, self.limits, first_job_id=60_001 + 100_000 * self.built)
        self.built += 1
        return driver

    def _reopen(self, template: SecondaryTier, after: int | None) -> _Instance:
        buffer = make_buffer(NUM_SLOTS, self.block_size)
        reopen: Callable[[SecondaryTier, memoryview], SecondaryTier] = getattr(self.tests, "reopen")  # noqa: B009 - the kit's hook, checked by has_hook
        driver = self._new_driver(reopen(template, buffer), buffer, self.model.caps)
        instance = _Instance(self.built - 1, driver)
        self.live.append(instance)
        self.model.join(instance.index, after=after)
        driver.wait_started()  # asked once started (KIT-19)
        return instance

    def _retire(self, instance: _Instance, *, forget: bool = True) -> None:
        """Settle ``instance`` and shut it down; ``forget``: the model drops it too (a restart keeps it
        until the next instance joined after it)."""
        self._settled(instance).driver.shutdown()
        self.live.remove(instance)
        if forget:
            self.model.leave(instance.index)

    @initialize()
    def start(self) -> None:
        """Build the first instance (and a second beside it where the swarm enables that and the tier
        declares sharing), with the plan's block size."""
        self.enabled = self.kinds
        buffer = make_buffer(NUM_SLOTS, self.block_size)
        tier = type(self).tier_factory(buffer)
        caps = resolve_capabilities(self.capabilities, tier)
        self.model = SharedStorageModel(caps)
        first = _Instance(0, self._new_driver(tier, buffer, caps))
        self.live.append(first)
        self.model.join(0, after=None)
        if "second_instance" in self.enabled and caps.sharing:
            self._reopen(tier, None)

    # ---- the model's view of results ---------------------------------------------------------
    def _absorb(self, instance: _Instance) -> None:
        """Fold the results ``instance`` reported since last time into the model."""
        fresh = instance.driver.reported_since(instance.seen)
        instance.seen += len(fresh)
        for job, done in fresh:
            if job.promotion:
                context = instance.contexts.pop(job.job_id, None)
                if context is not None:
                    instance.driver.tier.on_request_finished(context)
                self.model.load_finished(instance.index, job.job_id, job.keys, done)
            else:
                self.model.store_finished(instance.index, job.job_id, done)

    def _stepped(self, instance: _Instance) -> _Instance:
        """``instance`` after one end-of-step hook, its results folded into the model."""
        instance.driver.step()
        self._absorb(instance)
        return instance

    def _settled(self, instance: _Instance) -> _Instance:
        """``instance`` once its own jobs are all reported, their results folded into the model."""
        instance.driver.settle()
        self._absorb(instance)
        return instance

    def _absorb_all(self) -> None:
        for instance in self.live:
            self._absorb(instance)

    def _pick(self, who: int) -> _Instance:
        return self.live[who % len(self.live)]

    def _free(self, instance: _Instance, n: int) -> list[int] | None:
        """``n`` slots no job of ``instance`` in flight uses; with fewer free, one step instead, and None."""
        driver = instance.driver
        busy = {s for j in driver.pending() for s in driver.jobs[j].slots}
        free = [s for s in range(NUM_SLOTS) if s not in busy]
        if len(free) >= n:
            return free[:n]
        self._stepped(instance)
        return None

    def _store(self, instance: _Instance, keys: list[OffloadKey]) -> None:
        slots = self._free(instance, len(keys))
        if slots is not None:
            job = instance.driver.submit_store(keys, slots)
            self.model.store_submitted(instance.index, job.job_id, keys)

    def _load(self, instance: _Instance, keys: list[OffloadKey], context: ReqContext | None) -> bool:
        slots = self._free(instance, len(keys))
        if slots is None:
            return False
        job = instance.driver.submit_load(keys, slots, context=context)
        self.model.load_submitted(instance.index, job.job_id, keys, after_hit=context is not None)
        if context is not None:
            instance.contexts[job.job_id] = context
        return True

    # ---- rules -------------------------------------------------------------------------------
    @precondition(lambda self: "store" in self.enabled)
    @rule(who=_WHO, keys=_KEYS)
    def store(self, who: int, keys: list[OffloadKey]) -> None:
        """Submit a store of ``keys`` in one instance."""
        self._store(self._pick(who), keys)
        self._absorb_all()

    @precondition(lambda self: "twin_store" in self.enabled and len(self.live) > 1)
    @rule(who=_WHO, keys=_KEYS)
    def twin_store(self, who: int, keys: list[OffloadKey]) -> None:
        """Two live instances submit a store of the same keys before either is stepped."""
        first = self._pick(who)
        self._store(first, keys)
        self._store(self._pick(who + 1), keys)
        self._absorb_all()

    @precondition(lambda self: "load" in self.enabled)
    @rule(who=_WHO, keys=_KEYS)
    def load(self, who: int, keys: list[OffloadKey]) -> None:
        """Submit a load of ``keys`` (stored or not) in one instance."""
        self._load(self._pick(who), keys, None)
        self._absorb_all()

    @precondition(lambda self: "lookup" in self.enabled)
    @rule(who=_WHO, key=st.sampled_from(_POOL), then_load=st.booleans())
    def lookup(self, who: int, key: OffloadKey, then_load: bool) -> None:
        """Ask for ``key`` in a new request of one instance until it settles; after a HIT, maybe load it
        in that request."""
        instance = self._pick(who)
        context = TrackedContext("kvproto-kit-explore")
        answer = instance.driver.resolve([key], context)[key]
        self._absorb(instance)
        loading = False
        match answer:
            case lr.HIT:
                self.model.judge_hit(instance.index, key)
                loading = then_load and self._load(instance, [key], context)
            case lr.MISS:
                self.model.judge_miss(instance.index, key, past_deadline=key in instance.driver.deadline_misses)
            case lr.RETRY | lr.HIT_PENDING:
                raise ConformanceFailure("TIER-18", f"a settled lookup answered {answer.name}")
            case _ as other:
                unreachable(other, where="ExplorerMachine.lookup")
        if not loading:
            instance.driver.tier.on_request_finished(context)

    @precondition(lambda self: "step" in self.enabled)
    @rule(who=_WHO)
    def step(self, who: int) -> None:
        """One end-of-step hook in one instance."""
        self._stepped(self._pick(who))

    @precondition(lambda self: "reset" in self.enabled)
    @rule(who=_WHO)
    def reset(self, who: int) -> None:
        """``reset_cache`` in one instance once its own jobs are reported (the others' may be in flight)."""
        instance = self._settled(self._pick(who))
        answer: object = instance.driver.tier.reset_cache()
        if answer is True:
            self.model.reset_succeeded(instance.index)
        elif answer is not False:
            raise ConformanceFailure("TIER-16", f"reset_cache answered {answer!r}, not a bool")

    @precondition(lambda self: "restart" in self.enabled and self.tests.has_hook("reopen"))
    @rule(who=_WHO)
    def restart(self, who: int) -> None:
        """Shut one instance down once its jobs are reported, and reopen one over the storage."""
        instance = self._pick(who)
        self._retire(instance, forget=False)
        self._reopen(instance.driver.tier, instance.index)
        self.model.leave(instance.index)

    @precondition(lambda self: "compare" in self.enabled)
    @rule()
    def compare(self) -> None:
        """With nothing in flight, every instance is asked for every key of the pool in a new request."""
        for instance in self.live:
            instance.driver.settle()
        self._absorb_all()
        for instance in self.live:
            context = TrackedContext("kvproto-kit-explore-compare")
            answers = instance.driver.resolve(list(_POOL), context, patient=True)
            self._absorb(instance)
            for key, answer in answers.items():
                if answer is lr.HIT:
                    self.model.judge_hit(instance.index, key)
                else:
                    self.model.judge_miss(instance.index, key, past_deadline=key in instance.driver.deadline_misses)
            instance.driver.tier.on_request_finished(context)

    def teardown(self) -> None:
        """Settle and shut down every instance; a failure here is reported only if no step failed."""
        failing = sys.exc_info()[1] is not None
        type(self).runs[1] += sum(i.driver.steps for i in self.live)
        for instance in list(self.live):
            try:
                self._retire(instance)
            except ConformanceFailure:
                if not failing:
                    raise
            finally:
                instance.driver.shutdown()


def swarm_plan(max_block_bytes: int) -> list[tuple[frozenset[str], int]]:
    """The explorer's swarm (KIT-23): eight pairs of (operation kinds, block size), one per row of a
    two-level orthogonal array of strength 2 over the optional kinds (kind ``j`` is on in row ``r``
    when ``r & (j + 1)`` has an odd number of bits), so every two kinds run together, and each without
    the other, in two rows apiece; stores and comparisons are always on. The sizes, of those up to
    ``max_block_bytes``, go round the rows."""
    optional = [k for k in KINDS if k not in _ALWAYS]
    sizes = [s for s in SIZES if s <= max_block_bytes] or [SIZES[0]]
    plan: list[tuple[frozenset[str], int]] = []
    for row in range(_ROWS):
        on = {kind for j, kind in enumerate(optional) if (row & (j + 1)).bit_count() % 2 == 1}
        plan.append((frozenset(_ALWAYS | on), sizes[(row + row // len(sizes)) % len(sizes)]))
    return plan


def explorer_for(
    tests: KitBase, tier_factory: Callable[[memoryview], SecondaryTier], *, kinds: frozenset[str], block_size: int
) -> type[ExplorerMachine]:
    """An :class:`ExplorerMachine` bound to ``tests`` (its hooks, capabilities and limits), running the
    operation ``kinds`` with rows of ``block_size`` bytes."""
    attrs: dict[str, Any] = {
        "tier_factory": staticmethod(tier_factory),
        "tests": tests,
        "limits": tests.limits,
        "capabilities": tests.capabilities,
        "kinds": kinds,
        "block_size": block_size,
        "runs": [0, 0],
    }
    return type("ExplorerMachineForTier", (ExplorerMachine,), attrs)
