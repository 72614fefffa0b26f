"""Which threads a tier started and which of them were joined (TIER-16), recorded, not sampled.

Looking at ``threading.enumerate()`` once after ``shutdown()`` returns gives a verdict that depends
on timing: a worker the tier never joins passes when it happens to end a moment before the kit
looks (a mutation of the in-memory threaded tier that skipped its joins survived that way; so did
LMCache's fs adapter in some runs). :class:`ThreadLedger` records instead, from the moment the tier
is built until its check ends, every ``Thread.start()`` made by the kit's thread or by a thread
already recorded (a server started before the tier, e.g. a loopback S3 server handing each
connection to a thread of its own, is not the tier's), and every ``join()`` that returned with the
thread ended; and it holds each recorded thread at its very end (after its ``run`` returned) until
somebody joins it, or ``hold_s`` passes, or the ledger is left. So a tier's own
``if t.is_alive(): t.join()`` always finds it alive and joins it, while a thread the tier leaves to
end on its own is still there when the kit looks, however early its work ended: the same tier gets
the same verdict every run.

The ledger also knows which threads come from the tier's build (KIT-26): those started before
:meth:`ThreadLedger.mark_built` (while the spec's factory ran) that no join saw end, and every thread
one of them started later (a loopback server's thread per connection); :meth:`ThreadLedger.from_build`
says so.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

__all__ = ["ThreadLedger"]


class ThreadLedger:
    """While entered, records the threads started by the entering thread (and their descendants)
    and which of them a ``join()`` saw end. Not reentrant; ledgers may nest (each restores what it
    replaced)."""

    def __init__(self, *, hold_s: float = 10.0) -> None:
        self._hold_s = hold_s
        self._release = threading.Event()  # set when the ledger is left: no thread is held any more
        self._lock = threading.Lock()
        self._owner: threading.Thread | None = None
        self._started: list[threading.Thread] = []
        self._joined: set[int] = set()  # id() of recorded threads a join saw end
        # id() of each recorded thread (kept alive by _started, so no id is reused) -> set once a join began
        self._joining: dict[int, threading.Event] = {}
        self._saved: tuple[Callable[..., Any], Callable[..., Any]] | None = None
        # id() of each recorded thread -> id() of the recorded thread at the root of its line (itself
        # where the entering thread started it)
        self._root: dict[int, int] = {}
        self._built: set[int] | None = None  # id() of the roots started before mark_built

    def __enter__(self) -> ThreadLedger:
        if self._saved is not None:
            raise RuntimeError("ThreadLedger is not reentrant")
        self._owner = threading.current_thread()
        start, join = threading.Thread.start, threading.Thread.join
        self._saved = (start, join)
        ledger = self

        def recording_start(thread: threading.Thread) -> None:
            ledger._note_start(thread)
            start(thread)

        def recording_join(thread: threading.Thread, timeout: float | None = None) -> None:
            ledger._note_joining(thread)
            join(thread, timeout)
            if not thread.is_alive():
                ledger._note_join(thread)

        # Class attributes, replaced while entered (the ledger's whole point) and restored in __exit__.
        setattr(threading.Thread, "start", recording_start)  # noqa: B010 - a method replaced on the class
        setattr(threading.Thread, "join", recording_join)  # noqa: B010 - a method replaced on the class
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._saved is not None:
            start, join = self._saved
            setattr(threading.Thread, "start", start)  # noqa: B010 - restoring what __enter__ replaced
            setattr(threading.Thread, "join", join)  # noqa: B010 - restoring what __enter__ replaced
            self._saved = None
        self._release.set()

    def _note_start(self, thread: threading.Thread) -> None:
        parent = threading.current_thread()
        with self._lock:
            if parent is not self._owner and id(parent) not in self._joining:
                return
            self._started.append(thread)
            self._root[id(thread)] = self._root.get(id(parent), id(thread))
            joining = self._joining[id(thread)] = threading.Event()
        run = thread.run
        hold_s, release = self._hold_s, self._release

        def held_run() -> None:
            try:
                run()
            finally:  # held until a join begins (or the ledger is left, or hold_s passed)
                deadline = time.monotonic() + hold_s
                while not joining.is_set() and not release.is_set() and time.monotonic() < deadline:
                    joining.wait(0.05)

        setattr(thread, "run", held_run)  # noqa: B010 - the instance's run, which Thread's bootstrap calls

    def _note_joining(self, thread: threading.Thread) -> None:
        with self._lock:
            joining = self._joining.get(id(thread))
        if joining is not None:
            joining.set()

    def _note_join(self, thread: threading.Thread) -> None:
        with self._lock:
            if id(thread) in self._joining:
                self._joined.add(id(thread))

    def started(self) -> list[threading.Thread]:
        """The threads recorded so far, in the order they were started."""
        with self._lock:
            return list(self._started)

    def unjoined(self) -> list[threading.Thread]:
        """The recorded threads no ``join()`` saw end (still running, or ended on their own)."""
        with self._lock:
            return [t for t in self._started if id(t) not in self._joined]

    def mark_built(self) -> None:
        """Note that the tier is built: the threads recorded so far (and every thread any of them starts
        later) are the build's (:meth:`from_build`). Once only."""
        with self._lock:
            if self._built is not None:
                raise RuntimeError("ThreadLedger.mark_built called twice")
            self._built = {id(t) for t in self._started}

    def from_build(self, thread: threading.Thread) -> bool:
        """Whether ``thread`` (a recorded one) was started while the tier was built, before
        :meth:`mark_built`, or by a thread that was (at any depth), where no join saw that first thread
        of its line end: a thread started by one the tier joins (its dispatcher, say) is the tier's."""
        with self._lock:
            root = self._root.get(id(thread))
            return self._built is not None and root in self._built and root not in self._joined
