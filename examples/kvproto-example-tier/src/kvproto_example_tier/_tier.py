"""``FileTier``: its storage I/O is ``DirBackend`` (a :class:`kvproto.tierkit.BlobBackend`); BlobTier does
the rest (jobs, the checksummed envelope, the index rebuilt at start, verdicts, events, reset)."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kvproto import OffloadKey, envelope as env
from kvproto.tierkit import BlobBackend, BlobTier, BlobTierConfig, Published

if TYPE_CHECKING:
    from kvproto.testing import TierSpec

__all__ = ["DirBackend", "FileTier", "conformance_spec"]


class DirBackend:
    """Blobs as files under ``root``: written to a unique temp file, then renamed into place."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def prepare(self, namespace: str) -> None:
        (self.root / namespace).mkdir(parents=True, exist_ok=True)

    def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        path = self.root / name
        if path.exists():
            return Published.EXISTED  # first writer wins; BlobTier verifies every load anyway
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex}.tmp")
        with open(tmp, "wb") as f:
            for part in parts:
                f.write(part)
        os.replace(tmp, path)  # atomic: readers see no file or the whole one
        return Published.CREATED

    def read_into(self, name: str, buffers: Sequence[memoryview]) -> int:
        with open((self.root / name), "rb", buffering=0) as f:  # FileNotFoundError: the block is gone
            for buf in buffers:
                f.readinto(buf)
            return os.fstat(f.fileno()).st_size

    def sizes(self, names: Sequence[str]) -> list[int | None]:
        return [os.stat(p).st_size if (p := self.root / n).is_file() else None for n in names]

    def delete(self, name: str) -> None:
        (self.root / name).unlink(missing_ok=True)

    def list_blobs(self, namespace: str) -> Iterator[tuple[str, int]]:
        for path in (self.root / namespace).rglob("*.kvb"):
            yield path.relative_to(self.root).as_posix(), path.stat().st_size

    def clear(self, namespace: str) -> None:
        shutil.rmtree(self.root / namespace, ignore_errors=True)

    def close(self) -> None:
        pass


class FileTier(BlobTier):
    """The example tier: :class:`BlobTier` over a :class:`DirBackend`, one worker each way, jobs reported whole."""

    def __init__(self, buffer: memoryview, root: Path, *, name: str = "example-file") -> None:
        self.root = root
        backend: BlobBackend = DirBackend(root)
        config = BlobTierConfig(read_threads=1, write_threads=1, partial_jobs=False, start_in_background=False)
        super().__init__(backend, buffer, config, name=name)


def conformance_spec() -> TierSpec:
    """How ``kvproto conform example-file`` builds this tier: a fresh empty directory per tier, each under
    one temporary parent that the kit's process removes when it exits (``fresh_directory``)."""
    from kvproto.testing import TierSpec, fresh_directory

    def read_block(tier: FileTier, key: OffloadKey) -> bytes | None:
        path = tier.root / tier.name_of(key)
        return path.read_bytes()[env.HEADER_BYTES :] if path.exists() else None

    def seed_block(tier: FileTier, key: OffloadKey, data: bytes) -> None:
        DirBackend(tier.root).publish(tier.name_of(key), [memoryview(env.encode(key, data, tier.namespace))], 0)
        tier.vouch_for([key])

    def corrupt_on_read(tier: FileTier, keys: Iterable[OffloadKey]) -> None:
        for key in keys:
            path = tier.root / tier.name_of(key)
            data = bytearray(path.read_bytes())
            data[-1] ^= 0xFF
            path.write_bytes(bytes(data))

    return TierSpec(
        "example-file",
        "secondary",
        lambda buffer: FileTier(buffer, fresh_directory("kvproto-example-")),
        hooks={
            "reopen": lambda tier, buffer: FileTier(buffer, tier.root),
            "read_block": read_block,
            "seed_block": seed_block,
            "corrupt_on_read": corrupt_on_read,
        },
        tier_class=FileTier,
        description="kvproto_example_tier.FileTier(buffer, <fresh temporary directory>)",
    )
