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

The backend sees the engine's existence checks in chunks of 64 keys
(``kvproto.tierkit``'s probe checks a batch front first, chunk by chunk), so
one probe batch of 8,192 keys is 128 calls. A listing read to its end is
therefore kept for ``list_reuse_s`` seconds after it started (one per
namespace, at most the pages it was allowed: bounded) and answers the next
chunks under that namespace without a request; this instance's own creations
update it, and a deletion drops it. Its verdicts are those of a HEAD sent when
the listing ran: an object another writer creates within that window may
answer MISS (a lost hit), one another writer deletes may answer HIT and then
fail its load, as after any HEAD (never wrong bytes: loads verify). ``list_reuse_s = 0``
lets a listing answer only the call that made it. Otherwise what is
remembered is one number per namespace (objects under it), refreshed by each
listing and by this instance's own creations and deletions.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import obstore

if TYPE_CHECKING:
    from obstore.store import ObjectStore

__all__ = ["LIST_PAGE", "ListPlanner", "Listing", "list_sizes"]

_log = logging.getLogger("kvproto_obj")

LIST_PAGE = 1000
"""Objects per LIST page (S3's maximum; obstore's stream is read in chunks of this many)."""

_RELEARN_BATCHES = 256  # a namespace estimated too big to list is tried again after this many batches
_MAX_NAMESPACES = 64  # estimates kept (a tier asks about one namespace; bounded all the same)


class ListPlanner:
    """Per batch: list, or send HEADs (OBJ-11). ``page_cost``: one LIST page in HEADs; 0 never lists.

    ``ordered``: the store lists in key order, so a listing may be split into
    concurrent ranges that each stop past their last asked name.
    """

    def __init__(self, page_cost: int, *, ordered: bool, reuse_s: float = 0.0) -> None:
        self.page_cost = page_cost
        self.ordered = ordered
        self.reuse_s = reuse_s
        self._objects: dict[str, int] = {}  # namespace -> objects under it (an estimate)
        self._skipped: dict[str, int] = {}  # namespace -> batches sent as HEADs since it was last listed
        self._kept: dict[str, tuple[float, dict[str, int]]] = {}  # namespace -> (listing start, path -> size)
        self._deletions: dict[str, int] = {}  # namespace -> deletions seen (a listing across one is not kept)

    def kept(self, namespace: str, now: float) -> dict[str, int] | None:
        """The complete listing of ``namespace`` started less than ``reuse_s`` before ``now``, if any."""
        entry = self._kept.get(namespace)
        if entry is None:
            return None
        if now - entry[0] >= self.reuse_s:
            del self._kept[namespace]
            return None
        return entry[1]

    def deletions(self, namespace: str) -> int:
        """How many deletions under ``namespace`` this instance made so far (read before a listing)."""
        return self._deletions.get(namespace, 0)

    def keep(self, namespace: str, started: float, listed: dict[str, int], deletions: int) -> None:
        """Keep a complete listing of ``namespace`` (started at ``started``) for ``reuse_s`` seconds,
        unless this instance deleted an object there since it started (``deletions``: the count then)."""
        if self.reuse_s > 0 and self.deletions(namespace) == deletions:
            if namespace not in self._kept and len(self._kept) >= _MAX_NAMESPACES:
                self._kept.clear()
            self._kept[namespace] = (started, listed)

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

    def created(self, namespace: str, path: str, size: int) -> None:
        """This instance created object ``path`` (``size`` bytes) under ``namespace``."""
        if namespace in self._objects:
            self._objects[namespace] += 1
        entry = self._kept.get(namespace)
        if entry is not None:
            entry[1][path] = size

    def deleted(self, namespace: str) -> None:
        """This instance deleted (at most) one object under ``namespace``: its kept listing goes, and a
        listing running now will not be kept (it may have listed the object)."""
        if self._objects.get(namespace, 0) > 0:
            self._objects[namespace] -= 1
        self._kept.pop(namespace, None)
        if namespace not in self._deletions and len(self._deletions) >= _MAX_NAMESPACES:
            self._deletions.clear()
        self._deletions[namespace] = self._deletions.get(namespace, 0) + 1

    def cleared(self, namespace: str) -> None:
        """Every block object of ``namespace`` was deleted (reset_cache): forget its listing."""
        self.deleted(namespace)
        self.counted(namespace, 0)


@dataclass
class Listing:
    """What a listing decided: ``sizes`` of asked paths (None: absent); ``objects``: counted under the
    directory if every range was read to its end (else None); ``errors``: why ranges stopped early."""

    sizes: dict[str, int | None] = field(default_factory=dict)
    objects: int | None = None
    seen: int = 0
    errors: list[BaseException] = field(default_factory=list)
    everything: dict[str, int] | None = None  # every listed path and size, when the listing is complete


@dataclass
class _Range:
    found: dict[str, int] = field(default_factory=dict)
    counted: int = 0
    complete: bool = False
    error: BaseException | None = None


async def list_sizes(
    store: ObjectStore, directory: str, paths: Sequence[str], *, pages: int, ranges: int, time_limit: float,
    slots: asyncio.Semaphore,
) -> Listing:
    """List ``directory`` (ending in ``/``) for the asked object ``paths`` under it (OBJ-11).

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
                stream = obstore.list(store, directory, offset=after, chunk_size=LIST_PAGE)
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
        listing.everything = {path: size for part in done for path, size in part.found.items()}
    return listing
