"""The reference CPU primary tier: a slot pool over one host buffer (CPU-2..CPU-10).

Block states::

    ABSENT --prepare_store--> WRITING --complete_store(ok)--> READY <--pin/release--> PINNED
               WRITING --complete_store(failed)--> ABSENT (slot freed)
               WRITING --deadline passed--> ABSENT (slot quarantined, CPU-7, CPU-8)
               READY   --evicted by prepare_store / reset_cache--> ABSENT

``lookup`` answers HIT for READY and PINNED, HIT_PENDING for WRITING and MISS
otherwise; never RETRY (TIER-4). The tier keeps no per-request state.
"""

from __future__ import annotations

import enum
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass

import torch

from kvproto import (
    EventKind,
    LookupResult,
    OffloadingEvent,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
)
from kvproto import members as lr
from kvproto.errors import InvalidArgumentError, TierMisuseError

from kvproto_cpu._buffer import allocate_slot_buffer
from kvproto_cpu._config import CpuTierConfig
from kvproto_cpu._policy import EvictionPolicy, make_policy

__all__ = ["BlockState", "CpuTier", "CpuTierStats"]

_log = logging.getLogger("kvproto_cpu")


class BlockState(enum.Enum):
    """Where one key stands in the CPU tier (CPU-3)."""

    ABSENT = "absent"
    WRITING = "writing"
    READY = "ready"
    PINNED = "pinned"


@dataclass(slots=True)
class CpuTierStats:
    """Counters an operator can read (``CpuTier.stats``)."""

    stores_completed: int = 0
    stores_failed: int = 0
    evictions: int = 0
    expired_writes: int = 0
    late_completions: int = 0


@dataclass(slots=True)
class _Writing:
    slot: int
    started: float


@dataclass(slots=True)
class _Quarantined:
    slot: int
    since: float


