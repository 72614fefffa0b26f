"""The worker side of :class:`~kvproto.tierkit.BlobTier`: one key's store or load over a backend.

Everything here runs on the engine's worker threads, or (the ``*_async``
methods) on an asynchronous backend's event loop. A key's operation ends
in a :class:`KeyVerdict` and a *tick*: a number from one process-wide
counter taken at a point that orders it against deletions (TIERKIT-2).
"""

from __future__ import annotations

import enum
import itertools
import logging
import threading
from collections.abc import Callable, Sequence

from kvproto import envelope as env
from kvproto._keys import OffloadKey
from kvproto._results import unreachable
from kvproto.tierkit._backend import AsyncBlobBytes, BlobBackend, HeldReads, PublishBatches, Published, ReadBatches
from kvproto.tierkit._blob_async import LoopBackend

__all__ = ["SUFFIX", "BlobOps", "KeyVerdict", "blob_name", "short_error"]

_log = logging.getLogger("kvproto.tierkit")

SUFFIX = ".kvb"
"""The suffix of every block's blob name."""


def blob_name(namespace_hex: str, key: bytes) -> str:
    """``<namespace>/<aa>/<bb>/<digest>.kvb``: the name of ``key``'s blob (the fs and obj tiers' layout)."""
    digest = env.key_digest(key)
    return f"{namespace_hex}/{digest[:2]}/{digest[2:4]}/{digest}{SUFFIX}"


class KeyVerdict(enum.Enum):
    """How one key of a job ended."""

    CREATED = "created"  # store: this job published the blob; tick taken after
    EXISTED = "existed"  # store: already there (or known to the index); tick taken BEFORE looking
    FAILED = "failed"  # store: the backend raised
    LOADED = "loaded"  # load: verified bytes are in the slot row
    GONE = "gone"  # load: no such blob; tick taken BEFORE looking
    DAMAGED = "damaged"  # load: failed verification and was deleted; tick taken after the deletion
    FOREIGN = "foreign"  # load: another layout's or algorithm's blob at this name; left alone
    TRANSIENT = "transient"  # load: the read raised (EIO, EMFILE, timeout): the blob may still be there
    REFUSED = "refused"  # either: the tier was shut down when the job came; no I/O


class _Scratch(threading.local):
    def __init__(self) -> None:
        self.head = memoryview(bytearray(env.HEADER_BYTES))


