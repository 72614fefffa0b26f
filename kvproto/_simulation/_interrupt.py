"""Ctrl-C during a simulated run: a request to stop at the end of the step, not an exception mid-call.

A :class:`KeyboardInterrupt` raised inside a manager or tier call would leave
the stack half-way through it (a load prepared and never completed: pins
the shutdown check then calls leaked). While a run holds :class:`StopRequests`
in the main thread, SIGINT only counts a request; the loop stops at the end
of the step, drains and shuts down as at its end, and the report says it was
interrupted. A second Ctrl-C stops the drain's wait for jobs in flight.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType, TracebackType

__all__ = ["StopRequests"]


class StopRequests:
    """Counts SIGINTs while entered from the main thread (elsewhere it never sees one); the handler
    there before is put back on exit."""

    __slots__ = ("_installed", "_previous", "count")

    def __init__(self) -> None:
        self.count = 0
        self._installed = False
        self._previous: Callable[[int, FrameType | None], object] | int | None = None

    @property
    def requested(self) -> bool:
        """Whether a stop was asked for."""
        return self.count > 0

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1

    def __enter__(self) -> StopRequests:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
            self._installed = True
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self._installed:
            return
        self._installed = False
        previous, self._previous = self._previous, None
        # None: the handler before was not set from Python; the default one is the nearest.
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)
