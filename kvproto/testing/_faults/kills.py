"""Kill a crash check's writer process at its n-th storage write, or in the middle of it (TIER-24; issue 40:
"a crash anywhere, inside a write included"): :class:`StorageWriteKills`.

The crash check's other kill points come from a tier's own hooks or from the kit's wrapper below a
BlobTier; a tier written from scratch has neither, so its writes were cut only at seeded moments between
acknowledgements, never inside one block's sequence of writes. This reaches them through the interpreter,
in the forked writer process only (the patches and profile functions die with it): installed before the
writer's instance is built, it counts every storage write call the process makes outside the kit (the
``os`` module's creating, writing, renaming, linking, removing and syncing calls; the write methods of
``io``'s file objects and of ``mmap``; a socket's sends; ``sqlite3``'s ``execute`` family, ``commit``,
``blobopen`` and a blob's ``write``)
and kills the process (SIGKILL) at the ``nth``: right before that call, except an ``os.write`` or
``os.pwrite``, which first writes the first half of its bytes, as a writer killed inside the call can
leave them (a torn write); or, with ``after``, right after the ``nth`` of the writes made since
:meth:`StorageWriteKills.begin_stores` returned, before the tier's next step (held-out round 10: a slab
tier appending its index record before copying the block into its mapping left a record naming an
unwritten slot; no kill before a write lands between the two, since a copy into a mapping is no call;
counted from the stores, since a new instance's start-up makes more writes with every earlier writer's
files to open). ``nth=None`` only counts, so that a clean run says how many points there are.
"""

from __future__ import annotations

import mmap
import os
import socket
import sqlite3
import sys
import threading
from collections.abc import Callable
from types import FrameType

from kvproto.testing._faults.calls import _FILE_TYPES, _plumbing
from kvproto.testing._harness.crash import kill_self

__all__ = ["StorageWriteKills"]

_KIT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # kvproto/testing: the kit's own calls
_WRITE_OS_NAMES = (
    "open", "write", "pwrite", "writev", "pwritev", "fsync", "fdatasync", "rename", "replace", "link", "symlink",
    "unlink", "remove", "rmdir", "mkdir", "ftruncate", "truncate", "posix_fallocate", "copy_file_range", "sendfile",
)
_WRITE_OS = frozenset(id(getattr(os, name)) for name in _WRITE_OS_NAMES if hasattr(os, name))
_FILE_WRITES = frozenset({"write", "writelines", "flush", "truncate"})
_MMAP_WRITES = frozenset({"write", "write_byte", "flush", "move", "resize"})
_SOCKET_SENDS = frozenset({"send", "sendall", "sendmsg", "sendto"})
_SQLITE_WRITES = frozenset({"execute", "executemany", "executescript", "commit", "blobopen"})
_SQLITE_BLOB = getattr(sqlite3, "Blob", None)  # incremental blob I/O: a row's bytes written after its INSERT


def _storage_write(func: object) -> bool:
    """Whether calling ``func`` is a storage write (see the module docstring)."""
    if id(func) in _WRITE_OS:
        return True
    owner = getattr(func, "__self__", None)
    if owner is None or owner is os:
        return False
    name = getattr(func, "__name__", "")
    if isinstance(owner, _FILE_TYPES):
        return name in _FILE_WRITES and owner not in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
    if isinstance(owner, mmap.mmap):
        return name in _MMAP_WRITES
    if isinstance(owner, socket.socket):
        return name in _SOCKET_SENDS
    if isinstance(owner, (sqlite3.Connection, sqlite3.Cursor)):
        return name in _SQLITE_WRITES
    if _SQLITE_BLOB is not None and isinstance(owner, _SQLITE_BLOB):
        return name == "write"
    return False


def _kit_frame(frame: FrameType | None) -> bool:
    return frame is not None and frame.f_code.co_filename.startswith(_KIT)


class StorageWriteKills:
    """Counts a writer process's storage writes; kills it at the ``nth`` (1-based; ``None``: never).

    Only for a forked child the kit kills anyway: :meth:`install` patches ``os.write`` and ``os.pwrite``
    and installs a profile function in this thread and every thread started later, for the rest of
    the process's life.
    """

    def __init__(self, nth: int | None, *, after: bool = False) -> None:
        self.nth = nth
        self.after = after
        self.count = 0
        self.store_count = 0
        """The storage writes made since :meth:`begin_stores` (``count``: all of them)."""
        self._storing = False
        self._lock = threading.Lock()
        self._returning: tuple[int, object] | None = None  # (thread, call) to kill at once it returned

    def begin_stores(self) -> None:
        """The writer's instance is built: its stores begin (``after`` counts from here)."""
        with self._lock:
            self._storing = True

    def _reached(self) -> bool:
        """Count one storage write; whether it is the one to kill at."""
        with self._lock:
            self.count += 1
            self.store_count += self._storing
            return (self._storing and self.store_count == self.nth) if self.after else self.count == self.nth

    def install(self) -> None:
        """Start counting (and killing): every storage write of this process from now on."""
        self._tear("write")
        self._tear("pwrite")
        threading.setprofile(self._profile)
        sys.setprofile(self._profile)

    def _tear(self, name: str) -> None:
        """Replace ``os.<name>`` (``write`` or ``pwrite``: the buffer second) with one that counts a call made
        outside the kit and, at the ``nth``, writes the first half of its bytes and kills the process."""
        real: Callable[..., int] | None = getattr(os, name, None)
        if real is None:
            return
        kills = self

        def torn(*args: object) -> int:
            if not _kit_frame(sys._getframe(1)) and kills._reached():
                try:
                    real(*args) if kills.after else real(args[0], _half(args[1]), *args[2:])
                except OSError:
                    pass  # the half could not be written (an O_DIRECT alignment): the kill still lands
                kill_self()
            return real(*args)

        setattr(os, name, torn)

    def _profile(self, frame: FrameType, event: str, arg: object) -> None:
        if event != "c_call":
            returning = self._returning
            # ==, not is: from Python 3.12 the profiler hands each event a new bound method of the same call
            if (returning is not None and event in ("c_return", "c_exception") and returning[0] == threading.get_ident()
                    and returning[1] == arg):
                kill_self()  # the nth storage write returned (or raised): before the tier's next step
            return
        if not _storage_write(arg) or _kit_frame(frame) or _plumbing(frame):
            return
        if self._reached():
            if not self.after:
                kill_self()
            self._returning = (threading.get_ident(), arg)


def _half(data: object) -> memoryview:
    """The first half of a write's bytes (at least one byte of a non-empty write)."""
    view = memoryview(data).cast("B")  # type: ignore[arg-type]  # os.write's buffer argument, as given
    return view[: max(1, view.nbytes // 2)] if view.nbytes else view
