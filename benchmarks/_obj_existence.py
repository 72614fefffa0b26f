"""``bench obj``'s existence checks: sequential HEADs, the tier's batched HEADs, the tier's batched path (LIST).

:func:`existence_rates`: ``n_keys`` keys (1 in 8 stored, so the namespace
holds ``n_keys / 8`` objects and the manifest) asked in one step of a shared
:class:`kvproto_obj.ObjTier`, then steps every 1 ms until every key resolved
(the probe checks them front first, in chunks of 64), side by side in one
run with a plain sequential loop of ``obstore.head`` calls:

* ``tier_list``: the tier as configured by default (``list_page_cost`` 16):
  it answers the batch from one LIST made at its first chunk, which answers
  that batch's chunks only (OBJ-11, TIERKIT-7);
* ``tier_heads``: the same tier with ``list_page_cost=0``: concurrent HEADs
  only (``probe_concurrency`` at a time, one chunk after the other);
* ``sequential``: one ``obstore.head`` after the other.

Every side's verdicts must agree with what was stored.

:func:`crossover`: where LIST stops paying. ``filler`` objects under one
namespace directory (seeded straight into the moto server's memory, see
``SERVER``), then one batch of ``batch`` names (1 in 8 of them present)
answered by ``batch`` concurrent HEADs vs one complete listing of the
directory (through kvproto_obj's public ``StoreOps.list``, in 1,000-object pages and
concurrent ranges as the tier's listing makes them); seconds for each.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

from kvproto import OffloadKey, ReqContext, envelope as env, make_key, members as lr

if TYPE_CHECKING:
    from kvproto_obj import StoreOps

__all__ = ["SERVER", "crossover", "existence_rates", "seed"]

PROBE_CONCURRENCY = 64  # the tier's default
LIST_PAGE = 1000  # objects per LIST page: S3's maximum, the page the tier's listings ask for

SERVER = """
import hashlib, logging, sys
logging.getLogger("werkzeug").setLevel(logging.ERROR)
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
for line in sys.stdin:  # "BUCKET DIRECTORY START COUNT": filler objects written straight into moto's memory
    bucket, directory, start, count = line.split()
    from moto.core.models import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends
    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    for i in range(int(start), int(start) + int(count)):
        h = hashlib.sha256(b"fill" + i.to_bytes(8, "big")).hexdigest()
        backend.put_object(bucket, f"{directory}{h[:2]}/{h[2:4]}/{h}.fill", b"")
    print("seeded", flush=True)
server.stop()
"""
"""moto's server in a child process; its stdin takes seeding commands, and closing it stops the server."""


def seed(server_in: IO[str], server_out: IO[str], bucket: str, directory: str, start: int, count: int) -> None:
    """Write ``count`` empty filler objects under ``directory`` (ending in ``/``) into the server's memory."""
    server_in.write(f"{bucket} {directory} {start} {count}\n")
    server_in.flush()
    if server_out.readline().strip() != "seeded":
        raise RuntimeError("bench obj: the server did not seed its filler objects")


def _tier_seconds(tier: Any, keys: list[OffloadKey], req: ReqContext) -> tuple[float, int, bool]:
    """Ask every key in one step, then step every 1 ms until each resolved: seconds, HITs, all resolved."""
    t0 = time.perf_counter()
    first = [tier.lookup(k, req) for k in keys]
    if not all(a is lr.RETRY for a in first):
        raise RuntimeError("bench obj: a fresh tier answered an unknown key without checking it")
    while any(tier.lookup(k, req) is lr.RETRY for k in keys[-64:]):
        tier.on_step_end()
        time.sleep(0.001)
    answers = [tier.lookup(k, req) for k in keys]
    return time.perf_counter() - t0, sum(a is lr.HIT for a in answers), all(a is not lr.RETRY for a in answers)


