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

from collections.abc import Iterator
from pathlib import Path

from kvproto.testing import TierSpec, fresh_directory
from kvproto.tierkit import BlobTier, BlobTierConfig

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

    def path_of(self, name: str) -> Path:
        namespace, _, rest = name.partition("/")
        return self.root / namespace / f"shard{hash(name) % _SHARDS}" / rest

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
