"""Broken tiers for faults inside a tier's own transfer code (issue 17, section 1; TIER-30, TIER-31):
BlobTiers over a small file backend whose system calls go through kvproto-fs's
:class:`~kvproto_fs._conformance.KitFileOps`, so the kit's ``short_io`` and ``fail_io`` hooks reach
them. Each has one bug the kit passed while its faults stopped at the backend's entry points.

``IO_GALLERY`` maps each ``kvproto conform`` target to the check and clause it must fail on;
gallery_index.py gathers it into ``GALLERY``.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

from kvproto.testing import FaultyBackend, TierSpec
from kvproto.tierkit import BlobTier, BlobTierConfig, Published

from kvproto_fs._conformance import KitFileOps
from kvproto_fs._io import read_full, write_full
from tests.kvproto.testing.gallery import _QUICK, Expected

_roots: list[Path] = []


def _fresh_root() -> Path:
    if not _roots:
        _roots.append(Path(tempfile.mkdtemp(prefix="kvproto-gallery-io-")))
        atexit.register(shutil.rmtree, _roots[0], True)
    return Path(tempfile.mkdtemp(dir=_roots[0]))


class _Files:
    """Blobs as files (temp file + link, create-if-absent), every read and write through ``ops``.
    ``one_call``: one ``pwritev``/``preadv`` per blob, its count never looked at; ``close_on_error``:
    a write that raises closes its file."""

    def __init__(self, root: Path, *, one_call: bool, close_on_error: bool) -> None:
        self.root = root
        self.ops = KitFileOps()
        self._one_call = one_call
        self._close_on_error = close_on_error

    def prepare(self, namespace: str) -> None:
        (self.root / namespace / "tmp").mkdir(parents=True, exist_ok=True)

    def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        final = self.root / name
        if final.exists():
            return Published.EXISTED
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.root / name.split("/", 1)[0] / "tmp" / uuid.uuid4().hex
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            if self._one_call:
                self.ops.pwritev(fd, list(parts), 0)  # the bug of one_call: a short write is taken for all of it
            else:
                write_full(self.ops, fd, parts, 0)
        except OSError:
            if self._close_on_error:
                os.close(fd)
            tmp.unlink()
            raise
        os.close(fd)
        try:
            os.link(tmp, final)
        except FileExistsError:
            return Published.EXISTED
        finally:
            tmp.unlink()
        return Published.CREATED

    def read_into(self, name: str, buffers: Sequence[memoryview]) -> int:
        fd = os.open(self.root / name, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if self._one_call:
                self.ops.preadv(fd, list(buffers), 0)  # the bug of one_call: a short read is taken for all of it
                return size
            got = read_full(self.ops, fd, buffers, 0)
            return size if got == min(size, sum(b.nbytes for b in buffers)) else got
        finally:
            os.close(fd)

    def sizes(self, names: Sequence[str]) -> Sequence[int | None]:
        out: list[int | None] = []
        for name in names:
            try:
                out.append(os.stat(self.root / name).st_size)
            except FileNotFoundError:
                out.append(None)
        return out

    def delete(self, name: str) -> None:
        (self.root / name).unlink(missing_ok=True)

    def list_blobs(self, namespace: str) -> Iterator[tuple[str, int]]:
        base = self.root / namespace
        for path in base.rglob("*.kvb"):
            yield f"{namespace}/{path.relative_to(base).as_posix()}", path.stat().st_size

    def clear(self, namespace: str) -> None:
        shutil.rmtree(self.root / namespace, ignore_errors=True)
        (self.root / namespace / "tmp").mkdir(parents=True, exist_ok=True)

    def close(self) -> None:
        return None


class _FileTier(BlobTier):
    def __init__(self, buffer: memoryview, *, one_call: bool, close_on_error: bool, name: str) -> None:
        self.files = _Files(_fresh_root(), one_call=one_call, close_on_error=close_on_error)
        config = BlobTierConfig(shared=False, start_in_background=False)
        super().__init__(self.files, buffer, config, name=name, wrap=FaultyBackend)


class OneCallIo(_FileTier):
    """Bug: one ``pwritev`` per store and one ``preadv`` per load, their counts never looked at: a
    short write stores a truncated blob, a short read serves a partly read one (its size taken from
    the file)."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, one_call=True, close_on_error=True, name="one-call-io")


class LeaksOnIoError(_FileTier):
    """Bug: a write that raises (EIO, ENOSPC) leaves its file open: every failed store leaks a
    descriptor, until the process runs out."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, one_call=False, close_on_error=False, name="leaks-on-io-error")


def _short_io(tier: _FileTier, max_bytes: int) -> None:
    tier.files.ops.max_bytes = max_bytes


def _fail_io(tier: _FileTier, n: int) -> None:
    tier.files.ops.fail = n


def _spec(cls: type[_FileTier]) -> TierSpec:
    return TierSpec(
        cls.__name__, "secondary", cls, limits=_QUICK, tier_class=cls,
        hooks={"short_io": _short_io, "fail_io": _fail_io},
    )


def one_call_io() -> TierSpec:
    return _spec(OneCallIo)


def leaks_on_io_error() -> TierSpec:
    return _spec(LeaksOnIoError)


_HERE = __name__
IO_GALLERY: dict[str, Expected] = {
    f"{_HERE}:one_call_io": Expected("test_short_transfers_move_every_byte", "TIER-30", "but its load failed"),
    f"{_HERE}:leaks_on_io_error": Expected(
        "test_io_errors_inside_transfers_fail_cleanly", "TIER-31", "a failed transfer must close what it opened"
    ),
}
