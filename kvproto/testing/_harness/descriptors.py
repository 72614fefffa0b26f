"""The process's open file descriptors, as the kit counts them (TIER-31, TIER-16, KIT-23): which are
open on regular files, which of them a baseline did not hold once the tier's threads had time to close
theirs, and what a few of them point at."""

from __future__ import annotations

import gc
import os
import stat
import time

__all__ = ["FD_DIR", "describe_fds", "open_fds", "settled_leaks", "still_open"]

FD_DIR = "/proc/self/fd"
_FD_SETTLE_S = 3.0  # how long the kit waits for files closed by the tier's threads (a condition)


def open_fds() -> set[str] | None:
    """The process's file descriptors open on regular files (Linux), or None where the kit cannot list
    them. Directories, pipes and sockets are left out: a thread of the process walking a directory
    (a background delete) or talking to a server is not a transfer's leak."""
    try:
        names = os.listdir(FD_DIR)
    except OSError:
        return None
    files = set()
    for name in names:
        try:
            if stat.S_ISREG(os.stat(os.path.join(FD_DIR, name)).st_mode):
                files.add(name)
        except OSError:
            continue  # closed meanwhile
    return files


def _reachable_fds() -> set[str]:
    """:func:`open_fds` once unreachable objects were collected: a descriptor that only an object in a
    reference cycle holds (a closed database connection whose statements sit in a traceback) closes at
    the next collection, whenever the interpreter runs it. Collecting first makes what is counted the
    descriptors something still holds, the same every run (KIT-19), never the collector's timing."""
    gc.collect()
    return open_fds() or set()


def settled_leaks(baseline: set[str]) -> set[str]:
    """The regular-file descriptors open now that were not in ``baseline``, once the tier's threads had
    up to ``_FD_SETTLE_S`` to close what finished jobs opened (a condition polled, never a verdict by time)
    and unreachable objects were collected."""
    deadline = time.monotonic() + _FD_SETTLE_S
    leaked = (open_fds() or set()) - baseline
    while leaked and time.monotonic() < deadline:
        time.sleep(0.01)  # a tier thread may still be closing what a finished job opened
        leaked = _reachable_fds() - baseline
    return leaked


def still_open(held: set[str]) -> set[str]:
    """Those of ``held`` (regular-file descriptors) still open, once the tier's threads had up to
    ``_FD_SETTLE_S`` to close them (a condition polled, never a verdict by time) and unreachable objects
    were collected."""
    deadline = time.monotonic() + _FD_SETTLE_S
    left = held & (open_fds() or set())
    while left and time.monotonic() < deadline:
        time.sleep(0.01)
        left = held & _reachable_fds()
    return left


def describe_fds(fds: set[str]) -> str:
    """What a few leaked descriptors point at."""
    shown = []
    for fd in sorted(fds, key=int)[:3]:
        try:
            shown.append(f"{fd} -> {os.readlink(os.path.join(FD_DIR, fd))}")
        except OSError:
            shown.append(fd)
    return ", ".join(shown) + (", ..." if len(fds) > 3 else "")
