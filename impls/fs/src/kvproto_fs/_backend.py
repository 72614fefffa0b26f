"""``FileBackend``: the filesystem tier's storage, a :class:`kvproto.tierkit.BlobBackend` over a directory (FS-2, FS-3, FS-7).

A blob named ``<ns>/<aa>/<bb>/<digest>.kvb`` is the file of that path under
``root``. Publish = a unique temp file in ``<root>/<ns>/tmp/`` + hard link to
the final name (first writer wins; ``os.replace`` where links are refused) +
unlink of the temp. Reads and writes go straight between the file and the
slot row (``preadv``/``pwritev``), with O_DIRECT where the row is aligned.
Every system call of a block goes through :class:`FileOps` (fault injection).
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import logging
import os
import shutil
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Literal

from kvproto.tierkit import Published

from kvproto_fs._io import ALIGN, DirectIO, FileOps, address_of, link_refused, read_full, write_full

__all__ = ["TMP_SUFFIX", "FileBackend"]

_log = logging.getLogger("kvproto_fs")

TMP_SUFFIX = ".tmp"


class FileBackend:
    """Blobs as files under ``root`` (FS-2); see the module docstring.

    ``count(counter, n)`` receives the backend's own counters
    (``swept_temps``, ``link_fallbacks``).
    """

    def __init__(
        self,
        root: Path,
        *,
        durability: Literal["none", "data", "full"],
        direct: DirectIO,
        temp_grace_s: float,
        ops: FileOps | None = None,
        name: str = "fs",
        count: Callable[[str, int], None] | None = None,
    ) -> None:
        self.root = root
        self._root_slash = os.path.join(os.fspath(root), "")
        self._durability = durability
        self.direct = direct
        self._grace = temp_grace_s
        self._ops = ops if ops is not None else FileOps()
        self._name = name
        self._count: Callable[[str, int], None] = count if count is not None else (lambda counter, n: None)
        self._dev = os.stat(root).st_dev
        self._pid_tag = f"{os.getpid()}"
        self._counter = itertools.count(1)

    def path(self, name: str) -> str:
        """The file of blob ``name``."""
        return os.path.join(self.root, name)

    # -- BlobBackend -----------------------------------------------------------------------

    def prepare(self, namespace: str) -> None:
        """Make ``tmp/``; sweep orphan temps and old trash (FS-2, FS-3, FS-14). The ``<aa>/<bb>``
        directories are made by the first publish into each (:meth:`_link`)."""
        (self.root / namespace / "tmp").mkdir(parents=True, exist_ok=True)
        self._sweep(namespace)

    def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        """Temp file + link, create-if-absent; EXISTED if a complete file is already there (FS-3)."""
        final = self.path(name)
        try:
            if os.stat(final).st_size == size:
                return Published.EXISTED  # content-addressed: a complete block is never rewritten
        except FileNotFoundError:
            pass
        ops = self._ops
        tmp = self._temp_name(name)
        direct = self._direct_ok(parts)
        fd = -1
        try:
            if direct:
                try:
                    fd = ops.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_DIRECT)
                    head = self.direct.header_buffer()
                    head[:] = parts[0]
                    write_full(ops, fd, [head, parts[1]], 0)
                except OSError as exc:
                    if exc.errno != errno.EINVAL:
                        raise
                    self.direct.refuse(self._dev, exc)
                    direct = False
                    if fd >= 0:
                        ops.close(fd)
                        fd = -1
                    os.unlink(tmp)
            if not direct:
                fd = ops.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
                write_full(ops, fd, parts, 0)
            self.direct.count(direct)
            if self._durability != "none":
                ops.fsync(fd)
            ops.close(fd)
            fd = -1
            published = self._link(tmp, final)
        except BaseException:
            if fd >= 0:
                try:
                    ops.close(fd)
                except OSError:
                    pass
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        if self._durability == "full":
            dfd = os.open(os.path.dirname(final), os.O_RDONLY)
            try:
                ops.fsync(dfd)
            finally:
                os.close(dfd)
        return published

    def read_into(self, name: str, buffers: Sequence[memoryview]) -> int:
        """``preadv`` the file into ``buffers`` (O_DIRECT when the row allows); its size (FS-6, FS-7)."""
        path = self.path(name)
        ops = self._ops
        direct = self._direct_ok(buffers)
        try:
            fd = ops.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
        except FileNotFoundError:
            raise
        except OSError as exc:
            if not direct or exc.errno != errno.EINVAL:
                raise
            self.direct.refuse(self._dev, exc)
            direct = False
            fd = ops.open(path, os.O_RDONLY)
        try:
            return self._read_fd(fd, buffers, direct)
        finally:
            ops.close(fd)

    def _read_fd(self, fd: int, buffers: Sequence[memoryview], direct: bool) -> int:
        """Read the file of ``fd`` into ``buffers`` (``direct``: it was opened with O_DIRECT); its size."""
        ops = self._ops
        want = sum(b.nbytes for b in buffers)
        if direct:
            head = self.direct.header_buffer()
            try:
                got = read_full(ops, fd, [head, buffers[1]], 0)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self.direct.refuse(self._dev, exc)
                direct = False
                _set_direct(ops, fd, on=False)
                got = read_full(ops, fd, buffers, 0)
            else:
                buffers[0][:] = head
        else:
            got = read_full(ops, fd, buffers, 0)
        self.direct.count(direct)
        size = ops.fstat(fd).st_size
        return size if got == min(size, want) else got  # a short read reports a truncated file

    # -- HeldReads (TIERKIT-6, FS-13) ------------------------------------------------------------

    held_reads = True
    """Blobs are files: an open descriptor keeps reading an unlinked file (FS-13)."""

    def open_held(self, name: str) -> int:
        """An open file descriptor on blob ``name``: it reads the same bytes after an unlink (FS-13)."""
        return self._ops.open(self._root_slash + name, os.O_RDONLY)  # a str join: it runs per HIT

    def read_held(self, handle: object, buffers: Sequence[memoryview]) -> int:
        """As :meth:`read_into`, from the descriptor opened at the HIT (O_DIRECT switched on when the row allows)."""
        if type(handle) is not int:
            raise TypeError(f"FileBackend.read_held: not a descriptor: {handle!r:.40}")
        return self._read_fd(handle, buffers, self._direct_ok(buffers) and _set_direct(self._ops, handle, on=True))

    def close_held(self, handle: object) -> None:
        """Close the descriptor."""
        if type(handle) is int:
            try:
                self._ops.close(handle)
            except OSError:
                pass

    def close_held_many(self, handles: Sequence[object]) -> None:
        """Close each descriptor of ``handles`` (each exactly once, as :meth:`close_held`; never raises).

        The descriptors are sorted; a run of consecutive numbers all in ``handles`` (every one of them ours)
        is closed in one ``closerange`` (``close_range``: one system call), the others one by one. A probe's
        worker opens a check's files one after another, so a request's HITs mostly form a few runs."""
        fds = sorted({h for h in handles if type(h) is int})
        if not fds:
            return
        ops = self._ops
        low = prev = fds[0]
        for fd in itertools.islice(fds, 1, None):
            if fd != prev + 1:
                _close_run(ops, low, prev)
                low = fd
            prev = fd
        _close_run(ops, low, prev)

    def open_sizes(self, names: Sequence[str]) -> tuple[list[int | None], list[object | None]]:
        """An existence check that holds what it finds (:class:`kvproto.tierkit.HeldExistence`, FS-13).

        One ``open`` per name: a found file stays open (the HIT's handle) and its size comes from
        ``lseek(SEEK_END)`` on the descriptor (no second path walk, no stat record); an absent one costs
        the failed open. Where opening fails for another reason (EMFILE, EACCES) the size is a ``stat``'s,
        as :meth:`sizes` answers, with no handle. A directory at a blob's name opens too: its "size" is
        what the filesystem reports for it, which is never an envelope's on ext4 and tmpfs; elsewhere such
        a name would answer present and its load fail as transient (a directory is never written there)."""
        sizes: list[int | None] = []
        handles: list[object | None] = []
        prefix = self._root_slash
        open_ = self._ops.open
        lseek, rdonly, end = os.lseek, os.O_RDONLY, os.SEEK_END  # locals: this loop runs per name
        try:
            for name in names:
                try:
                    fd = open_(prefix + name, rdonly)
                except (FileNotFoundError, NotADirectoryError):
                    sizes.append(None)
                    handles.append(None)
                    continue
                except OSError:  # EMFILE...: answer as sizes does; the lookup tries (and counts) again
                    sizes.append(self._stat_size(prefix + name))
                    handles.append(None)
                    continue
                handles.append(fd)
                try:
                    sizes.append(lseek(fd, 0, end))
                except OSError:
                    sizes.append(None)  # not a seekable file: not a blob
        except BaseException:
            for handle in handles:
                self.close_held(handle)
            raise
        return sizes, handles

    @staticmethod
    def _stat_size(path: str) -> int | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return st.st_size if stat.S_ISREG(st.st_mode) else None

    def sizes(self, names: Sequence[str]) -> list[int | None]:
        """``stat`` of each file: its size if it is a regular file, else None (FS-5)."""
        out: list[int | None] = []
        for name in names:
            try:
                st = os.stat(self.path(name))
            except OSError:
                out.append(None)
                continue
            out.append(st.st_size if stat.S_ISREG(st.st_mode) else None)
        return out

    def delete(self, name: str) -> None:
        """Unlink the file; a missing one is fine."""
        try:
            self._ops.unlink(self.path(name))
        except FileNotFoundError:
            pass

    def list_blobs(self, namespace: str) -> Iterator[tuple[str, int]]:
        """Every ``<aa>/<bb>/*.kvb`` file of the namespace, directory by directory (the restart scan)."""
        ns_dir = self.root / namespace
        ops = self._ops
        for top in _subdirs(ops, ns_dir):
            for sub in _subdirs(ops, ns_dir / top):
                try:
                    entries = list(ops.scandir(ns_dir / top / sub))
                except OSError:
                    continue
                for entry in entries:
                    try:
                        size = entry.stat(follow_symlinks=False).st_size
                    except OSError:
                        continue
                    yield f"{namespace}/{top}/{sub}/{entry.name}", size

    def clear(self, namespace: str) -> None:
        """Rename the namespace directory aside and delete it in the background (FS-10)."""
        ns_dir = self.root / namespace
        trash = self.root / f".trash-{namespace}-{uuid.uuid4().hex[:12]}"
        try:
            os.rename(ns_dir, trash)
        except FileNotFoundError:
            return
        except OSError:
            _log.warning("FsTier %r: could not move %s aside; deleting in place", self._name, ns_dir)
            trash = ns_dir
        if trash != ns_dir:
            (ns_dir / "tmp").mkdir(parents=True, exist_ok=True)
        threading.Thread(target=shutil.rmtree, args=(trash, True), name=f"kvproto-{self._name}-rm", daemon=True).start()

    def close(self) -> None:
        """Nothing to release: every file is closed after each operation."""

    # -- internals ---------------------------------------------------------------------------

    def _direct_ok(self, parts: Sequence[memoryview]) -> bool:
        """O_DIRECT for [4 KiB header, aligned row] only, on a filesystem that has not refused it (FS-7)."""
        if len(parts) != 2 or parts[0].nbytes != ALIGN or parts[1].readonly:
            return False
        row = parts[1]
        return self.direct.usable(self._dev, address_of(row), row.nbytes)

    def _temp_name(self, name: str) -> str:
        """Unique per writer (pid, thread, counter, random), never per key (FS-3)."""
        n = next(self._counter)
        namespace = name.split("/", 1)[0]
        return os.path.join(
            self.root, namespace, "tmp",
            f"{self._pid_tag}-{threading.get_ident()}-{n}-{uuid.uuid4().hex[:8]}{TMP_SUFFIX}",
        )

    def _link(self, tmp: str, final: str) -> Published:
        ops = self._ops
        parent = os.path.dirname(final)
        published = Published.CREATED
        for attempt in (0, 1):
            try:
                ops.link(tmp, final)
                break
            except FileExistsError:
                published = Published.EXISTED  # the first writer won: same key, same bytes
                break
            except FileNotFoundError:
                if attempt:
                    raise
                try:
                    os.mkdir(parent)  # the leaf <bb>, where its <aa> exists (FS-2)
                except FileExistsError:
                    pass
                except FileNotFoundError:
                    os.makedirs(parent, exist_ok=True)  # the first block under its <aa> (or after a reset)
            except OSError as exc:
                if not link_refused(exc):
                    raise
                self._count("link_fallbacks", 1)
                ops.replace(tmp, final)
                return Published.CREATED
        ops.unlink(tmp)
        return published

    def _sweep(self, namespace: str) -> None:
        now = time.time()
        swept = 0
        try:
            entries = list(self._ops.scandir(self.root / namespace / "tmp"))
        except FileNotFoundError:
            entries = []
        for entry in entries:
            if not entry.name.endswith(TMP_SUFFIX):
                continue
            try:
                if now - entry.stat(follow_symlinks=False).st_mtime >= self._grace:
                    os.unlink(entry.path)
                    swept += 1
            except OSError:
                continue
        for entry in self._ops.scandir(self.root):
            if entry.name.startswith(f".trash-{namespace}-"):
                shutil.rmtree(entry.path, ignore_errors=True)
        if swept:
            self._count("swept_temps", swept)


def _close_run(ops: FileOps, low: int, high: int) -> None:
    """Close descriptors ``low`` to ``high`` (included), each ours; never raises."""
    try:
        if low == high:
            ops.close(low)
        else:
            ops.closerange(low, high + 1)
    except OSError:
        pass


def _set_direct(ops: FileOps, fd: int, *, on: bool) -> bool:
    """Switch O_DIRECT on or off for ``fd``; False if the filesystem refuses (the read is then buffered)."""
    try:
        flags = ops.fcntl(fd, fcntl.F_GETFL)
        ops.fcntl(fd, fcntl.F_SETFL, (flags | os.O_DIRECT) if on else (flags & ~os.O_DIRECT))
    except OSError:
        return False
    return True


def _subdirs(ops: FileOps, path: Path) -> list[str]:
    """The two-character directories in ``path``, sorted; none if it cannot be listed (a reset removed it)."""
    try:
        return sorted(e.name for e in ops.scandir(path) if len(e.name) == 2 and e.is_dir(follow_symlinks=False))
    except OSError:
        return []
