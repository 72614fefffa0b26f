"""``RedisBackend``: the Redis/Valkey tier's storage I/O, a :class:`kvproto.tierkit.BlobBackend` over redis-py.

Blob ``name`` (``<namespace>/<aa>/<bb>/<digest>.kvb``, or ``<namespace>/manifest.json``) is the
string key ``<prefix>:<name>``. Every request goes through :class:`~kvproto_redis.RedisOps`
(REDIS-9) and runs on the engine's worker threads, never the scheduler's: a pipeline of ``SET NX``
per run of a store job's blocks (REDIS-3, TIERKIT-11), a pipeline of ``GET`` per run of a load job's,
each value copied into its slot row (REDIS-5), one pipeline of ``STRLEN`` + ``GETRANGE`` per existence
chunk (REDIS-6), ``UNLINK``, ``SCAN`` pages.

A HIT is not held (no ``HeldReads``: a value has no handle that outlives its deletion), so a key the
server evicts, expires or another instance deletes between the lookup and the load fails its load
(``FileNotFoundError``: the engine makes it MISS), counted in ``missing_on_load`` (REDIS-7). Where the
lookup's existence check read the envelope's checksum field, the load compares it: a value replaced
meanwhile fails too (``replaced_on_load``), never serves the new bytes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence

from cachetools import LRUCache

from kvproto.tierkit import MemoryBackend, Published

from kvproto_redis._config import RedisTierConfig
from kvproto_redis._ops import CHECKSUM_FIELD, Client, RedisOps
from kvproto_redis._stats import RedisTierStats

__all__ = ["PIPELINE_BYTES", "PIPELINE_KEYS", "RedisBackend", "short_error"]

_log = logging.getLogger("kvproto_redis")

_BLOCK_SUFFIX = ".kvb"
_MANIFEST = "manifest.json"
PIPELINE_KEYS = 32
"""The most blocks one pipeline of ``SET NX`` or ``GET`` carries (TIERKIT-11)."""
PIPELINE_BYTES = 2 << 20
"""The most bytes of blocks one such pipeline carries, unless a single block is larger."""
_SEEN_CHECKSUMS = 65536  # checksum fields seen by existence checks, not yet used by a load; the oldest go past it


class RedisBackend:
    """Blobs as string keys ``<prefix>:<name>`` of one Redis server or cluster (REDIS-2..REDIS-9).

    Counters go to ``stats`` (``stores_created``, ``already_present``, ``missing_on_load``,
    ``replaced_on_load``, ``failed_probes``), under the backend's own lock: the engine writes only
    the fields of :class:`~kvproto.tierkit.BlobTierStats`. ``owns_client``: :meth:`close` closes
    the client (a client given by the caller stays open).
    """

    def __init__(self, client: Client, config: RedisTierConfig, stats: RedisTierStats, *, tier_name: str,
                 ops: RedisOps | None = None, owns_client: bool = True) -> None:
        self.client = client
        self.ops = RedisOps() if ops is None else ops
        self.prefix = f"{config.prefix}:"
        self._ttl_ms = None if config.ttl_s is None else max(1, round(config.ttl_s * 1000))
        self._clear_bound_s = config.job_timeout_s
        self._stats = stats
        self._tier = tier_name
        self._owns_client = owns_client
        self._lock = threading.Lock()  # the counters above and the checksums seen
        self._seen: LRUCache[str, bytes] = LRUCache(_SEEN_CHECKSUMS)  # blob name -> checksum field its last probe read

    def key(self, name: str) -> str:
        """The Redis key of blob ``name``."""
        return self.prefix + name

    def _count(self, counter: str, n: int = 1) -> None:
        with self._lock:
            setattr(self._stats, counter, getattr(self._stats, counter) + n)

    # -- BlobBackend -----------------------------------------------------------------------

    def prepare(self, namespace: str) -> None:
        """Nothing to prepare: keys need no directories (the engine writes the manifest)."""

    def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        """One ``SET key value NX`` (``PX ttl`` with ``ttl_s``) of the joined parts (REDIS-3): the one copy
        of the row into the request. A key already there is :attr:`Published.EXISTED`, left as it is
        (the engine verifies every load; a damaged value is deleted by the load that finds it)."""
        created = self.ops.set_if_absent(self.client, self.key(name), b"".join(parts), self._ttl_ms)
        with self._lock:
            return self._published(name, created)

    def publish_batch_keys(self, blob_bytes: int) -> int:
        """How many blocks of ``blob_bytes`` one :meth:`publish_many` pipeline takes (TIERKIT-11, REDIS-3); 1 (key
        by key, through ``ops.set_if_absent``) where ``ops`` is of a class that changed ``set_if_absent`` but not
        ``set_if_absent_many``: a store never bypasses it (REDIS-9)."""
        return _pipeline_keys(self.ops, "set_if_absent", blob_bytes)

    def publish_many(self, blobs: Sequence[tuple[str, Sequence[memoryview], int]]) -> list[Published | Exception]:
        """:meth:`publish` of each blob in one pipeline of ``SET NX`` (REDIS-3): each answer its own, a SET the
        server refused (``maxmemory``, an ACL) its error; raises when the pipeline failed as a whole."""
        answers = self.ops.set_if_absent_many(
            self.client, [(self.key(name), b"".join(parts)) for name, parts, _ in blobs], self._ttl_ms)
        if len(answers) != len(blobs):
            raise RuntimeError(f"a pipeline of {len(blobs)} SET NX answered {len(answers)} replies")
        with self._lock:
            return [answer if isinstance(answer, Exception) else self._published(name, answer)
                    for (name, _, _), answer in zip(blobs, answers, strict=True)]

    def _published(self, name: str, created: bool) -> Published:
        """Under the lock: count a publish of ``name`` that created it or found it (REDIS-3)."""
        self._seen.pop(name, None)  # this instance wrote it (or found it): an earlier probe's field no longer applies
        if name.endswith(_BLOCK_SUFFIX):
            if created:
                self._stats.stores_created += 1
            else:
                self._stats.already_present += 1
        return Published.CREATED if created else Published.EXISTED

    def read_into(self, name: str, buffers: Sequence[memoryview]) -> int:
        """One ``GET``, copied into ``buffers`` in order; the value's size (REDIS-5, REDIS-7).

        No such key raises ``FileNotFoundError`` (counted ``missing_on_load``); so does a value whose
        envelope checksum field differs from the one the lookup's existence check read (replaced
        since, counted ``replaced_on_load``). Any other error is transient.
        """
        with self._lock:
            seen = self._seen.pop(name, None)
        answer = self._copied(name, self.ops.get(self.client, self.key(name)), seen, buffers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def read_batch_keys(self, blob_bytes: int) -> int:
        """How many blocks of ``blob_bytes`` one :meth:`read_many` pipeline takes (TIERKIT-11, REDIS-5); 1 (key by
        key, through ``ops.get``) where ``ops`` is of a class that changed ``get`` but not ``get_many`` (REDIS-9)."""
        return _pipeline_keys(self.ops, "get", blob_bytes)

    def read_many(self, reads: Sequence[tuple[str, Sequence[memoryview]]]) -> list[int | Exception]:
        """:meth:`read_into` of each blob from one pipeline of ``GET`` (REDIS-5, REDIS-7): each answer its own
        (a size, or the ``FileNotFoundError`` or error ``read_into`` would raise); raises when the pipeline
        failed as a whole."""
        with self._lock:
            seen = [self._seen.pop(name, None) for name, _ in reads]
        values = self.ops.get_many(self.client, [self.key(name) for name, _ in reads])
        if len(values) != len(reads):
            raise RuntimeError(f"a pipeline of {len(reads)} GET answered {len(values)} replies")
        return [self._copied(name, value, field, buffers)
                for (name, buffers), value, field in zip(reads, values, seen, strict=True)]

    def _copied(self, name: str, data: bytes | None | Exception, seen: bytes | None, buffers: Sequence[memoryview]
                ) -> int | Exception:
        """A GET's value of ``name`` copied into ``buffers``: its size, or what :meth:`read_into` raises for it."""
        if isinstance(data, Exception):
            return data
        if data is None:
            if name.endswith(_BLOCK_SUFFIX):
                self._count("missing_on_load")
            return FileNotFoundError(f"{self.key(name)}: no such key (evicted, expired or deleted since the lookup)")
        first, last = CHECKSUM_FIELD
        if seen is not None and data[first : last + 1] != seen:
            self._count("replaced_on_load")
            return FileNotFoundError(f"{self.key(name)}: replaced since the lookup read its checksum")
        return MemoryBackend.scatter(memoryview(data), buffers)

    def sizes(self, names: Sequence[str]) -> list[int | None]:
        """Each blob's size or ``None``, from one pipeline of ``STRLEN`` + ``GETRANGE`` (REDIS-6).

        The checksum field read for a block is kept for its load (REDIS-7). A key whose commands failed
        answers ``None`` (counted ``failed_probes``); raises only when every key failed (or the
        pipeline itself did: the server is unreachable).
        """
        answers = self.ops.probe(self.client, [self.key(n) for n in names])
        sizes: list[int | None] = []
        errors: list[BaseException] = []
        with self._lock:
            for name, answer in zip(names, answers, strict=True):
                if isinstance(answer, BaseException):
                    errors.append(answer)
                    sizes.append(None)
                    continue
                size, field = answer
                sizes.append(size or None)
                self._remember(name, field if size and name.endswith(_BLOCK_SUFFIX) else None)
            self._stats.failed_probes += len(errors)
        if errors:
            _log.warning("RedisTier %r: %d of %d existence checks failed (answered MISS): %s",
                         self._tier, len(errors), len(names), short_error(errors[0]))
            if len(errors) == len(names):
                raise errors[0]
        return sizes

    def _remember(self, name: str, field: bytes | None) -> None:
        """Keep the checksum field a probe read for ``name`` (None: forget it); the oldest go past the bound."""
        if field is None:
            self._seen.pop(name, None)
        else:
            self._seen[name] = field  # the least recently seen goes past _SEEN_CHECKSUMS

    def delete(self, name: str) -> None:
        """``UNLINK`` the key; an absent key is not an error."""
        with self._lock:
            self._seen.pop(name, None)
        self.ops.delete(self.client, [self.key(name)])

    def list_blobs(self, namespace: str) -> Iterator[tuple[str, int]]:
        """Every key under ``<prefix>:<namespace>/`` as ``(blob name, size)``: SCAN pages, sized by a probe each."""
        cut = len(self.prefix)
        for page in self.ops.scan(self.client, f"{self.key(namespace)}/*"):
            for key, answer in zip(page, self.ops.probe(self.client, page), strict=True):
                if not isinstance(answer, BaseException) and answer[0]:
                    yield key[cut:], answer[0]

    def clear(self, namespace: str) -> None:
        """``UNLINK`` every block key of ``namespace`` (not its manifest), SCAN page by page, within
        ``job_timeout_s`` (REDIS-10): a TimeoutError past it (the keys deleted stay deleted)."""
        manifest = self.key(f"{namespace}/{_MANIFEST}")
        deadline = time.monotonic() + self._clear_bound_s
        with self._lock:
            self._seen.clear()
        for page in self.ops.scan(self.client, f"{self.key(namespace)}/*"):
            self.ops.delete(self.client, [k for k in page if k != manifest])
            if time.monotonic() > deadline:
                raise TimeoutError(f"clearing {self.key(namespace)}/ took over {self._clear_bound_s} s")

    def close(self) -> None:
        """Close the client's connections (a client given by the caller is left open)."""
        if self._owns_client:
            self.client.close()


def _pipeline_keys(ops: RedisOps, single: str, blob_bytes: int) -> int:
    """Blocks of ``blob_bytes`` per pipeline (at most ``PIPELINE_KEYS`` and ``PIPELINE_BYTES``), or 1 where
    ``ops``'s class changed the one-key method ``single`` but not its pipeline ``<single>_many`` (REDIS-9)."""
    kind = type(ops)
    many = f"{single}_many"
    if getattr(kind, single) is not getattr(RedisOps, single) and getattr(kind, many) is getattr(RedisOps, many):
        return 1
    return max(1, min(PIPELINE_KEYS, PIPELINE_BYTES // max(1, blob_bytes)))


def short_error(exc: BaseException) -> str:
    """An error on one line: its type and its first line (never a password: redis-py does not echo one)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:300]}" if lines else type(exc).__name__
