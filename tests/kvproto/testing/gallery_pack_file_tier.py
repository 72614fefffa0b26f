"""Gallery (KIT-13): held-out round 10, written from the public docs by someone who had not read the kit
and measured before anyone looked (the kit passed it then); it joined the gallery after.
Bug: the start-up scan collects tombstones and reset markers and applies them after its loop, not in
pack order, so a restart drops every block stored after a ``reset_cache`` (or published again after its
deletion). The kit now stores after a reset and restarts (TIER-18).

A secondary tier whose blobs live in ONE append-only tar file ("pack file") with an in-memory index.

Why a tar: one file per node instead of millions of small files (inode pressure on the cache disk),
sequential appends, and the pack stays inspectable with plain ``tar tvf``. Each blob is a ustar member
(``<namespace>/<aa>/<bb>/<digest>.kvb``); a deletion appends a zero-length tombstone member
``<name>.del``; ``reset_cache`` appends one ``<namespace>/.cleared`` marker. The index (name -> data
offset, size) is rebuilt by scanning the member headers at start-up; appends take ``flock`` on the pack
so that two instances over one pack never interleave their members, and a torn member at the tail
(a writer killed mid-append) is cut off by the start-up scan.

The storage I/O is :class:`TarPackBackend` (a :class:`kvproto.tierkit.BlobBackend`);
:class:`kvproto.tierkit.BlobTier` does the rest.
"""

from __future__ import annotations

import fcntl
import os
import tarfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kvproto import OffloadKey, envelope as env
from kvproto.tierkit import BlobBackend, BlobTier, BlobTierConfig, Published

from tests.kvproto.testing.gallery_registry import Gallery

if TYPE_CHECKING:
    from kvproto.testing import TierSpec

__all__ = ["TarPackBackend", "TarPackTier", "conformance_spec"]

_BLOCK = 512
_NUL_BLOCK = b"\0" * _BLOCK
_TOMBSTONE = ".del"
_CLEARED = "/.cleared"


def _write_all(fd: int, parts: Sequence[bytes | memoryview]) -> None:
    """Append every byte of ``parts`` (O_APPEND fd; a short write continues where it stopped)."""
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    while views:
        n = os.writev(fd, views)
        while views and n >= views[0].nbytes:
            n -= views[0].nbytes
            views.pop(0)
        if views and n:
            views[0] = views[0][n:]


def _pread_exact(fd: int, buffers: Sequence[memoryview], offset: int) -> None:
    """Fill ``buffers`` from ``offset`` (a short read continues; EOF before the end is an error)."""
    views = [b for b in buffers if b.nbytes]
    while views:
        n = os.preadv(fd, views, offset)
        if n == 0:
            raise OSError(f"tar pack truncated at offset {offset}")
        offset += n
        while views and n >= views[0].nbytes:
            n -= views[0].nbytes
            views.pop(0)
        if views and n:
            views[0] = views[0][n:]


