"""The existence checks of :class:`~kvproto.tierkit.BlobTier` (shared mode, the probe's worker; TIERKIT-5..7).

:class:`Existence` is what :class:`kvproto.AsyncProbe` calls: one chunk of
keys at a time (:func:`~kvproto.tierkit._blob_scan.check_exists` degrades per
key), inside the scope of a batch when the backend offers
:class:`~kvproto.tierkit.ExistenceBatches` (TIERKIT-7). With held HITs
(TIERKIT-6) every blob a check found is opened there, off the scheduler's
thread, for the lookup that answers HIT to take: in the same call as the
check when the backend offers :class:`~kvproto.tierkit.HeldExistence` (one
``open`` per found file instead of a ``stat`` and an ``open``), else after it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from kvproto._async_probe import BatchCheck
from kvproto._keys import OffloadKey
from kvproto.tierkit._backend import BlobBackend, ExistenceBatches, HeldExistence
from kvproto.tierkit._blob_holds import Holds
from kvproto.tierkit._blob_ops import BlobOps
from kvproto.tierkit._blob_scan import Sizes, check_exists, names_of

__all__ = ["Existence"]


class Existence:
    """The probe's check over ``ops.backend`` (its worker thread only); ``holds``: held HITs, if on."""

    def __init__(
        self, ops: BlobOps, holds: Holds | None, *, tier_name: str, count: Callable[[str, int], None]
    ) -> None:
        self._ops = ops
        self._holds = holds
        self._tier = tier_name
        self._count = count
        backend: BlobBackend = ops.backend
        self.batches = backend if isinstance(backend, ExistenceBatches) else None
        self._opener = backend if holds is not None and isinstance(backend, HeldExistence) else None

    def check(self, keys: Sequence[OffloadKey], sizes: Sizes | None = None) -> list[OffloadKey]:
        """The keys of ``keys`` whose blob is one envelope long (TIERKIT-5).

        ``sizes``: the batch's chunk call (TIERKIT-7), else the backend's. With held HITs, each found
        blob is opened here for the lookup that answers HIT (TIERKIT-6)."""
        holds = self._holds
        if holds is None:
            return check_exists(self._ops, keys, tier_name=self._tier, count=self._count, sizes=sizes)
        generation = holds.generation
        names: dict[OffloadKey, str] = {}
        if self._opener is None or sizes is not None:
            found = check_exists(self._ops, keys, tier_name=self._tier, count=self._count, names=names, sizes=sizes)
            holds.preopen(found, generation, names)
            return found
        return self._check_opening(self._opener, holds, keys, generation)

    def _check_opening(
        self, opener: HeldExistence, holds: Holds, keys: Sequence[OffloadKey], generation: int
    ) -> list[OffloadKey]:
        """:meth:`check` where the check itself opens what it finds (``open_sizes``), within the cap;
        every handle it opened is kept for a found key or closed, whatever happens."""
        room = max(0, holds.room())
        ops = self._ops
        backend = ops.backend
        calls: list[tuple[int, Sequence[int | None], Sequence[object | None]]] = []  # the chunk's call (at most one)

        def open_sizes(chunk: Sequence[str]) -> Sequence[int | None]:
            first = chunk[:room]
            got, handles = opener.open_sizes(first)
            try:
                answer = got if len(chunk) <= room else [*got, *backend.sizes(chunk[room:])]  # past the cap: not held
            except BaseException:  # the chunk degrades to key by key: nothing opened here is a HIT's
                for handle in handles:
                    if handle is not None:
                        holds.backend.close_held(handle)
                raise
            calls.append((len(chunk), got, handles))
            return answer

        kept: list[OffloadKey] = []  # found keys, each with its handle (two lists: no tuple per HIT)
        kept_handles: list[object] = []
        unused: list[object] = []
        answered = False
        try:
            found = check_exists(ops, keys, tier_name=self._tier, count=self._count, sizes=open_sizes)
            answered = True
        finally:
            for asked, got, handles in calls:  # recorded only if the whole call answered (no key-by-key fallback)
                if not answered:
                    unused += [handle for handle in handles if handle is not None]
                    continue
                # The call's names were those of the keys that could be named, in order (check_exists).
                named = keys if asked == len(keys) else [key for key in keys if _nameable(ops, key)]
                want = ops.blob_bytes
                for key, size, handle in zip(named, got, handles, strict=False):  # past the cap: no handle
                    if handle is not None:
                        if size == want:
                            kept.append(key)
                            kept_handles.append(handle)
                        else:
                            unused.append(handle)  # the wrong size: not a block
                unused += [handle for handle in handles[len(named):] if handle is not None]  # never, by contract
            for handle in unused:
                holds.backend.close_held(handle)
        holds.deposit(kept, kept_handles, generation)
        return found

    @contextmanager
    def batch(self, batches: ExistenceBatches, keys: Sequence[OffloadKey]) -> Iterator[BatchCheck]:
        """The probe's scope of one batch (TIERKIT-7): the backend sees every name of the batch, then its
        chunks under the batch's token, then the batch's end, whatever happens."""
        token = batches.begin_sizes(names_of(self._ops, keys))

        def check(chunk: Sequence[OffloadKey]) -> list[OffloadKey]:
            return self.check(chunk, sizes=lambda names: batches.batch_sizes(token, names))

        try:
            yield check
        finally:
            batches.end_sizes(token)


def _nameable(ops: BlobOps, key: OffloadKey) -> bool:
    """Whether ``key`` has a blob name (check_exists asks only those; a malformed key is MISS alone)."""
    try:
        ops.name_of(key)
    except Exception:
        return False
    return True
