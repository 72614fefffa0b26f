"""A writer in a child process that the kit kills (SIGKILL): the machinery of the crash-consistency
check (TIER-24). The check's judgement lives in :mod:`kvproto.testing._checks.secondary.crash`.

The child is forked (POSIX): it inherits the check's objects, builds its own tier instance over
the same storage (the ``reopen`` hook), and reports over a pipe, one line each: ``R`` once ready,
``A <index>`` for each key whose store job reported it stored, ``W <count>`` for the storage writes it
counted (:class:`~kvproto.testing._faults.kills.StorageWriteKills`), ``D`` when done (its tier shut down),
``F <clause>\\t<detail>`` for a conformance failure in it, ``E <error>`` for anything else. The parent
reads with a bound and kills; every wait is for a line or the child's end, never a fixed time.
"""

from __future__ import annotations

import os
import select
import signal
import time
import warnings
from collections.abc import Callable

from kvproto.testing._harness.failures import ConformanceFailure

__all__ = ["CHILD_BOUND_S", "Child", "kill_self"]

CHILD_BOUND_S = 20.0
"""The longest the kit waits for a child's next line or its end: a bound against a hang."""


def kill_self() -> None:
    """SIGKILL this process (a kill point, in the child)."""
    os.kill(os.getpid(), signal.SIGKILL)


class Child:
    """``run(say)`` in a forked child process; ``say(line)`` sends one line to the parent."""

    def __init__(self, run: Callable[[Callable[[str], None]], None]) -> None:
        read_fd, write_fd = os.pipe()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork() of a multi-threaded process
            pid = os.fork()
        if pid == 0:  # pragma: no cover - the child's side runs in the child, which coverage never sees end
            os.close(read_fd)

            def say(line: str) -> None:
                os.write(write_fd, (line.replace("\n", " ") + "\n").encode())

            code = 0
            try:
                run(say)
                say("D")
            except ConformanceFailure as failure:
                say(f"F {failure.clause}\t{failure.detail}")
                code = 3
            except BaseException as error:  # reported to the parent, whatever it is
                say(f"E {type(error).__name__}: {error}")
                code = 4
            os._exit(code)
        os.close(write_fd)
        self.pid = pid
        self._fd = read_fd
        self._rest = b""
        self.lines: list[str] = []
        self.ended = False
        self.status: int | None = None

    def read_until(self, enough: Callable[[list[str]], bool], bound_s: float = CHILD_BOUND_S) -> bool:
        """Read lines until ``enough(lines)``, the child's end (its pipe closed) or the bound; whether
        ``enough`` holds."""
        deadline = time.monotonic() + bound_s
        while not enough(self.lines):
            left = deadline - time.monotonic()
            if self.ended or left <= 0:
                return enough(self.lines)
            ready, _, _ = select.select([self._fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._fd, 65536)
            if not chunk:
                self.ended = True
                continue
            *whole, self._rest = (self._rest + chunk).split(b"\n")
            self.lines.extend(line.decode(errors="replace") for line in whole)
        return True

    def acked(self) -> list[int]:
        """The indices of the keys the child said were stored."""
        return [int(line[2:]) for line in self.lines if line.startswith("A ")]

    def writes(self) -> int:
        """How many storage writes the child said it made (its ``W <count>`` line; 0 without one)."""
        return next((int(line[2:]) for line in self.lines if line.startswith("W ")), 0)

    def store_writes(self) -> int:
        """How many of them it made once its instance was built (its ``S <count>`` line; 0 without one)."""
        return next((int(line[2:]) for line in self.lines if line.startswith("S ")), 0)

    def failure(self) -> str | None:
        """The child's own failure line (``F ...`` or ``E ...``), if it sent one."""
        return next((line for line in self.lines if line[:2] in ("F ", "E ")), None)

    def kill(self) -> None:
        """SIGKILL the child (if still there), then reap it; idempotent."""
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.reap()

    def reap(self, bound_s: float = CHILD_BOUND_S) -> int:
        """Wait for the child's end (killing it past ``bound_s``); its wait status."""
        if self.status is None:
            deadline = time.monotonic() + bound_s
            while True:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.status = status
                    break
                if time.monotonic() > deadline:
                    os.kill(self.pid, signal.SIGKILL)
                    deadline = float("inf")
                time.sleep(0.001)
            self._drain()
            os.close(self._fd)
        return self.status

    def _drain(self) -> None:
        """Read what the ended child left in the pipe (its write end is closed: no read blocks)."""
        while not self.ended:
            chunk = os.read(self._fd, 65536)
            if not chunk:
                self.ended = True
                break
            *whole, self._rest = (self._rest + chunk).split(b"\n")
            self.lines.extend(line.decode(errors="replace") for line in whole)

    def killed(self) -> bool:
        """True once reaped, if SIGKILL ended it."""
        status = self.reap()
        return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
