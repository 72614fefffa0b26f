"""The ``obj`` entry point of the ``kvproto.tiers`` group: what ``kvproto conform obj`` checks (KIT-9, OBJ-10).

Job faults (``fail_next_jobs``, ``fail_keys``) are armed on a
:class:`kvproto.testing.FaultyBackend` between the engine and the store and
applied by the kit's :func:`kvproto.testing.faulty_jobs` class of ObjTier,
never by the tier's own job paths (it has no fault knob). The embedded default needs no server: each tier gets a fresh obstore
``MemoryStore``, which the ``reopen`` hook shares with the second instance
(persistence and sharing between live instances, as two engines share one
bucket). :func:`obj_spec` builds the same spec over any store factory: the
test suite runs it against a loopback S3 server (moto).
"""

from __future__ import annotations

import errno
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import obstore
from obstore.exceptions import AlreadyExistsError, PreconditionError
from obstore.store import MemoryStore

from kvproto import OffloadKey, envelope as env
from kvproto.testing import FaultyBackend, RequestFaults, TierSpec, faulty_jobs, remote_fault_hooks, request_faults_of

from kvproto_obj._backend import _RANGED
from kvproto_obj._config import ObjTierConfig
from kvproto_obj._listing import LIST_PAGE
from kvproto_obj._ops import StoreOps
from kvproto_obj._tier import ObjTier

if TYPE_CHECKING:
    from obstore import Bytes, ObjectMeta
    from obstore.store import ObjectStore

__all__ = ["OBJ_HOOKS", "KitStoreOps", "conformance_spec", "faults_of", "kit_ops", "obj_spec", "ops_of"]


class KitStoreOps(RequestFaults, StoreOps):
    """The kit's store below ObstoreBackend (OBJ-13): obstore's requests, counted, and failed or
    re-answered as some stores do.

    * ``requests``: every request made so far (a LIST counts one per page it read, or one if it failed).
    * ``fail_transfers``: the next that many requests (GET, PUT, HEAD, DELETE, LIST) raise
      ``OSError(EIO)`` (the ``fail_io`` hook).
    * ``failing_lists``: the next that many LIST requests fail (a one-line error): the tier's next
      listings fail (OBJ-11: the batch degrades to HEADs, never to MISS).
    * ``conflicts_as_precondition``: a create-if-absent PUT onto an existing object is answered
      ``PreconditionError`` (409/412, as some S3 providers answer), not ``AlreadyExistsError`` (OBJ-3).
    * ``ranged``: the store lists in key order from a native start-after (OBJ-11's ranged listings;
      ``None``: as the tier's kind says). The kit's in-memory store does; the spec's first instance
      lists in ranges, as on S3, and the ``reopen`` instance in reverse key order.
    * ``lost_races``: the next that many create-if-absent PUTs are answered ``PreconditionError`` (S3's
      409 ConditionalRequestConflict: another writer's conditional upload of the name was in flight)
      and store nothing, as when that other upload then fails; ``races_lost`` counts them (the
      ``lose_write_races`` hook, TIER-10).
    * ``down``: every request fails (connection refused): the store is down (the ``start_down`` hook).
    * ``reversed_listings``: a listing comes in reverse key order, pages of the same size, as a store
      other than S3 may list (a local directory): only S3 is listed in ranges (OBJ-11). The kit's
      spec sets it for every store but S3 (:func:`kit_ops`).
    """

    storage = "the store"
    below = "ObstoreBackend"

    def __init__(self, *, conflicts_as_precondition: bool = False, failing_lists: int = 0,
                 reversed_listings: bool = False, down: bool = False, ranged: bool | None = None) -> None:
        super().__init__(down=down)
        self.ranged = ranged
        self.reversed_listings = reversed_listings
        self.failing_lists = failing_lists
        self.conflicts_as_precondition = conflicts_as_precondition
        self.lost_races = 0
        self.races_lost = 0

    async def put(self, store: ObjectStore, path: str, body: Sequence[memoryview] | bytes, *,
                  mode: Literal["create", "overwrite"] = "overwrite") -> object:
        """A PUT, counted; failed when armed; a conflict answered 412 in ``conflicts_as_precondition`` mode;
        a create-if-absent PUT lost to a failed writer (409, nothing stored) while ``lost_races`` lasts."""
        self.request(f"PUT {path}")
        if mode == "create" and self.lost_races > 0:
            self.lost_races -= 1
            self.races_lost += 1
            raise PreconditionError(f"kvproto kit: PUT {path}: 409 ConditionalRequestConflict (another upload in flight)")
        try:
            return await super().put(store, path, body, mode=mode)
        except AlreadyExistsError as exc:
            if self.conflicts_as_precondition:
                raise PreconditionError(f"kvproto kit: PUT {path}: 412 Precondition Failed (If-None-Match)") from exc
            raise

    async def get(self, store: ObjectStore, path: str, if_match: str | None = None) -> Bytes:
        """A GET, counted; failed when armed."""
        self.request(f"GET {path}")
        return await super().get(store, path, if_match)

    async def head(self, store: ObjectStore, path: str) -> ObjectMeta:
        """A HEAD, counted."""
        self.request(f"HEAD {path}")
        return await super().head(store, path)

    async def delete(self, store: ObjectStore, paths: str | Sequence[str]) -> None:
        """A DELETE, counted."""
        self.request(f"DELETE {paths}")
        await super().delete(store, paths)

    def list(self, store: ObjectStore, prefix: str, *, offset: str | None = None,
             chunk_size: int = 1000) -> AsyncIterator[Sequence[ObjectMeta]]:
        """LIST pages, each counted; the armed ones fail."""
        pages = super().list(store, prefix, offset=offset, chunk_size=chunk_size)

        async def counted() -> AsyncIterator[Sequence[ObjectMeta]]:
            if self.down or self.fail_transfers > 0:
                self.request(f"LIST {prefix}")
            if self.failing_lists > 0:
                self.failing_lists -= 1
                self.requests += 1
                raise OSError(errno.EIO, f"kvproto kit: LIST {prefix} failed (injected below ObstoreBackend)")
            if not self.reversed_listings:
                async for page in pages:
                    self.requests += 1  # a page read is a request; the end of a short page's listing is not one
                    yield page
                return
            everything = [meta async for page in pages for meta in page]
            everything.reverse()
            for i in range(0, len(everything), chunk_size):
                self.requests += 1
                yield everything[i : i + chunk_size]

        return counted()


