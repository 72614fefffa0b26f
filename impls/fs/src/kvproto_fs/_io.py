"""File operations of the filesystem tier: publish (temp + link), verified reads, O_DIRECT probing (FS-3, FS-7).

Everything here runs on the tier's worker threads, never on the scheduler's.
Every system call goes through a :class:`FileOps` object, so tests can inject
disk-full, I/O errors and crashes at named points.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl as _fcntl
import logging
import mmap
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

__all__ = ["ALIGN", "DirectIO", "FileOps", "address_of", "aligned_buffer", "read_full", "write_full"]

_log = logging.getLogger("kvproto_fs")

ALIGN = 4096
"""Alignment of buffer addresses, lengths and offsets used for O_DIRECT."""

O_DIRECT: int = getattr(os, "O_DIRECT", 0)
_LINK_REFUSED = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK, errno.ENOSYS}


class FileOps:
    """The system calls the tier makes; subclass to inject faults (tests do, for ENOSPC, EIO and kills)."""

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        return os.open(path, flags, mode)

    def pwritev(self, fd: int, buffers: Sequence[memoryview], offset: int) -> int:
        return os.pwritev(fd, buffers, offset)

    def preadv(self, fd: int, buffers: Sequence[memoryview], offset: int) -> int:
        return os.preadv(fd, buffers, offset)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def close(self, fd: int) -> None:
        os.close(fd)

    def closerange(self, low: int, high: int) -> None:
        """Close every descriptor from ``low`` up to ``high`` (excluded), ignoring errors; one system call on
        Linux (``close_range``). Only ever given a range of descriptors the caller owns, each of them."""
        os.closerange(low, high)

    def link(self, src: str, dst: str) -> None:
        os.link(src, dst)

    def replace(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def fstat(self, fd: int) -> os.stat_result:
        return os.fstat(fd)

    def fcntl(self, fd: int, cmd: int, arg: int = 0) -> int:
        return _fcntl.fcntl(fd, cmd, arg)

    def scandir(self, path: str | os.PathLike[str]) -> Iterator[os.DirEntry[str]]:
        return os.scandir(path)


def address_of(view: memoryview) -> int:
    """The address of a writable buffer's first byte (for alignment checks)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


def aligned_buffer(size: int) -> memoryview:
    """``size`` bytes of page-aligned anonymous memory (mmap), writable."""
    return memoryview(mmap.mmap(-1, size))


def write_full(ops: FileOps, fd: int, buffers: Sequence[memoryview], offset: int) -> None:
    """``pwritev`` until every byte is written (short writes are retried; 0 bytes is ENOSPC)."""
    pending = [b.cast("B") for b in buffers if b.nbytes]
    while pending:
        done = ops.pwritev(fd, pending, offset)
        if done <= 0:
            raise OSError(errno.ENOSPC, "pwritev wrote nothing")
        offset += done
        _consume(pending, done)


def read_full(ops: FileOps, fd: int, buffers: Sequence[memoryview], offset: int) -> int:
    """``preadv`` until the buffers are full or the file ends; returns the bytes read."""
    pending = [b.cast("B") for b in buffers if b.nbytes]
    total = 0
    while pending:
        done = ops.preadv(fd, pending, offset)
        if done <= 0:
            break
        total += done
        offset += done
        _consume(pending, done)
    return total


def _consume(pending: list[memoryview], done: int) -> None:
    """Drop the first ``done`` bytes of ``pending`` after a short vectored transfer (whole buffers, then a prefix)."""
    while pending and done >= pending[0].nbytes:
        done -= pending[0].nbytes
        pending.pop(0)
    if pending and done:
        pending[0] = pending[0][done:]


@dataclass
class _PerThread(threading.local):
    header: memoryview | None = None


class DirectIO:
    """Decides, per I/O, whether O_DIRECT can be used (FS-7).

    O_DIRECT needs the buffer address, every length and the file offset
    aligned. It is tried only when the actual buffers of this I/O are aligned
    to :data:`ALIGN` (the real slot row, not a probe page), and a filesystem
    (by ``st_dev``) that refuses it once (EINVAL at open, read or write) is
    never asked again: that I/O is redone buffered.
    """

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self._refused: set[int] = set()
        self._lock = threading.Lock()
        self._local = _PerThread()
        self.direct_ios = 0
        self.buffered_ios = 0

    def header_buffer(self) -> memoryview:
        """This thread's aligned 4 KiB header buffer."""
        buf = self._local.header
        if buf is None:
            buf = aligned_buffer(ALIGN)
            self._local.header = buf
        return buf

    def usable(self, dev: int, row_address: int, row_len: int) -> bool:
        """True if O_DIRECT may be tried for a row at ``row_address`` on device ``dev``."""
        if self.mode == "off" or not O_DIRECT:
            return False
        if row_address % ALIGN or row_len % ALIGN:
            return False
        with self._lock:
            return dev not in self._refused

    def refuse(self, dev: int, why: BaseException) -> None:
        """Remember that filesystem ``dev`` refused O_DIRECT; later I/O there is buffered."""
        with self._lock:
            if dev in self._refused:
                return
            self._refused.add(dev)
        _log.info("kvproto-fs: O_DIRECT refused on device %#x (%s); using buffered I/O there", dev, why)

    def count(self, direct: bool) -> None:
        with self._lock:
            if direct:
                self.direct_ios += 1
            else:
                self.buffered_ios += 1


def link_refused(exc: OSError) -> bool:
    """True if ``os.link`` failed because the filesystem does not do hard links (fall back to replace)."""
    return exc.errno in _LINK_REFUSED


def probe_direct(directory: str, ops: FileOps | None = None) -> OSError | None:
    """Write and read one aligned page with O_DIRECT in ``directory``; the error, or None if it works."""
    if not O_DIRECT:
        return OSError(errno.EINVAL, "this platform has no O_DIRECT")
    path = os.path.join(directory, f".direct-probe-{os.getpid()}-{threading.get_ident()}")
    buf = aligned_buffer(ALIGN)
    try:
        fd = (ops if ops is not None else FileOps()).open(path, os.O_CREAT | os.O_RDWR | O_DIRECT, 0o600)
        try:
            os.pwritev(fd, [buf], 0)
            os.preadv(fd, [buf], 0)
        finally:
            os.close(fd)
    except OSError as exc:
        return exc
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    return None
