"""``MemoryBackend``: a :class:`~kvproto.tierkit.BlobBackend` in a dict (tests, examples, mutation testing)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

from kvproto.tierkit._backend import Published

__all__ = ["MemoryBackend"]


class MemoryBackend:
    """Blobs in a dictionary, guarded by a lock; every promise of :class:`BlobBackend` kept.

    Several tiers may share one instance (shared mode between in-process
    tiers). ``blobs`` is the dictionary itself: tests read and damage it.
    """

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def prepare(self, namespace: str) -> None:
        """Nothing to prepare."""

    def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        """Create-if-absent: the joined parts, or EXISTED if ``name`` is taken."""
        with self._lock:
            if name in self.blobs:
                return Published.EXISTED
        data = b"".join(parts)  # copy outside the lock; the check above is repeated below
        with self._lock:
            if name in self.blobs:
                return Published.EXISTED
            self.blobs[name] = data
        return Published.CREATED

    def read_into(self, name: str, buffers: Sequence[memoryview]) -> int:
        """Copy the blob's first bytes into ``buffers``; FileNotFoundError if absent."""
        with self._lock:
            data = self.blobs.get(name)
        if data is None:
            raise FileNotFoundError(name)
        return self.scatter(data, buffers)

    @staticmethod
    def scatter(data: bytes | memoryview, buffers: Sequence[memoryview]) -> int:
        """Copy ``data``'s first bytes into ``buffers``, one after another (a buffer past the end of
        ``data`` is left as it was); returns ``len(data)``, as ``read_into`` does. A memoryview is
        sliced without a copy of its own (a backend's ``read_into`` may hand its client's buffer)."""
        offset = 0
        size = len(data)
        for buf in buffers:
            n = max(0, min(buf.nbytes, size - offset))
            buf[:n] = data[offset : offset + n]
            offset += n
        return size

    def sizes(self, names: Sequence[str]) -> list[int | None]:
        """Each blob's length, or None."""
        with self._lock:
            return [len(b) if (b := self.blobs.get(n)) is not None else None for n in names]

    def delete(self, name: str) -> None:
        """Remove ``name`` if present."""
        with self._lock:
            self.blobs.pop(name, None)

    def list_blobs(self, namespace: str) -> Iterator[tuple[str, int]]:
        """A snapshot of the blobs under ``namespace/``."""
        prefix = namespace + "/"
        with self._lock:
            found = [(n, len(b)) for n, b in self.blobs.items() if n.startswith(prefix)]
        yield from found

    def clear(self, namespace: str) -> None:
        """Remove every blob under ``namespace/``."""
        prefix = namespace + "/"
        with self._lock:
            for name in [n for n in self.blobs if n.startswith(prefix)]:
                del self.blobs[name]

    def close(self) -> None:
        """Nothing to release (the blobs stay: another tier may use them)."""
