"""``BatchCalls``: operations started in one turn of the event loop go to Mooncake as one batch call (MC-3, MC-4).

:class:`kvproto.tierkit.BlobTier` runs a job over an asynchronous backend as one task on the
backend's loop, starting each key's operation in the same turn (up to its bound of operations in
flight). Each operation here adds its item to the pending batch and waits; the batch is handed to a
worker thread (the loop's default executor) at the end of the turn, or at once when it reaches
``max_keys``: one ``batch_put_from_multi_buffers`` or ``batch_get_into`` per batch, never per key; at most
``max_calls`` such calls run at once, and the next batch gathers meanwhile.

Slots (:class:`kvproto_mooncake._staging.StagingArea`) go back exactly once, by whoever is done last:
the waiter, after it used the answer (or when its wait ends with the batch already over), or the
batch, when it ends after its waiter gave up (a job timeout cancelled it, or its ``watch`` said the call is
not worth waiting for: MC-12). The loop thread never blocks on Mooncake.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
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
    """Items submitted in one loop turn become one call of ``run(items) -> answers`` (one per item, in order),
    at most ``max_calls`` calls running at once.

    With no call running, a batch goes as soon as it holds ``start_keys`` items (the link is idle: the rest
    of the turn's items form the next batch while it transfers). While ``max_calls`` calls run, the next
    batch stays open (its items keep joining it, up to ``max_keys``) and goes when a call ends: its keys
    are made ready (headers built, slots taken) while the current one transfers. A batch full at
    ``max_keys`` waits, sealed, in order. Items whose waiter gave up before their batch went are left out.

    With a ``watch``, a waiter asks it each ``watch_every_s`` it has waited; when it answers False the waiter
    gives up at once with a ConnectionError (its slot goes back when its batch is over).
    """

    def __init__(self, run: Callable[[list[_Item]], list[_Answer]], *, max_keys: int, max_calls: int,
                 name: str, start_keys: int | None = None, watch: Callable[[], Awaitable[bool]] | None = None,
                 watch_every_s: float = 0.25) -> None:
        self._run = run
        self._watch = watch
        self._watch_every_s = watch_every_s
        self._max = max_keys
        self._start = max_keys if start_keys is None else max(1, min(start_keys, max_keys))
        self._max_calls = max_calls
        self._name = name
        self._pending: list[_Entry[_Item, _Answer]] = []
        self._sealed: deque[list[_Entry[_Item, _Answer]]] = deque()
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
        if len(self._pending) >= self._max or (len(self._pending) >= self._start and not self.calls_running):
            self._seal()  # full, or enough to start an idle link while the rest of the turn's keys get ready
            self._dispatch()
        elif not self._flush_posted:
            self._flush_posted = True
            loop.call_soon(self._flush)
        try:
            return await (entry.answer if self._watch is None else self._watched(entry.answer, self._watch))
        except BaseException:
            if entry.answer.done() and not entry.answer.cancelled():
                give_back()  # the batch is over (an answer or an error came): the slot is free now
            else:
                entry.answer.cancel()  # given up before or while its batch runs: the batch gives the slot back
            raise

    async def _watched(self, answer: asyncio.Future[_Answer], watch: Callable[[], Awaitable[bool]]) -> _Answer:
        """``answer``'s result, unless ``watch()``, asked each ``watch_every_s`` of waiting, says to give up."""
        while True:
            done, _ = await asyncio.wait((answer,), timeout=self._watch_every_s)
            if done:
                return answer.result()
            if not await watch():
                raise ConnectionError(f"{self._name}: given up after the call's server stopped answering")

    def _seal(self) -> None:
        if self._pending:
            self._sealed.append(self._pending)
            self._pending = []

    def _flush(self) -> None:
        """The end of a loop turn: the open batch goes if a call may start now (else it stays open)."""
        self._flush_posted = False
        if self.calls_running < self._max_calls:
            self._seal()
        self._dispatch()

    def _dispatch(self) -> None:
        """Start sealed batches while fewer than ``max_calls`` calls run; a batch's gone waiters are left out."""
        while self._sealed and self.calls_running < self._max_calls:
            entries = []
            for entry in self._sealed.popleft():
                if entry.answer.cancelled():
                    entry.give_back()  # its waiter gave up before the batch went: no transfer for it
                else:
                    entries.append(entry)
            if not entries:
                continue
            self.calls_running += 1
            self.calls += 1
            self.items += len(entries)
            done = asyncio.get_running_loop().run_in_executor(None, self._run, [e.item for e in entries])
            done.add_done_callback(partial(self._settle, entries))

    def _settle(self, entries: list[_Entry[_Item, _Answer]], done: asyncio.Future[list[_Answer]]) -> None:
        """On the loop: each waiter gets its answer (or the call's error); a gone waiter's slot goes back; the
        next batch goes."""
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
        if not self._sealed:
            self._seal()
        self._dispatch()

    @property
    def waiting(self) -> int:
        """Items not yet in a running call (open and sealed batches)."""
        return len(self._pending) + sum(len(batch) for batch in self._sealed)
