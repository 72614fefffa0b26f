"""The primary tier's state machine, storage-agnostic: :class:`SlotTable` (TIER-3..TIER-17, CPU-3..CPU-10).

Block states::

    ABSENT --prepare_store--> WRITING --complete_store(ok)--> READY <--pin/release--> PINNED
               WRITING --complete_store(failed)--> ABSENT (slot freed)
               WRITING --deadline passed--> ABSENT (slot quarantined until the late completion)
               WRITING --quarantine_stores--> ABSENT (slot held until release_slots: MGR-17)
               READY   --evicted by prepare_store / evict / reset_cache--> ABSENT

A slot is an index ``0 <= slot < num_slots``; what a slot holds (a row of a
``bytearray``, of pinned host memory...) is the data plane's business, never
the table's.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Collection, Container, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import TypeAlias

import kvproto.members as lr
from kvproto._events import MAX_PENDING_EVENTS, EventKind, OffloadingEvent
from kvproto._jobs import PrepareStoreOutput
from kvproto._key_batches import check_not_a_single_key, key_batch
from kvproto._keys import OffloadKey
from kvproto._requests import ReqContext
from kvproto._results import LookupResult
from kvproto.errors import InvalidArgumentError, TierMisuseError
from kvproto.tierkit._eviction import EvictionPolicy, PolicyName
from kvproto.tierkit._slot_checks import check_config, make_policy_of
from kvproto.tierkit._slot_types import HOST_PRIMARY_CAPABILITIES, BlockState, SlotStats

__all__ = ["HOST_PRIMARY_CAPABILITIES", "BlockState", "SlotStats", "SlotTable"]

_log = logging.getLogger("kvproto.tierkit")


# A WRITING key's (slot, due): due is the clock time after which the write is expired (started +
# pending_deadline_s), infinity without a deadline. A plain tuple: the store path makes one per key.
_Writing: TypeAlias = tuple[int, float]


_NOTHING_TO_STORE = PrepareStoreOutput((), ())
_NEVER = float("inf")  # the due time of a write when there is no deadline


class SlotTable:
    """Slots, block states, counted pins, eviction and events of a primary tier; no bytes (TIER-3..TIER-17).

    A primary tier is a ``SlotTable`` plus a buffer of ``num_slots`` rows: the
    table implements every :class:`kvproto.PrimaryTier` method but ``buffer``,
    so a subclass that adds the buffer is a primary tier (mypy checks it
    structurally; nothing requires the base class)::

        class BytesPrimary(SlotTable):
            def __init__(self, num_slots: int, block_bytes: int) -> None:
                super().__init__(num_slots, name="bytes-primary", pending_deadline_s=30.0)
                self._rows = memoryview(bytearray(num_slots * block_bytes)).cast("B", (num_slots, block_bytes))

            @property
            def buffer(self) -> memoryview:
                return self._rows

    ``kvproto.MemoryPrimaryTier`` and ``kvproto_cpu.CpuTier`` are built so.

    Arguments: ``num_slots`` (an int >= 1); keyword-only ``name`` (a
    non-empty str, used in events, errors and logs); ``policy``, ``"lru"``,
    ``"arc"`` or an :class:`EvictionPolicy` instance (CPU-6);
    ``pending_deadline_s``, ``None`` or ``float("inf")`` for no deadline, else
    a number > 0: a write still WRITING after that many seconds of ``clock``
    is failed, answers MISS and its slot is quarantined (CPU-7, CPU-8);
    ``clock``, monotonic seconds (tests inject a fake one). Bad values raise
    :class:`~kvproto.errors.ConfigurationError` naming the argument.

    Expired writes (CPU-7, CPU-8): the transfer of an expired write may still
    land in its slot, so the slot is *quarantined*: no key is stored into it
    until the late ``complete_store`` of that key arrives (which frees it and
    is otherwise ignored: the key never becomes READY). No timer ends a
    quarantine; a write that never completes holds its slot for the table's
    life (``quarantined_slots``). While quarantined, the key itself is not
    reserved again either: ``complete_store`` names keys, not slots, so a late
    completion could not be told from a new store's.

    Abandoned stores (MGR-17, :class:`kvproto.SlotQuarantine`): a caller that
    knows its transfers by job (the tiering manager) ends a store with
    :meth:`quarantine_stores`: the key is ABSENT at once and can be stored
    again, its slot held until :meth:`release_slots` says the transfer into
    it is over. ``quarantined_slots`` counts both kinds of held slots.

    Hooks for a subclass: :meth:`select_victims` (which READY blocks a store
    evicts), :meth:`evict` (drop READY blocks now), :attr:`ready_slots` and
    :attr:`pins` (read-only live views of the slots and the pin counts).
    Events are bounded: at most ``MAX_PENDING_EVENTS`` (65,536) untaken, the
    oldest dropped (MGR-18). ``stats`` counts stores, failures, evictions,
    expired writes and late completions.

    Not thread-safe: call it from one thread (the scheduler's).
    """

    def __init__(
        self,
        num_slots: int,
        *,
        name: str = "slots",
        policy: PolicyName | EvictionPolicy = "lru",
        pending_deadline_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        owner = type(self).__name__
        check_config(owner, num_slots, pending_deadline_s, name, clock)
        self._name = name
        self._num_slots = num_slots
        self._deadline = None if pending_deadline_s is None else float(pending_deadline_s)
        # None: no deadline at all, so a WRITING lookup never reads the clock.
        self._due_after = None if pending_deadline_s is None or pending_deadline_s == _NEVER else float(pending_deadline_s)
        self._clock = clock
        self._policy = make_policy_of(owner, policy, num_slots)
        # pop() hands out the lowest free slot first, so a fresh table gives consecutive runs.
        self._free: list[int] = list(range(num_slots - 1, -1, -1))
        self._ready: dict[OffloadKey, int] = {}  # READY and PINNED keys -> slot; cleared, never rebound (MGR-15)
        self._writing: dict[OffloadKey, _Writing] = {}  # in start order, hence in deadline order
        self._pins: dict[OffloadKey, int] = {}  # only keys with >= 1 pin
        self._quarantine: dict[OffloadKey, int] = {}  # expired key -> its slot, held until it completes
        self._held: dict[int, OffloadKey] = {}  # slot of an abandoned store -> its key, held until release_slots
        self._events: deque[OffloadingEvent] = deque(maxlen=MAX_PENDING_EVENTS)
        self._closed = False
        self.stats = SlotStats()

    # ------------------------------------------------------------------ properties

    @property
    def name(self) -> str:
        """A short, stable name used in events and logs."""
        return self._name

    @property
    def num_slots(self) -> int:
        """How many slots the table holds."""
        return self._num_slots

    @property
    def pending_deadline_s(self) -> float | None:
        """Seconds a write may stay WRITING before it is failed, as given; ``None``: no deadline (CPU-7)."""
        return self._deadline

    @property
    def policy(self) -> EvictionPolicy:
        """The eviction policy ordering the READY blocks (CPU-6)."""
        return self._policy

    @property
    def free_slots(self) -> int:
        """Slots neither holding a block nor reserved nor quarantined."""
        return len(self._free)

    @property
    def quarantined_slots(self) -> int:
        """Slots of expired writes, held until their late completion arrives (CPU-8), and of abandoned
        stores, held until :meth:`release_slots` (MGR-17)."""
        return len(self._quarantine) + len(self._held)

    @property
    def ready_keys(self) -> Container[OffloadKey]:
        """Live view of exactly the keys ``lookup`` answers HIT for (READY or PINNED) (MGR-15, CPU-3).

        A view of the one dict the table keeps for its life, updated in place
        (cleared on reset, never rebound), so a view taken once stays right.
        """
        return self._ready.keys()

    @property
    def ready_contains(self) -> Callable[[OffloadKey], bool]:
        """``key in ready_keys`` as the ready dict's own bound ``__contains__`` (MGR-15, MGR-20): the
        manager's batched scans call it from C, about a third cheaper than through the view."""
        return self._ready.__contains__

    @property
    def ready_slots(self) -> Mapping[OffloadKey, int]:
        """Read-only live view: each READY or PINNED key -> its slot (CPU-3)."""
        return MappingProxyType(self._ready)

    @property
    def pins(self) -> Mapping[OffloadKey, int]:
        """Read-only live view: each pinned key -> its pin count (>= 1) (CPU-5)."""
        return MappingProxyType(self._pins)

    def state(self, key: OffloadKey) -> BlockState:
        """The state of ``key`` (CPU-3); an expired (quarantined) key is ABSENT."""
        if key in self._ready:
            return BlockState.PINNED if key in self._pins else BlockState.READY
        if key in self._writing:
            return BlockState.WRITING
        return BlockState.ABSENT

    def pin_count(self, key: OffloadKey) -> int:
        """How many pins ``key`` holds (CPU-5)."""
        return self._pins.get(key, 0)

    def slot_of(self, key: OffloadKey) -> int | None:
        """The slot of a WRITING, READY or PINNED ``key``; ``None`` otherwise."""
        slot = self._ready.get(key)
        if slot is not None:
            return slot
        writing = self._writing.get(key)
        return None if writing is None else writing[0]

    def check_slot(self, slot: int) -> int:
        """Return ``slot`` if it is a slot index of this table, else raise TierMisuseError (CPU-10)."""
        if type(slot) is not int or not 0 <= slot < self._num_slots:
            raise TierMisuseError(f"{self._name}: slot {slot!r} is out of range 0..{self._num_slots - 1}")
        return slot

    # ------------------------------------------------------------------ lookups

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """HIT if READY or PINNED, HIT_PENDING if WRITING within its deadline, else MISS (TIER-4, CPU-3, CPU-7).

        Never RETRY (LR-4). O(1) and allocation-free for HIT and MISS (one or
        two dict probes, no clock read); a WRITING key reads the clock only
        when a deadline is set, and one past its deadline is expired on the
        spot (its slot quarantined) and answers MISS. ``key`` is not
        type-checked here: this is the hot path.
        """
        if key in self._ready:
            return lr.HIT
        writing = self._writing.get(key)
        if writing is None:
            return lr.MISS
        if self._due_after is None:
            return lr.HIT_PENDING
        now = self._clock()
        if now <= writing[1]:
            return lr.HIT_PENDING
        self._expire(key, writing, now)
        return lr.MISS

    def lookup_many(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> list[LookupResult]:
        """``[self.lookup(k, req_context) for k in keys]`` (TIER-17).

        A single key (``bytes``) or a ``str`` passed as ``keys`` raises
        :class:`~kvproto.errors.InvalidArgumentError`.
        """
        check_not_a_single_key(self._name, "lookup_many", keys)
        lookup = self.lookup
        return [lookup(key, req_context) for key in keys]

    def touch(self, keys: Iterable[OffloadKey]) -> None:
        """Mark the READY ``keys`` as recently used for the policy; other keys are ignored (TIER-5, CPU-6).

        Never blocks. A single key (``bytes``) or a ``str`` passed as ``keys``
        raises :class:`~kvproto.errors.InvalidArgumentError`.
        """
        check_not_a_single_key(self._name, "touch", keys)
        ready = self._ready
        touch = self._policy.touch
        for key in keys:
            if key in ready:
                touch(key)

    # ------------------------------------------------------------------ stores

    def prepare_store(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        """Reserve a slot for each key not present, evicting only what is needed (TIER-6, CPU-4).

        Keys READY, PINNED or WRITING are skipped, as are repeats and keys
        whose expired write is quarantined (CPU-8); an empty output when
        nothing is left. If fewer slots are free than keys to store, exactly
        the shortfall of READY blocks is evicted in policy order
        (:meth:`select_victims`), never a pinned block and never one of
        ``keys`` (one REMOVED event; ``evicted`` lists them). WRITING blocks
        and quarantined slots are never taken. All or nothing: ``None`` and no
        change at all when too few blocks can be evicted, or after
        ``shutdown``. The reserved keys are WRITING (HIT_PENDING), their slots
        distinct and ascending.

        A non-``bytes`` key, or a single key or ``str`` passed as ``keys``,
        raises :class:`~kvproto.errors.InvalidArgumentError` before anything
        changes.
        """
        batch = key_batch(self._name, "prepare_store", keys)
        if self._closed:
            return None
        ready, writing, quarantine, free = self._ready, self._writing, self._quarantine, self._free
        if len(batch) == 1 and free:
            # One key and a free slot, as every promotion asks (MGR-2): no dedup, no eviction.
            key = batch[0]
            if key in ready or key in writing or key in quarantine:
                return _NOTHING_TO_STORE
            slot = free.pop()
            after = self._due_after
            writing[key] = (slot, _NEVER if after is None else self._clock() + after)
            return PrepareStoreOutput(batch, (slot,))
        # A dict keeps the first occurrence of each key in order: repeats need no second slot.
        to_store: dict[OffloadKey, None] = {}
        for key in batch:
            if key not in ready and key not in writing and key not in quarantine:
                to_store[key] = None
        if not to_store:
            return _NOTHING_TO_STORE
        count = len(to_store)
        evicted: tuple[OffloadKey, ...] = ()
        if count > len(free):
            victims = self.select_victims(count - len(free), set(batch), to_store)
            if victims is None:
                return None
            evicted = self._drop(victims)
        due = _NEVER if self._due_after is None else self._clock() + self._due_after
        # Ascending slots give a data plane long runs of consecutive slots to copy at once.
        slots = free[-count:]
        del free[-count:]
        slots.sort()
        stored = tuple(to_store)
        for key, slot in zip(stored, slots, strict=True):
            writing[key] = (slot, due)
        return PrepareStoreOutput(stored, tuple(slots), evicted)

    def complete_store(self, keys: Iterable[OffloadKey], success: bool) -> None:
        """Finish stores (TIER-7, CPU-4, CPU-8).

        ``success``: each WRITING key becomes READY and is admitted to the
        policy (one STORED event for all). Failure: each WRITING key becomes
        ABSENT and its slot is freed, so a failed store is never visible. Keys
        already READY or PINNED are untouched either way. A late completion of
        an expired key frees its quarantined slot and is otherwise ignored
        (counted in ``stats.late_completions``): the key never becomes READY
        and no event is emitted.

        Raises, before anything changes: :class:`~kvproto.errors.TierMisuseError`
        naming a key the table never reserved (``.key``);
        :class:`~kvproto.errors.InvalidArgumentError` when ``success`` is not a
        ``bool``, a key is not ``bytes``, or a single key or ``str`` is passed
        as ``keys``.
        """
        flag: object = success
        if flag is not True and flag is not False:
            raise InvalidArgumentError(
                f"{self._name}: complete_store(success={flag!r}): success must be a bool, got {type(flag).__name__}"
            )
        batch = key_batch(self._name, "complete_store", keys)
        ready, writing, quarantine, free = self._ready, self._writing, self._quarantine, self._free
        for key in batch:
            if key not in writing and key not in ready and key not in quarantine:
                raise TierMisuseError(f"{self._name}: complete_store of key {key!r}, which was never prepared", key=key)
        stored: list[OffloadKey] = []
        admit = self._policy.admit
        for key in batch:
            pending = writing.pop(key, None)
            if pending is not None:
                if success:
                    ready[key] = pending[0]
                    admit(key)
                    stored.append(key)
                else:
                    free.append(pending[0])
                    self.stats.stores_failed += 1
                continue
            slot = quarantine.pop(key, None)
            if slot is not None:
                free.append(slot)
                self.stats.late_completions += 1
                _log.warning(
                    "%s: late complete_store(success=%s) of expired key %r ignored; slot %d freed",
                    self._name, success, key, slot,
                )
        if stored:
            self.stats.stores_completed += len(stored)
            self._events.append(OffloadingEvent(EventKind.STORED, tuple(stored), self._name))

    def quarantine_stores(self, keys: Sequence[OffloadKey]) -> tuple[int, ...]:
        """End the stores of ``keys`` that their caller abandoned, keeping their slots (MGR-17, CPU-8).

        Each WRITING key, or key whose expired write is quarantined, becomes
        ABSENT at once (MISS, and :meth:`prepare_store` reserves it again);
        its slot stays out of the pool, because the abandoned transfer may
        still land in it, until :meth:`release_slots` gives it back. Other
        keys are skipped. Returns the held slots, in the order of ``keys``.
        No event: the keys never became READY. A non-``bytes`` key raises
        :class:`~kvproto.errors.InvalidArgumentError` before anything changes.
        """
        batch = key_batch(self._name, "quarantine_stores", keys)
        writing, quarantine, held = self._writing, self._quarantine, self._held
        slots: list[int] = []
        for key in batch:
            pending = writing.pop(key, None)
            slot = pending[0] if pending is not None else quarantine.pop(key, None)
            if slot is None:
                continue
            held[slot] = key
            slots.append(slot)
        self.stats.abandoned_stores += len(slots)
        return tuple(slots)

    def release_slots(self, slots: Iterable[int]) -> None:
        """Return slots held by :meth:`quarantine_stores` to the pool: their transfers are over (MGR-17).

        A slot that is not held (never quarantined, or released already)
        raises :class:`~kvproto.errors.TierMisuseError` before anything changes.
        """
        batch = [self.check_slot(slot) for slot in slots]
        held = self._held
        for slot in batch:
            if slot not in held:
                raise TierMisuseError(f"{self._name}: release_slots({slot}): the slot is not held by quarantine_stores")
        if len(set(batch)) != len(batch):
            raise TierMisuseError(f"{self._name}: release_slots names a slot twice: {sorted(batch)}")
        for slot in batch:
            del held[slot]
            self._free.append(slot)
        self.stats.released_slots += len(batch)

    # ------------------------------------------------------------------ loads

    def prepare_load(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> tuple[int, ...]:
        """Pin each READY key once per occurrence and return the slots in order (TIER-8, CPU-5).

        A pinned block is never evicted. A key that is not READY or PINNED
        raises :class:`~kvproto.errors.TierMisuseError` naming it (``.key``),
        and a non-``bytes`` key or a single key or ``str`` passed as ``keys``
        :class:`~kvproto.errors.InvalidArgumentError`, before any pin is taken.
        """
        batch = key_batch(self._name, "prepare_load", keys)
        ready = self._ready
        slots: list[int] = []
        for key in batch:
            slot = ready.get(key)
            if slot is None:
                raise TierMisuseError(
                    f"{self._name}: prepare_load of key {key!r}, which is {self.state(key).name}, not READY", key=key
                )
            slots.append(slot)
        pins = self._pins
        for key in batch:
            pins[key] = pins.get(key, 0) + 1
        return tuple(slots)

    def complete_load(self, keys: Iterable[OffloadKey]) -> None:
        """Release one pin per occurrence of each key (TIER-9, CPU-5).

        Pins are counted: a block pinned twice stays protected until released
        twice. Releasing more pins than were taken raises
        :class:`~kvproto.errors.TierMisuseError` naming the key (``.key``), and
        a non-``bytes`` key or a single key or ``str`` passed as ``keys``
        :class:`~kvproto.errors.InvalidArgumentError`, before any pin is
        released; pin counts never go negative.
        """
        counts = Counter(key_batch(self._name, "complete_load", keys))
        pins = self._pins
        for key, count in counts.items():
            held = pins.get(key, 0)
            if held < count:
                raise TierMisuseError(
                    f"{self._name}: complete_load releases {count} pin(s) of key {key!r}, which holds {held}", key=key
                )
        for key, count in counts.items():
            left = pins[key] - count
            if left:
                pins[key] = left
            else:
                del pins[key]

    # ------------------------------------------------------------------ eviction hooks

    def select_victims(
        self, count: int, keep: Container[OffloadKey], incoming: Collection[OffloadKey] = ()
    ) -> list[OffloadKey] | None:
        """``count`` unpinned READY keys outside ``keep``, in policy order; ``None`` if too few (TIER-6, CPU-6).

        ``incoming`` are the keys about to be stored (ARC adapts to them).
        Changes nothing, so a refused store leaves the table as it was. A
        subclass may override it to choose differently, but must keep those
        promises.
        """
        pins = self._pins
        return self._policy.select_victims(count, incoming, lambda k: k not in pins and k not in keep)

    def evict(self, keys: Iterable[OffloadKey]) -> tuple[OffloadKey, ...]:
        """Drop the READY, unpinned ``keys`` now and free their slots (one REMOVED event) (TIER-14, CPU-6).

        Other keys (absent, WRITING, pinned) are skipped; returns the keys
        dropped. For a tier that must give memory back outside a store.
        """
        ready, pins = self._ready, self._pins
        return self._drop(dict.fromkeys(k for k in key_batch(self._name, "evict", keys) if k in ready and k not in pins))

    # ------------------------------------------------------------------ lifecycle

    def on_request_finished(self, req_context: ReqContext) -> None:
        """Nothing to drop: the table keeps no per-request state (TIER-12, CPU-9)."""

    def on_step_end(self) -> None:
        """Expire the writes past their deadline (TIER-13, CPU-7).

        Non-blocking: cost is proportional to what expires. Quarantined slots
        stay quarantined: only their late completion frees them (CPU-8).
        """
        if self._due_after is None or not self._writing:
            return
        now = self._clock()
        writing = self._writing
        while writing:
            key, pending = next(iter(writing.items()))
            if now <= pending[1]:
                break
            self._expire(key, pending, now)

    def take_events(self) -> list[OffloadingEvent]:
        """Return and forget the STORED and REMOVED events since the last call (TIER-14, CPU-4)."""
        events = list(self._events)
        self._events.clear()
        return events

    def has_pending_work(self) -> bool:
        """True while a store is WRITING or a load holds a pin (TIER-15, CPU-9).

        An expired write no longer counts (CPU-7), though its slot stays quarantined.
        """
        return bool(self._writing) or bool(self._pins)

    def reset_cache(self) -> bool:
        """Drop every READY block (one REMOVED event) and answer True (TIER-16, CPU-9).

        False, changing nothing, while a store is WRITING or a block is pinned.
        Quarantined slots stay quarantined: their late writes may still land.
        """
        if self._writing or self._pins:
            return False
        removed = tuple(self._ready)
        self._ready.clear()
        self._policy.clear()
        held = set(self._quarantine.values()) | self._held.keys()
        self._free[:] = [s for s in range(self._num_slots - 1, -1, -1) if s not in held]
        if removed:
            self._events.append(OffloadingEvent(EventKind.REMOVED, removed, self._name))
        return True

    def shutdown(self) -> None:
        """Fail every WRITING block (as if expired) and refuse new stores; idempotent (TIER-16, CPU-9).

        The failed writes answer MISS and their slots are quarantined (CPU-8).
        The table runs no threads; pins held by loads in flight stay until
        released, and READY blocks stay readable.
        """
        self._closed = True
        if self._writing:
            now = self._clock()
            for key, pending in list(self._writing.items()):
                self._expire(key, pending, now)

    # ------------------------------------------------------------------ internals

    def _drop(self, victims: Iterable[OffloadKey]) -> tuple[OffloadKey, ...]:
        """Free the slots of READY ``victims`` (the caller checked them); one REMOVED event."""
        dropped = tuple(victims)
        ready, free, evict = self._ready, self._free, self._policy.evict
        for victim in dropped:
            free.append(ready.pop(victim))
            evict(victim)
        if dropped:
            self.stats.evictions += len(dropped)
            self._events.append(OffloadingEvent(EventKind.REMOVED, dropped, self._name))
        return dropped

    def _expire(self, key: OffloadKey, pending: _Writing, now: float) -> None:
        slot, due = pending
        del self._writing[key]
        self._quarantine[key] = slot
        self.stats.expired_writes += 1
        late = "" if self._due_after is None else f" {now - due + self._due_after:.3f} s after it started"
        _log.warning(
            "%s: store of key %r still WRITING%s; failed, slot %d quarantined until its completion arrives",
            self._name, key, late, slot,
        )
