"""Hold one of a tier's own threads at a storage call, whatever the tier is built on (KIT-23, issue 40:
"a writer paused inside a storage call while other instances act"): :class:`StorageCallGate`.

The faults of :mod:`kvproto.testing._faults.backend` and the backdoor hooks reach a tier through its
backend or its spec; a tier written from scratch, with neither, keeps its races out of reach: a load
that finds a block's place under a lock and reads it after letting go, a background existence check
whose answer lands after a reset. The gate reaches them through the interpreter instead: installed
with :func:`threading.setprofile` before an instance is built, it sees every call a thread that
instance starts makes into a C function, and once armed it holds the first of those threads that
calls one of the storage calls below (before the call, or right after it returned), until the
check releases it, so the check acts while the tier's own thread is held there: an interleaving
that happens every run, not by luck (KIT-19).

Storage calls: the ``os`` module's file calls (``open``, ``pread``, ``pwrite``, ``read``, ``write``,
``stat``, ``rename``, ``link``, ``unlink``, ``fsync``, ...), the read and write methods of ``io``'s file
objects (the interpreter's own standard streams left out: a log line is no storage call), a socket's
sends and receives, and ``sqlite3``'s ``execute`` family and incremental blob I/O (``blobopen``, a blob's
``read`` and ``write``). Threads the kit runs (the main thread, and
those named ``kvproto-kit...``) are never held: a tier that does its storage I/O on the engine's
thread has nothing the gate can hold, and the checks using it say so ("not checked").
"""

from __future__ import annotations

import errno
import io
import os
import socket
import sqlite3
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType

from kvproto.testing._faults.probes import GATE_BOUND_S

__all__ = ["StorageCallGate", "storage_calls_gated"]

_OS_NAMES = (
    "open", "close", "read", "pread", "readv", "preadv", "write", "pwrite", "writev", "pwritev", "stat", "lstat",
    "fstat", "rename", "replace", "link", "unlink", "remove", "fsync", "fdatasync", "ftruncate", "truncate",
    "scandir", "listdir", "sendfile", "copy_file_range", "posix_fallocate",
)
_OS_CALLS = frozenset(id(getattr(os, name)) for name in _OS_NAMES if hasattr(os, name))
_FILE_TYPES = (io.FileIO, io.BufferedReader, io.BufferedWriter, io.BufferedRandom, io.TextIOWrapper)
_FILE_METHODS = frozenset({"read", "readinto", "readall", "read1", "readinto1", "readline", "readlines", "write",
                           "writelines", "flush"})
_SOCKET_METHODS = frozenset({"send", "sendall", "sendmsg", "recv", "recv_into", "recvfrom", "recvfrom_into",
                             "recvmsg"})
_SQLITE_METHODS = frozenset({"execute", "executemany", "executescript", "commit", "fetchone", "fetchmany",
                             "fetchall", "blobopen"})
_SQLITE_BLOB = getattr(sqlite3, "Blob", None)  # incremental blob I/O (Connection.blobopen)
_BLOB_METHODS = frozenset({"read", "write"})


def _storage_call(func: object) -> str | None:
    """The name of ``func`` if calling it is a storage call (see the module docstring), else None."""
    if id(func) in _OS_CALLS:
        return f"os.{getattr(func, '__name__', '?')}"
    owner = getattr(func, "__self__", None)
    name = getattr(func, "__name__", "")
    if owner is None or owner is os:
        return None
    if isinstance(owner, _FILE_TYPES) and name in _FILE_METHODS:
        if owner in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            return None
        return f"{type(owner).__name__}.{name}"
    if isinstance(owner, socket.socket) and name in _SOCKET_METHODS:
        return f"socket.{name}"
    if isinstance(owner, (sqlite3.Connection, sqlite3.Cursor)) and name in _SQLITE_METHODS:
        return f"sqlite3.{type(owner).__name__}.{name}"
    if _SQLITE_BLOB is not None and isinstance(owner, _SQLITE_BLOB) and name in _BLOB_METHODS:
        return f"sqlite3.Blob.{name}"
    return None


def _kit_thread(thread: threading.Thread) -> bool:
    return thread is threading.main_thread() or thread.name.startswith("kvproto-kit")


_PLUMBING = tuple(
    os.path.join(os.path.dirname(os.__file__), name) for name in ("asyncio", "logging", "selectors.py", "concurrent")
)
"""Standard-library modules whose own calls are plumbing, not storage: an event loop's wake-up socket,
a log handler's file, an executor's queue."""