def kit_ops(config: ObjTierConfig, *, conflicts_as_precondition: bool = False, ranged: bool = False) -> KitStoreOps:
    """The KitStoreOps for a tier of ``config``: on S3 as it lists; elsewhere in ranges (``ranged``:
    the in-memory store lists in key order from a native start-after) or in reverse key order."""
    if config.kind in _RANGED:
        return KitStoreOps(conflicts_as_precondition=conflicts_as_precondition)
    return KitStoreOps(conflicts_as_precondition=conflicts_as_precondition, reversed_listings=not ranged,
                       ranged=True if ranged else None)


def ops_of(tier: ObjTier) -> KitStoreOps:
    """The :class:`KitStoreOps` a tier of the kit's spec makes its requests through."""
    return request_faults_of(tier, KitStoreOps)


def _reopen(tier: ObjTier, buffer: memoryview) -> ObjTier:
    """A second instance over the same store and prefix (a second engine on the same bucket), whose
    store answers a conflicting conditional PUT 412 (PreconditionError) as some S3 providers do."""
    ops = kit_ops(tier.config, conflicts_as_precondition=True)
    return faulty_jobs(ObjTier)(buffer, tier.config, name=tier.name, store=tier.store, wrap=FaultyBackend, ops=ops)


def _reopen_other_layout(tier: ObjTier, buffer: memoryview) -> ObjTier:
    """A second instance over the same store and prefix for another model layout (another namespace, TIER-22)."""
    layout = {**tier.config.layout, "kvproto-kit": "another layout"}
    return faulty_jobs(ObjTier)(
        buffer, tier.config.model_copy(update={"layout": layout}), name=tier.name, store=tier.store, wrap=FaultyBackend,
        ops=kit_ops(tier.config),
    )


