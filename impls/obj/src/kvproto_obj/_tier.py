"""``ObjTier``: the reference object-store secondary tier: a :class:`kvproto.tierkit.BlobTier` over obstore (OBJ-1..OBJ-10).

Objects: ``<prefix>/<namespace>/<aa>/<bb>/<digest>.kvb``, each a
:mod:`kvproto.envelope` (4 KiB header + payload): the same names and bytes as
the filesystem tier ``kvproto-fs`` writes under its root, so a bucket synced
to a directory is an FsTier root and the other way round.
``<prefix>/<namespace>/manifest.json`` is the layout manifest.

The engine (:class:`~kvproto.tierkit.BlobTier`, shared mode) owns jobs,
verification, verdicts, events and shutdown; :class:`ObstoreBackend` makes
the requests, on the one event loop the engine keeps for an asynchronous
backend in a background thread. Lookups never do I/O: keys this
instance stored or loaded answer HIT, others go through batched HEADs; once a
load finds an object missing that the tier remembered (the store lost it:
restarted empty, a lifecycle rule), what it remembered until then goes through
HEADs too (TIERKIT-10, OBJ-14).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from kvproto import BatchLookup, OffloadKey, SecondaryTier, tierkit
from kvproto.tierkit import BlobBackend, SharedStoreTier

from kvproto_obj._backend import ObstoreBackend
from kvproto_obj._config import ObjTierConfig
from kvproto_obj._ops import StoreOps
from kvproto_obj._stats import ObjTierStats
from kvproto_obj._store import make_store

if TYPE_CHECKING:
    from obstore.store import ObjectStore

__all__ = ["ObjTier"]

_T = TypeVar("_T")


class ObjTier(SharedStoreTier):
    """A secondary tier keeping one verified envelope object per block in an object store (OBJ-1..OBJ-10).

    ``buffer`` is the primary tier's slot buffer (a writable, C-contiguous
    2-D ``memoryview`` of format ``"B"``, one row per slot). ``store``, when
    given, is the obstore store to use instead of the one ``config``
    describes (several tiers sharing one in-process MemoryStore; tests).
    ``wrap``, when given, is put between the engine and the object store
    (tracing, metrics, or the kit's :class:`kvproto.testing.FaultyBackend`):
    the engine hands it the store's backend as a synchronous
    :class:`~kvproto.tierkit.BlobBackend` (TIERKIT-8). The tier has no
    fault knob: the kit fails jobs through a :func:`kvproto.testing.faulty_jobs`
    class of it (KIT-5).
    ``ops``, when given, makes every request to the store (:class:`StoreOps`, OBJ-13: the
    conformance spec's counting, fault-arming one); by default obstore's functions.

    ``reset_cache`` deletes every block object of this namespace, then forgets them (TIER-16, OBJ-9):
    False while a job is unreported, after shutdown, or when the store did not answer. It blocks the
    scheduler for the listing and deletions (bounded by ``job_timeout_s``); in a shared bucket it
    removes the other instances' blocks too (their loads fail, then MISS).
    """

    def __init__(self, buffer: memoryview, config: ObjTierConfig, *, name: str = "obj",
                 store: ObjectStore | None = None, wrap: Callable[[BlobBackend], BlobBackend] | None = None,
                 ops: StoreOps | None = None) -> None:
        self.config = config = tierkit.tier_config(config, ObjTierConfig, f"ObjTier {name!r}")
        self.store: ObjectStore = make_store(config) if store is None else store
        stats = ObjTierStats()
        self._io = ObstoreBackend(self.store, config, stats, tier_name=name, ops=ops)
        persistent = config.kind != "memory" or store is not None
        # Other engines write the same bucket: unknown keys are checked by HEAD (OBJ-7); a key stored or loaded
        # here is not uploaded again (OBJ-4); an operation's bound lies above the backend's own.
        super().__init__(self._io, buffer, config, name=name, stats=stats, wrap=wrap,
                         read_threads=config.max_concurrency, write_threads=config.max_concurrency,
                         op_timeout_s=config.job_timeout_s + 1.0, persistent=persistent, reasons={
                             "async_lookup": "RETRY while a HEAD request checks a key this instance does not know",
                             "eviction": "never deletes blocks on its own: use the bucket's lifecycle rules",
                             **({} if persistent else {"persistence": "a MemoryStore built by the tier lives and dies with it"}),
                         }, check=lambda: self._check_store(buffer, name))
        self.stats: ObjTierStats = stats
        self.ops: StoreOps = self._io.ops
        self.base = self._io.path(self.namespace.hex())

    def _check_store(self, buffer: memoryview, name: str) -> None:
        """Write the layout manifest now, so an unreachable store or a missing bucket fails at once (OBJ-1).

        Runs before any thread of the tier starts; a buffer the engine will
        refuse is left to it (no request is made).
        """
        given: object = buffer  # checked at run time: callers may pass anything
        shape = buffer.shape if isinstance(given, memoryview) else None
        if shape is None or len(shape) != 2 or shape[1] < 1:
            return
        path, body = tierkit.layout_manifest(shape[1], self.config.layout)
        config = self.config
        where = (f"write {self._io.path(path)} to the {config.kind!r} store "
                 f"(bucket={config.bucket!r}, endpoint={config.endpoint!r})")
        with tierkit.storage_check(f"ObjTier {name!r}", where):
            _run_now(self._io.publish(path, [memoryview(body)], len(body)),
                     config.connect_timeout_s + config.retry_timeout_s + 1.0)

    # -- operator surface --------------------------------------------------------------------

    def storage_name(self, name: str) -> str:
        """The object name of the engine's blob ``name``: ``<prefix>/<name>`` (OBJ-2)."""
        return self._io.path(name)

    def path_of(self, key: OffloadKey) -> str:
        """The object name that holds ``key``'s block (the filesystem tier's path under its root)."""
        return self.key_of(key)

    def known_keys(self) -> frozenset[OffloadKey]:
        """The keys this instance remembers as present right now (stored or loaded by it, and not
        distrusted since: TIERKIT-10); a lookup answers HIT for them without a request."""
        return self.vouched_keys()

    def listed_objects(self) -> int | None:
        """How many objects the tier estimates under its namespace (OBJ-11: what decides LIST or HEADs); None: unknown."""
        return self._io.planner.estimate(self.namespace.hex())

    @property
    def open_existence_batches(self) -> int:
        """Probe batches open in the backend now, each with its listings (TIERKIT-7: none outlives its batch)."""
        return len(self._io.batches)

    @property
    def existence_batches(self) -> int:
        """How many batches of existence checks (HEAD requests) went to the store so far."""
        return self._io.existence_batches


def _conforms(tier: ObjTier) -> tuple[SecondaryTier, BatchLookup]:
    """Never called: mypy proves here that ObjTier satisfies SecondaryTier structurally and offers lookup_many
    (BatchLookup)."""
    return tier, tier


def _run_now(coro: Coroutine[Any, Any, _T], timeout: float) -> _T:
    """Run ``coro`` to the end on a fresh event loop in a helper thread, within ``timeout`` seconds.

    A thread of its own, so a caller inside a running event loop can build a tier.
    """
    box: list[_T] = []
    errors: list[BaseException] = []

    def run() -> None:
        async def bounded() -> _T:
            async with asyncio.timeout(timeout):
                return await coro

        try:
            box.append(asyncio.run(bounded()))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, name="kvproto-obj-check", daemon=True)
    thread.start()
    thread.join(timeout + 1.0)
    if errors:
        raise errors[0]
    if not box:
        raise TimeoutError(f"no answer within {timeout:.1f} s")
    return box[0]