def existence_rates(config: Callable[..., Any], n_keys: int, prefix: str) -> dict[str, float]:
    """Existence checks resolved per second by the three sides of the module docstring, and ratios."""
    import obstore

    from kvproto_obj import ObjTier

    small = memoryview(bytearray(4 * 4096)).cast("B", (4, 4096))
    settings = dict(probe_min_interval_s=0.0, probe_deadline_steps=10**9, probe_timeout_s=3000.0,
                    probe_concurrency=PROBE_CONCURRENCY)
    keys = [make_key(hashlib.sha256(prefix.encode() + i.to_bytes(8, "big")).digest(), 0) for i in range(n_keys)]
    seeded = keys[::8]
    figures: dict[str, float] = {"keys": float(n_keys), "stored": float(len(seeded))}
    agree = True
    store: Any = None
    paths: list[str] = []
    for side, options in (("tier_list", {}), ("tier_heads", {"list_page_cost": 0})):
        tier = ObjTier(small, config(prefix, **settings, **options), name=side)
        try:
            if side == "tier_list":
                async def put_all(tier: Any = tier) -> None:
                    slots = asyncio.Semaphore(64)
                    payload = bytes(4096)

                    async def one(k: OffloadKey) -> None:
                        async with slots:
                            await obstore.put_async(tier.store, tier.path_of(k), env.encode(k, payload, tier.namespace))

                    await asyncio.gather(*(one(k) for k in seeded))

                asyncio.run(put_all())
            seconds, hits, resolved = _tier_seconds(tier, keys, ReqContext(f"bench-{side}"))
            figures[f"{side}_per_s"] = n_keys / seconds
            figures[f"{side}_s"] = seconds
            figures[f"{side}_lists"] = float(tier.stats.existence_lists)
            figures[f"{side}_from_listing"] = float(tier.stats.existence_from_listing)
            agree &= resolved and hits == len(seeded)
            store, paths = tier.store, [tier.path_of(k) for k in keys]
        finally:
            tier.shutdown()
    t0 = time.perf_counter()
    found = 0
    for path in paths:
        try:
            obstore.head(store, path)
            found += 1
        except FileNotFoundError:
            pass
    seconds = time.perf_counter() - t0
    figures["sequential_per_s"] = n_keys / seconds
    figures["sequential_s"] = seconds
    agree &= found == len(seeded)
    figures["tier_list_over_sequential"] = figures["sequential_s"] / figures["tier_list_s"]
    figures["tier_heads_over_sequential"] = figures["sequential_s"] / figures["tier_heads_s"]
    figures["answers_agree"] = float(agree)
    return figures


def crossover(store: Any, directory: str, filler: int, batch: int, *, ranges: int) -> dict[str, float]:
    """Seconds to answer ``batch`` names under ``directory`` (holding ``filler`` objects): concurrent HEADs
    vs one complete listing (in ``ranges`` concurrent ranges); the two must agree."""
    import obstore

    from kvproto_obj import StoreOps

    n_present = batch // 8
    asked = [_fill_path(directory, i) for i in range(n_present)]
    asked += [_fill_path(directory, i, ".absent") for i in range(n_present, batch)]

    async def heads() -> list[int | None]:
        slots = asyncio.Semaphore(PROBE_CONCURRENCY)

        async def one(path: str) -> int | None:
            async with slots:
                try:
                    return (await obstore.head_async(store, path))["size"]
                except FileNotFoundError:
                    return None

        return await asyncio.gather(*(one(p) for p in asked))

    async def listed() -> list[int | None]:
        sizes = await _listed_sizes(StoreOps(), store, directory, asked, ranges)
        return [sizes[p] for p in asked]

    t0 = time.perf_counter()
    by_head = asyncio.run(heads())
    head_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    by_list = asyncio.run(listed())
    list_s = time.perf_counter() - t0
    return {"head_s": head_s, "list_s": list_s, "list_over_head": list_s / head_s,
            "agree": float(by_head == by_list and sum(s is not None for s in by_list) == n_present)}


async def _listed_sizes(
    ops: StoreOps, store: Any, directory: str, asked: list[str], ranges: int
) -> dict[str, int | None]:
    """One complete listing of ``directory`` through ``ops`` (pages of :data:`LIST_PAGE`), split as the
    tier splits its listings (OBJ-11): ``ranges`` concurrent ranges of the sorted asked paths, each
    from the previous range's last path to its own. Each asked path's size, None where it is absent."""
    wanted = sorted(set(asked))
    step = -(-len(wanted) // max(1, min(ranges, len(wanted))))
    groups = [wanted[i : i + step] for i in range(0, len(wanted), step)]

    async def one(j: int) -> dict[str, int]:
        after = groups[j - 1][-1] if j > 0 else None
        bound = groups[j][-1] if j < len(groups) - 1 else None  # the last range reads to the end
        found: dict[str, int] = {}
        async for page in ops.list(store, directory, offset=after, chunk_size=LIST_PAGE):
            for meta in page:
                if bound is not None and meta["path"] > bound:
                    return found  # key order: nothing of this range comes after
                found[meta["path"]] = meta["size"]
        return found

    found: dict[str, int] = {}
    for part in await asyncio.gather(*(one(j) for j in range(len(groups)))):
        found.update(part)
    return {path: found.get(path) for path in asked}


def _fill_path(directory: str, i: int, suffix: str = ".fill") -> str:
    """The path of filler object ``i`` under ``directory`` (as ``SERVER`` seeds it), or another suffix's."""
    h = hashlib.sha256(b"fill" + i.to_bytes(8, "big")).hexdigest()
    return f"{directory}{h[:2]}/{h[2:4]}/{h}{suffix}"