def _reopen_with_layout(tier: ObjTier, buffer: memoryview, layout: Mapping[str, str]) -> ObjTier:
    """A second instance over the same store and prefix whose layout is ``layout`` over the tier's own (TIER-22)."""
    merged = {**tier.config.layout, **layout}
    return faulty_jobs(ObjTier)(
        buffer, tier.config.model_copy(update={"layout": merged}), name=tier.name, store=tier.store, wrap=FaultyBackend,
        ops=kit_ops(tier.config),
    )


def _lose_write_races(tier: ObjTier, n: int) -> int:
    """The next ``n`` create-if-absent PUTs lose a race to a conditional upload that then fails: 409,
    nothing stored (TIER-10); how many it answered so since the previous call."""
    ops = ops_of(tier)
    ops.lost_races = n
    lost, ops.races_lost = ops.races_lost, 0
    return lost


def _start_down(tier: ObjTier, buffer: memoryview) -> ObjTier:
    """A second instance over the same store while it is down: OBJ-1's start-up check (the layout
    manifest's PUT) must refuse it with ConfigurationError (KIT-20)."""
    return faulty_jobs(ObjTier)(buffer, tier.config, name=tier.name, store=tier.store, wrap=FaultyBackend,
                                ops=KitStoreOps(down=True))


def _expected_abilities(tier: ObjTier) -> tuple[str, ...]:
    """What OBJ-10 says an ObjTier built as this spec builds it (over a store it is given) declares:
    async lookups, sharing, partial jobs and persistence (KIT-21)."""
    return ("async_lookup", "sharing", "partial_jobs", "persistence")


def _objects(tier: ObjTier) -> list[str]:
    """The paths of every object under the tier's namespace, listed without the tier (uncounted)."""
    directory = f"{tier.base}/"
    return [meta["path"] for chunk in obstore.list(tier.store, directory, chunk_size=LIST_PAGE) for meta in chunk]


def _storage_names(tier: ObjTier) -> list[str]:
    """The path of every object under the tier's configured prefix (every namespace there), listed
    without the tier (uncounted): what every instance over that prefix wrote (OBJ-2, TIER-37). Other
    prefixes of the same bucket are other deployments' storage, not this one's."""
    root, _, _ = tier.base.rpartition("/")
    listed = obstore.list(tier.store, f"{root}/" if root else None, chunk_size=LIST_PAGE)
    return [meta["path"] for chunk in listed for meta in chunk]


def _namespace_of(tier: ObjTier) -> str:
    """The prefix every object the tier writes lies under: ``<prefix>/<namespace>/`` (OBJ-2, TIER-37)."""
    return f"{tier.base}/"


_FILLERS_AFTER = 8


def _grow_storage(tier: ObjTier, objects: int) -> None:
    """Add filler objects under the tier's namespace until it holds ``objects`` (never asked about; the
    first few sort after every block, the rest before, so a listing in key order reads them first) (TIER-33)."""
    have = len(_objects(tier))
    for i in range(have, objects):
        where = "~" if i - have < _FILLERS_AFTER else "0"  # "0/" sorts before every block, "~/" after
        obstore.put(tier.store, f"{tier.base}/{where}/kvproto-kit-filler-{i:06d}", b"filler")


