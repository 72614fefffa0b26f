"""The storage half of a file backend for the gallery's broken file tiers (gallery_faults.py,
gallery_io.py): blobs as files under ``root``, named by their blob names. Each gallery backend adds
its own ``publish`` and ``read_into`` (where its bug is) to what is here, which has none."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

from kvproto.tierkit import Published


class FileBlobs:
    """Existence (``sizes``), ``delete``, the restart scan's ``list_blobs`` and ``clear`` of blobs
    stored as files ``root / name``: the honest part of a :class:`kvproto.tierkit.BlobBackend`."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def prepare(self, namespace: str) -> None:
        (self.root / namespace).mkdir(parents=True, exist_ok=True)

    def path_of(self, name: str) -> Path:
        """The file of blob ``name``: ``root / name`` (a subclass may place blobs otherwise)."""
        return self.root / name

    def sizes(self, names: Sequence[str]) -> Sequence[int | None]:
        out: list[int | None] = []
        for name in names:
            try:
                out.append(os.stat(self.path_of(name)).st_size)
            except FileNotFoundError:
                out.append(None)
        return out

    @staticmethod
    def link_in(tmp: Path, final: Path) -> Published:
        """Give the written temporary file ``tmp`` its final name, create-if-absent (a hard link: the
        first writer's blob stays), and remove the temporary name either way."""
        try:
            os.link(tmp, final)
        except FileExistsError:
            return Published.EXISTED
        finally:
            tmp.unlink()
        return Published.CREATED

    def delete(self, name: str) -> None:
        self.path_of(name).unlink(missing_ok=True)

    def list_blobs(self, namespace: str) -> Iterator[tuple[str, int]]:
        base = self.root / namespace
        for path in base.rglob("*.kvb"):
            yield f"{namespace}/{path.relative_to(base).as_posix()}", path.stat().st_size

    def clear(self, namespace: str) -> None:
        shutil.rmtree(self.root / namespace, ignore_errors=True)
        self.prepare(namespace)

    def close(self) -> None:
        return None
