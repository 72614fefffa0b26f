"""Registered memory the tier moves blocks through (MC-3, MC-4): fixed slots, lent one operation at a time.

Mooncake moves data between a cluster's segments and memory registered with the client
(``register_buffer``): over RDMA only registered memory can be read or written, over TCP it is read
and written in place. The tier registers the engine's slot buffer (stores read the rows there) and
two areas of its own: one header slot per store in flight (the envelope's 4 KiB header, gathered with
the row in one multi-buffer put), one whole-envelope slot per load in flight.

A slot's lifetime is an operation's, and an operation outlives its waiter when a job's time runs out
(the batch call keeps running on its worker thread): a slot goes back to the area only when both the
batch call and its waiter are done with it (:class:`kvproto_mooncake._batches.BatchCalls`). So a late
transfer never writes a slot that another operation uses, and never a slot row of the engine: loads
land in a slot of the tier's own and are copied into the row by the waiter, only if it still waits.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import mmap
from collections import deque

from kvproto_mooncake._client import SharedClient

__all__ = ["StagingArea", "address_of"]

_log = logging.getLogger("kvproto_mooncake")


def address_of(view: memoryview) -> int:
    """The address of a writable buffer's first byte."""
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


class StagingArea:
    """``slots`` slots of ``slot_bytes`` each, in one anonymous mapping registered with ``shared``.

    :meth:`take` and :meth:`give` run on the backend's event loop only (no lock): a slot is handed to
    the first operation waiting for one.
    """

    def __init__(self, shared: SharedClient, slots: int, slot_bytes: int, *, what: str) -> None:
        self.slot_bytes = slot_bytes
        self._what = what
        self._map = mmap.mmap(-1, slots * slot_bytes)
        self.view = memoryview(self._map)
        self.base = address_of(self.view)
        self._shared = shared
        shared.register(self.base, slots * slot_bytes)
        self._free = list(range(slots - 1, -1, -1))
        self._slots = slots
        self._waiting: deque[asyncio.Future[int]] = deque()

    @property
    def lent(self) -> int:
        """Slots out now (their operation, or its batch call, not finished)."""
        return self._slots - len(self._free)

    async def take(self) -> int:
        """A free slot (waiting for one); the caller gives it back exactly once."""
        if self._free:
            return self._free.pop()
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        try:
            return await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.give(waiter.result())  # handed over as the wait was cancelled: not ours to keep
            raise

    def give(self, slot: int) -> None:
        """Return ``slot``: to the first operation still waiting, else to the free list."""
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(slot)
                return
        self._free.append(slot)

    def slot(self, slot: int) -> memoryview:
        """The bytes of ``slot``."""
        start = slot * self.slot_bytes
        return self.view[start : start + self.slot_bytes]

    def address(self, slot: int) -> int:
        """The address of ``slot``'s first byte."""
        return self.base + slot * self.slot_bytes

    def close(self) -> None:
        """Unregister and unmap, unless a slot is still out (a batch call still running): then the area is
        left mapped and registered (a late transfer must not write freed memory) and the leak is logged."""
        if self.lent:
            _log.warning("kvproto-mooncake: %d %s slot(s) still in a running Mooncake call at shutdown: "
                         "their area (%d bytes) stays mapped", self.lent, self._what, self._map.size())
            return
        self._shared.unregister(self.base)
        try:
            self.view.release()
            self._map.close()
        except BufferError:  # a view of a slot is still referenced somewhere: the mapping goes with it
            pass