def _request_plan(tier: ObjTier, n: int) -> tuple[int, int]:
    """The requests OBJ-11's plan makes for an existence batch of ``n`` unknown keys, the namespace's
    size learnt by the batch before (TIER-33): a listing of the pages the namespace fills when those,
    its objects plus one, fit in ``n // list_page_cost`` pages (one range off S3; on S3 ranges that
    run out of pages leave their names to HEADs); else one HEAD per key."""
    cost = tier.config.list_page_cost
    pages = n // cost if cost else 0
    needed = -(-(len(_objects(tier)) + 1) // LIST_PAGE)
    if pages >= 1 and needed <= pages:
        ranges = max(1, min(pages, n, needed)) if tier.ops.ranged or tier.config.kind in _RANGED else 1
        if ranges > 1 and pages // ranges < needed:
            return 1, pages + n  # a range may run out of pages: its names get HEADs
        return 1, needed + ranges - 1  # each range's last page may be cut at its bound
    return n, n


def faults_of(tier: ObjTier) -> FaultyBackend:
    """The :class:`~kvproto.testing.FaultyBackend` a tier built with ``wrap=FaultyBackend`` injects through (its
    job faults need the tier built as ``faulty_jobs(ObjTier)(...)``, as this spec does)."""
    return FaultyBackend.below(tier)


def _read_block(tier: ObjTier, key: OffloadKey) -> bytes | None:
    try:
        data = obstore.get(tier.store, tier.path_of(key)).bytes()
    except FileNotFoundError:
        return None
    return bytes(memoryview(data)[env.HEADER_BYTES:])


def _seed_block(tier: ObjTier, key: OffloadKey, data: bytes) -> None:
    obstore.put(tier.store, tier.path_of(key), env.encode(key, data, tier.namespace))


def _corrupt_on_read(tier: ObjTier, keys: Iterable[OffloadKey]) -> None:
    """Overwrite each stored object with one payload byte flipped: the checksum must catch it."""
    for key in keys:
        path = tier.path_of(key)
        try:
            data = bytearray(memoryview(obstore.get(tier.store, path).bytes()))
        except FileNotFoundError:
            continue
        data[env.HEADER_BYTES] ^= 0xFF
        obstore.put(tier.store, path, bytes(data))


def _fork_safe(tier: ObjTier) -> bool:
    """No: obstore's runtime does not survive a fork, so a forked child cannot store (TIER-24 is not checked)."""
    return False


OBJ_HOOKS: dict[str, Callable[..., Any]] = {
    "reopen": _reopen,
    "reopen_other_layout": _reopen_other_layout,
    "reopen_with_layout": _reopen_with_layout,
    "read_block": _read_block,
    "seed_block": _seed_block,
    "corrupt_on_read": _corrupt_on_read,
    "fork_safe": _fork_safe,
    **remote_fault_hooks(KitStoreOps),
    "lose_write_races": _lose_write_races,
    "grow_storage": _grow_storage,
    "request_plan": _request_plan,
    "start_down": _start_down,
    "expected_abilities": _expected_abilities,
    "storage_names": _storage_names,
    "namespace_of": _namespace_of,
    "replace_block": _seed_block,  # an object replaced after a HEAD fails its conditional GET (OBJ-12, TIER-34)
}
"""The kit's backdoor hooks for ObjTier (KIT-5); job faults need a tier built as ``faulty_jobs(ObjTier)(...,
wrap=FaultyBackend)``,
store faults and request counts one built with ``ops=kit_ops(config)`` (OBJ-13: a hook on a tier built
without them raises ConfigurationError, which the kit reports against the hook, KIT-5)."""


_PREFIX = "kvproto-kit/obj"
"""The kit's objects live under a prefix, as production's do (OBJ-2: ``<prefix>/<namespace>/...``)."""


def obj_spec(
    name: str = "obj",
    *,
    make_store: Callable[[], ObjectStore] = MemoryStore,
    config: ObjTierConfig | None = None,
    description: str = "",
) -> TierSpec:
    """ObjTier over a fresh store per tier (``make_store()``), all capabilities but eviction declared.

    Each tier is a ``faulty_jobs(ObjTier)`` built with ``wrap=FaultyBackend``: the kit's job faults (KIT-5).
    """
    cfg = ObjTierConfig(max_concurrency=8, probe_concurrency=16, prefix=_PREFIX) if config is None else config

    def build(buffer: memoryview) -> ObjTier:
        ranged = cfg.kind == "memory"  # the in-memory store lists in key order with a native start-after
        return faulty_jobs(ObjTier)(buffer, cfg, name=name, store=make_store(), wrap=FaultyBackend,
                                    ops=kit_ops(cfg, ranged=ranged))

    return TierSpec(
        name,
        "secondary",
        build,
        hooks=OBJ_HOOKS,
        tier_class=ObjTier,
        description=description or (
            f"kvproto_obj.ObjTier(buffer, ObjTierConfig(prefix={_PREFIX!r}), store=obstore.store.MemoryStore())"
        ),
    )


def conformance_spec() -> TierSpec:
    """``kvproto conform obj``: a fresh in-memory store per tier, shared by ``reopen`` (no server needed)."""
    return obj_spec()
