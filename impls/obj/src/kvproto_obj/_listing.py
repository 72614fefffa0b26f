"""Existence from LIST: a batch of existence checks answered by listing the namespace (OBJ-11).

A HEAD per key costs the server one request per key, however many run at
once; a LIST page answers up to 1,000 objects in one request. For a batch of
``n`` names under one namespace directory, :class:`ListPlanner` allows a
listing of at most ``n // list_page_cost`` pages (never more requests than
the HEADs it replaces, by the configured exchange rate), and only while its
estimate of the namespace's size says the listing fits. :func:`list_sizes`
lists the directory in at most that many pages, as several concurrent ranges
when the store lists in key order from a native offset (S3: ``start-after`` = the last
asked name of the range before), and answers per asked name:

* a name listed: its listed size (the same size a HEAD reports; the engine
  compares it with one envelope's, and a load still verifies the envelope);
* a name not listed by a range that was read to its end: absent (``None``);
* a name of a range that stopped early (its page budget spent, an error, its
  time bound) and not listed: undecided; the caller sends it a HEAD.

The engine hands the backend each probe batch whole before its chunks of
64 keys (``kvproto.tierkit.ExistenceBatches``, TIERKIT-7): a batch's
budget is counted over all its names, and its listing, made at its first
chunk under a namespace, answers that batch's later chunks without a
request. :class:`OpenBatches` holds it for exactly that batch and drops it
when the batch ends: a verdict never outlives the batch that asked, so an
object another instance creates after a listing is seen by the next batch.
This instance's own creations update an open batch's listing, its
deletions drop it. What outlives a batch is one number per namespace
(objects under it), refreshed by each listing and by this instance's own
creations and deletions.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from obstore.store import ObjectStore

    from kvproto_obj._ops import StoreOps

__all__ = ["LIST_PAGE", "MAX_OPEN_BATCHES", "ListPlanner", "Listing", "OpenBatches", "list_sizes"]

_log = logging.getLogger("kvproto_obj")

LIST_PAGE = 1000
"""Objects per LIST page (S3's maximum; obstore's stream is read in chunks of this many)."""

_RELEARN_BATCHES = 256  # a namespace estimated too big to list is tried again after this many batches
_MAX_NAMESPACES = 64  # estimates kept (a tier asks about one namespace; bounded all the same)

MAX_OPEN_BATCHES = 4
"""Existence batches open at once (a tier opens one at a time); beginning one more ends the oldest."""


class ListPlanner:
    """Per batch: list, or send HEADs (OBJ-11). ``page_cost``: one LIST page in HEADs; 0 never lists.

    ``ordered``: the store lists in key order, so a listing may be split into
    concurrent ranges that each stop past their last asked name.
    """

    def __init__(self, page_cost: int, *, ordered: bool) -> None:
        self.page_cost = page_cost
        self.ordered = ordered
        self._objects: dict[str, int] = {}  # namespace -> objects under it (an estimate)
        self._skipped: dict[str, int] = {}  # namespace -> batches sent as HEADs since it was last listed
        self._deletions: dict[str, int] = {}  # namespace -> deletions seen (a listing across one is not kept)

    def deletions(self, namespace: str) -> int:
        """How many deletions under ``namespace`` this instance made so far (read before a listing)."""
        return self._deletions.get(namespace, 0)

    def estimate(self, namespace: str) -> int | None:
        """The estimated number of objects under ``namespace`` (None: unknown)."""
        return self._objects.get(namespace)

    def pages_for(self, namespace: str, n: int) -> int:
        """How many LIST pages a batch of ``n`` names under ``namespace`` may spend (0: send HEADs).

        ``n // page_cost``, unless the namespace is estimated to need more
        pages than that (then 0, except once every ``_RELEARN_BATCHES`` such
        batches: the namespace may have shrunk). Unknown namespaces are
        listed within the budget, which teaches the estimate.
        """
        if self.page_cost == 0:
            return 0
        pages = n // self.page_cost
        if pages < 1:
            return 0
        known = self._objects.get(namespace)
        if known is not None and -(-(known + 1) // LIST_PAGE) > pages:
            skipped = self._skipped.get(namespace, 0) + 1
            if skipped < _RELEARN_BATCHES:
                self._skipped[namespace] = skipped
                return 0
        self._skipped.pop(namespace, None)
        return pages

    def ranges_for(self, namespace: str, pages: int, names: int) -> int:
        """How many concurrent ranges to list in: one per estimated page, within ``pages`` and ``names``."""
        known = self._objects.get(namespace)
        if not self.ordered or known is None:
            return 1
        return max(1, min(pages, names, -(-(known + 1) // LIST_PAGE)))

    def counted(self, namespace: str, objects: int) -> None:
        """A complete listing (or the restart scan) found ``objects`` objects under ``namespace``."""
        if namespace not in self._objects and len(self._objects) >= _MAX_NAMESPACES:
            self._objects.clear()
        self._objects[namespace] = objects

    def outgrew(self, namespace: str, pages: int, seen: int) -> None:
        """A listing of ``pages`` pages did not reach the end after ``seen`` objects: too big for that budget."""
        self.counted(namespace, max(seen, pages * LIST_PAGE))

    def created(self, namespace: str) -> None:
        """This instance created an object under ``namespace``."""
        if namespace in self._objects:
            self._objects[namespace] += 1

    def deleted(self, namespace: str) -> None:
        """This instance deleted (at most) one object under ``namespace``: a listing running now will
        not be kept for its batch (it may have listed the object)."""
        if self._objects.get(namespace, 0) > 0:
            self._objects[namespace] -= 1
        if namespace not in self._deletions and len(self._deletions) >= _MAX_NAMESPACES:
            self._deletions.clear()
        self._deletions[namespace] = self._deletions.get(namespace, 0) + 1

    def cleared(self, namespace: str) -> None:
        """Every block object of ``namespace`` was deleted (reset_cache): count it empty."""
        self.deleted(namespace)
        self.counted(namespace, 0)


@dataclass
class _Open:
    names: dict[str, list[str]]  # namespace -> the batch's blob names under it
    listed: dict[str, dict[str, int | None]] = field(default_factory=dict)  # namespace -> name -> size
    tried: set[str] = field(default_factory=set)  # namespaces this batch listed (or chose HEADs for)


class OpenBatches:
    """The existence batches open now (TIERKIT-7) and what their listings decided, per blob name.

    At most :data:`MAX_OPEN_BATCHES`; a batch lives from :meth:`begin` to
    :meth:`end`, and its listings with it (bounded by the pages each was
    allowed). Runs on one event loop: no lock.
    """

    def __init__(self) -> None:
        self._open: dict[int, _Open] = {}
        self._next = 0

    def begin(self, names: dict[str, list[str]]) -> int:
        """Open a batch of ``names`` (by namespace); the token for its chunks. Ends the oldest if full."""
        while len(self._open) >= MAX_OPEN_BATCHES:
            del self._open[next(iter(self._open))]
        self._next += 1
        self._open[self._next] = _Open(names)
        return self._next

    def get(self, token: object) -> _Open | None:
        """The open batch of ``token`` (None: ended, dropped, or not a token of ours)."""
        return self._open.get(token) if isinstance(token, int) else None

    def end(self, token: object) -> None:
        """The batch is over: its listings go."""
        if isinstance(token, int):
            self._open.pop(token, None)

    def __len__(self) -> int:
        return len(self._open)

    def created(self, namespace: str, name: str, size: int) -> None:
        """This instance created blob ``name``: an open batch that listed ``namespace`` now sees it."""
        for batch in self._open.values():
            listed = batch.listed.get(namespace)
            if listed is not None and name in listed:
                listed[name] = size

    def deleted(self, namespace: str) -> None:
        """This instance deleted a blob under ``namespace``: open batches forget their listings of it
        (their later chunks send HEADs)."""
        for batch in self._open.values():
            batch.listed.pop(namespace, None)

    def clear(self) -> None:
        """Every batch ends (the backend closes)."""
        self._open.clear()


@dataclass
class Listing:
    """What a listing decided: ``sizes`` of asked paths (None: absent); ``objects``: counted under the
    directory if every range was read to its end (else None); ``errors``: why ranges stopped early."""

    sizes: dict[str, int | None] = field(default_factory=dict)
    objects: int | None = None
    seen: int = 0
    errors: list[BaseException] = field(default_factory=list)


@dataclass
class _Range:
    found: dict[str, int] = field(default_factory=dict)
    counted: int = 0
    complete: bool = False
    error: BaseException | None = None


async def list_sizes(
    ops: StoreOps, store: ObjectStore, directory: str, paths: Sequence[str], *, pages: int, ranges: int, time_limit: float,
    slots: asyncio.Semaphore,
) -> Listing:
    """List ``directory`` (ending in ``/``) for the asked object ``paths`` under it, through ``ops`` (OBJ-11, OBJ-13).

    At most ``pages`` pages in all, split over ``ranges`` concurrent ranges
    of the sorted asked paths (each range holds one of ``slots`` while it
    lists, and stops after ``time_limit`` seconds). Never raises: a failed
    range leaves its unlisted paths undecided and names its error.
    """
    wanted = sorted(set(paths))
    k = max(1, min(ranges, pages, len(wanted)))
    per = max(1, pages // k)
    step = -(-len(wanted) // k)
    groups = [wanted[i : i + step] for i in range(0, len(wanted), step)]

    async def one(j: int) -> _Range:
        after = groups[j - 1][-1] if j > 0 else None
        bound = groups[j][-1] if j < len(groups) - 1 else None  # the last range reads to the end
        out = _Range()
        read = 0
        try:
            async with slots, asyncio.timeout(time_limit):
                stream = ops.list(store, directory, offset=after, chunk_size=LIST_PAGE)
                async for chunk in stream:
                    for meta in chunk:
                        path = meta["path"]
                        if bound is not None and path > bound:
                            out.complete = True  # key order: nothing of this range comes after
                            return out
                        out.counted += 1
                        out.found[path] = meta["size"]  # bounded: at most ``pages`` pages in all
                    read += 1
                    if len(chunk) < LIST_PAGE:
                        out.complete = True  # a short chunk is the stream's last
                        return out
                    if read >= per:
                        return out  # the budget is spent: the rest of the range stays undecided
                out.complete = True
        except Exception as exc:  # a list that fails degrades to HEADs for what it did not decide
            out.error = exc
        return out

    done = await asyncio.gather(*(one(j) for j in range(len(groups))))
    listing = Listing()
    for group, part in zip(groups, done, strict=True):
        listing.seen += part.counted
        if part.error is not None:
            listing.errors.append(part.error)
        for path in group:
            if path in part.found:
                listing.sizes[path] = part.found[path]
            elif part.complete:
                listing.sizes[path] = None
    if all(part.complete for part in done):
        listing.objects = listing.seen
    return listing
