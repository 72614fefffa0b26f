"""The torch-free reference primary tier: a slot pool over one ``bytearray`` (TIER-3..TIER-17).

It mirrors the state machine of the reference CPU tier (``impls.cpu.CpuTier``,
CPU-3..CPU-10) without torch, pydantic or a data plane, so that the kit, the
manager's tests and tier authors have a primary tier that needs nothing but
the standard library. Block states::

    ABSENT --prepare_store--> WRITING --complete_store(ok)--> READY <--pin/release--> PINNED
               WRITING --complete_store(failed)--> ABSENT (slot freed)
               WRITING --deadline passed--> ABSENT (slot quarantined until the late completion)
               READY   --evicted by prepare_store (LRU) / reset_cache--> ABSENT

``lookup`` answers HIT for READY and PINNED, HIT_PENDING for WRITING and MISS
otherwise; never RETRY (LR-4, TIER-4). The tier keeps no per-request state.

Differences from ``CpuTier``: eviction is LRU only (no ARC); a quarantined
slot is held until the late completion arrives, with no grace period after
which it would be reused (so a slot is never handed out while a write that may
land in it is outstanding); and argument types are checked
(:class:`~kvproto.errors.InvalidArgumentError`) where ``CpuTier`` trusts them.
"""

from __future__ import annotations

import enum
import logging
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import kvproto.members as lr
from kvproto._capabilities import Capabilities
from kvproto._events import MAX_PENDING_EVENTS, EventKind, OffloadingEvent
from kvproto._jobs import PrepareStoreOutput
from kvproto._requests import ReqContext
from kvproto._keys import OffloadKey
from kvproto._results import LookupResult
from kvproto.errors import ConfigurationError, InvalidArgumentError, InvalidKeyError, TierMisuseError

if TYPE_CHECKING:
    from kvproto._protocols import BatchLookup, PrimaryTier, ReadyKeys

__all__ = ["BlockState", "MemoryPrimaryTier"]

_log = logging.getLogger("kvproto.memory_primary_tier")

# A single key passed where a batch is expected iterates as characters or ints.
_NOT_A_BATCH = (str, bytes, bytearray, memoryview)


class BlockState(enum.Enum):
    """Where one key stands in a :class:`MemoryPrimaryTier` (CPU-3)."""

    ABSENT = "absent"
    WRITING = "writing"
    READY = "ready"
    PINNED = "pinned"


@dataclass(slots=True)
class _Writing:
    slot: int
    started: float
    due: float  # started + pending_deadline_s; expired once the clock is past it