def _plumbing(frame: FrameType) -> bool:
    return frame.f_code.co_filename.startswith(_PLUMBING)


def _on_behalf_of(frame: FrameType | None, packages: tuple[str, ...]) -> bool:
    """Whether a frame of a module of ``packages`` (or of a package inside them) is on ``frame``'s stack."""
    while frame is not None:
        name = frame.f_globals.get("__name__")
        if isinstance(name, str) and any(name == p or name.startswith(f"{p}.") for p in packages):
            return True
        frame = frame.f_back
    return False


class StorageCallGate:
    """Holds the first storage call (see the module docstring) a tier's own thread makes once armed.

    ``after``: hold the thread right after the call returned (its answer in hand, not yet used) instead
    of before it. A held thread waits until :meth:`release`, or :data:`GATE_BOUND_S` at most (a bound
    against a hang: a check that needs longer releases first). One thread per :meth:`arm`.

    ``fail``: instead of holding it, make that call raise ``OSError(EIO)`` before it runs, as a disk or
    a connection failing there would (the interpreter then stops profiling that thread: one fault per
    thread, so a check that fails several calls builds an instance per fault).

    ``packages``: only a call made on behalf of the tier's own code counts, one with a frame of a module
    of these packages on its thread's stack (its client library's socket call included; an engine's
    dispatcher thread resolving a path does not).
    """

    def __init__(self, *, after: bool = False, fail: bool = False, packages: Sequence[str] = ()) -> None:
        if after and fail:
            raise ValueError("StorageCallGate: a call that already returned cannot fail")
        self.after = after
        self.fail = fail
        self.packages = tuple(packages)
        self.entered = threading.Event()
        self.held: str | None = None
        """``"<thread name>: <call>"`` of the thread held (or that was), once one was."""
        self._armed = False
        self._closed = False
        self._skip = 0
        self._go = threading.Event()
        self._lock = threading.Lock()
        self._event = "c_return" if after else "c_call"

    def arm(self, skip: int = 0) -> None:
        """Hold a storage call of a tier's thread: the next one, or the one after ``skip`` more went by."""
        with self._lock:
            self.entered = threading.Event()  # new events: a thread let go by an earlier round is not held again
            self._go = threading.Event()
            self.held = None
            self._skip = skip
            self._armed = True

    @property
    def armed(self) -> bool:
        """Whether the next storage call of a tier's thread will be held."""
        return self._armed

    @property
    def released(self) -> bool:
        """Whether the check let go of the thread held (or of the hold it armed) since the last :meth:`arm`."""
        return self._go.is_set()

    def release(self) -> None:
        """Let the held thread go on (and hold no other)."""
        with self._lock:
            self._armed = False
            go = self._go
        go.set()

    def close(self) -> None:
        """Release, and have each profiled thread that calls again drop the profile function (no cost left)."""
        self._closed = True
        self.release()

    def wait_entered(self, timeout_s: float) -> bool:
        """Whether a thread is held (or was), waiting up to ``timeout_s``."""
        return self.entered.wait(timeout_s)

    def profile(self, frame: FrameType, event: str, arg: object) -> None:
        """The profile function (:func:`threading.setprofile`) of every thread started while installed."""
        if self._closed:
            sys.setprofile(None)  # this thread outlived the check: it stops paying for the gate
            return
        if event != self._event or not self.armed:
            return
        call = _storage_call(arg)
        if call is None or _plumbing(frame) or (self.packages and not _on_behalf_of(frame, self.packages)):
            return
        if self.fail and call == "os.close":
            return  # a close that fails still frees its descriptor (Linux): failing it before it ran cannot happen
        thread = threading.current_thread()
        if _kit_thread(thread):
            return
        with self._lock:
            if not self._armed:
                return
            if self._skip > 0:
                self._skip -= 1
                return
            self._armed = False
            self.held = f"{thread.name}: {call}"
            entered, go = self.entered, self._go
        entered.set()
        if self.fail:
            raise OSError(errno.EIO, f"kvproto-kit: an I/O error injected at {call}")
        go.wait(GATE_BOUND_S)


@contextmanager
def storage_calls_gated(gate: StorageCallGate) -> Iterator[StorageCallGate]:
    """Install ``gate`` for every thread started inside the block (build the instance to hold inside
    it); on the way out the gate is closed (each thread it profiled drops it at its next call), and threads
    started later get the profile function installed before."""
    before = threading.getprofile()
    threading.setprofile(gate.profile)
    try:
        yield gate
    finally:
        threading.setprofile(before)
        gate.close()
