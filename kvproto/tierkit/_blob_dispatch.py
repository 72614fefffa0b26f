"""``Dispatcher``: how :class:`~kvproto.tierkit.BlobTier` hands work from the scheduler's thread to its own (TIERKIT-9).

Starting a job means waking another thread: a worker pool's ``submit``
(which may start a thread, and takes a lock the workers contend for) or
an event loop's ``call_soon_threadsafe`` (a write to the loop's wake-up
socket). Each of those gives up the interpreter's lock (the GIL), and a
thread that gives it up while another thread runs Python waits a whole
switch interval (5 ms) or more to get it back: one ``submit_store`` held
the scheduler for 51.6 ms that way (issue 38). So the scheduler's thread
only appends a thunk to a :class:`queue.SimpleQueue` (C code: no system
call that releases the GIL, never blocks), and one dispatcher thread per
tier runs the thunks, in order: it makes those calls instead.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from queue import SimpleQueue

__all__ = ["Dispatcher"]

_log = logging.getLogger("kvproto.tierkit")


class Dispatcher:
    """Runs posted thunks on its own thread, in the order posted; :meth:`post` never blocks (TIERKIT-9)."""

    def __init__(self, *, name: str) -> None:
        self._name = name
        self._queue: SimpleQueue[Callable[[], None] | None] = SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"kvproto-{name}-dispatch", daemon=True)
        self._thread.start()
        self._closed = False

    def post(self, thunk: Callable[[], None]) -> None:
        """Run ``thunk`` on the dispatcher's thread after those posted before it. After :meth:`close`, a
        ``RuntimeError`` (nothing runs it)."""
        if self._closed:
            raise RuntimeError(f"the dispatcher of {self._name!r} is closed")
        self._queue.put(thunk)

    def flush(self, timeout: float) -> bool:
        """Wait until every thunk posted so far ran (tests, tools; never the scheduler). True at once
        after :meth:`close`; False if ``timeout`` seconds passed first."""
        ran = threading.Event()
        try:
            self.post(ran.set)
        except RuntimeError:
            return True  # closed: close() runs (or ran) what was posted
        return ran.wait(timeout)

    def close_soon(self) -> None:
        """Refuse further thunks; the thread stops once it ran those posted so far. Never blocks;
        idempotent. A caller posting from another thread posts and closes under one lock (BlobTier does)."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)

    def close(self) -> None:
        """:meth:`close_soon`, then wait until the thread ran every thunk posted and stopped. Idempotent."""
        self.close_soon()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        while True:
            thunk = self._queue.get()
            if thunk is None:
                return
            try:
                thunk()
            except Exception:  # a bug in a thunk: logged; the thunks make sure their jobs still end
                _log.warning("BlobTier %r: dispatching work failed", self._name, exc_info=True)