class BlobOps:
    """One key's store or load: envelope, backend call, verification (TIERKIT-1)."""

    def __init__(
        self,
        backend: BlobBackend,
        *,
        tier_name: str,
        namespace: bytes,
        block_bytes: int,
        row: Callable[[int], memoryview],
        ticks: itertools.count[int],
        deleted: Callable[[OffloadKey, int], None],
        count: Callable[[str], None],
    ) -> None:
        self.backend = backend
        self.namespace = namespace
        self.namespace_hex = namespace.hex()
        self.block_bytes = block_bytes
        self.blob_bytes = env.HEADER_BYTES + block_bytes
        self._codec = env.EnvelopeCodec(namespace, block_bytes)  # ENV-7: the per-block work of the envelope
        self._tier = tier_name
        self._row = row
        self._ticks = ticks
        self._deleted = deleted
        self._count = count
        self._scratch = _Scratch()
        self._reader: tuple[object, AsyncBlobBytes | None] | None = None  # (backend, itself if AsyncBlobBytes)
        # TIERKIT-11: the most keys of a job one backend call takes (1: key by key), asked once
        self._publisher = backend if isinstance(backend, PublishBatches) else None
        self.store_run = 1 if self._publisher is None else self._publisher.publish_batch_keys(self.blob_bytes)
        self._batch_reader = backend if isinstance(backend, ReadBatches) else None
        self.load_run = 1 if self._batch_reader is None else self._batch_reader.read_batch_keys(self.blob_bytes)

    def name_of(self, key: bytes) -> str:
        """The blob name of ``key`` in this namespace."""
        return blob_name(self.namespace_hex, key)

    def tick(self) -> int:
        """The next tick (thread-safe: ``itertools.count`` is atomic)."""
        return next(self._ticks)

    def store(self, key: OffloadKey, slot: int) -> tuple[KeyVerdict, int]:
        """Publish slot row ``slot`` as ``key``'s envelope, create-if-absent."""
        before, name, parts = self._store_args(key, slot)
        try:
            published = self.backend.publish(name, parts, self.blob_bytes)
        except Exception as exc:
            return self._store_failed(key, exc, before)
        return self._stored(published, before)

    def store_many(self, keys: Sequence[OffloadKey], slots: Sequence[int]) -> list[tuple[KeyVerdict, int]]:
        """:meth:`store` of each key, their publishes in one :meth:`PublishBatches.publish_many` (TIERKIT-11).

        Each key ends on its own answer: a blob the batch failed fails its key alone (partial stores
        are reported as they are); a batch that raised, or answered the wrong number of blobs, fails
        them all. Every key's first tick is taken before the request, a CREATED one's second after it.
        """
        batch = self._publisher
        if batch is None:
            return [self.store(key, slot) for key, slot in zip(keys, slots, strict=True)]
        args = [self._store_args(key, slot) for key, slot in zip(keys, slots, strict=True)]
        try:
            answers = batch.publish_many([(name, parts, self.blob_bytes) for _, name, parts in args])
            if len(answers) != len(args):
                raise RuntimeError(f"publish_many answered {len(answers)} blobs of {len(args)}")
        except Exception as exc:
            return [self._store_failed(key, exc, before) for key, (before, _, _) in zip(keys, args, strict=True)]
        verdicts: list[tuple[KeyVerdict, int]] = []
        for key, (before, _, _), answer in zip(keys, args, answers, strict=True):
            if isinstance(answer, Exception):
                verdicts.append(self._store_failed(key, answer, before))
            else:
                verdicts.append(self._stored(answer, before))
        return verdicts

    async def store_async(self, io: LoopBackend, key: OffloadKey, slot: int) -> tuple[KeyVerdict, int]:
        """:meth:`store` on the backend's event loop (``io.inner``'s coroutine, within ``op_timeout_s``)."""
        before, name, parts = self._store_args(key, slot)
        try:
            published = await io.bounded(io.inner.publish(name, parts, self.blob_bytes))
        except Exception as exc:
            return self._store_failed(key, exc, before)
        return self._stored(published, before)

    def _store_args(self, key: OffloadKey, slot: int) -> tuple[int, str, tuple[memoryview, memoryview]]:
        before = next(self._ticks)
        row = self._row(slot)
        header = self._codec.header(key, row)
        return before, self.name_of(key), (memoryview(header), row)

    def _store_failed(self, key: OffloadKey, exc: Exception, before: int) -> tuple[KeyVerdict, int]:
        _log.warning("BlobTier %r: store of %s failed: %s: %s", self._tier, key.hex()[:16], type(exc).__name__,
                     short_error(exc))
        return KeyVerdict.FAILED, before

    def _stored(self, published: Published, before: int) -> tuple[KeyVerdict, int]:
        match published:
            case Published.CREATED:
                return KeyVerdict.CREATED, next(self._ticks)
            case Published.EXISTED:
                return KeyVerdict.EXISTED, before
            case _ as other:
                unreachable(other, where="BlobBackend.publish")

    def load(
        self, key: OffloadKey, slot: int, held: tuple[HeldReads, object] | None = None
    ) -> tuple[KeyVerdict, int]:
        """Read ``key``'s blob into slot row ``slot`` and verify it; delete it if damaged (TIERKIT-2, TIERKIT-3).

        ``held``: read from this handle, taken at the HIT (TIERKIT-6), not by name."""
        name = self.name_of(key)
        head = self._scratch.head
        row = self._row(slot)
        before = next(self._ticks)
        try:
            if held is None:
                size = self.backend.read_into(name, (head, row))
            else:
                size = held[0].read_held(held[1], (head, row))
        except Exception as exc:
            return self._loaded(key, name, head, row, exc, before)
        return self._loaded(key, name, head, row, size, before)

    def load_many(self, keys: Sequence[OffloadKey], slots: Sequence[int]) -> list[tuple[KeyVerdict, int]]:
        """:meth:`load` of each key (by name), their reads in one :meth:`ReadBatches.read_many` (TIERKIT-11).

        Each key ends on its own answer (gone, transient, damaged and deleted, loaded); a batch that
        raised, or answered the wrong number of reads, fails them all as transient errors.
        """
        batch = self._batch_reader
        if batch is None:
            return [self.load(key, slot) for key, slot in zip(keys, slots, strict=True)]
        names = [self.name_of(key) for key in keys]
        heads = [memoryview(bytearray(env.HEADER_BYTES)) for _ in keys]  # each its own: read in one call
        rows = [self._row(slot) for slot in slots]
        befores = [next(self._ticks) for _ in keys]
        try:
            sizes = batch.read_many([(name, (head, row)) for name, head, row in zip(names, heads, rows, strict=True)])
            if len(sizes) != len(keys):
                raise RuntimeError(f"read_many answered {len(sizes)} reads of {len(keys)}")
        except Exception as exc:
            return [self._read_failed(name, exc) for name in names]
        return [self._loaded(*each) for each in zip(keys, names, heads, rows, sizes, befores, strict=True)]

    def _loaded(self, key: OffloadKey, name: str, head: memoryview, row: memoryview, size: int | Exception,
                before: int) -> tuple[KeyVerdict, int]:
        """How a read of ``key``'s blob into ``head`` and ``row`` ended: its size, or what it raised."""
        if isinstance(size, FileNotFoundError):
            return KeyVerdict.GONE, before  # absent at some point after this tick: a store vouching later wins
        if isinstance(size, Exception):
            return self._read_failed(name, size)
        verdict = self._verify(key, name, head, row, size)
        if verdict is KeyVerdict.DAMAGED:
            return verdict, self.delete(key, damaged=True)
        return verdict, next(self._ticks)

    async def load_async(self, io: LoopBackend, key: OffloadKey, slot: int) -> tuple[KeyVerdict, int]:
        """:meth:`load` on the backend's event loop (each operation within ``op_timeout_s``)."""
        name = self.name_of(key)
        row = self._row(slot)
        before = next(self._ticks)
        inner = io.inner
        reader = self._bytes_reader(inner)  # the body as stored: copied and checked at once
        head = blob = memoryview(b"")
        size = 0
        try:
            if reader is not None:
                blob = await io.bounded(reader.read_bytes(name))
            else:
                head = memoryview(bytearray(env.HEADER_BYTES))  # its own: the loop interleaves many loads
                size = await io.bounded(inner.read_into(name, (head, row)))
        except FileNotFoundError:
            return KeyVerdict.GONE, before
        except Exception as exc:
            return self._read_failed(name, exc)
        verdict = self._verify(key, name, head, row, size) if reader is None else self._verify_copy(key, name, blob, row)
        if verdict is KeyVerdict.DAMAGED:
            try:
                await io.bounded(io.inner.delete(name))
            except Exception as exc:
                self._delete_failed(name, exc)
            else:
                self._count("damaged_removed")
            return verdict, self._note_deleted(key)
        return verdict, next(self._ticks)

    def _bytes_reader(self, inner: object) -> AsyncBlobBytes | None:
        """``inner`` if it is an :class:`AsyncBlobBytes`, else ``None``; asked once per backend object (a
        protocol ``isinstance`` walks the protocol's members each time: once per load was ~1% of a load's CPU)."""
        known = self._reader
        if known is None or known[0] is not inner:
            known = (inner, inner if isinstance(inner, AsyncBlobBytes) else None)
            self._reader = known
        return known[1]

    def _read_failed(self, name: str, exc: Exception) -> tuple[KeyVerdict, int]:
        _log.warning("BlobTier %r: reading %s failed (transient): %s: %s", self._tier, name, type(exc).__name__,
                     short_error(exc))
        return KeyVerdict.TRANSIENT, next(self._ticks)

    def _verify(self, key: OffloadKey, name: str, head: memoryview, row: memoryview, size: int) -> KeyVerdict:
        """LOADED, FOREIGN (left alone), or DAMAGED (the caller deletes it)."""
        try:
            if size == self.blob_bytes:
                self._codec.verify(key, head, row)  # verify_header (payload_len) + verify_payload, ENV-7
            else:
                env.verify_payload(self._header(key, head, size), row)  # raises: the length is wrong
        except env.EnvelopeError as exc:
            return self._rejected(name, exc)
        return KeyVerdict.LOADED

    def _verify_copy(self, key: OffloadKey, name: str, blob: memoryview, row: memoryview) -> KeyVerdict:
        """As :meth:`_verify`, for the whole blob as the backend returned it (:class:`AsyncBlobBytes`): its
        payload is copied into ``row`` and checked in the same pass (a damaged one leaves unusable bytes there)."""
        try:
            header = self._header(key, blob[: env.HEADER_BYTES], blob.nbytes)
            env.copy_verified(header, blob[env.HEADER_BYTES :], row)
        except env.EnvelopeError as exc:
            return self._rejected(name, exc)
        return KeyVerdict.LOADED

    def _header(self, key: OffloadKey, head: memoryview, size: int) -> env.Header:
        """The blob's checked header, given its first bytes and its size; EnvelopeError at the first mismatch."""
        if size < env.HEADER_BYTES:
            raise env.EnvelopeError("length", f"blob holds {size} bytes, shorter than a header")
        header = env.verify_header(head, key=key, namespace=self.namespace, payload_len=self.block_bytes)
        if size != self.blob_bytes:
            raise env.EnvelopeError("length", f"blob holds {size} bytes, expected {self.blob_bytes}")
        return header

    def _rejected(self, name: str, exc: env.EnvelopeError) -> KeyVerdict:
        """FOREIGN (left alone) for another layout's or algorithm's blob, else DAMAGED (the caller deletes it)."""
        if exc.field in ("namespace", "algorithm"):
            _log.warning("BlobTier %r: %s holds %s; leaving it alone (a configuration mismatch)", self._tier, name, exc)
            self._count("foreign_left")
            return KeyVerdict.FOREIGN
        _log.warning("BlobTier %r: %s failed verification (%s); deleting it", self._tier, name, exc)
        return KeyVerdict.DAMAGED

    def delete(self, key: OffloadKey, *, damaged: bool) -> int:
        """Delete ``key``'s blob, then tell the engine (with the tick after) so a store that found it
        a moment ago does not vouch for it (TIERKIT-2). Returns that tick."""
        name = self.name_of(key)
        try:
            self.backend.delete(name)
        except Exception as exc:
            self._delete_failed(name, exc)
        else:
            if damaged:
                self._count("damaged_removed")
        return self._note_deleted(key)

    def _delete_failed(self, name: str, exc: Exception) -> None:
        _log.warning("BlobTier %r: could not delete %s: %s: %s", self._tier, name, type(exc).__name__, short_error(exc))

    def _note_deleted(self, key: OffloadKey) -> int:
        tick = next(self._ticks)
        self._deleted(key, tick)
        return tick


def short_error(exc: BaseException) -> str:
    """The first line of an error (object stores' messages carry long dumps)."""
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
