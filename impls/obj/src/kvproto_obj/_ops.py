"""``StoreOps``: the object-store requests the tier makes, one method per request kind (OBJ-13).

:class:`~kvproto_obj.ObstoreBackend` and the listings of OBJ-11 make every
request through one ``StoreOps`` object instead of calling obstore's
functions directly, the way ``kvproto-fs`` makes its file calls through
``FileOps``. Production uses this class (each method is one obstore call);
the conformance spec (``kvproto conform obj``) passes a subclass that counts
requests and fails, reorders or re-answers them as a store below the tier
may (:class:`kvproto_obj._conformance.KitStoreOps`), so the kit's faults
reach ObstoreBackend's own error paths.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import TYPE_CHECKING, Literal

import obstore

if TYPE_CHECKING:
    from obstore import Bytes, ObjectMeta
    from obstore.store import ObjectStore

__all__ = ["StoreOps"]


class StoreOps:
    """One method per request (OBJ-13): PUT, GET (with its body), HEAD, DELETE, LIST pages.

    A method raises what obstore raises (``FileNotFoundError`` for a missing
    object, ``AlreadyExistsError``/``PreconditionError`` for a refused
    conditional request, other errors for a failing store). Stateless: one
    instance may serve several backends.
    """

    ranged: bool | None = None
    """Whether the store lists in key order from a native start-after, so a listing may run in
    concurrent ranges (OBJ-11); ``None``: as its kind says (S3 does, the others do not)."""

    def put(self, store: ObjectStore, path: str, body: Sequence[memoryview] | bytes, *,
            mode: Literal["create", "overwrite"] = "overwrite") -> Awaitable[object]:
        """One single-part PUT of ``body`` at ``path`` (``mode="create"``: ``If-None-Match: *``).

        Returns obstore's own awaitable (no coroutine of ours per request: the production path stays
        one call, OBJ-13), as ``head`` and ``delete`` do."""
        return obstore.put_async(store, path, body, mode=mode, use_multipart=False)

    async def get(self, store: ObjectStore, path: str, if_match: str | None = None) -> Bytes:
        """One GET of the whole object at ``path`` (``if_match``: conditional on that ETag); its bytes."""
        if if_match is None:
            result = await obstore.get_async(store, path)
        else:
            result = await obstore.get_async(store, path, options={"if_match": if_match})
        return await result.bytes_async()

    def head(self, store: ObjectStore, path: str) -> Awaitable[ObjectMeta]:
        """One HEAD of the object at ``path``: its metadata (``size``, ``e_tag``)."""
        return obstore.head_async(store, path)

    def delete(self, store: ObjectStore, paths: str | Sequence[str]) -> Awaitable[None]:
        """DELETE the object(s) at ``paths`` (one request per call; a missing single object raises
        ``FileNotFoundError`` where the store says so)."""
        return obstore.delete_async(store, paths)

    def list(self, store: ObjectStore, prefix: str, *, offset: str | None = None,
             chunk_size: int = 1000) -> AsyncIterator[Sequence[ObjectMeta]]:
        """The objects under ``prefix`` (after ``offset``, where the store has a native start-after),
        a page of at most ``chunk_size`` per item: each page is one LIST request."""
        stream = obstore.list(store, prefix, offset=offset, chunk_size=chunk_size)
        return stream.__aiter__()