class CpuTier:
    """The CPU primary tier (satisfies :class:`kvproto.PrimaryTier`, CPU-2..CPU-10).

    ``CpuTier(CpuTierConfig(num_slots=1024, block_bytes=2 << 20))``. ``clock``
    (seconds, monotonic) drives the pending-write deadline; tests inject a
    fake one. ``name`` appears in events.

    Expired writes (CPU-7, CPU-8): a block WRITING longer than
    ``pending_deadline_s`` is failed, so lookups answer MISS and nobody waits
    on it. Its transfer may still be running, though, and would write into the
    slot; so the slot is *quarantined*, not freed: no key is stored into it
    until the late ``complete_store`` of that key arrives (which frees it and
    is otherwise ignored: the key never becomes READY). No timer ends a
    quarantine: a slot is never reused while a transfer that may write it is
    outstanding, whatever the deadlines (CPU-8). While quarantined, the key
    itself is not reserved again either, because ``complete_store`` names
    keys, not slots, and a late completion could not be told from the new
    store's.

    The tier is not thread-safe: call it from one thread (the scheduler's).
    The data plane (:class:`CpuTransferHandler`) touches only the buffer from
    its worker, and drives completions from ``poll`` on the caller's thread.
    """

    def __init__(
        self,
        config: CpuTierConfig,
        *,
        name: str = "cpu",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._config = config
        self._name = name
        self._clock = clock
        self._num_slots = config.slot_count
        self._block_bytes = config.block_bytes
        self._deadline = config.pending_deadline_s
        slots = allocate_slot_buffer(self, self._num_slots, self._block_bytes, config.pin_memory)
        self._tensor = slots.tensor
        self._buffer = slots.view
        self._pinned = slots.pinned
        # pop() hands out the lowest free slot first, so a fresh tier gives consecutive runs.
        self._free: list[int] = list(range(self._num_slots - 1, -1, -1))
        self._ready: dict[OffloadKey, int] = {}
        self._writing: dict[OffloadKey, _Writing] = {}  # in start order
        self._pins: dict[OffloadKey, int] = {}  # only keys with >= 1 pin
        self._quarantine: dict[OffloadKey, _Quarantined] = {}  # in expiry order
        self._policy: EvictionPolicy = make_policy(config.policy, self._num_slots)
        # Events nobody takes cannot grow without bound: the oldest are dropped.
        self._events: deque[OffloadingEvent] = deque(maxlen=MAX_PENDING_EVENTS)
        self._closed = False
        self.stats = CpuTierStats()

    # ------------------------------------------------------------------ properties

    @property
    def name(self) -> str:
        """A short, stable name used in events and logs."""
        return self._name

    @property
    def buffer(self) -> memoryview:
        """Writable ``(num_slots, block_bytes)`` view of the slot buffer, format ``"B"``, no copy (TIER-3, CPU-2)."""
        return self._buffer

    @property
    def tensor(self) -> torch.Tensor:
        """The slot buffer as a uint8 tensor ``[num_slots, block_bytes]``, sharing ``buffer``'s memory (CPU-2)."""
        return self._tensor

    @property
    def pinned(self) -> bool:
        """Whether the slot buffer is pinned (page-locked) for CUDA copies (CPU-2)."""
        return self._pinned

    @property
    def config(self) -> CpuTierConfig:
        """The configuration the tier was built with (CPU-1)."""
        return self._config

    @property
    def num_slots(self) -> int:
        """How many slots the buffer holds (``config.slot_count``, CPU-1)."""
        return self._num_slots

    @property
    def block_bytes(self) -> int:
        """The size of one block, one slot row, in bytes (CPU-1)."""
        return self._block_bytes

    @property
    def free_slots(self) -> int:
        """Slots neither holding a block nor reserved nor quarantined."""
        return len(self._free)

    @property
    def ready_keys(self) -> Container[OffloadKey]:
        """Live view of exactly the keys ``lookup`` answers HIT for (READY or PINNED) (MGR-15, CPU-3)."""
        return self._ready.keys()

    def state(self, key: OffloadKey) -> BlockState:
        """The state of ``key`` (CPU-3); an expired or quarantined key is ABSENT."""
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
        return self._buffer.cast("B")[start : start + self._block_bytes]

    # ------------------------------------------------------------------ lookups

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """HIT if READY or PINNED, HIT_PENDING if WRITING within its deadline, else MISS (TIER-4, CPU-3, CPU-7).

        Never RETRY. A WRITING block past its deadline is expired on the spot
        and answers MISS.
        """
        if key in self._ready:
            return lr.HIT
        writing = self._writing.get(key)
        if writing is None:
            return lr.MISS
        now = self._clock()
        if now - writing.started > self._deadline:
            self._expire(key, writing, now)
            return lr.MISS
        return lr.HIT_PENDING

    def lookup_many(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> list[LookupResult]:
        """``[self.lookup(k, req_context) for k in keys]`` (TIER-17)."""
        lookup = self.lookup
        return [lookup(key, req_context) for key in keys]

    def touch(self, keys: Iterable[OffloadKey]) -> None:
        """Mark the READY ``keys`` as recently used; other keys are ignored (TIER-5, CPU-6)."""
        ready = self._ready
        touch = self._policy.touch
        for key in keys:
            if key in ready:
                touch(key)

    # ------------------------------------------------------------------ stores

    def prepare_store(
        self, keys: Sequence[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        """Reserve a slot for each key not present, evicting only what is needed (TIER-6, CPU-4).

        Keys READY, PINNED or WRITING are skipped, as are duplicates and keys
        whose expired write is quarantined (CPU-8). If fewer slots are free
        than keys to store, exactly the shortfall of unpinned READY blocks is
        evicted, in policy order, never one of ``keys``. All or nothing:
        ``None`` (and no change) when not enough can be evicted or after
        ``shutdown``; an empty output when nothing needs storing. The reserved
        keys are WRITING (HIT_PENDING); evictions emit one REMOVED event.
        A non-bytes key, or a single key or ``str`` passed as ``keys``, raises
        :class:`~kvproto.errors.InvalidArgumentError` before anything changes.
        """
        keys = _key_batch(self._name, "prepare_store", keys)
        if self._closed:
            return None
        ready, writing, quarantine = self._ready, self._writing, self._quarantine
        free = self._free
        if len(keys) == 1 and free:
            # One key and a free slot, as every promotion asks (MGR-2): no dedup, no eviction.
            key = keys[0]
            if key in ready or key in writing or key in quarantine:
                return _NOTHING_TO_STORE
            slot = free.pop()
            writing[key] = _Writing(slot, self._clock())
            return PrepareStoreOutput(keys, (slot,))
        # A dict keeps the first occurrence of each key in order: duplicates need no second set.
        to_store: dict[OffloadKey, None] = {}
        for key in keys:
            if key not in ready and key not in writing and key not in quarantine:
                to_store[key] = None
        if not to_store:
            return _NOTHING_TO_STORE
        count = len(to_store)
        evicted: tuple[OffloadKey, ...] = ()
        if count > len(free):
            pins = self._pins
            wanted = set(keys)  # never evict a key of this call, READY ones included
            victims = self._policy.select_victims(
                count - len(free), to_store, lambda k: k not in pins and k not in wanted
            )
            if victims is None:
                return None
            for victim in victims:
                free.append(ready.pop(victim))
                self._policy.evict(victim)
            evicted = tuple(victims)
            self.stats.evictions += len(evicted)
            self._events.append(OffloadingEvent(EventKind.REMOVED, evicted, self._name))
        now = self._clock()
        # Ascending slots give the data plane long runs of consecutive slots to copy at once.
        slots = free[-count:]
        del free[-count:]
        slots.sort()
        stored = tuple(to_store)
        for key, slot in zip(stored, slots, strict=True):
            writing[key] = _Writing(slot, now)
        return PrepareStoreOutput(stored, tuple(slots), evicted)

    def complete_store(self, keys: Iterable[OffloadKey], success: bool) -> None:
        """Finish stores (TIER-7, CPU-4, CPU-8).

        ``success``: each WRITING key becomes READY (one STORED event for all).
        Failure: each WRITING key becomes ABSENT and its slot is freed. Keys
        already READY or PINNED are untouched either way. A late completion of
        an expired key frees its quarantined slot and is otherwise ignored
        (counted in ``stats.late_completions``), never READY. A key the tier
        never reserved raises :class:`~kvproto.errors.TierMisuseError` naming
        it, and a ``success`` that is not a bool, a non-bytes key, or a single
        key or ``str`` passed as ``keys`` raise
        :class:`~kvproto.errors.InvalidArgumentError`, before anything changes.
        """
        flag: object = success
        if flag is not True and flag is not False:
            raise InvalidArgumentError(f"{self._name}: complete_store(success={flag!r}): success must be a bool")
        batch = _key_batch(self._name, "complete_store", keys)
        for key in batch:
            if not (key in self._writing or key in self._ready or key in self._quarantine):
                raise TierMisuseError(
                    f"{self._name}: complete_store of key {key!r}, which was never prepared",
                    key=key,
                )
        stored: list[OffloadKey] = []
        for key in batch:
            writing = self._writing.pop(key, None)
            if writing is not None:
                if success:
                    self._ready[key] = writing.slot
                    self._policy.admit(key)
                    stored.append(key)
                else:
                    self._free.append(writing.slot)
                    self.stats.stores_failed += 1
                continue
            quarantined = self._quarantine.pop(key, None)
            if quarantined is not None:
                self._free.append(quarantined.slot)
                self._late_completion(key, success)
        if stored:
            self.stats.stores_completed += len(stored)
            self._events.append(OffloadingEvent(EventKind.STORED, tuple(stored), self._name))

    # ------------------------------------------------------------------ loads

    def prepare_load(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> tuple[int, ...]:
        """Pin each READY key once per occurrence and return the slots in order (TIER-8, CPU-5).

        A key that is not READY or PINNED raises
        :class:`~kvproto.errors.TierMisuseError` naming it, before any pin is taken.
        """
        keys = _key_batch(self._name, "prepare_load", keys)
        ready = self._ready
        slots: list[int] = []
        for key in keys:
            slot = ready.get(key)
            if slot is None:
                raise TierMisuseError(
                    f"{self._name}: prepare_load of key {key!r}, which is "
                    f"{self.state(key).name}, not READY",
                    key=key,
                )
            slots.append(slot)
        pins = self._pins
        for key in keys:
            pins[key] = pins.get(key, 0) + 1
        return tuple(slots)

    def complete_load(self, keys: Iterable[OffloadKey]) -> None:
        """Release one pin per occurrence of each key (TIER-9, CPU-5).

        Releasing more pins than were taken raises
        :class:`~kvproto.errors.TierMisuseError` naming the key, before any
        pin is released; pin counts never go negative.
        """
        counts = Counter(keys)
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
        """Expire writes past the deadline (TIER-13, CPU-7); quarantines end only with their late completion (CPU-8).

        Non-blocking: cost is proportional to what expires.
        """
        now = self._clock()
        deadline = self._deadline
        while self._writing:
            key, writing = next(iter(self._writing.items()))
            if now - writing.started <= deadline:
                break
            self._expire(key, writing, now)

    def take_events(self) -> list[OffloadingEvent]:
        """Return and forget the STORED and REMOVED events since the last call (TIER-14, CPU-4)."""
        events = list(self._events)
        self._events.clear()
        return events

    def has_pending_work(self) -> bool:
        """True while a store is WRITING or a load holds a pin (TIER-15, CPU-9)."""
        return bool(self._writing) or bool(self._pins)

    def reset_cache(self) -> bool:
        """Drop every READY block (one REMOVED event); False, changing nothing, while work is in flight (TIER-16, CPU-9).

        Quarantined slots stay quarantined: their late writes may still land.
        """
        if self._writing or self._pins:
            return False
        removed = tuple(self._ready)
        self._ready.clear()
        self._policy.clear()
        held = {q.slot for q in self._quarantine.values()}
        self._free = [s for s in range(self._num_slots - 1, -1, -1) if s not in held]
        if removed:
            self._events.append(OffloadingEvent(EventKind.REMOVED, removed, self._name))
        return True

    def shutdown(self) -> None:
        """Fail every WRITING block (as if expired) and refuse new stores; idempotent (TIER-16, CPU-9).

        The tier runs no threads; pins held by loads in flight stay until released.
        """
        self._closed = True
        now = self._clock()
        for key, writing in list(self._writing.items()):
            self._expire(key, writing, now)

    # ------------------------------------------------------------------ internals

    def _expire(self, key: OffloadKey, writing: _Writing, now: float) -> None:
        del self._writing[key]
        self._quarantine[key] = _Quarantined(writing.slot, now)
        self.stats.expired_writes += 1
        _log.warning(
            "%s: store of key %r still WRITING after %.3f s; failed, slot %d quarantined",
            self._name,
            key,
            now - writing.started,
            writing.slot,
        )

    def _late_completion(self, key: OffloadKey, success: bool) -> None:
        self.stats.late_completions += 1
        _log.warning(
            "%s: late complete_store(success=%s) of expired key %r ignored", self._name, success, key
        )


_NOTHING_TO_STORE = PrepareStoreOutput((), ())

#: The most events kept for ``take_events``; beyond, the oldest are dropped (a bounded queue).
MAX_PENDING_EVENTS = 65_536


def _key_batch(name: str, method: str, keys: Iterable[object]) -> tuple[OffloadKey, ...]:
    """``keys`` read once, as a tuple of bytes keys; a single key or ``str`` is an
    :class:`~kvproto.errors.InvalidArgumentError` (it would iterate as characters or ints)."""
    given: object = keys
    if type(given) is tuple and len(given) == 1 and type(given[0]) is bytes:
        return given  # the common single-key call, already checked
    if isinstance(given, (str, bytes, bytearray, memoryview)):
        raise InvalidArgumentError(f"{name}: {method} takes a sequence of keys, got a single {type(given).__name__} {given!r}")
    batch = tuple(keys)
    for position, key in enumerate(batch):
        if not isinstance(key, bytes):
            raise InvalidArgumentError(f"{name}: {method}: key {position} is {key!r}, not bytes")
    return batch  # type: ignore[return-value]  # every element was just checked to be bytes
