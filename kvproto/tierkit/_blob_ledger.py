"""The scheduler side of :class:`~kvproto.tierkit.BlobTier`: which keys are there, and what vouches for them.

The index maps each key believed stored to the *tick* of the last operation
that vouched for it (a store that created or found the blob, a load that
verified it), least recently used first. Deletions the engine makes (damaged
blobs, evictions) and blobs a load found missing are ticks too. A key stays
in the index only while something vouched for it after the last deletion
seen: this closes the damaged-load / skipped-store race (TIERKIT-2).

Keys whose blob a load found unusable and left in place (another namespace's
or algorithm's: not the tier's to delete; a damaged or truncated blob of its
own is deleted, so the storage itself then says it is gone) are remembered,
bounded, as *unusable*: they answer MISS without asking the storage, and a
store that finds that blob there (create-if-absent) does not vouch for it;
only a store that creates the blob anew, a load that verifies one, or a reset
makes the key usable again (TIER-4).
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import KW_ONLY, dataclass, field

from kvproto._events import MAX_PENDING_EVENTS, EventKind, OffloadingEvent
from kvproto._keys import OffloadKey

__all__ = ["Ledger"]


@dataclass(eq=False)
class Ledger:
    """Index, pins, stores in flight, deletions they must hear of, doomed blobs, bounded events.

    Every method takes :attr:`lock`; the workers call :meth:`note_deleted`
    only, everything else runs on the scheduler's thread.
    """

    tier_name: str
    blob_bytes: int  # every blob is one envelope long
    _: KW_ONLY
    recent_keys: int | None  # the index's bound, None: unbounded
    lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    index: OrderedDict[OffloadKey, int] = field(default_factory=OrderedDict, init=False)  # key -> its stamp
    pins: dict[OffloadKey, int] = field(default_factory=dict, init=False)  # keys of loads in flight (never evicted)
    storing: dict[OffloadKey, int] = field(default_factory=dict, init=False)  # keys of stores in flight (never evicted)
    # The last deletion seen while a store of the key was in flight.
    deleted: dict[OffloadKey, int] = field(default_factory=dict, init=False)
    doomed: dict[OffloadKey, int] = field(default_factory=dict, init=False)  # evicted, blob not deleted yet -> ticket
    events: deque[OffloadingEvent] = field(default_factory=lambda: deque(maxlen=MAX_PENDING_EVENTS), init=False)  # TIERKIT-3
    # Keys a load found unusable, oldest first, at most MAX_PENDING_EVENTS (TIER-4). Read without the
    # lock on the scheduler's thread (lookup), changed on it only.
    unusable: OrderedDict[OffloadKey, None] = field(default_factory=OrderedDict, init=False)
    _ticket: int = field(default=0, init=False)
    # TIERKIT-10: a stamp at or below this tick no longer vouches for its key (a load found a blob the
    # index vouched for missing: the storage may have lost everything from before). Written and read on
    # the scheduler's thread (and read by stores deciding whether to skip); 0: every stamp vouches.
    distrusted_to: int = field(default=0, init=False)
    scanning: bool = field(default=False, init=False)  # while a restart scan runs, losses are remembered for it:
    lost_at: dict[OffloadKey, int] = field(default_factory=dict, init=False)  # key -> last deletion or loss seen during the scan

    @property
    def used_bytes(self) -> int:
        """Bytes of the indexed blobs (every blob is one envelope long)."""
        return len(self.index) * self.blob_bytes

    def emit(self, kind: EventKind, keys: Sequence[OffloadKey]) -> None:
        """Queue an event (the oldest untaken events are dropped beyond MAX_PENDING_EVENTS)."""
        if keys:
            with self.lock:
                self.events.append(OffloadingEvent(kind, tuple(keys), self.tier_name))

    def take_events(self) -> list[OffloadingEvent]:
        """Every queued event, oldest first; the queue is emptied."""
        with self.lock:
            events = list(self.events)
            self.events.clear()
        return events

    # -- jobs ------------------------------------------------------------------------------

    def begin_store(self, keys: Iterable[OffloadKey]) -> None:
        """A store of ``keys`` starts: never evict them meanwhile; a pending eviction of them is cancelled."""
        with self.lock:
            for key in keys:
                self.storing[key] = self.storing.get(key, 0) + 1
                self.doomed.pop(key, None)

    def begin_load(self, keys: Iterable[OffloadKey]) -> None:
        """A load of ``keys`` starts: never evict them meanwhile."""
        with self.lock:
            for key in keys:
                self.pins[key] = self.pins.get(key, 0) + 1

    def note_deleted(self, key: OffloadKey, tick: int) -> None:
        """A blob of ``key`` was deleted (or found missing) at ``tick``: a store in flight that found it
        before then must not vouch for it (TIERKIT-2). Any thread."""
        with self.lock:
            if key in self.storing and self.deleted.get(key, 0) < tick:
                self.deleted[key] = tick
            if self.scanning:
                self.lost_at[key] = max(tick, self.lost_at.get(key, 0))

    def end_store(
        self, results: Sequence[tuple[OffloadKey, int | None]], created: Iterable[OffloadKey] = ()
    ) -> tuple[list[OffloadKey], int]:
        """A store ended: ``(key, tick)`` per key, ``None`` for a failed key; ``created``: the keys whose blob it
        made anew. Returns the keys that vouch (now indexed) and how many stores lost the race with a deletion
        (not indexed, they fail). A key found unusable vouches only if this store created its blob."""
        ok: list[OffloadKey] = []
        lost = 0
        unusable = self.unusable
        for key in created:
            unusable.pop(key, None)
        with self.lock:
            for key, tick in results:
                if tick is not None and unusable and key in unusable:
                    tick = None  # it found the unusable blob there: no evidence the key is readable
                if tick is not None and self.deleted.get(key, 0) > tick:
                    tick = None  # found a blob that a deletion then removed: it is not there
                    lost += 1
                left = self.storing[key] - 1
                if left:
                    self.storing[key] = left
                else:
                    del self.storing[key]
                    self.deleted.pop(key, None)
                if tick is not None:
                    self._vouch(key, tick)
                    ok.append(key)
            self._trim()
        return ok, lost

    def end_load(self, keys: Iterable[OffloadKey]) -> None:
        """A load of ``keys`` ended: unpin them."""
        with self.lock:
            for key in keys:
                left = self.pins[key] - 1
                if left:
                    self.pins[key] = left
                else:
                    del self.pins[key]

    def vouch(self, keys: Iterable[tuple[OffloadKey, int]]) -> None:
        """``(key, tick)``: verified present at ``tick`` (a load, a scan); most recently used."""
        unusable = self.unusable
        with self.lock:
            for key, tick in keys:
                unusable.pop(key, None)
                self._vouch(key, tick)
            self._trim()

    def mark_unusable(self, keys: Iterable[OffloadKey]) -> None:
        """A load found these keys' blobs unusable: MISS from now on, until a store creates them anew (TIER-4)."""
        unusable = self.unusable
        for key in keys:
            unusable[key] = None
            unusable.move_to_end(key)
        while len(unusable) > MAX_PENDING_EVENTS:
            unusable.popitem(last=False)

    def lose(self, keys: Iterable[tuple[OffloadKey, int]], *, gone: bool) -> list[OffloadKey]:
        """``(key, tick)``: a load found the key unusable at ``tick``. Drop each key nothing vouched for
        since; ``gone`` (missing or deleted): a restart scan running must not add it back either.
        (Stores in flight hear of the engine's own deletions through :meth:`note_deleted`; a blob found
        missing is no evidence against a store that found it: another writer may have made it.)
        Returns the dropped keys."""
        dropped: list[OffloadKey] = []
        with self.lock:
            for key, tick in keys:
                if gone and self.scanning:
                    self.lost_at[key] = max(tick, self.lost_at.get(key, 0))
                stamp = self.index.get(key)
                if stamp is not None and stamp < tick:
                    del self.index[key]
                    dropped.append(key)
        return dropped

    def vouches(self, key: OffloadKey) -> bool:
        """True if the index holds ``key`` with a stamp newer than the last distrust (TIERKIT-10)."""
        return self.index.get(key, 0) > self.distrusted_to

    def distrust(self, tick: int) -> None:
        """Every stamp up to ``tick`` stops vouching for its key (TIERKIT-10): such a key answers HIT again
        only once something vouches for it anew (a store, a load, an existence check and then a load).
        O(1); the keys stay indexed (events, budget and eviction are unchanged)."""
        if tick > self.distrusted_to:
            self.distrusted_to = tick

    def _vouch(self, key: OffloadKey, tick: int) -> None:
        index = self.index
        old = index.get(key)
        index[key] = tick if old is None or old < tick else old
        index.move_to_end(key)

    def _trim(self) -> None:
        if self.recent_keys is not None:
            while len(self.index) > self.recent_keys:
                self.index.popitem(last=False)

    # -- budget, scan, reset -----------------------------------------------------------------

    def evict(self, budget: int) -> list[tuple[OffloadKey, int]]:
        """Drop least recently used keys (never pinned or being stored) until within ``budget`` bytes;
        returns ``(key, ticket)`` of each, to delete later unless stored again meanwhile."""
        with self.lock:
            excess = self.excess_blocks(budget)
            chosen: list[OffloadKey] = []
            for key in self.index:
                if len(chosen) >= excess:
                    break
                if key not in self.pins and key not in self.storing:
                    chosen.append(key)
            return self.doom(chosen)

    def excess_blocks(self, budget: int) -> int:
        """How many blocks over ``budget`` bytes the index holds (0 if within it); under ``lock``."""
        return max(0, -(-(self.used_bytes - budget) // self.blob_bytes))

    def doom(self, keys: Sequence[OffloadKey]) -> list[tuple[OffloadKey, int]]:
        """Evict ``keys`` (indexed): drop them from the index, give each a ticket to delete its blob
        later unless stored again meanwhile, and announce them in one REMOVED event; under ``lock``.
        Returns ``(key, ticket)`` of each."""
        victims: list[tuple[OffloadKey, int]] = []
        for key in keys:
            self._ticket += 1
            victims.append((key, self._ticket))
            del self.index[key]
            self.doomed[key] = self._ticket
        if victims:
            self.events.append(OffloadingEvent(EventKind.REMOVED, tuple(keys), self.tier_name))
        return victims

    def still_doomed(self, key: OffloadKey, ticket: int) -> bool:
        """True (and forgets the ticket) if ``key`` was not stored again since its eviction."""
        with self.lock:
            if self.doomed.get(key) != ticket:
                return False
            del self.doomed[key]
            return True

    def add_scanned(self, keys: Iterable[tuple[OffloadKey, int]]) -> int:
        """``(key, tick)``: a restart scan found the key's blob at ``tick``; indexed as the least recently
        used unless a deletion or loss of it was seen since. Returns how many were added."""
        added = 0
        with self.lock:
            for key, tick in keys:
                if key in self.index or key in self.doomed or self.lost_at.get(key, 0) > tick:
                    continue
                self.index[key] = 0  # vouched for by nothing newer than any deletion
                self.index.move_to_end(key, last=False)
                added += 1
        return added

    def scan(self, running: bool) -> None:
        """A restart scan starts (True) or ends (False); losses are remembered only meanwhile."""
        with self.lock:
            self.scanning = running
            self.lost_at.clear()

    def clear(self) -> tuple[OffloadKey, ...]:
        """Forget every key (``reset_cache``; no job in flight); returns the keys that were indexed."""
        with self.lock:
            keys = tuple(self.index)
            self.index.clear()
            self.doomed.clear()
            self.deleted.clear()
            self.unusable.clear()
            if keys:
                self.events.append(OffloadingEvent(EventKind.REMOVED, keys, self.tier_name))
        return keys