class TarPackBackend:
    """Blobs as members of one ustar pack file; reads are ``preadv`` at the member's data offset."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()  # this instance's threads; flock orders the instances
        self._index: dict[str, tuple[int, int]] = {}  # name -> (data offset, size)

    # -- the scan ---------------------------------------------------------------------------------

    def _members(self, end: int) -> tuple[list[tuple[str, int, int]], int]:
        """Every complete member as (name, data offset, size), and where the last complete one ends."""
        found: list[tuple[str, int, int]] = []
        off = 0
        while off + _BLOCK <= end:
            head = os.pread(self._fd, _BLOCK, off)
            if len(head) < _BLOCK or head == _NUL_BLOCK:
                break
            try:
                info = tarfile.TarInfo.frombuf(head, "utf-8", "surrogateescape")
            except tarfile.HeaderError:
                break  # a torn header: the tail of a killed append
            data = off + _BLOCK
            if data + info.size > end:
                break  # a torn member
            found.append((info.name, data, info.size))
            off = data + info.size + (-info.size) % _BLOCK
        return found, off

    def _scan(self) -> dict[str, tuple[int, int]]:
        """Rebuild the index from the pack (flock held): later members win, tombstones and clears remove."""
        end = os.fstat(self._fd).st_size
        members, good_end = self._members(end)
        if good_end < end:
            os.ftruncate(self._fd, good_end)  # cut a torn tail so that later appends stay readable
        live: dict[str, tuple[int, int]] = {}
        deleted: set[str] = set()
        cleared: set[str] = set()
        for name, data, size in members:
            if name.endswith(_TOMBSTONE):
                deleted.add(name[: -len(_TOMBSTONE)])
            elif name.endswith(_CLEARED):
                cleared.add(name[: -len(_CLEARED)] + "/")
            else:
                live[name] = (data, size)  # a later copy of the same name replaces the earlier one
        # tombstones are only ever appended after the member they delete: apply them once, at the end
        for name in deleted:
            live.pop(name, None)
        for prefix in cleared:
            for name in [n for n in live if n.startswith(prefix)]:
                del live[name]
        return live

    def _append(self, name: str, parts: Sequence[bytes | memoryview], size: int) -> int:
        """Append one member (flock held by the caller); returns its data offset."""
        info = tarfile.TarInfo(name)
        info.size = size
        info.mode = 0o644
        info.mtime = int(time.time())
        head = info.tobuf(format=tarfile.USTAR_FORMAT)
        start = os.fstat(self._fd).st_size
        _write_all(self._fd, [head, *parts, b"\0" * ((-size) % _BLOCK)])
        return start + len(head)

    # -- BlobBackend --------------------------------------------------------------------------------

    def prepare(self, namespace: str) -> None:
        with self._lock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                self._index = self._scan()
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        with self._lock:
            if name in self._index:
                return Published.EXISTED
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                data = self._append(name, parts, size)
                os.fdatasync(self._fd)
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            self._index[name] = (data, size)  # readers find it only once it is whole
        return Published.CREATED

    def read_into(self, name: str, buffers: Sequence[memoryview]) -> int:
        with self._lock:
            found = self._index.get(name)
        if found is None:
            raise FileNotFoundError(name)
        data, size = found  # members are never rewritten: the bytes stay valid after the lock
        want: list[memoryview] = []
        left = size
        for buf in buffers:
            n = min(buf.nbytes, left)
            want.append(buf[:n])
            left -= n
        _pread_exact(self._fd, want, data)
        return size

    def sizes(self, names: Sequence[str]) -> list[int | None]:
        with self._lock:
            return [e[1] if (e := self._index.get(n)) is not None else None for n in names]

    def delete(self, name: str) -> None:
        with self._lock:
            if self._index.pop(name, None) is None:
                return
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                self._append(name + _TOMBSTONE, [], 0)
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def list_blobs(self, namespace: str) -> Iterator[tuple[str, int]]:
        prefix = namespace + "/"
        with self._lock:
            found = [(n, e[1]) for n, e in self._index.items() if n.startswith(prefix)]
        yield from found

    def clear(self, namespace: str) -> None:
        prefix = namespace + "/"
        with self._lock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                self._append(namespace + _CLEARED, [], 0)
                os.fdatasync(self._fd)
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            for name in [n for n in self._index if n.startswith(prefix)]:
                del self._index[name]

    def close(self) -> None:
        with self._lock:
            os.close(self._fd)


class TarPackTier(BlobTier):
    """:class:`BlobTier` over a :class:`TarPackBackend` at ``path`` (private: one instance writes at a time)."""

    def __init__(
        self,
        buffer: memoryview,
        path: Path | str,
        *,
        layout: Mapping[str, str | int | float | bool | None] | None = None,
        name: str = "tarpack",
        wrap: Callable[[BlobBackend], BlobBackend] | None = None,
    ) -> None:
        self.path = Path(path)
        config = BlobTierConfig(layout=dict(layout or {}), read_threads=2, write_threads=2)
        super().__init__(TarPackBackend(self.path), buffer, config, name=name, wrap=wrap)


def conformance_spec() -> TierSpec:
    """``kvproto conform tests.kvproto.testing.gallery_pack_file_tier:conformance_spec``: a fresh pack file per tier."""
    from kvproto.testing import TierSpec, fresh_directory

    def read_block(tier: TarPackTier, key: OffloadKey) -> bytes | None:
        backend = TarPackBackend(tier.path)
        try:
            backend.prepare("")
            name = tier.name_of(key)
            (size,) = backend.sizes([name])
            if size is None:
                return None
            out = memoryview(bytearray(size))
            backend.read_into(name, [out])
            return bytes(out[env.HEADER_BYTES:])
        finally:
            backend.close()

    return TierSpec(
        "tarpack",
        "secondary",
        lambda buffer: TarPackTier(buffer, fresh_directory("kvproto-tarpack-") / "pack.tar"),
        hooks={
            "reopen": lambda tier, buffer: TarPackTier(buffer, tier.path),
            "reopen_other_layout": lambda tier, buffer: TarPackTier(buffer, tier.path, layout={"model": "other"}),
            "read_block": read_block,
        },
        tier_class=TarPackTier,
        description="TarPackTier(buffer, <fresh directory>/pack.tar)",
    )


PACK_FILE_GALLERY = Gallery()
"""This module's target (gallery_registry.py); gallery_index.py gathers it into ``GALLERY``."""


@PACK_FILE_GALLERY.fails("test_blocks_stored_after_a_reset_outlive_a_restart", "TIER-18", "stored after a reset_cache")
def applies_its_reset_markers_last() -> TierSpec:
    return conformance_spec()
