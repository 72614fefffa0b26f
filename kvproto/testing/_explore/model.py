"""What live and successive instances over one storage may observe: the explorer's model (KIT-23).

One object holds, for every instance the explorer built over the same storage, what the contract
holds that instance to, and judges each observation as it is made:

* **A HIT names a block that may exist** (TIER-4): some instance submitted a store of the key and no
  successful ``reset_cache`` removed it since (a store in flight at the reset may still land). Where
  the tier declares ``sharing``, an instance may still remember a block it stored or loaded that
  another instance's reset removed (its index is a memo, TIERKIT-10): it may answer HIT for it until a
  load of it fails there, and that load's failure is excused (TIER-4: the block answers HIT again only
  if a load right after succeeds); a store of such a block there proves nothing (it may be skipped on
  the memo's word).
* **A block stored is seen** (TIER-10, TIER-18): a key whose store an instance reported successful
  (a store in flight during a reset proves nothing) answers HIT in a fresh request of that instance,
  and of every live instance where the tier declares
  ``sharing`` (of an instance reopened after it, where it declares ``persistence``), until a reset by
  any instance removes it; declared ``eviction`` excuses a MISS of a block some instance's REMOVED
  event named, unless a store of it submitted after that event has landed since (TIER-14: an evicting
  tier names what it drops), and so
  does AP-3's deadline (a RETRY until ``max_retry_steps``, then MISS).
* **A HIT loads** (TIER-4, TIER-26): a load submitted after a HIT, in the request that saw it, succeeds,
  unless the storage was disturbed since the HIT: a reset by any instance, or, where the tier declares
  eviction, a store by any instance submitted or landing (either may evict). Other requests, live
  beside it or finished meanwhile (with or without loading their own HITs), disturb nothing.
* **A damaged block excuses only itself** (TIER-10): a block the explorer damaged in storage is certain
  nowhere, and a load holding it may fail (whole, or from it on); every other block keeps its
  judgements: a delete of the damaged block that took its neighbour with it is a lost write.
* **A certain block loads** (TIER-10): a load of keys stored for certain fails none of them unless the
  storage was disturbed meanwhile. A load holding a key not stored for certain may fail whole (with
  or without partial_jobs), or, reporting some keys done, from that key on (CAP-4); they stay certain,
  and a later load must deliver them.
* **Bytes are the key's** (TIER-10): judged by each instance's driver for every key a load reports done.

The model only reads what the explorer tells it; it never calls a tier.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvproto._capabilities import Capabilities
from kvproto._keys import OffloadKey
from kvproto.testing._harness.driver import short_key
from kvproto.testing._harness.failures import ConformanceFailure

__all__ = ["HELD_NOTE", "PendingLoad", "SharedStorageModel"]

HELD_NOTE = (
    " (a request kept open while other requests of the instance held HITs, and one of them finished without "
    "loading its own)"
)


@dataclass(frozen=True, slots=True)
class PendingLoad:
    """A load in flight: the keys certain for its instance when it was submitted, the model's count of
    disturbances then, and whether it follows a HIT of its request (TIER-4)."""

    sure: frozenset[OffloadKey]
    disturbances: int
    after_hit: bool
    held: bool = False  # its request stayed open across other operations after the HIT


class SharedStorageModel:
    """The explorer's model of one storage and the instances over it (see the module docstring)."""

    def __init__(self, capabilities: Capabilities, *, memo_stores: bool = True) -> None:
        self.caps = capabilities
        self.memo_stores = memo_stores  # a store of a remembered key may be skipped on the memo's word
        self.possible: set[OffloadKey] = set()  # some store submitted since the last reset removed it
        self.certain: dict[int, set[OffloadKey]] = {}  # per instance: keys it must see
        self.remembered: dict[int, set[OffloadKey]] = {}  # per instance: what it stored or loaded itself
        self.stored_by: dict[OffloadKey, int] = {}  # the instance whose store made a key certain
        self.disturbances = 0  # resets, and stores submitted or landing where the tier declares eviction
        self.stores: dict[tuple[int, int], tuple[OffloadKey, ...]] = {}  # (instance, job) -> keys
        self.raced: set[tuple[int, int]] = set()  # stores in flight at a reset: their success proves nothing
        self.loads: dict[tuple[int, int], PendingLoad] = {}
        self.broken: set[OffloadKey] = set()  # damaged in storage by the explorer: excused until a reset removes them
        self.armed: set[OffloadKey] = set()  # damaged through a hook (its next read, whenever): excused for good
        self.removed: dict[OffloadKey, int] = {}  # named by some instance's REMOVED event: -> the count then
        self.removals = 0  # REMOVED keys reported in all
        self.submitted_at: dict[tuple[int, int], int] = {}  # (instance, store job) -> removals when submitted

    # ---- instances ------------------------------------------------------------------------
    def join(self, instance: int, *, after: int | None) -> None:
        """``instance`` is built over the storage; ``after``: the instance it follows (its restart),
        or None for one built beside the live ones."""
        self.remembered[instance] = set()
        live = [self.certain[i] for i in self.certain if i != after]
        if self.caps.sharing and live:
            self.certain[instance] = set(live[0])
        elif after is not None and self.caps.persistence:
            self.certain[instance] = set(self.certain.get(after, ()))
        else:
            self.certain[instance] = set()

    def leave(self, instance: int) -> None:
        """``instance`` was shut down: nothing it had in flight is judged any more."""
        self.certain.pop(instance, None)
        self.remembered.pop(instance, None)
        self.stores = {k: v for k, v in self.stores.items() if k[0] != instance}
        self.submitted_at = {k: v for k, v in self.submitted_at.items() if k[0] != instance}
        self.raced = {k for k in self.raced if k[0] != instance}
        self.loads = {k: v for k, v in self.loads.items() if k[0] != instance}

    def _seers(self, instance: int) -> Iterable[set[OffloadKey]]:
        """The certain-sets a store by ``instance`` adds to: every live instance where blocks are shared."""
        return self.certain.values() if self.caps.sharing else [self.certain[instance]]

    # ---- stores and resets -----------------------------------------------------------------
    def store_submitted(self, instance: int, job_id: int, keys: Sequence[OffloadKey]) -> None:
        """A store of ``keys`` was submitted: they may exist from now on. With ``sharing``, a store of
        a key the instance remembers but is not held to (another instance's reset may have removed it)
        proves nothing where the tier may skip it on its memo's word (``memo_stores``: TIERKIT-10's
        ``trust_index_on_store``); a tier that says it does not is held to it like any store: reported
        done, the block is there for every instance (TIER-10, TIER-18)."""
        flying = {k for (owner, _), ks in self.stores.items() if owner == instance for k in ks}
        memo, sure = self.remembered[instance] | flying, self.certain[instance]  # its index may hold those
        if self.caps.sharing and self.memo_stores and any(k in memo and k not in sure for k in keys):
            self.raced.add((instance, job_id))
        self.possible.update(keys)
        self.submitted_at[(instance, job_id)] = self.removals
        self.stores[(instance, job_id)] = tuple(keys)
        if self.caps.eviction:
            self.disturbances += 1

    def store_finished(self, instance: int, job_id: int, done: frozenset[OffloadKey]) -> None:
        """The store reported ``done`` keys stored; a key it failed is no longer certain anywhere (the
        store may have disturbed it), nor is one it stored while a reset ran (the reset may have
        removed it after it was written)."""
        raced = (instance, job_id) in self.raced
        self.raced.discard((instance, job_id))
        since = self.submitted_at.pop((instance, job_id), self.removals)
        for key in done:  # the copy it stored: a REMOVED taken before its submit named an older one
            if self.removed.get(key, since + 1) <= since:
                del self.removed[key]
        if self.caps.eviction:
            self.disturbances += 1  # an evicting tier may make room when a store lands, as at its submit
        self.remembered[instance].update(done)  # its index holds them, raced or not
        if raced:
            done = frozenset()
        done = done - self.broken - self.armed  # a store of a damaged block may be skipped as EXISTED
        for key in self.stores.pop((instance, job_id), ()):
            for seen in self._seers(instance):
                if key in done:
                    seen.add(key)
                else:
                    seen.discard(key)
            if key in done:
                self.stored_by[key] = instance

    def reset_succeeded(self, instance: int) -> None:
        """``reset_cache`` returned True in ``instance``: every block is gone but those a store still
        in flight (in another instance) may yet write."""
        self.disturbances += 1
        self.remembered[instance].clear()
        for seen in self._seers(instance):
            seen.clear()
        self.possible = {k for keys in self.stores.values() for k in keys}
        self.raced.update(self.stores)
        self.broken &= self.possible  # a damaged block is gone unless a store in flight writes it again

    def removed_reported(self, keys: Iterable[OffloadKey]) -> None:
        """Some instance's REMOVED event named ``keys`` (TIER-14): where the tier declares eviction, a MISS of
        them is that eviction (without it, still a lost write)."""
        for key in keys:
            self.removals += 1
            self.removed[key] = self.removals

    def damaged(self, keys: Iterable[OffloadKey], *, hook: bool = False) -> None:
        """The explorer damaged the stored copy of ``keys`` (through the ``corrupt_on_read`` hook where
        ``hook``: excused for good, the hook may fire at any later read): none is certain anywhere any
        more, and a load holding one may fail (the tier may delete it, or keep it and skip its re-store)."""
        keys = list(keys)
        (self.armed if hook else self.broken).update(keys)
        for seen in self.certain.values():
            seen.difference_update(keys)

    # ---- lookups ---------------------------------------------------------------------------
    def judge_hit(self, instance: int, key: OffloadKey) -> None:
        """A settled HIT in ``instance``: the key may exist (or, with ``sharing``, the instance may
        remember it), or TIER-4 fails."""
        if key not in self.possible and not (self.caps.sharing and key in self.remembered.get(instance, ())):
            raise ConformanceFailure(
                "TIER-4",
                f"instance {instance}: lookup({short_key(key)}) answered HIT for a block no instance stored "
                "since the last successful reset_cache (of any instance over the storage)",
            )

    def judge_miss(self, instance: int, key: OffloadKey, *, past_deadline: bool) -> None:
        """A settled MISS in a fresh request of ``instance``: fine unless the key is certain there; where the
        tier declares eviction, a REMOVED event of some instance must have named it (TIER-14)."""
        if key not in self.certain.get(instance, ()) or past_deadline:
            return
        if self.caps.eviction and key in self.removed:  # only a tier that declares eviction may drop a block
            return
        by = self.stored_by.get(key, instance)
        if self.caps.eviction:
            raise ConformanceFailure(
                "TIER-14",
                f"instance {instance}: key {short_key(key)}, stored successfully by instance {by}, answers MISS in a "
                "new request, but no instance's REMOVED event named it: a tier that evicts names every block it "
                "drops (a block gone without one is a lost write)",
            )
        if by == instance:
            raise ConformanceFailure(
                "TIER-10",
                f"instance {instance}: key {short_key(key)} was stored successfully but a new request is told MISS "
                "(the tier does not declare eviction): a lost write",
            )
        how = "beside it (the tier declares sharing)" if self.caps.sharing else "before it (it declares persistence)"
        raise ConformanceFailure(
            "TIER-18",
            f"instance {instance}: key {short_key(key)}, stored successfully by instance {by} {how}, answers MISS "
            "in a new request",
        )

    # ---- loads -----------------------------------------------------------------------------
    def load_submitted(
        self, instance: int, job_id: int, keys: Sequence[OffloadKey], *, after_hit: bool, since: int | None = None
    ) -> None:
        """A load of ``keys`` was submitted in ``instance``; ``after_hit``: in the request told HIT for
        them, ``since``: the count of disturbances at the earliest of those HITs (None: now)."""
        sure = frozenset(k for k in keys if k in self.certain.get(instance, ()))
        stale = any(k not in self.possible or k in self.broken or k in self.armed for k in keys)  # removed or damaged
        at = self.disturbances if since is None else since
        self.loads[(instance, job_id)] = PendingLoad(sure, at, after_hit and not stale, since is not None)

    def load_finished(
        self, instance: int, job_id: int, keys: Sequence[OffloadKey], done: frozenset[OffloadKey]
    ) -> None:
        """The load reported ``done``: judge the keys it failed (see the module docstring)."""
        pending = self.loads.pop((instance, job_id), None)
        remembered = self.remembered.get(instance, set())
        remembered.difference_update(k for k in keys if k not in done)
        remembered.update(done)
        if pending is None or pending.disturbances != self.disturbances or done >= set(keys):
            return
        if pending.after_hit:
            held = pending.held and self.caps.holds_hits  # a held HIT loads (TIER-26)
            raise ConformanceFailure(
                "TIER-26" if held else "TIER-4",
                f"instance {instance}: load job {job_id} of {short_key(keys[0])}, submitted after its HIT in the "
                f"same request{HELD_NOTE if pending.held else ''}, failed while no instance disturbed the storage "
                "since the HIT: the HIT was not readable",
            )
        # A job holding a key not surely stored may fail whole, or, reporting some keys done, from that key on (CAP-4).
        first_unsure = next((i for i, k in enumerate(keys) if k not in pending.sure), len(keys))
        tried = keys if first_unsure == len(keys) else keys[:first_unsure] if done else ()
        lost = [k for k in tried if k not in done and k in self.certain.get(instance, ())]
        if lost and not self.caps.eviction:
            raise ConformanceFailure(
                "TIER-10",
                f"instance {instance}: key {short_key(lost[0])} was stored successfully (by instance "
                f"{self.stored_by.get(lost[0], instance)}) but load job {job_id} failed it while no instance reset "
                "the storage: a lost write",
            )
