"""The storage seam of :class:`~kvproto.tierkit.BlobTier`: a backend is a secondary tier's I/O, nothing else.

A backend stores opaque *blobs* under names the engine chooses. It knows
nothing of keys, slots, jobs, envelopes, verdicts or budgets: the engine
owns the naming (``<namespace>/<aa>/<bb>/<digest>.kvb``, so the filesystem
and object-store tiers stay interoperable), the :mod:`kvproto.envelope`
around each block, verification, and every piece of tier state
(TIERKIT-1).

Two flavours, the same methods:

* :class:`BlobBackend`: plain methods, called on the engine's worker threads
  (files: ``pwritev``/``preadv`` straight from and into the slot row).
* :class:`AsyncBlobBackend`: coroutines, run on one event loop the engine
  keeps in a background thread (obstore and other asyncio clients).

Errors. ``FileNotFoundError`` from :meth:`~BlobBackend.read_into` means "no
such blob": the block is gone. Every other exception from any method is a
*transient* failure (EIO, EMFILE, a timeout, a refused connection): the
operation failed, the blob may well still be there, and the engine never
reports it removed (TIERKIT-3).

Names are ``/``-separated relative paths of ASCII letters, digits, ``.``,
``-`` and ``_``; a backend maps them onto its storage (a directory tree, an
object-key prefix) however it likes, one blob per name.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Protocol, runtime_checkable

from kvproto._keys import OffloadKey

__all__ = [
    "AsyncBlobBackend", "AsyncBlobBytes", "AsyncExistenceBatches", "BlobBackend", "ExistenceBatches", "HeldExistence",
    "HeldReads", "JobAdmission", "PublishBatches", "Published", "ReadBatches",
]


class Published(enum.Enum):
    """What :meth:`BlobBackend.publish` did (create-if-absent)."""

    CREATED = "created"
    """This call made the blob: it holds exactly the parts given."""
    EXISTED = "existed"
    """A blob of that name was already there (the first writer won): nothing was written. Its
    bytes are whatever the first writer wrote, or a damaged leftover: the engine verifies on load."""


class BlobBackend(Protocol):
    """Synchronous blob storage; every method runs on an engine worker thread, never the scheduler's.

    Methods may be called concurrently from several threads, for different
    names and for the same name.
    """

    def prepare(self, namespace: str) -> None:
        """Make ``namespace`` ready for use (directories, orphan sweeps): no job's store or load starts
        before it returned (TIERKIT-1).

        Runs on the engine's housekeeping thread at start-up (and again after
        :meth:`clear`; the jobs submitted after that reset wait for it too). May be slow:
        a job waits for it until its deadline (``job_timeout_s``), or 30 s without one, then
        starts anyway. Existence checks (:meth:`sizes`) may run meanwhile. An exception is
        logged; the tier still starts (its I/O will fail and be reported as failed jobs).
        """
        ...

    def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        """Store the concatenation of ``parts`` (``size`` bytes in all: the sum of their lengths) as blob
        ``name``, create-if-absent.

        Atomic: readers see either no blob or the complete one, never a
        prefix. If a blob ``name`` already exists (of any content) nothing is
        written and :attr:`Published.EXISTED` is returned; never overwrite a
        complete blob (where the storage cannot refuse, overwriting a blob
        with the same bytes is allowed: blobs are content-addressed). Raise
        on failure (disk full, I/O error): the engine fails that key.
        ``parts`` are views of caller memory (a slot row): read them during
        the call only.
        """
        ...

    def read_into(self, name: str, buffers: Sequence[memoryview]) -> int:
        """Fill ``buffers`` in order from the start of blob ``name``; return the blob's total size in bytes.

        Reads ``min(size, sum of buffer lengths)`` bytes; a buffer the blob
        is too short to reach keeps its old contents (the engine compares the
        returned size with the envelope's: it must be the ``size`` the blob was
        published with, never a stored or compressed size, or the blob is taken
        for damaged, deleted, and its key answers MISS). Raise ``FileNotFoundError`` if
        there is no such blob; any other exception is transient. Buffers
        may be empty (read nothing, return the size: the restart scan reads
        a header only). The last buffer is usually a slot row: read straight
        into it (``preadv``, O_DIRECT where aligned), avoid copies.
        """
        ...

    def sizes(self, names: Sequence[str]) -> Sequence[int | None]:
        """Each blob's size in bytes, or ``None`` if absent or unreadable; one answer per name, in order.

        The size is the one the blob was published with (``publish``'s ``size``): a blob of any other
        size is not taken for a block, and its key answers MISS.

        The existence check of shared mode (a batch per end-of-step hook, off
        the scheduler's thread). Raise only if the whole batch failed (every
        key then answers MISS for now).
        """
        ...

    def delete(self, name: str) -> None:
        """Delete blob ``name``; a missing blob is not an error. Raise on failure (it is logged)."""
        ...

    def list_blobs(self, namespace: str) -> Iterator[tuple[str, int]]:
        """Every blob under ``namespace + "/"`` as ``(name, size)``, in any order (the restart scan).

        Names returned are full names (they start with ``namespace + "/"``),
        usable with :meth:`read_into` and :meth:`delete`. Blobs written while
        the listing runs may or may not be listed. Temporary files of
        unfinished publishes must not be listed.
        """
        ...

    def clear(self, namespace: str) -> None:
        """Delete every blob under ``namespace + "/"`` (``reset_cache``); may finish in the background.

        Called on the scheduler's thread with no job in flight: return
        quickly (rename aside, then delete in the background, as the
        filesystem backend does). Blobs published after the call returns are
        kept. Only this namespace: another layout's blobs over the same
        storage stay (TIER-22); its ``manifest.json`` may go or stay (after a
        clear, BlobTier calls ``prepare`` again and publishes the manifest anew).
        """
        ...

    def close(self) -> None:
        """Release resources (threads, connections); called once at the tier's shutdown, after its jobs."""
        ...


class AsyncBlobBackend(Protocol):
    """The asyncio flavour of :class:`BlobBackend`: the same methods and promises, as coroutines.

    Every coroutine runs on the one event loop the engine keeps in a
    background thread; :meth:`clear` and :meth:`close` are awaited there too
    (bounded by the engine's timeouts).
    """

    async def prepare(self, namespace: str) -> None:
        """As :meth:`BlobBackend.prepare`."""
        ...

    async def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        """As :meth:`BlobBackend.publish` (create-if-absent; :attr:`Published.EXISTED` if already there)."""
        ...

    async def read_into(self, name: str, buffers: Sequence[memoryview]) -> int:
        """As :meth:`BlobBackend.read_into` (``FileNotFoundError``: gone; anything else: transient)."""
        ...

    async def sizes(self, names: Sequence[str]) -> Sequence[int | None]:
        """As :meth:`BlobBackend.sizes` (batch the requests concurrently)."""
        ...

    async def delete(self, name: str) -> None:
        """As :meth:`BlobBackend.delete`."""
        ...

    def list_blobs(self, namespace: str) -> AsyncIterator[tuple[str, int]]:
        """As :meth:`BlobBackend.list_blobs` (an async iterator)."""
        ...

    async def clear(self, namespace: str) -> None:
        """As :meth:`BlobBackend.clear`."""
        ...

    async def close(self) -> None:
        """As :meth:`BlobBackend.close`."""
        ...


@runtime_checkable
class AsyncBlobBytes(Protocol):
    """Optional, for an :class:`AsyncBlobBackend` whose storage hands a blob back as one buffer of its own
    (object stores: a GET's body). The engine's load then copies the payload into the slot row and checks
    its checksum in one pass (:func:`kvproto.envelope.copy_verified`), instead of :meth:`~AsyncBlobBackend.read_into`
    copying it and the engine reading the row again to check it (TIERKIT-3)."""

    async def read_bytes(self, name: str) -> memoryview:
        """Blob ``name``'s bytes, whole (a view the engine reads once, then drops); ``FileNotFoundError`` if
        there is no such blob, any other exception transient (as :meth:`~AsyncBlobBackend.read_into`)."""
        ...


@runtime_checkable
class JobAdmission(Protocol):
    """Deprecated, consulted by nothing: a backend's ``refuse(keys, store=)`` (TIERKIT-4).

    :class:`~kvproto.tierkit.BlobTier` once asked it which keys of each
    submitted job to fail without I/O; it no longer does: every job it is
    given runs, and a backend (or the wrapped backend ``wrap=`` made) that
    offers ``refuse`` gets a ``DeprecationWarning`` at the tier's
    construction. The name stays importable so code naming it keeps
    working. To fail jobs, wrap the tier (:class:`kvproto.tierkit.ForwardingSecondary`,
    as :class:`kvproto.testing.faults.FaultySecondary` does) or fail the
    backend's operations in a backend wrapper; the kit's job faults are
    :func:`kvproto.testing.faulty_jobs` over a :class:`kvproto.testing.FaultyBackend`.
    """

    def refuse(self, keys: Sequence[OffloadKey], *, store: bool) -> frozenset[OffloadKey]:
        """The keys of this job (a store if ``store``, else a load) to fail without I/O; never called."""
        ...


@runtime_checkable
class HeldReads(Protocol):
    """Optional: a synchronous backend that can keep a blob readable from a lookup's HIT to its load (TIERKIT-6).

    :meth:`open_held` returns a handle that later reads the bytes the blob
    held when it was opened, even if the blob is deleted or replaced
    meanwhile (on POSIX an open file descriptor: an unlinked file stays
    readable until closed). :class:`~kvproto.tierkit.BlobTier` opens one when
    a lookup answers HIT, reads from it at the load and closes it on every
    path (load done or failed, request ended, reset, shutdown, a bound of
    steps). Opening must be cheap (one system call, no data read): it runs
    on the existence check's worker, or at a lookup on the scheduler's thread.
    """

    @property
    def held_reads(self) -> bool:
        """True if :meth:`open_held` works (a forwarding wrapper offers the methods, and says here whether
        what it wraps does)."""
        ...

    def open_held(self, name: str) -> object:
        """A read handle on blob ``name``; ``FileNotFoundError`` if absent, any other exception (EMFILE) transient."""
        ...

    def read_held(self, handle: object, buffers: Sequence[memoryview]) -> int:
        """As :meth:`BlobBackend.read_into`, from ``handle``: fill ``buffers``; return the blob's size then."""
        ...

    def close_held(self, handle: object) -> None:
        """Release ``handle`` (exactly once per handle); never raises."""
        ...


@runtime_checkable
class PublishBatches(Protocol):
    """Optional: a synchronous backend that publishes several blobs in one request (TIERKIT-11).

    Where a publish costs a round trip (a network store), :class:`~kvproto.tierkit.BlobTier` hands a
    store job's keys to :meth:`publish_many` in batches of at most :meth:`publish_batch_keys` blobs,
    each batch one task of the writer pool, instead of one :meth:`BlobBackend.publish` per key. Not
    used on an asynchronous backend's loop, nor through a ``wrap``per that does not offer it.
    """

    def publish_batch_keys(self, blob_bytes: int) -> int:
        """The most blobs of ``blob_bytes`` bytes each that one :meth:`publish_many` should take (asked once,
        when the tier starts); 1 or less: publish key by key (e.g. while a subclass changed ``publish`` alone)."""
        ...

    def publish_many(self, blobs: Sequence[tuple[str, Sequence[memoryview], int]]) -> Sequence[Published | Exception]:
        """Each ``(name, parts, size)`` as :meth:`BlobBackend.publish` would store it (create-if-absent,
        atomic per blob), in as few requests as the storage allows. One answer per blob, in order: the
        :class:`Published` that ``publish`` would have returned, or the exception it would have raised
        (that blob failed; the others stand). Raise only if the whole batch failed (every blob of it
        then fails). ``parts`` are read during the call only."""
        ...


@runtime_checkable
class ReadBatches(Protocol):
    """Optional: a synchronous backend that reads several blobs in one request (TIERKIT-11).

    As :class:`PublishBatches`, for loads: a load job's keys go to :meth:`read_many` in batches of at
    most :meth:`read_batch_keys`, each batch one task of the reader pool (not while the job reads from
    handles held at HITs, TIERKIT-6).
    """

    def read_batch_keys(self, blob_bytes: int) -> int:
        """The most blobs of ``blob_bytes`` bytes each that one :meth:`read_many` should take (asked once,
        when the tier starts); 1 or less: read key by key (e.g. while a subclass changed ``read_into`` alone)."""
        ...

    def read_many(self, reads: Sequence[tuple[str, Sequence[memoryview]]]) -> Sequence[int | Exception]:
        """Each ``(name, buffers)`` as :meth:`BlobBackend.read_into` would fill it, in as few requests as the
        storage allows. One answer per read, in order: the blob's size, or the exception ``read_into`` would
        have raised (``FileNotFoundError``: no such blob; any other: transient). Raise only if the whole
        batch failed (every read of it then failed, transient)."""
        ...


@runtime_checkable
class HeldExistence(Protocol):
    """Optional, with :class:`HeldReads`: an existence check that opens what it finds (TIERKIT-6, TIERKIT-5).

    With held HITs on, :class:`~kvproto.tierkit.BlobTier` keeps a read handle on every blob an
    existence check found, for the lookup answering HIT. Asking :meth:`BlobBackend.sizes`, then
    :meth:`HeldReads.open_held` for each blob found, costs two round trips per found blob; a backend
    offering :meth:`open_sizes` answers both at once (files: one ``open`` per name, the size from the
    descriptor). Runs on the probe's worker thread, like ``sizes``.
    """

    def open_sizes(self, names: Sequence[str]) -> tuple[Sequence[int | None], Sequence[object | None]]:
        """``(sizes, handles)``, one entry per name, in order: ``sizes`` as :meth:`BlobBackend.sizes`
        answers; ``handles[i]`` a handle as :meth:`HeldReads.open_held` returns on blob ``names[i]``, or
        None where none was opened (absent, or opening failed, e.g. EMFILE: the size is then still
        answered as ``sizes`` would). The caller closes every handle returned (``close_held``). Raise
        only if the whole batch failed, with no handle left open (every key then degrades as when
        ``sizes`` raises)."""
        ...


@runtime_checkable
class ExistenceBatches(Protocol):
    """Optional: a synchronous backend that sees a whole existence batch, then its chunks (TIERKIT-7).

    The engine checks a probe batch in chunks (TIERKIT-5). A backend offering
    these methods gets :meth:`begin_sizes` with every name of the batch
    before the first chunk, :meth:`batch_sizes` (the token, a chunk's names)
    for each chunk, and :meth:`end_sizes` once, after the last chunk was
    answered or the batch was abandoned (a chunk raised, reset, shutdown):
    whatever the backend learnt for the batch (a listing) may answer its
    chunks, and must answer nothing else: a verdict never outlives the batch
    that asked, so a blob another instance stores after it is seen by the
    next batch. All three run on the probe's worker, one batch at a time per
    tier. ``begin_sizes`` raising: the batch's chunks go to plain
    :meth:`BlobBackend.sizes`; ``batch_sizes`` raising: as ``sizes`` raising
    (the chunk's keys are asked one by one through ``sizes``).
    """

    def begin_sizes(self, names: Sequence[str]) -> object:
        """A batch of existence checks of ``names`` begins; return a token for its chunks."""
        ...

    def batch_sizes(self, batch: object, names: Sequence[str]) -> Sequence[int | None]:
        """As :meth:`BlobBackend.sizes`, for ``names`` (a chunk of the batch ``batch`` began with)."""
        ...

    def end_sizes(self, batch: object) -> None:
        """The batch is over: forget what it learnt. Called once per token; must not raise."""
        ...


@runtime_checkable
class AsyncExistenceBatches(Protocol):
    """The asyncio flavour of :class:`ExistenceBatches` (TIERKIT-7), awaited on the engine's loop."""

    async def begin_sizes(self, names: Sequence[str]) -> object:
        """As :meth:`ExistenceBatches.begin_sizes`."""
        ...

    async def batch_sizes(self, batch: object, names: Sequence[str]) -> Sequence[int | None]:
        """As :meth:`ExistenceBatches.batch_sizes`."""
        ...

    async def end_sizes(self, batch: object) -> None:
        """As :meth:`ExistenceBatches.end_sizes`."""
        ...
