"""``ObstoreBackend``: the object-store tier's storage I/O, an :class:`kvproto.tierkit.AsyncBlobBackend` on obstore.

Blob ``name`` lives at object ``<prefix>/<name>``. Every request is one
obstore call on the event loop the engine keeps for the backend (OBJ-3..OBJ-6,
OBJ-8): PUT create-if-absent (``If-None-Match: *``), one GET copied into the
caller's buffers, HEADs batched with ``asyncio.gather`` (or a batch answered
from LIST pages where that costs fewer requests, OBJ-11: the backend sees each
probe batch whole, ``kvproto.tierkit.AsyncExistenceBatches``, TIERKIT-7, and a
listing answers that batch's chunks only), DELETE, LIST. GETs
and PUTs in flight are bounded by ``max_concurrency`` together, HEADs and
existence LISTs by ``probe_concurrency``; each request is bounded by
``job_timeout_s`` (on top of obstore's own retry and timeout settings), an
existence batch by ``probe_timeout_s`` (its listing by half of that).

A HIT is not held (no ``HeldReads``: an object has no handle that outlives its deletion), so a block
another instance deletes between the lookup and the load fails its load, never serves other bytes
(OBJ-12). Where the lookup's HEAD (not a listing) saw an ETag, the load's GET is conditional on it (``If-Match``):
an object replaced meanwhile is a failed load too, not a different block.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import TYPE_CHECKING, Literal, TypeVar

from cachetools import LRUCache
from obstore.exceptions import AlreadyExistsError, NotSupportedError, PreconditionError

from kvproto.tierkit import Published

from kvproto_obj._config import ObjTierConfig
from kvproto_obj._listing import ListPlanner, OpenBatches, list_sizes
from kvproto_obj._ops import StoreOps
from kvproto_obj._stats import ObjTierStats

if TYPE_CHECKING:
    from obstore.store import ObjectStore

__all__ = ["ObstoreBackend", "short_error"]

_log = logging.getLogger("kvproto_obj")

_T = TypeVar("_T")

_BLOCK_SUFFIX = ".kvb"
_LIST_CHUNK = 1000
_RANGED = frozenset({"s3"})  # lists in key order from a native start-after: ranged listings (OBJ-11)
_SEEN_ETAGS = 65536  # ETags of HEADs not yet used by a load (OBJ-12); the oldest are forgotten past it


class ObstoreBackend:
    """Blobs as objects of one obstore store under ``config.prefix`` (OBJ-2..OBJ-9).

    Counters go to ``stats`` (``uploads``, ``already_present``,
    ``timed_out_jobs``, ``probe_errors``, ``existence_lists``,
    ``list_errors``) and :attr:`existence_batches`.
    """

    def __init__(self, store: ObjectStore, config: ObjTierConfig, stats: ObjTierStats, *, tier_name: str,
                 ops: StoreOps | None = None) -> None:
        self.store = store
        self.ops = StoreOps() if ops is None else ops  # every request goes through it (OBJ-13)
        self._prefix = f"{config.prefix}/" if config.prefix else ""
        self._mode: Literal["create", "overwrite"] = "create" if config.conditional_put else "overwrite"
        self._timeout = config.job_timeout_s
        self._probe_timeout = config.probe_timeout_s
        self._io = asyncio.Semaphore(config.max_concurrency)  # GETs and PUTs together (OBJ-4)
        self._heads = asyncio.Semaphore(config.probe_concurrency)
        self._stats = stats
        self._tier = tier_name
        self.existence_batches = 0
        ranged = config.kind in _RANGED if self.ops.ranged is None else self.ops.ranged
        self.planner = ListPlanner(config.list_page_cost, ordered=ranged)
        self.batches = OpenBatches()
        self._etags: LRUCache[str, str] = LRUCache(_SEEN_ETAGS)  # blob name -> ETag its last HEAD saw (OBJ-12)

    def path(self, name: str) -> str:
        """The object path of blob ``name``."""
        return self._prefix + name

    async def _bounded(self, request: Awaitable[_T]) -> _T:
        """``request`` within ``job_timeout_s`` (a black-holed endpoint must not hold a job for minutes, OBJ-8)."""
        try:
            async with asyncio.timeout(self._timeout):
                return await request
        except TimeoutError:
            self._stats.timed_out_jobs += 1
            raise

    # -- AsyncBlobBackend ------------------------------------------------------------------

    async def prepare(self, namespace: str) -> None:
        """Nothing to prepare: objects need no directories (the engine writes the manifest)."""

    async def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        """One single-part PUT of the joined parts, create-if-absent (OBJ-3).

        "Already exists" is :attr:`Published.EXISTED` and leaves the object as
        it is; a conflicting conditional write (409 on some providers) is
        EXISTED if a HEAD then shows an object of ``size`` bytes. Without
        ``conditional_put`` (or where the store refuses conditional writes)
        a plain overwrite: safe, blobs are content-addressed and verified on load.
        """
        path = self.path(name)
        block = name.endswith(_BLOCK_SUFFIX)
        body = list(parts)  # obstore joins them: the one copy of the row into the request body (OBJ-4)
        async with self._io:
            try:
                await self._bounded(self.ops.put(self.store, path, body, mode=self._mode))
            except AlreadyExistsError:
                return self._existed(block)
            except PreconditionError:
                meta = await self._bounded(self.ops.head(self.store, path))  # raises: the store fails
                if meta["size"] != size:
                    raise
                return self._existed(block)
            except (NotSupportedError, NotImplementedError):
                if self._mode == "overwrite":
                    raise
                _log.warning("ObjTier %r: the store refuses conditional writes; overwriting %s", self._tier, path)
                await self._bounded(self.ops.put(self.store, path, body))
        self._etags.pop(name, None)  # this instance wrote it: a HEAD's ETag from before no longer applies
        if block:
            self._stats.uploads += 1
            namespace = _namespace_of(name)
            self.planner.created(namespace)
            self.batches.created(namespace, name, size)
        return Published.CREATED

    def _existed(self, block: bool) -> Published:
        if block:
            self._stats.already_present += 1
        return Published.EXISTED

    async def read_into(self, name: str, buffers: Sequence[memoryview]) -> int:
        """One GET; its bytes are copied into ``buffers`` in order (the one copy into the slot row, OBJ-6).

        A missing object raises ``FileNotFoundError`` (obstore's own); any
        other error is transient. If a HEAD (the lookup's existence check)
        saw an ETag for ``name`` since, the GET is ``If-Match`` on it: an
        object replaced meanwhile raises ``FileNotFoundError`` too, counted
        in ``stats.replaced_on_load`` (OBJ-12).
        """
        data = await self.read_bytes(name)
        offset = 0
        total = data.nbytes
        for buf in buffers:
            n = min(buf.nbytes, total - offset)
            if n <= 0:
                break
            buf[:n] = data[offset : offset + n]
            offset += n
        return total

    async def read_bytes(self, name: str) -> memoryview:
        """One GET (conditional as :meth:`read_into`'s, OBJ-12): the body as obstore returned it, no copy
        (:class:`kvproto.tierkit.AsyncBlobBytes`: the engine copies it into the slot row and checks it in
        one pass, OBJ-6)."""
        etag = self._etags.pop(name, None)
        async with self._io:
            try:
                data = memoryview(await self._bounded(self.ops.get(self.store, self.path(name), etag)))
            except PreconditionError as exc:
                self._stats.replaced_on_load += 1
                raise FileNotFoundError(f"{name}: replaced since the lookup saw ETag {etag}") from exc
            return data

    async def sizes(self, names: Sequence[str]) -> list[int | None]:
        """Each object's size, or ``None``; the batch within ``probe_timeout_s`` (OBJ-5, OBJ-11).

        Names under a namespace whose listing fits this call's budget
        (:class:`~kvproto_obj._listing.ListPlanner`) are answered from LIST
        pages made for this call: a listed name by its listed size, an
        unlisted one as absent if its range was read to the end. Every other
        name, and every name a listing left undecided (it failed, timed out
        or outgrew its budget), gets a HEAD (at most ``probe_concurrency`` at
        once). A 404 or a failed HEAD answers ``None``; raises only when
        every name's HEAD failed.
        """
        self.existence_batches += 1
        answers: dict[str, int | None | BaseException] = {}
        async with asyncio.timeout(self._probe_timeout):
            for namespace, group in _by_namespace(names).items():
                pages = self.planner.pages_for(namespace, len(set(group)))
                if pages:
                    answers.update(await self._listed(namespace, group, pages))
            await self._head_rest(names, answers)
        return self._answer(names, answers)

    async def begin_sizes(self, names: Sequence[str]) -> object:
        """A probe batch of ``names`` begins (TIERKIT-7): its token. Nothing is asked yet."""
        return self.batches.begin(_by_namespace(names))

    async def batch_sizes(self, batch: object, names: Sequence[str]) -> list[int | None]:
        """As :meth:`sizes`, for a chunk of ``batch`` (OBJ-11, TIERKIT-7).

        At the batch's first chunk under a namespace, the planner chooses
        for the batch's names there (its budget: all of them): a listing
        (made now, after every key of the batch was asked) or HEADs. The
        names the listing decided answer this chunk and the batch's later
        chunks without a request; the others get HEADs. The listing ends
        with the batch (:meth:`end_sizes`). An unknown ``batch`` (ended, or
        pushed out by newer batches) answers as :meth:`sizes`.
        """
        open_batch = self.batches.get(batch)
        if open_batch is None:
            return await self.sizes(names)
        self.existence_batches += 1
        answers: dict[str, int | None | BaseException] = {}
        async with asyncio.timeout(self._probe_timeout):
            for namespace, group in _by_namespace(names).items():
                listed = open_batch.listed.get(namespace)
                if listed is not None:
                    self._stats.existence_from_listing += 1
                elif namespace not in open_batch.tried:
                    open_batch.tried.add(namespace)
                    asked = open_batch.names.get(namespace, group)
                    pages = self.planner.pages_for(namespace, len(set(asked)))
                    if pages:
                        deletions = self.planner.deletions(namespace)
                        listed = await self._listed(namespace, asked, pages)
                        if self.planner.deletions(namespace) == deletions and self.batches.get(batch) is open_batch:
                            open_batch.listed[namespace] = listed  # not across a deletion of ours
                if listed is not None:
                    answers.update((n, listed[n]) for n in group if n in listed)
            await self._head_rest(names, answers)
        return self._answer(names, answers)

    async def end_sizes(self, batch: object) -> None:
        """The batch is over (TIERKIT-7): its listings go."""
        self.batches.end(batch)

    async def _head_rest(self, names: Sequence[str], answers: dict[str, int | None | BaseException]) -> None:
        """A HEAD for each name of ``names`` not in ``answers`` (at most ``probe_concurrency`` at once)."""
        for name in answers:
            self._etags.pop(name, None)  # answered by a listing: its load is not conditional (OBJ-12)

        async def one(name: str) -> int | None | BaseException:
            async with self._heads:
                try:
                    meta = await self.ops.head(self.store, self.path(name))
                except FileNotFoundError:
                    self._etags.pop(name, None)
                    return None
                except Exception as exc:
                    return exc
            self._saw(name, meta["e_tag"])
            return meta["size"]

        rest = [n for n in dict.fromkeys(names) if n not in answers]
        answers.update(zip(rest, await asyncio.gather(*(one(n) for n in rest)), strict=True))

    def _answer(self, names: Sequence[str], answers: dict[str, int | None | BaseException]) -> list[int | None]:
        errors = [a for a in (answers[n] for n in names) if isinstance(a, BaseException)]
        if errors:
            self._stats.probe_errors += len(errors)
            _log.warning("ObjTier %r: %d of %d existence checks failed (answered MISS): %s",
                         self._tier, len(errors), len(names), short_error(errors[0]))
            if len(errors) == len(names):
                raise errors[0]
        return [a if isinstance(a, int) else None for a in (answers[n] for n in names)]

    async def _listed(self, namespace: str, names: list[str], pages: int) -> dict[str, int | None]:
        """The names of ``names`` (all under ``namespace``) a listing of at most ``pages`` pages decides
        (OBJ-11); teaches the planner the namespace's size."""
        cut = len(self._prefix)
        distinct = len(set(names))
        ranges = self.planner.ranges_for(namespace, pages, distinct)
        self._stats.existence_lists += 1
        listing = await list_sizes(self.ops, self.store, self.path(namespace) + "/", [self.path(n) for n in names],
                                   pages=pages, ranges=ranges, time_limit=self._probe_timeout / 2, slots=self._heads)
        if listing.objects is not None:
            self.planner.counted(namespace, listing.objects)
        elif not listing.errors:
            self.planner.outgrew(namespace, pages, listing.seen)
        if listing.errors:
            self._stats.list_errors += len(listing.errors)
            _log.warning("ObjTier %r: %d of %d listings of %s failed; their keys get HEADs: %s", self._tier,
                         len(listing.errors), ranges, self.path(namespace), short_error(listing.errors[0]))
        return {path[cut:]: size for path, size in listing.sizes.items()}

    def _saw(self, name: str, etag: str | None) -> None:
        """Remember the ETag a HEAD saw for ``name``, for the next load's conditional GET (OBJ-12)."""
        if etag is None:
            self._etags.pop(name, None)
        else:
            self._etags[name] = etag  # the least recently seen goes past _SEEN_ETAGS

    async def delete(self, name: str) -> None:
        """DELETE the object; a missing one is not an error."""
        self._etags.pop(name, None)
        try:
            await self._bounded(self.ops.delete(self.store, self.path(name)))
        except FileNotFoundError:
            pass
        namespace = _namespace_of(name)
        self.planner.deleted(namespace)
        self.batches.deleted(namespace)

    async def list_blobs(self, namespace: str) -> AsyncIterator[tuple[str, int]]:
        """Every object under ``<prefix>/<namespace>/`` as ``(blob name, size)``."""
        cut = len(self._prefix)
        objects = 0
        async for chunk in self.ops.list(self.store, self.path(namespace) + "/", chunk_size=_LIST_CHUNK):
            objects += len(chunk)
            for meta in chunk:
                yield meta["path"][cut:], meta["size"]
        self.planner.counted(namespace, objects)  # the restart scan teaches the listing planner (OBJ-11)

    async def clear(self, namespace: str) -> None:
        """Delete every block object of ``namespace`` (not its manifest), within ``job_timeout_s`` (OBJ-9)."""
        manifest = self.path(f"{namespace}/manifest.json")

        async def run() -> None:
            async for chunk in self.ops.list(self.store, self.path(namespace) + "/", chunk_size=_LIST_CHUNK):
                paths = [meta["path"] for meta in chunk if meta["path"] != manifest]
                if paths:
                    await self.ops.delete(self.store, paths)

        self.planner.cleared(namespace)  # before: no listing from before the deletions answers after them
        self._etags.clear()
        self.batches.deleted(namespace)
        await self._bounded(run())
        self.planner.cleared(namespace)
        self.batches.deleted(namespace)

    async def close(self) -> None:
        """Open existence batches end; obstore's connection pools go with the store object."""
        self.batches.clear()


def _namespace_of(name: str) -> str:
    """The namespace directory a blob name lives under (its first path component)."""
    return name.partition("/")[0]


def _by_namespace(names: Sequence[str]) -> dict[str, list[str]]:
    """Names grouped by namespace directory (names without one are left out: they get HEADs)."""
    groups: dict[str, list[str]] = {}
    for name in names:
        namespace, slash, _ = name.partition("/")
        if slash and namespace:
            groups.setdefault(namespace, []).append(name)
    return groups


def short_error(exc: BaseException) -> str:
    """The first line of an error (obstore's messages carry a long debug dump)."""
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