class MemoryPrimaryTier:
    """A primary tier over an in-memory slot buffer (satisfies :class:`kvproto.PrimaryTier`, TIER-1).

    ``MemoryPrimaryTier(num_slots=32, block_bytes=64)``. Keyword arguments:

    * ``num_slots``, ``block_bytes``: the buffer is ``num_slots`` rows of
      ``block_bytes`` bytes (ints >= 1).
    * ``pending_deadline_s``: ``None`` (the default) lets a write stay WRITING
      until it completes; a number > 0 fails a write still WRITING after that
      many seconds of ``clock``: it answers MISS and its slot is quarantined
      (CPU-7, CPU-8).
    * ``name``: a non-empty str, used in events and logs.
    * ``clock``: monotonic seconds; tests inject a fake one.

    Bad values raise :class:`~kvproto.errors.ConfigurationError` naming the
    argument.

    Expired writes (CPU-7, CPU-8): the transfer of an expired write may still
    be running and land in its slot later, so the slot is *quarantined*: no key
    is stored into it until the late ``complete_store`` of that key arrives
    (which frees it and is otherwise ignored: the key never becomes READY).
    There is no grace period: a write that never completes keeps its slot out
    of use for the tier's lifetime (``quarantined_slots`` counts them), which
    is the price of never serving bytes a stale write overwrote. While
    quarantined, the key itself is not reserved again either, because
    ``complete_store`` names keys, not slots, and a late completion could not
    be told from a new store's.

    The tier is not thread-safe: call it from one thread (the scheduler's).
    """

    def __init__(
        self,
        *,
        num_slots: int,
        block_bytes: int,
        pending_deadline_s: float | None = None,
        name: str = "memory-primary",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        _check_config(num_slots, block_bytes, pending_deadline_s, name, clock)
        self._name = name
        self._num_slots = num_slots
        self._block_bytes = block_bytes
        self._deadline = None if pending_deadline_s is None else float(pending_deadline_s)
        self._clock = clock
        try:
            self._data = bytearray(num_slots * block_bytes)
        except (MemoryError, OverflowError) as exc:
            raise ConfigurationError(
                f"MemoryPrimaryTier {name!r}: cannot allocate {num_slots} slots x {block_bytes} bytes "
                f"= {num_slots * block_bytes:,} bytes; lower num_slots or block_bytes"
            ) from exc
        self._flat = memoryview(self._data)
        self._buffer = self._flat.cast("B", (num_slots, block_bytes))
        # pop() hands out the lowest free slot first, so a fresh tier gives consecutive runs.
        self._free: list[int] = list(range(num_slots - 1, -1, -1))
        # READY and PINNED keys -> slot, least recently used first (the LRU order).
        self._ready: OrderedDict[OffloadKey, int] = OrderedDict()
        self._writing: dict[OffloadKey, _Writing] = {}  # in start order, hence in deadline order
        self._pins: dict[OffloadKey, int] = {}  # only keys with >= 1 pin
        self._quarantine: dict[OffloadKey, int] = {}  # expired key -> its slot, held until it completes
        # Events nobody takes cannot grow without bound: the oldest are dropped (MGR-18).
        self._events: deque[OffloadingEvent] = deque(maxlen=MAX_PENDING_EVENTS)
        self._closed = False
        self.capabilities = Capabilities(
            eviction=True,
            reasons={
                "async_lookup": "a primary tier never answers RETRY",
                "persistence": "in-memory by design",
                "sharing": "one process's buffer",
                "partial_jobs": "stores complete per call",
            },
        )

    # ------------------------------------------------------------------ properties

    @property
    def name(self) -> str:
        """A short, stable name used in events and logs."""
        return self._name

    @property
    def buffer(self) -> memoryview:
        """Writable, C-contiguous ``(num_slots, block_bytes)`` view of the slot buffer, format ``"B"``.

        The same memory on every access, never a copy (TIER-3, CPU-2); the view
        keeps the memory alive after the tier is gone.
        """
        return self._buffer

    @property
    def num_slots(self) -> int:
        """How many slots the buffer holds."""
        return self._num_slots

    @property
    def block_bytes(self) -> int:
        """The size of one block, one slot row, in bytes."""
        return self._block_bytes

    @property
    def pending_deadline_s(self) -> float | None:
        """Seconds a write may stay WRITING before it is failed; ``None``: no deadline (CPU-7)."""
        return self._deadline

    @property
    def free_slots(self) -> int:
        """Slots neither holding a block nor reserved nor quarantined."""
        return len(self._free)

    @property
    def quarantined_slots(self) -> int:
        """Slots of expired writes, held until their late completion arrives (CPU-8)."""
        return len(self._quarantine)

    @property
    def ready_keys(self) -> Container[OffloadKey]:
        """Live view of exactly the keys ``lookup`` answers HIT for (READY or PINNED) (MGR-15, CPU-3)."""
        return self._ready.keys()

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
        return None if writing is None else writing.slot

    def check_slot(self, slot: int) -> int:
        """Return ``slot`` if it is a slot index of this tier, else raise TierMisuseError (CPU-10)."""
        if type(slot) is not int or not 0 <= slot < self._num_slots:
            raise TierMisuseError(
                f"{self._name}: slot {slot!r} is out of range 0..{self._num_slots - 1}"
            )
        return slot

    def slot_view(self, slot: int) -> memoryview:
        """The 1-D writable row of ``slot`` (a 2-D memoryview cannot be indexed by row) (CPU-10)."""
        start = self.check_slot(slot) * self._block_bytes
        return self._flat[start : start + self._block_bytes]

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
        if self._deadline is None:
            return lr.HIT_PENDING
        now = self._clock()
        if now <= writing.due:
            return lr.HIT_PENDING
        self._expire(key, writing, now)
        return lr.MISS

    def lookup_many(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> list[LookupResult]:
        """``[self.lookup(k, req_context) for k in keys]`` (TIER-17).

        A single key (``bytes``) or a ``str`` passed as ``keys`` raises
        :class:`~kvproto.errors.InvalidArgumentError`.
        """
        _check_not_a_single_key(self._name, "lookup_many", keys)
        lookup = self.lookup
        return [lookup(key, req_context) for key in keys]

    def touch(self, keys: Iterable[OffloadKey]) -> None:
        """Mark the READY ``keys`` as most recently used; other keys are ignored (TIER-5, CPU-6).

        Never blocks. A single key (``bytes``) or a ``str`` passed as ``keys``
        raises :class:`~kvproto.errors.InvalidArgumentError`.
        """
        _check_not_a_single_key(self._name, "touch", keys)
        ready = self._ready
        move = ready.move_to_end
        for key in keys:
            if key in ready:
                move(key)

    # ------------------------------------------------------------------ stores

    def prepare_store(
        self, keys: Sequence[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        """Reserve a slot for each key not present, evicting only what is needed (TIER-6, CPU-4).

        Keys READY, PINNED or WRITING are skipped, as are repeats and keys
        whose expired write is quarantined (CPU-8); an empty output when
        nothing is left. If fewer slots are free than keys to store, exactly
        the shortfall of READY blocks is evicted, least recently used first,
        never a pinned block and never one of ``keys`` (one REMOVED event;
        ``evicted`` lists them). WRITING blocks and quarantined slots are never
        taken. All or nothing: ``None`` and no change at all when too few
        blocks can be evicted, or after ``shutdown``. The reserved keys are
        WRITING (HIT_PENDING), their slots distinct and ascending.

        A non-``bytes`` key, or a single key or ``str`` passed as ``keys``,
        raises :class:`~kvproto.errors.InvalidArgumentError` before anything
        changes.
        """
        batch = _batch(self._name, "prepare_store", keys)
        if self._closed:
            return None
        ready, writing, quarantine = self._ready, self._writing, self._quarantine
        # A dict keeps the first occurrence of each key in order: repeats need no second slot.
        to_store: dict[OffloadKey, None] = {}
        for key in batch:
            if key not in ready and key not in writing and key not in quarantine:
                to_store[key] = None
        if not to_store:
            return PrepareStoreOutput((), ())
        free = self._free
        count = len(to_store)
        evicted: tuple[OffloadKey, ...] = ()
        if count > len(free):
            victims = self._select_victims(count - len(free), frozenset(batch))
            if victims is None:
                return None
            for victim in victims:
                free.append(ready.pop(victim))
            evicted = tuple(victims)
            self._events.append(OffloadingEvent(EventKind.REMOVED, evicted, self._name))
        now = self._clock()
        due = float("inf") if self._deadline is None else now + self._deadline
        # Ascending slots give a data plane long runs of consecutive slots to copy at once.
        slots = free[-count:]
        del free[-count:]
        slots.sort()
        stored = tuple(to_store)
        for key, slot in zip(stored, slots, strict=True):
            writing[key] = _Writing(slot, now, due)
        return PrepareStoreOutput(stored, tuple(slots), evicted)

    def complete_store(self, keys: Iterable[OffloadKey], success: bool) -> None:
        """Finish stores (TIER-7, CPU-4, CPU-8).

        ``success``: each WRITING key becomes READY, most recently used (one
        STORED event for all). Failure: each WRITING key becomes ABSENT and its
        slot is freed, so a failed store is never visible. Keys already READY or
        PINNED are untouched either way. A late completion of an expired key
        frees its quarantined slot and is otherwise ignored: the key never
        becomes READY and no event is emitted.

        Raises, before anything changes: :class:`~kvproto.errors.TierMisuseError`
        naming a key the tier never reserved (``.key``);
        :class:`~kvproto.errors.InvalidArgumentError` when ``success`` is not a
        ``bool``, a key is not ``bytes``, or a single key or ``str`` is passed
        as ``keys``.
        """
        flag: object = success
        if flag is not True and flag is not False:
            raise InvalidArgumentError(
                f"{self._name}: complete_store(success={flag!r}): success must be a bool, "
                f"got {type(flag).__name__}"
            )
        batch = _batch(self._name, "complete_store", keys)
        ready, writing, quarantine = self._ready, self._writing, self._quarantine
        for key in batch:
            if key not in writing and key not in ready and key not in quarantine:
                raise TierMisuseError(
                    f"{self._name}: complete_store of key {key!r}, which was never prepared",
                    key=key,
                )
        stored: list[OffloadKey] = []
        for key in batch:
            pending = writing.pop(key, None)
            if pending is not None:
                if success:
                    ready[key] = pending.slot
                    stored.append(key)
                else:
                    self._free.append(pending.slot)
                continue
            slot = quarantine.pop(key, None)
            if slot is not None:
                self._free.append(slot)
                _log.warning(
                    "%s: late complete_store(success=%s) of expired key %r ignored; slot %d freed",
                    self._name,
                    success,
                    key,
                    slot,
                )
        if stored:
            self._events.append(OffloadingEvent(EventKind.STORED, tuple(stored), self._name))

    # ------------------------------------------------------------------ loads

    def prepare_load(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> tuple[int, ...]:
        """Pin each READY key once per occurrence and return the slots in order (TIER-8, CPU-5).

        A pinned block is never evicted. A key that is not READY or PINNED
        raises :class:`~kvproto.errors.TierMisuseError` naming it (``.key``),
        and a non-``bytes`` key or a single key or ``str`` passed as ``keys``
        :class:`~kvproto.errors.InvalidArgumentError`, before any pin is taken.
        """
        batch = _batch(self._name, "prepare_load", keys)
        ready = self._ready
        slots: list[int] = []
        for key in batch:
            slot = ready.get(key)
            if slot is None:
                raise TierMisuseError(
                    f"{self._name}: prepare_load of key {key!r}, which is "
                    f"{self.state(key).name}, not READY",
                    key=key,
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
        counts = Counter(_batch(self._name, "complete_load", keys))
        pins = self._pins
        for key, count in counts.items():
            held = pins.get(key, 0)
            if held < count:
                raise TierMisuseError(
                    f"{self._name}: complete_load releases {count} pin(s) of key {key!r}, "
                    f"which holds {held}",
                    key=key,
                )
        for key, count in counts.items():
            left = pins[key] - count
            if left:
                pins[key] = left
            else:
                del pins[key]

    # ------------------------------------------------------------------ lifecycle

    def on_request_finished(self, req_context: ReqContext) -> None:
        """Nothing to drop: the tier keeps no per-request state (TIER-12, CPU-9)."""

    def on_step_end(self) -> None:
        """Expire the writes past their deadline (TIER-13, CPU-7).

        Non-blocking: cost is proportional to what expires. Quarantined slots
        stay quarantined: only their late completion frees them (CPU-8).
        """
        if self._deadline is None or not self._writing:
            return
        now = self._clock()
        writing = self._writing
        while writing:
            key, pending = next(iter(writing.items()))
            if now <= pending.due:
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
        held = set(self._quarantine.values())
        self._free = [s for s in range(self._num_slots - 1, -1, -1) if s not in held]
        if removed:
            self._events.append(OffloadingEvent(EventKind.REMOVED, removed, self._name))
        return True

    def shutdown(self) -> None:
        """Fail every WRITING block (as if expired) and refuse new stores; idempotent (TIER-16, CPU-9).

        The failed writes answer MISS and their slots are quarantined (CPU-8).
        The tier runs no threads; pins held by loads in flight stay until
        released, and READY blocks stay readable.
        """
        self._closed = True
        if self._writing:
            now = self._clock()
            for key, pending in list(self._writing.items()):
                self._expire(key, pending, now)

    # ------------------------------------------------------------------ internals

    def _select_victims(self, count: int, wanted: frozenset[OffloadKey]) -> list[OffloadKey] | None:
        """``count`` unpinned READY keys outside ``wanted``, least recently used first; None if too few.

        Changes nothing, so a refused store leaves the tier as it was.
        """
        pins = self._pins
        victims: list[OffloadKey] = []
        for key in self._ready:
            if key not in pins and key not in wanted:
                victims.append(key)
                if len(victims) == count:
                    return victims
        return None

    def _expire(self, key: OffloadKey, pending: _Writing, now: float) -> None:
        del self._writing[key]
        self._quarantine[key] = pending.slot
        _log.warning(
            "%s: store of key %r still WRITING after %.3f s; failed, slot %d quarantined "
            "until its completion arrives",
            self._name,
            key,
            now - pending.started,
            pending.slot,
        )


def _check_config(
    num_slots: object, block_bytes: object, pending_deadline_s: object, name: object, clock: object
) -> None:
    """Raise ConfigurationError naming the first bad argument."""
    for arg, value in (("num_slots", num_slots), ("block_bytes", block_bytes)):
        if type(value) is not int or value < 1:
            raise ConfigurationError(f"MemoryPrimaryTier: {arg} must be an int >= 1, got {value!r}")
    if pending_deadline_s is not None and (
        type(pending_deadline_s) not in (int, float)
        or not cast(float, pending_deadline_s) > 0.0  # NaN fails this too
    ):
        raise ConfigurationError(
            f"MemoryPrimaryTier: pending_deadline_s must be None or a number > 0, "
            f"got {pending_deadline_s!r}"
        )
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"MemoryPrimaryTier: name must be a non-empty str, got {name!r}")
    if not callable(clock):
        raise ConfigurationError(f"MemoryPrimaryTier: clock must be callable, got {clock!r}")


def _check_not_a_single_key(tier: str, method: str, keys: object) -> None:
    if isinstance(keys, _NOT_A_BATCH):
        raise InvalidArgumentError(
            f"{tier}: {method} takes a sequence of keys, got a {type(keys).__name__} {keys!r}; "
            "pass one key as [key]"
        )


def _batch(tier: str, method: str, keys: Iterable[object]) -> tuple[OffloadKey, ...]:
    """``keys`` as a tuple, each checked to be ``bytes``; InvalidArgumentError naming the culprit."""
    _check_not_a_single_key(tier, method, keys)
    batch = tuple(keys)
    for position, key in enumerate(batch):
        if not isinstance(key, bytes):
            raise InvalidKeyError(
                f"{tier}: {method}: key #{position} is {key!r} of type {type(key).__name__}, "
                "not bytes"
            )
    return cast(tuple[OffloadKey, ...], batch)


if TYPE_CHECKING:

    def _conforms(tier: MemoryPrimaryTier) -> tuple[PrimaryTier, BatchLookup, ReadyKeys]:
        """Never called: mypy proves MemoryPrimaryTier satisfies these protocols (TIER-1, TIER-17, MGR-15)."""
        return tier, tier, tier
