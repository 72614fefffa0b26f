"""The explorer: a swarm of instances over one storage, judged by one model (KIT-23, issue 40).

Each example draws which kinds of operation it may use (swarm testing: a run that never resets
reaches the states only long store sequences reach), one block size from tiny to MiB rows, and then
interleaves, over up to three instances built with the ``reopen`` hook:

* stores, loads and lookups in any instance, each lookup in a request of its own;
* the same keys stored by two live instances at once (a tier declaring ``sharing``);
* ``reset_cache`` in one instance while the others have jobs in flight (a reset racing loads);
* a restart: one instance shut down and reopened over the storage (``persistence`` then holds it to
  its blocks);
* requests that stay open across operations: up to three live requests per instance holding HITs at
  once, one finished (``on_request_finished``), with or without loading its HITs, while the others go on
  and load theirs later (TIER-26, TIERKIT-6);
* a block damaged in storage (the ``corrupt_on_read`` hook, or a BlobTier's blob replaced by a damaged
  copy through its backend), in a key pool of neighbouring blob names: pairs of keys whose digests share
  their first byte (one ``<aa>/`` directory), one pair their first two (one ``<aa>/<bb>/``), so that a
  delete of one block that takes its neighbour with it is seen (TIER-10);
* at the run's first comparison, a hot block kept in use while fresh blocks flow past the tier's
  capacity (a tier declaring eviction, rows up to 64 KiB): after each job of the flood the hot block
  is asked for and loaded, until the tier has evicted two jobs' worth; the storage is then full, and
  every store after makes room (what the tier evicts and what its storage drops must agree: a storage
  that drops blocks the tier still indexes answers HIT, then fails the load, TIER-4);
* a settle-and-compare: every instance asked, in a new request, for every key of the pool; then, where
  the tier declares eviction and no request is live, a store of one new block, which must succeed
  (every request finished: nothing may still hold a block, TIER-12).

After the last instance is shut down, the process holds no file descriptor on a regular file that it
did not hold before the first was built (TIER-16: shutdown closes what the tier opened).

Every observation is judged by :class:`~kvproto.testing._explore.model.SharedStorageModel`; each
load's bytes by the instance's driver. Only the tier the kit's factory built has its calls listed
when a failure is reported; the steps of the machine are listed for all.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from kvproto import envelope as env, members as lr
from kvproto._capabilities import Capabilities
from kvproto._events import EventKind
from kvproto._keys import OffloadKey
from kvproto._protocols import SecondaryTier
from kvproto._requests import ReqContext
from kvproto._results import LookupResult, unreachable
from kvproto.testing._explore.model import SharedStorageModel
from kvproto.testing._harness.data import key_pool, make_buffer
from kvproto.testing._harness.descriptors import describe_fds, open_fds, settled_leaks
from kvproto.testing._harness.driver import TrackedContext, resolve_capabilities, short_key
from kvproto.testing._harness.failures import ConformanceFailure
from kvproto.testing._harness.secondary_driver import SecondaryDriver
from kvproto.testing._harness.settings import KitLimits

if TYPE_CHECKING:
    from kvproto.testing._harness.base import KitBase

__all__ = ["KINDS", "SIZES", "ExplorerMachine", "explorer_for", "neighbour_pool", "swarm_plan"]

KINDS = ("store", "load", "lookup", "step", "reset", "restart", "second_instance", "twin_store", "compare")
"""The kinds of operation an example may enable (swarm testing); ``lookup`` enables requests kept open
too, ``load`` the damaging of a stored block."""

SIZES = (48, 4096, 65_560, 1 << 20, 3 << 20)
"""Block sizes an example may draw, up to the profile's ``explore_max_block_bytes``: tiny rows, a page,
just past 64 KiB (a ranged read's threshold in many stores), one MiB and several."""

_ALWAYS = frozenset({"store", "compare"})
_ROWS = 8
NUM_SLOTS = 8
MAX_INSTANCES = 3
def neighbour_pool(tag: str, pairs: int) -> list[OffloadKey]:
    """``2 * pairs`` keys in pairs whose digests (ENV-5: the blob names of a file-per-blob store,
    ``<aa>/<bb>/<digest>``) share their first byte and differ in the second, but the first pair, which
    shares its first two bytes: every block of the pool has a neighbour in its directory or the one above."""
    by_prefix: dict[str, OffloadKey] = {}
    found: list[OffloadKey] = []
    for key in key_pool(tag, 1 << 14):
        digest = env.key_digest(key)
        width = 2 if found else 4
        other = by_prefix.get(digest[:width])
        if other is not None and (width == 4 or env.key_digest(other)[2:4] != digest[2:4]):
            found += [other, key]
            if len(found) == 2 * pairs:
                return found
            by_prefix = {}
        else:
            by_prefix.setdefault(digest[:width], key)
    raise AssertionError(f"neighbour_pool: no {pairs} pairs among 16384 keys")  # never: a pair comes every ~20 keys


_WIDE: tuple[OffloadKey, ...] = tuple(neighbour_pool("explore", 12))
_POOL: tuple[OffloadKey, ...] = _WIDE[:10]  # what single stores, loads, lookups and comparisons draw from
_CROWD_MAX_BYTES = 65_560  # the crowd of the wide pool runs with rows up to this size (it stores 24 blocks)
_PROBES: tuple[OffloadKey, ...] = tuple(key_pool("explore-probe", 16))
FLOOD_MOST = 512
"""The most fresh blocks a flood stores (a tier that reports no eviction before: its capacity is larger)."""
_KEYS = st.lists(st.sampled_from(_POOL), min_size=1, max_size=3, unique=True)
_WHO = st.integers(min_value=0, max_value=MAX_INSTANCES - 1)


@dataclass(slots=True)
class _Request:
    """A request kept open across operations: the keys it asked, and each HIT's count of the model's
    disturbances when it was answered (TIER-4: a HIT loads unless the storage was disturbed since)."""

    context: ReqContext
    asked: set[OffloadKey] = field(default_factory=set)
    hits: dict[OffloadKey, int] = field(default_factory=dict)


@dataclass(slots=True)
class _Instance:
    """One live instance: its driver, how many of its results the model has seen, and the request of
    each load that follows a HIT (finished once the load is reported: live in the tier until then)."""

    index: int
    driver: SecondaryDriver
    seen: int = 0
    loading: dict[int, _Request] = field(default_factory=dict)
    open: list[_Request] = field(default_factory=list)
    stored: bool = False  # a store of it reported a block stored (it has room for one)


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
        self.fd_baseline: set[str] | None = None
        self.probes = 0
        self.flooded = False
        self.opened = 0
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
        """Finish its open requests, settle ``instance`` and shut it down; ``forget``: the model drops it
        too (a restart keeps it until the next instance joined after it)."""
        while instance.open:
            instance.driver.tier.on_request_finished(instance.open.pop().context)
        self._settled(instance).driver.shutdown()
        self.live.remove(instance)
        if forget:
            self.model.leave(instance.index)

    @initialize()
    def start(self) -> None:
        """Build the first instance (and a second beside it where the swarm enables that and the tier
        declares sharing), with the plan's block size."""
        self.enabled = self.kinds
        self.fd_baseline = open_fds()  # before the first instance opens anything (TIER-16)
        buffer = make_buffer(NUM_SLOTS, self.block_size)
        tier = type(self).tier_factory(buffer)
        caps = resolve_capabilities(self.capabilities, tier)
        self.model = SharedStorageModel(caps, memo_stores=trusts_memo_on_store(tier))
        first = _Instance(0, self._new_driver(tier, buffer, caps))
        self.live.append(first)
        self.model.join(0, after=None)
        if "second_instance" in self.enabled and caps.sharing and self.tests.has_hook("reopen"):
            self._reopen(tier, None)

    # ---- the model's view of results ---------------------------------------------------------
    def _absorb(self, instance: _Instance) -> None:
        """Fold the results ``instance`` reported since last time into the model."""
        fresh = instance.driver.reported_since(instance.seen)
        instance.seen += len(fresh)
        for job, done in fresh:
            if job.promotion:
                request = instance.loading.pop(job.job_id, None)
                if request is not None:
                    instance.driver.tier.on_request_finished(request.context)
                self.model.load_finished(instance.index, job.job_id, job.keys, done)
            else:
                instance.stored = instance.stored or bool(done)
                self.model.store_finished(instance.index, job.job_id, done)
        self._take_removals(instance)

    def _take_removals(self, instance: _Instance) -> None:
        """Tell the model the keys ``instance``'s REMOVED events named since last time (TIER-14)."""
        events = instance.driver.tier.take_events()
        self.model.removed_reported(k for e in events if e.kind is EventKind.REMOVED for k in e.keys)

    def _removals_taken(self) -> None:
        """Take every live instance's REMOVED events: a MISS in one may be another's eviction (TIER-14)."""
        for instance in self.live:
            self._take_removals(instance)

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

    def _store(self, instance: _Instance, keys: list[OffloadKey]) -> int | None:
        """Submit a store of ``keys`` in ``instance``; its job id (None: no free slots, a step instead)."""
        slots = self._free(instance, len(keys))
        if slots is None:
            return None
        job = instance.driver.submit_store(keys, slots)
        self.model.store_submitted(instance.index, job.job_id, keys)
        return job.job_id

    def _load(
        self, instance: _Instance, keys: list[OffloadKey], request: _Request | None, *, since: int | None = None
    ) -> bool:
        """Submit a load of ``keys``; with ``request``, in the request that was told HIT for them
        (``since``: the model's disturbances at the earliest HIT, or now), which stays live until the
        load is reported."""
        slots = self._free(instance, len(keys))
        if slots is None:
            return False
        context = None if request is None else request.context
        job = instance.driver.submit_load(keys, slots, context=context)
        self.model.load_submitted(instance.index, job.job_id, keys, after_hit=request is not None, since=since)
        if request is not None:
            instance.loading[job.job_id] = request
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
    @rule(who=_WHO, keys=_KEYS, damage=st.booleans())
    def load(self, who: int, keys: list[OffloadKey], damage: bool) -> None:
        """Submit a load of ``keys`` (stored or not) in one instance; with ``damage`` (one load in two),
        the first key's stored copy is damaged before (see :meth:`_damage`)."""
        instance = self._pick(who)
        if damage:
            self._damage(instance, keys[0])
        self._load(instance, keys, None)
        self._absorb_all()

    @precondition(lambda self: "lookup" in self.enabled)
    @rule(who=_WHO, key=st.sampled_from(_POOL), then_load=st.booleans())
    def lookup(self, who: int, key: OffloadKey, then_load: bool) -> None:
        """Ask for ``key`` in a new request of one instance until it settles; after a HIT, maybe load it
        in that request."""
        self._ask_then_load(self._pick(who), [key], load=then_load, name="kvproto-kit-explore")

    def _ask_then_load(self, instance: _Instance, keys: list[OffloadKey], *, load: bool, name: str) -> None:
        """Ask ``instance`` for ``keys`` in a new request named ``name`` until each settles; where ``load``,
        load the HITs the model vouches for in that request (a HIT must load: TIER-4)."""
        request = _Request(TrackedContext(name), asked=set(keys))
        hits = self._asked(instance, keys, request.context)
        if not (hits and load and self._load(instance, hits, request)):
            instance.driver.tier.on_request_finished(request.context)

    @staticmethod
    def _shared_verdict(instance: _Instance, key: OffloadKey) -> bool:
        """Whether a request of ``instance`` still live in the tier was answered for ``key``: one kept
        open, or one waiting for the load of its HITs (finished once that load is reported). A verdict is
        shared by every request that asked and kept until the last of them finishes (AP-4), so a new
        request may be told that older answer, MISS or HIT, which the model does not judge."""
        live = (*instance.open, *instance.loading.values())
        return any(key in request.asked for request in live)

    def _judged(self, instance: _Instance, key: OffloadKey, answer: LookupResult, *, shared: bool) -> None:
        """Judge a settled answer for ``key`` in a new request of ``instance`` (an older verdict shared
        with an open request, ``shared``, is not judged: AP-4); the caller has taken every live instance's
        REMOVED events since (:meth:`_removals_taken`)."""
        if shared:
            return
        if answer is lr.HIT:
            self.model.judge_hit(instance.index, key)
        else:
            self.model.judge_miss(instance.index, key, past_deadline=key in instance.driver.deadline_misses)

    def _asked(self, instance: _Instance, keys: Sequence[OffloadKey], context: ReqContext) -> list[OffloadKey]:
        """Ask ``instance`` for ``keys``, in order, in ``context``'s request until each settles, judge the
        answers, and return the HITs the model vouches for (not older verdicts shared with an open request).
        A MISS is judged by what the model held certain when the asking began: a store reported while the
        lookups resolved (the tier stepped meanwhile) may have landed after the tier answered (round 9: a
        correct tier answered MISS for a key its store in flight had not yet written, and was blamed)."""
        shared = {key for key in keys if self._shared_verdict(instance, key)}
        self._absorb(instance)
        certain = set(self.model.certain.get(instance.index, ()))
        answers = instance.driver.resolve(keys, context)
        self._absorb(instance)
        self._removals_taken()
        hits: list[OffloadKey] = []
        for key, answer in answers.items():
            match answer:
                case lr.MISS if key not in certain:
                    pass  # not certain when asked: the MISS may predate a store reported since
                case lr.HIT | lr.MISS:
                    self._judged(instance, key, answer, shared=key in shared)
                    if answer is lr.HIT and key not in shared:
                        hits.append(key)
                case lr.RETRY | lr.HIT_PENDING:
                    raise ConformanceFailure("TIER-18", f"a settled lookup answered {answer.name}")
                case _ as other:
                    unreachable(other, where="ExplorerMachine._asked")
        return hits

    def _crowd(self, instance: _Instance) -> None:
        """Store every key of the wide pool in ``instance``, a slot-full per job: enough blocks that one
        request can hold more HITs than a tier closes one by one (TIERKIT-6's batched closes)."""
        for start in range(0, len(_WIDE), NUM_SLOTS):
            self._store(self._settled(instance), list(_WIDE[start : start + NUM_SLOTS]))
        self._absorb_all()

    @precondition(lambda self: "lookup" in self.enabled)
    @rule(
        who=_WHO, order=st.permutations(_WIDE), cut=st.integers(1, len(_WIDE) - 1), width=st.integers(1, 3),
        crowd=st.booleans(),
    )
    def hold(self, who: int, order: list[OffloadKey], cut: int, width: int, crowd: bool) -> None:
        """Ask for the keys of ``order`` in two requests of one instance that stay open (those already
        open, or new ones): the first ``cut`` in the first, the next ``width`` in the second, the rest
        in the first again, so each request's HITs are interleaved with the other's; HITs stay held
        until their request loads them or finishes (TIER-26). With ``crowd`` (rows up to 64 KiB), the
        whole wide pool is stored first (:meth:`_crowd`)."""
        instance = self._pick(who)
        if crowd and self.block_size <= _CROWD_MAX_BYTES:
            self._crowd(instance)
        while len(instance.open) < 2:
            instance.open.append(_Request(TrackedContext(f"kvproto-kit-explore-open-{self.opened}")))
            self.opened += 1
        first, second = instance.open[-2:]
        for request, keys in ((first, order[:cut]), (second, order[cut : cut + width]), (first, order[cut + width :])):
            fresh = [key for key in keys if key not in request.asked]
            for key in self._asked(instance, fresh, request.context):
                request.hits[key] = self.model.disturbances
            request.asked.update(fresh)

    @precondition(lambda self: "lookup" in self.enabled)
    @rule(who=_WHO)
    def release(self, who: int) -> None:
        """Finish the open request of one instance holding the most HITs, without loading them; then
        every other open request loads its HITs in itself (each finishes once its load is reported):
        another request's end must not take their HITs (TIER-26, TIERKIT-6)."""
        instance = self._pick(who)
        if not instance.open:
            return
        biggest = max(instance.open, key=lambda r: len(r.hits))
        instance.open.remove(biggest)
        instance.driver.tier.on_request_finished(biggest.context)
        instance.driver.quiet_steps(1)  # what its end hands to the tier's threads (closing handles) runs now
        self._absorb(instance)
        while instance.open:
            request = instance.open.pop()
            keys = list(request.hits)[:NUM_SLOTS]
            since = min((request.hits[k] for k in keys), default=None)
            if not (keys and self._load(instance, keys, request, since=since)):
                instance.driver.tier.on_request_finished(request.context)
        self._absorb_all()

    @precondition(lambda self: "step" in self.enabled)
    @rule(who=_WHO)
    def step(self, who: int) -> None:
        """One end-of-step hook in one instance."""
        self._stepped(self._pick(who))

    @precondition(lambda self: "reset" in self.enabled)
    @rule(who=_WHO)
    def reset(self, who: int) -> None:
        """``reset_cache`` in one instance once its own jobs are reported (the others' may be in flight);
        after a reset that succeeded, another live instance, where there is one, stores again the blocks
        it remembers storing or loading: reported done, they must be there for every instance, whatever
        it remembered (TIER-10, TIER-18, TIERKIT-10)."""
        instance = self._settled(self._pick(who))
        answer: object = instance.driver.tier.reset_cache()
        if answer is True:
            self.model.reset_succeeded(instance.index)
        elif answer is not False:
            raise ConformanceFailure("TIER-16", f"reset_cache answered {answer!r}, not a bool")
        if answer is True and len(self.live) > 1:
            other = self._pick(self.live.index(instance) + 1)
            known = [key for key in _WIDE if key in self.model.remembered.get(other.index, ())][:NUM_SLOTS]
            if known:
                self._store(other, known)
            self._absorb_all()

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
        """With nothing in flight, every instance is asked for every key of the pool in a new request
        (with rows over 64 KiB, its HITs then load in one job in that request, reported before the next
        instance is asked: a load of MiBs, past the batch limits a backend's multi-key requests keep, as
        a read split at 4 MiB); the run's first comparison, where the tier declares eviction and rows
        are up to 64 KiB, floods the first instance first (:meth:`_flood`; the rule draws nothing, so the
        search over the other rules is the same with or without it)."""
        for instance in self.live:
            instance.driver.settle()
        self._absorb_all()
        if not self.flooded and self.model.caps.eviction and self.block_size <= _CROWD_MAX_BYTES:
            self.flooded = True
            first = self.live[0]
            hot = next((k for k in _POOL if k in self.model.certain.get(first.index, ())), _POOL[0])
            self._flood(first, hot)
        for instance in self.live:
            context = TrackedContext("kvproto-kit-explore-compare")
            answers = instance.driver.resolve(list(_POOL), context, patient=True)
            self._absorb(instance)
            self._removals_taken()
            shared = {key for key in answers if self._shared_verdict(instance, key)}
            for key, answer in answers.items():
                self._judged(instance, key, answer, shared=key in shared)
            hits = [key for key, answer in answers.items() if answer is lr.HIT and key not in shared]
            if self.block_size > _CROWD_MAX_BYTES and len(hits) > 1 and self._load(
                instance, hits[:NUM_SLOTS], _Request(context, asked=set(_POOL))
            ):
                self._settled(instance)  # judged, and its request finished, before the next instance is asked
            else:
                instance.driver.tier.on_request_finished(context)
        if self.model.caps.eviction and not any(i.open for i in self.live):
            for instance in self.live:
                self._probe_store(instance)

    def _flood(self, instance: _Instance, hot: OffloadKey) -> None:
        """Store ``hot`` in ``instance``, then fresh blocks a slot-full per job, asking for ``hot`` in a new
        request after each job and loading it on a HIT (an engine's hot prefix), and reading back the
        previous job's blocks, until REMOVED events named two jobs' worth of evictions, a job failed, or
        :data:`FLOOD_MOST` blocks: the storage at its capacity, where every later store makes room. Then
        every flooded block is asked for in one new request. A HIT loads (TIER-4); a MISS is the tier's
        eviction only where a REMOVED event named the block (TIER-14), or a lost write: a block read
        before it was evicted must be named as any other."""
        self._take_removals(instance)
        before = self.model.removals
        flooded: list[OffloadKey] = []
        for start in range(-1, FLOOD_MOST, NUM_SLOTS):
            keys = [hot] if start < 0 else list(_flood_keys()[start : start + NUM_SLOTS])
            job_id = self._store(self._settled(instance), keys)
            self._settled(instance)
            self._ask_then_load(instance, [hot], load=True, name="kvproto-kit-explore-hot")
            if start > 0:  # the previous job's blocks read back once (a request continuing their prefix)
                self._settled(instance)
                self._ask_then_load(instance, flooded[-NUM_SLOTS:], load=True, name="kvproto-kit-explore-read-back")
            self._settled(instance)
            flooded.extend(keys if start >= 0 else ())
            evicted = self.model.removals - before  # the REMOVED keys its events named (each absorb takes them)
            if job_id is None or not instance.driver.results[job_id].success or evicted >= 2 * NUM_SLOTS:
                break
        self._ask_then_load(self._settled(instance), flooded, load=False, name="kvproto-kit-explore-after-flood")

    def _probe_store(self, instance: _Instance) -> None:
        """With no request live and nothing in flight, a store of one new block in ``instance``, a tier
        declaring eviction that stored a block before, succeeds: nothing may hold a block once every
        request that was told HIT has finished (TIER-12), so eviction can make room. A failed try gets
        up to two more, each after a quiet step (a tier that evicts in the background)."""
        if not instance.stored:
            return
        key = _PROBES[self.probes % len(_PROBES)]
        self.probes += 1
        for _ in range(3):
            job = instance.driver.submit_store([key], [0])
            self.model.store_submitted(instance.index, job.job_id, [key])
            self._settled(instance)
            if instance.driver.results[job.job_id].success:
                return
            self._stepped(instance)
        raise ConformanceFailure(
            "TIER-12",
            f"instance {instance.index}: with every request finished and nothing in flight, 3 stores of one new "
            f"block ({short_key(key)}) failed, though the tier declares eviction and stored blocks before: "
            "something still holds its blocks for requests that ended (a finished request's holds must be dropped)",
        )

    def _damage(self, instance: _Instance, key: OffloadKey) -> None:
        """Damage the stored copy of ``key`` once ``instance``'s jobs are reported (a load of it must then
        fail, never serve its bytes; the tier may delete it): through the ``corrupt_on_read`` hook, or,
        over a BlobTier, by replacing its blob with a copy whose last byte is flipped. Its neighbours
        stay stored (TIER-10)."""
        self._settled(instance)
        if self.tests.has_hook("corrupt_on_read"):
            if key not in self.model.certain.get(instance.index, ()):
                return  # the hook damages a stored block: an author's hook may raise for one never stored
            self.model.damaged([key], hook=True)
            getattr(self.tests, "corrupt_on_read")(instance.driver.tier, [key])  # noqa: B009 - the kit's hook
            return
        backend, name_of = getattr(instance.driver.tier, "backend", None), getattr(instance.driver.tier, "name_of", None)
        if backend is None or not callable(name_of) or key not in self.model.possible:
            return
        self.model.damaged([key])
        name = name_of(key)
        size = next(iter(backend.sizes([name])), None)
        if not isinstance(size, int) or size <= 0:
            return
        copy = bytearray(size)
        backend.read_into(name, [memoryview(copy)])
        copy[-1] ^= 0xFF
        backend.delete(name)
        backend.publish(name, [memoryview(copy)], size)

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
        if not failing and self.fd_baseline is not None:
            leaked = settled_leaks(self.fd_baseline)
            if leaked:
                raise ConformanceFailure(
                    "TIER-16",
                    f"{len(leaked)} file descriptor(s) on regular files opened while the explorer ran are still open "
                    f"after every instance was shut down ({describe_fds(leaked)}): shutdown must close what the "
                    "tier opened, and a delete the file it deleted",
                )


@functools.cache
def _flood_keys() -> tuple[OffloadKey, ...]:
    """The :data:`FLOOD_MOST` fresh keys a flood stores (made at its first use)."""
    return tuple(key_pool("explore-flood", FLOOD_MOST))


def trusts_memo_on_store(tier: SecondaryTier) -> bool:
    """Whether ``tier`` may report a store of a block it remembers done without sending it (TIERKIT-10):
    True unless it says otherwise, as a :class:`~kvproto.tierkit.BlobTier` configured without
    ``trust_index_on_store`` does (its stores then reach the storage, and a backend's own memo that
    skips them is the backend's bug)."""
    config = getattr(tier, "blob_config", None)
    return getattr(config, "trust_index_on_store", True) is not False


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
