"""A broken tier that loses its blocks across a restart only, because a restart is a new process
(TIER-18; issue 40, held-out round 9: a Bloom filter's bit positions and an LMCache adapter's drive,
each picked with Python's ``hash()``).

``hash()`` of ``str`` and ``bytes`` is salted per process (``PYTHONHASHSEED``). Inside one interpreter, and
in a child it forks, every instance agrees where a block lies; a restarted engine does not. The crash
check's writers (TIER-24) get another process's ``hash()`` in the tier's own code, and a clean writer's
round must then be seen in full. ``RESTART_GALLERY`` maps the target to the check it must fail;
gallery_index.py gathers it into ``GALLERY``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

from kvproto.testing import TierSpec, fresh_directory
from kvproto.tierkit import BlobTier, BlobTierConfig, Published

from kvproto_fs._io import read_full, write_full
from tests.kvproto.testing.gallery import _QUICK
from tests.kvproto.testing.gallery_io import _Files
from tests.kvproto.testing.gallery_registry import Gallery

__all__ = ["RESTART_GALLERY", "HashShardedFiles", "hash_sharded_files"]

RESTART_GALLERY = Gallery()
"""This module's targets, each registered by its factory's ``fails`` decorator (gallery_registry.py)."""

_SHARDS = 4


class _ShardedFiles(_Files):
    """Blobs as files spread over ``_SHARDS`` folders of their namespace, the folder picked by
    ``hash(name)`` (the bug: another process picks another folder)."""

    def _path(self, name: str) -> Path:
        namespace, _, rest = name.partition("/")
        return self.root / namespace / f"shard{hash(name) % _SHARDS}" / rest

    def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        final = self._path(name)
        if final.exists():
            return Published.EXISTED
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.root / name.split("/", 1)[0] / "tmp" / uuid.uuid4().hex
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            write_full(self.ops, fd, parts, 0)
        finally:
            os.close(fd)
        return self.link_in(tmp, final)

    def read_into(self, name: str, buffers: Sequence[memoryview]) -> int:
        fd = os.open(self._path(name), os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            got = read_full(self.ops, fd, buffers, 0)
            return size if got == min(size, sum(b.nbytes for b in buffers)) else got
        finally:
            os.close(fd)

    def sizes(self, names: Sequence[str]) -> Sequence[int | None]:
        out: list[int | None] = []
        for name in names:
            try:
                out.append(os.stat(self._path(name)).st_size)
            except FileNotFoundError:
                out.append(None)
        return out

    def delete(self, name: str) -> None:
        self._path(name).unlink(missing_ok=True)

    def list_blobs(self, namespace: str) -> Iterator[tuple[str, int]]:
        base = self.root / namespace
        for path in base.glob("shard*/**/*.kvb"):
            rest = path.relative_to(base).parts[1:]  # the shard folder is no part of the name
            yield f"{namespace}/{'/'.join(rest)}", path.stat().st_size


class HashShardedFiles(BlobTier):
    """A persistent file tier whose blobs lie in ``hash(name)``-picked folders: every block is where this
    process looks for it, and a restarted engine loses three in four (its loads find no file)."""

    def __init__(self, buffer: memoryview, *, root: Path | None = None) -> None:
        self.root = fresh_directory("kvproto-gallery-sharded-") if root is None else root
        files = _ShardedFiles(self.root, one_call=False, close_on_error=True)
        config = BlobTierConfig(persistent=True, start_in_background=False)
        super().__init__(files, buffer, config, name="hash-sharded-files")


def _reopen(tier: HashShardedFiles, buffer: memoryview) -> HashShardedFiles:
    return HashShardedFiles(buffer, root=tier.root)


@RESTART_GALLERY.fails("test_a_killed_writer_leaves_no_false_hit", "TIER-18", "Python's per-process hash()")
def hash_sharded_files() -> TierSpec:
    return TierSpec("hash-sharded-files", "secondary", HashShardedFiles, hooks={"reopen": _reopen}, limits=_QUICK,
                    tier_class=HashShardedFiles)
