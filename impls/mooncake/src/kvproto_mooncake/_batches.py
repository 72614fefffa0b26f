"""``BatchCalls``: operations started in one turn of the event loop go to Mooncake as one batch call (MC-3, MC-4).

:class:`kvproto.tierkit.BlobTier` runs a job over an asynchronous backend as one task on the
backend's loop, starting each key's operation in the same turn (up to its bound of operations in
flight). Each operation here adds its item to the pending batch and waits; the batch is handed to a
worker thread (the loop's default executor) at the end of the turn, or at once when it reaches
``max_keys``: one ``batch_put_from_multi_buffers`` or ``batch_get_into`` per batch, never per key.

Slots (:class:`kvproto_mooncake._staging.StagingArea`) go back exactly once, by whoever is done last:
the waiter, after it used the answer (or when its wait ends with the batch already over), or the
batch, when it ends after its waiter gave up (a job timeout cancelled it). The loop thread never
blocks on Mooncake.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["BatchCalls"]

_log = logging.getLogger("kvproto_mooncake")

_Item = TypeVar("_Item")
_Answer = TypeVar("_Answer")


@dataclass(slots=True)
class _Entry(Generic[_Item, _Answer]):
    item: _Item
    answer: asyncio.Future[_Answer]
    give_back: Callable[[], None]


class BatchCalls(Generic[_Item, _Answer]):
    """Items submitted in one loop turn become one call of ``run(items) -> answers`` (one per item, in order)."""

    def __init__(self, run: Callable[[list[_Item]], list[_Answer]], *, max_keys: int, name: str) -> None:
        self._run = run
        self._max = max_keys
        self._name = name
        self._pending: list[_Entry[_Item, _Answer]] = []
        self._flush_posted = False
        self.calls_running = 0
        self.calls = 0
        self.items = 0

    async def call(self, item: _Item, give_back: Callable[[], None]) -> _Answer:
        """``item``'s answer from the batch it joins. After a normal return the caller gives its slot back
        (``give_back``) once done with it; if this raises, the slot is given back here or by the batch."""
        loop = asyncio.get_running_loop()
        entry: _Entry[_Item, _Answer] = _Entry(item, loop.create_future(), give_back)
        self._pending.append(entry)
        if len(self._pending) >= self._max:
            self._flush()
        elif not self._flush_posted:
            self._flush_posted = True
            loop.call_soon(self._flush)
        try:
            return await entry.answer
        except BaseException:
            if entry.answer.done() and not entry.answer.cancelled():
                give_back()  # the batch is over (an answer or an error came): the slot is free now
            raise  # cancelled while the batch runs: the batch gives the slot back when it ends

    def _flush(self) -> None:
        """Hand the pending items to a worker thread as one call."""
        self._flush_posted = False
        entries, self._pending = self._pending, []
        if not entries:
            return
        self.calls_running += 1
        self.calls += 1
        self.items += len(entries)
        loop = asyncio.get_running_loop()
        done = loop.run_in_executor(None, self._run, [e.item for e in entries])
        done.add_done_callback(lambda f: self._settle(entries, f))

    def _settle(self, entries: list[_Entry[_Item, _Answer]], done: asyncio.Future[list[_Answer]]) -> None:
        """On the loop: each waiter gets its answer (or the call's error); a gone waiter's slot goes back."""
        self.calls_running -= 1
        error = done.exception() if not done.cancelled() else ConnectionError("the batch call was cancelled")
        answers = done.result() if error is None else []
        if error is None and len(answers) != len(entries):
            error = RuntimeError(f"{self._name}: {len(answers)} answers for {len(entries)} items")
        if error is not None and not isinstance(error, OSError):
            _log.warning("kvproto-mooncake %s: a batch of %d failed: %r", self._name, len(entries), error)
        for i, entry in enumerate(entries):
            if entry.answer.cancelled():
                entry.give_back()
            elif error is not None:
                entry.answer.set_exception(error)
            else:
                entry.answer.set_result(answers[i])
