"""Lock-order inversions among a tier's own locks, recorded, not waited for (TIER-11).

Two of a tier's threads deadlock when one takes lock A then lock B while another takes B then A
(a store holding its cache lock across its disk write, a load promoting into the cache under its disk
lock), but only when the two interleave within microseconds: a check that waits for the hang finds it
in some runs and not in others. Like the Linux kernel's lockdep, :class:`LockOrder` records instead,
while entered, the order in which each thread takes every ``threading.Lock`` created meanwhile by code
outside the standard library and the kit (each lock known by where it was created: its *class*), and
looks for a cycle in those orders. Two code paths that take the same two classes of lock in opposite
orders can deadlock whether or not they did in this run, so the same tier gets the same verdict every
run the paths run.

What it leaves alone, so it never blames a correct tier: an order between two locks of one class
(instances of one object nested, as lockdep's nesting annotations allow); a cycle whose every order was
always taken under one common lock (a gate: the two paths can never hold their first locks at once);
``RLock`` and the locks of the standard library (``Event``, ``Condition``, ``queue``) and of the kit.
"""

from __future__ import annotations

import _thread
import os
import sys
import sysconfig
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType, TracebackType
from typing import Any

__all__ = ["Inversion", "LockOrder"]

_STDLIB = tuple(
    os.path.normcase(os.path.realpath(p)) + os.sep
    for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]}
)
_KIT = os.path.normcase(os.path.realpath(os.path.dirname(os.path.dirname(__file__)))) + os.sep  # kvproto/testing/
_PLAIN: Callable[[], Any] = _thread.allocate_lock  # an untraced lock
_STANDARD = threading.Lock  # what threading.Lock is while no LockOrder is entered


def _ours(filename: str) -> bool:
    """Whether a lock created in ``filename`` is left untraced: the standard library's and the kit's."""
    path = os.path.normcase(os.path.realpath(filename))
    return path.startswith(_KIT) or (path.startswith(_STDLIB) and "site-packages" not in path)


def _where(frame: FrameType | None) -> str:
    """``file:line (function)`` of ``frame``, the file relative to the working directory where it is under it."""
    if frame is None:
        return "<unknown>"
    name = frame.f_code.co_filename
    try:
        rel = os.path.relpath(name)
        name = name if rel.startswith("..") else rel
    except ValueError:  # another drive (Windows)
        pass
    return f"{name}:{frame.f_lineno} ({frame.f_code.co_name})"


_ENTERED: list[LockOrder] = []  # the LockOrders entered now, oldest first
_ENTERED_LOCK = _PLAIN()


def _after_fork_in_child() -> None:
    """A forked child (the kit's crash check forks its writers) gets fresh untraced mutexes: another thread of
    the parent may have held one at the fork, and it would stay held in the child for ever."""
    global _ENTERED_LOCK
    _ENTERED_LOCK = _PLAIN()
    for monitor in _ENTERED:
        monitor.forked()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _factory() -> Any:
    """``threading.Lock`` while a LockOrder is entered: a plain lock for the standard library and the kit, else
    a lock traced by the latest LockOrder entered."""
    caller = sys._getframe(1)
    with _ENTERED_LOCK:
        monitor = _ENTERED[-1] if _ENTERED else None
    if monitor is None or _ours(caller.f_code.co_filename):
        return _PLAIN()
    return monitor.make(_where(caller))


