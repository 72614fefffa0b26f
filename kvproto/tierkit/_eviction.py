"""Eviction policies for a :class:`~kvproto.tierkit.SlotTable`: one small protocol, LRU and ARC (CPU-6).

A policy only orders the READY blocks; the slot table decides what may be evicted
(never a pinned block, never a key of the store being prepared) and passes
that as ``evictable`` to :meth:`EvictionPolicy.select_victims`, which must not
change any state, so a store that cannot get enough victims changes nothing.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Collection
from typing import Literal, Protocol

from kvproto._keys import OffloadKey
from kvproto._results import unreachable
from kvproto.errors import ConfigurationError

__all__ = ["ArcPolicy", "EvictionPolicy", "LruPolicy", "PolicyName", "make_policy"]


class EvictionPolicy(Protocol):
    """Orders the resident (READY) blocks for eviction (CPU-6).

    ``admit`` a key when it becomes READY, ``touch`` it when it is used,
    ``evict`` it when the tier evicts it, ``remove`` it when it leaves for
    another reason (reset), ``clear`` to forget everything.
    """

    def admit(self, key: OffloadKey) -> None:
        """``key`` became resident."""
        ...

    def touch(self, key: OffloadKey) -> None:
        """``key`` (resident) was used; unknown keys are ignored."""
        ...

    def evict(self, key: OffloadKey) -> None:
        """``key`` (resident) was evicted."""
        ...

    def remove(self, key: OffloadKey) -> None:
        """Forget ``key`` entirely; unknown keys are ignored."""
        ...

    def clear(self) -> None:
        """Forget every key."""
        ...

    def select_victims(
        self,
        count: int,
        incoming: Collection[OffloadKey],
        evictable: Callable[[OffloadKey], bool],
    ) -> list[OffloadKey] | None:
        """Choose ``count`` distinct resident keys for which ``evictable`` holds, best first.

        ``None`` if fewer than ``count`` such keys exist. Changes no state.
        ``incoming`` are the keys about to be stored (ARC uses them).
        """
        ...


class LruPolicy:
    """Least recently used: evicts the key admitted or touched longest ago (CPU-6)."""

    def __init__(self) -> None:
        self._order: OrderedDict[OffloadKey, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._order)

    def admit(self, key: OffloadKey) -> None:
        self._order[key] = None
        self._order.move_to_end(key)

    def touch(self, key: OffloadKey) -> None:
        if key in self._order:
            self._order.move_to_end(key)

    def evict(self, key: OffloadKey) -> None:
        self._order.pop(key, None)

    def remove(self, key: OffloadKey) -> None:
        self._order.pop(key, None)

    def clear(self) -> None:
        self._order.clear()

    def select_victims(
        self,
        count: int,
        incoming: Collection[OffloadKey],
        evictable: Callable[[OffloadKey], bool],
    ) -> list[OffloadKey] | None:
        if count <= 0:
            return []
        victims = list(itertools.islice(filter(evictable, self._order), count))
        return victims if len(victims) == count else None


class ArcPolicy:
    """Adaptive Replacement Cache (Megiddo and Modha, FAST 2003) over ``capacity`` slots (CPU-6).

    ``T1`` holds keys seen once recently, ``T2`` keys seen at least twice;
    ``B1`` and ``B2`` are ghost lists of keys recently evicted from each.
    ``target_t1`` (the paper's ``p``) is how large ``T1`` should be: a key
    re-stored while in ``B1`` grows it by ``max(|B2|/|B1|, 1)``, one re-stored
    while in ``B2`` shrinks it by ``max(|B1|/|B2|, 1)``. Eviction takes the
    LRU end of ``T1`` when ``|T1| > p`` (or ``|T1| == p`` and an incoming key
    is in ``B2``), else of ``T2``; a one-pass scan therefore never displaces
    blocks used twice while ``p`` is small. Ghost lists are bounded:
    ``|T1| + |B1| <= c`` and ``|T1| + |T2| + |B1| + |B2| <= 2c``.

    Deviations forced by the tier: adaptation happens when the block becomes
    READY (``admit``), not when its store is requested; and when the list ARC
    prefers holds only pinned blocks, the victim comes from the other list.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ConfigurationError(f"ArcPolicy capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.target_t1 = 0.0
        self.t1: OrderedDict[OffloadKey, None] = OrderedDict()
        self.t2: OrderedDict[OffloadKey, None] = OrderedDict()
        self.b1: OrderedDict[OffloadKey, None] = OrderedDict()
        self.b2: OrderedDict[OffloadKey, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2)

    def admit(self, key: OffloadKey) -> None:
        if key in self.t1 or key in self.t2:
            self.touch(key)
            return
        if key in self.b1:
            delta = max(len(self.b2) / len(self.b1), 1.0)
            self.target_t1 = min(float(self.capacity), self.target_t1 + delta)
            del self.b1[key]
            self.t2[key] = None
        elif key in self.b2:
            delta = max(len(self.b1) / len(self.b2), 1.0)
            self.target_t1 = max(0.0, self.target_t1 - delta)
            del self.b2[key]
            self.t2[key] = None
        else:
            self.t1[key] = None
        self._trim_ghosts()

    def touch(self, key: OffloadKey) -> None:
        if key in self.t1:
            del self.t1[key]
            self.t2[key] = None
        elif key in self.t2:
            self.t2.move_to_end(key)

    def evict(self, key: OffloadKey) -> None:
        if key in self.t1:
            del self.t1[key]
            self.b1[key] = None
        elif key in self.t2:
            del self.t2[key]
            self.b2[key] = None
        self._trim_ghosts()

    def remove(self, key: OffloadKey) -> None:
        for lst in (self.t1, self.t2, self.b1, self.b2):
            lst.pop(key, None)

    def clear(self) -> None:
        for lst in (self.t1, self.t2, self.b1, self.b2):
            lst.clear()
        self.target_t1 = 0.0

    def select_victims(
        self,
        count: int,
        incoming: Collection[OffloadKey],
        evictable: Callable[[OffloadKey], bool],
    ) -> list[OffloadKey] | None:
        victims: list[OffloadKey] = []
        if count <= 0:
            return victims
        tie_to_t1 = any(key in self.b2 for key in incoming)
        from_t1 = iter(self.t1)
        from_t2 = iter(self.t2)
        t1_len = len(self.t1)
        p = self.target_t1
        while len(victims) < count:
            prefer_t1 = t1_len > 0 and (t1_len > p or (tie_to_t1 and t1_len == p))
            first, second = (from_t1, from_t2) if prefer_t1 else (from_t2, from_t1)
            key = next(filter(evictable, first), None)
            if key is None:
                key = next(filter(evictable, second), None)
                if key is None:
                    return None
            if key in self.t1:
                t1_len -= 1
            victims.append(key)
        return victims

    def _trim_ghosts(self) -> None:
        c = self.capacity
        while self.b1 and len(self.t1) + len(self.b1) > c:
            self.b1.popitem(last=False)
        while len(self.t1) + len(self.t2) + len(self.b1) + len(self.b2) > 2 * c:
            if self.b2:
                self.b2.popitem(last=False)
            elif self.b1:
                self.b1.popitem(last=False)
            else:  # pragma: no cover - T1 + T2 never exceed c slots
                break


PolicyName = Literal["lru", "arc"]


def make_policy(name: PolicyName, capacity: int) -> EvictionPolicy:
    """The policy ``name`` over ``capacity`` slots (CPU-6)."""
    match name:
        case "lru":
            return LruPolicy()
        case "arc":
            return ArcPolicy(capacity)
        case _:
            unreachable(name, where="make_policy(name)")