def _caller() -> FrameType | None:
    """The first frame outside this module: the code that took the lock."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    return frame


@dataclass(slots=True)
class _Order:
    """One order seen: a lock of class ``later`` taken while holding one of class ``first``."""

    thread: str  # the thread that first took it
    at: str  # where that thread took the later lock
    guards: frozenset[str]  # classes held every time this order was taken (besides first and later)


@dataclass(frozen=True, slots=True)
class Inversion:
    """A cycle of lock orders no common lock guards: ``orders`` as ``(first, later, how)``, ``first`` and
    ``later`` lock classes (where each was created), ``how`` the thread and place that took ``later``."""

    orders: tuple[tuple[str, str, str], ...]

    def describe(self) -> str:
        """The cycle in words: each order with the thread and the line that took it."""
        steps = "; ".join(f"the lock made at {later} was taken while the lock made at {first} was held ({how})"
                          for first, later, how in self.orders)
        return f"lock-order inversion, a deadlock waiting for two threads to interleave: {steps}"


class _TracedLock:
    """A ``threading.Lock`` whose acquisitions and releases :class:`LockOrder` records."""

    __slots__ = ("_lock", "_monitor", "site")

    def __init__(self, monitor: LockOrder, site: str) -> None:
        self._lock = _PLAIN()
        self._monitor = monitor
        self.site = site

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got: bool = self._lock.acquire(blocking, timeout)
        if got:
            self._monitor.took(self)
        return got

    def release(self) -> None:
        self._monitor.gave(self)
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.release()

    def locked(self) -> bool:
        held: bool = self._lock.locked()
        return held

    def _at_fork_reinit(self) -> None:
        self._lock._at_fork_reinit()

    acquire_lock = acquire
    release_lock = release

    def __repr__(self) -> str:
        return f"<traced lock created at {self.site}, {'locked' if self._lock.locked() else 'unlocked'}>"


@dataclass(eq=False)
class LockOrder:
    """While entered, ``threading.Lock()`` called from code outside the standard library and the kit makes
    a traced lock; :attr:`inversion` is the first lock-order cycle no common lock guards (None: none seen).
    Entries may nest or overlap on several threads: a new lock is recorded by the latest one entered, and
    ``threading.Lock`` is the standard factory again once every entry has been left."""

    inversion: Inversion | None = field(default=None, init=False)
    _orders: dict[tuple[str, str], _Order] = field(default_factory=dict, init=False)
    _held: dict[int, list[_TracedLock]] = field(default_factory=dict, init=False)  # thread ident -> held, in order
    _holder: dict[int, int] = field(default_factory=dict, init=False)  # id(lock) -> ident of the thread holding it
    _mutex: Any = field(default_factory=_PLAIN, init=False)  # untraced: guards the three above

    def __enter__(self) -> LockOrder:
        with _ENTERED_LOCK:
            _ENTERED.append(self)
            threading.Lock = _factory  # type: ignore[assignment]  # a factory of traced locks stands for threading.Lock while entered
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        with _ENTERED_LOCK:
            if self in _ENTERED:
                _ENTERED.remove(self)
            if not _ENTERED:
                threading.Lock = _STANDARD  # the standard factory again once no LockOrder is entered

    def forked(self) -> None:
        """In a forked child: a fresh mutex; only the forking thread lives on, so only its held locks stay held."""
        self._mutex = _PLAIN()
        me = threading.get_ident()
        self._held = {me: self._held.get(me, [])}
        self._holder = {key: ident for key, ident in self._holder.items() if ident == me}

    def make(self, site: str) -> _TracedLock:
        """A traced lock of class ``site`` (where it was created), recorded by this monitor."""
        return _TracedLock(self, site)

    def took(self, lock: _TracedLock) -> None:
        """``lock`` was acquired by the current thread: record its order after every lock the thread holds."""
        me = threading.get_ident()
        with self._mutex:
            held = self._held.setdefault(me, [])
            classes = [h.site for h in held]
            for first in dict.fromkeys(classes):
                if first == lock.site:
                    continue  # two locks of one class nested: left alone (no false blame)
                guards = frozenset(c for c in classes if c not in (first, lock.site))
                order = self._orders.get((first, lock.site))
                if order is None:
                    self._orders[(first, lock.site)] = _Order(threading.current_thread().name, _where(_caller()), guards)
                elif order.guards <= guards:
                    continue  # taken under every gate it was taken under before: nothing new
                else:  # taken with fewer guards than before: a gate no longer excuses it
                    order.guards = order.guards & guards
                if self.inversion is None:
                    self.inversion = self._cycle(first, lock.site)
            held.append(lock)
            self._holder[id(lock)] = me

    def gave(self, lock: _TracedLock) -> None:
        """``lock`` is being released (by any thread: a Lock may be released by another than its holder)."""
        with self._mutex:
            holder = self._holder.pop(id(lock), None)
            held = self._held.get(holder) if holder is not None else None
            if held is not None:
                for i in range(len(held) - 1, -1, -1):
                    if held[i] is lock:
                        del held[i]
                        break

    def _cycle(self, first: str, later: str) -> Inversion | None:
        """Under the mutex, the order ``first -> later`` just recorded or weakened: a path ``later -> ... -> first``
        closing a cycle whose orders share no guard, as an :class:`Inversion`; None if there is none."""
        path = self._unguarded_path(later, first, [later], self._orders[(first, later)].guards)
        if path is None:
            return None
        cycle = [(first, later), *zip(path, path[1:], strict=False)]
        orders = [self._orders[step] for step in cycle]
        return Inversion(tuple((a, b, f"thread {o.thread!r} at {o.at}") for (a, b), o in zip(cycle, orders, strict=True)))

    def _unguarded_path(self, at: str, goal: str, path: list[str], common: frozenset[str]) -> list[str] | None:
        """A simple path of recorded orders from ``path[-1] == at`` to ``goal`` after which no guard is common to
        every order of the cycle (``common``: the guards shared so far), or None. Every path is tried, not only
        the first found: one cycle taken under a gate does not hide another through the same locks that is not
        (a tier has a handful of lock classes)."""
        if at == goal:
            return None if common else path
        for (a, b), order in self._orders.items():
            if a == at and (b == goal or b not in path):
                found = self._unguarded_path(b, goal, [*path, b], common & order.guards)
                if found is not None:
                    return found
        return None
