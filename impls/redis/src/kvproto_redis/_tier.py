"""``RedisTier``: the Redis/Valkey secondary tier: a :class:`kvproto.tierkit.BlobTier` over redis-py (REDIS-1..REDIS-11).

Keys: ``<prefix>:<namespace>/<aa>/<bb>/<digest>.kvb``, each value a :mod:`kvproto.envelope`
(4 KiB header + payload), and ``<prefix>:<namespace>/manifest.json``, the layout manifest: the
names the filesystem and object-store tiers use under their roots, behind a key prefix.

The engine (:class:`~kvproto.tierkit.BlobTier`, shared mode) owns jobs, verification, verdicts,
events and shutdown; :class:`RedisBackend` makes the requests on the engine's worker threads. Lookups
never do I/O: keys this instance stored or loaded answer HIT, others go through pipelined existence
checks off the scheduler's thread.
"""

from __future__ import annotations

from collections.abc import Callable

from kvproto import BatchLookup, SecondaryTier, tierkit
from kvproto.tierkit import BlobBackend, SharedStoreTier

from kvproto_redis._backend import RedisBackend
from kvproto_redis._client import make_client
from kvproto_redis._config import RedisTierConfig
from kvproto_redis._ops import Client, RedisOps
from kvproto_redis._stats import RedisTierStats

__all__ = ["RedisTier"]


class RedisTier(SharedStoreTier):
    """A secondary tier keeping one verified envelope per block as a Redis string key (REDIS-1..REDIS-11).

    ``buffer`` is the primary tier's slot buffer (a writable, C-contiguous 2-D ``memoryview`` of
    format ``"B"``, one row per slot). ``client``, when given, is the redis-py client to use instead
    of the one ``config`` describes (the caller keeps it open and closes it). ``wrap``, when given, is
    put between the engine and the backend (tracing, metrics, or the kit's
    :class:`kvproto.testing.FaultyBackend`, TIERKIT-8). The tier has no fault knob: the kit fails jobs
    through a :func:`kvproto.testing.faulty_jobs` class of it (KIT-5). ``ops``, when given, makes
    every request (:class:`RedisOps`, REDIS-9: the conformance spec's counting, fault-arming one).

    ``reset_cache`` deletes every block key of this namespace, then forgets them (TIER-16, REDIS-10):
    False while a job is unreported, after shutdown, or when the server did not answer. It blocks the
    scheduler for the SCAN and UNLINKs (bounded by ``job_timeout_s``); on a shared server it removes
    the other instances' blocks of this namespace too (their loads fail, then MISS).
    """

    def __init__(self, buffer: memoryview, config: RedisTierConfig, *, name: str = "redis",
                 client: Client | None = None, wrap: Callable[[BlobBackend], BlobBackend] | None = None,
                 ops: RedisOps | None = None) -> None:
        self.config = config = tierkit.tier_config(config, RedisTierConfig, f"RedisTier {name!r}")
        self.client: Client = make_client(config) if client is None else client
        stats = RedisTierStats()
        self._io = RedisBackend(self.client, config, stats, tier_name=name, ops=ops, owns_client=client is None)
        # Other engines use the same server: unknown keys are checked by a pipeline (REDIS-6); a key stored or
        # loaded here is not sent again (REDIS-4); one command's bound, retries included (REDIS-8).
        super().__init__(self._io, buffer, config, name=name, stats=stats, wrap=wrap, read_threads=config.read_threads,
                         write_threads=config.write_threads, op_timeout_s=config.op_bound_s, reasons={
                             "async_lookup": "RETRY while a pipelined existence check asks the server about a key this "
                                             "instance does not know",
                             "eviction": "never deletes blocks on its own: the server's maxmemory-policy (or ttl_s) "
                                         "does, and a key it evicted fails its load and answers MISS",
                             "holds_hits": "a Redis value has no read handle that outlives its deletion",
                         }, check=lambda: self._check_server(buffer, name), release=self._io.close)
        self.stats: RedisTierStats = stats
        self.ops: RedisOps = self._io.ops

    def _check_server(self, buffer: memoryview, name: str) -> None:
        """PING, then write the layout manifest now, so a server that is down, refuses the credentials or
        the TLS handshake fails at once (REDIS-1). A buffer the engine will refuse is left to it."""
        given: object = buffer  # checked at run time: callers may pass anything
        shape = buffer.shape if isinstance(given, memoryview) else None
        config = self.config
        with tierkit.storage_check(f"RedisTier {name!r}", f"use the server at {config.where()} (prefix {config.prefix!r})"):
            self._io.ops.ping(self.client)
            if shape is None or len(shape) != 2 or shape[1] < 1:
                return
            path, body = tierkit.layout_manifest(shape[1], config.layout)
            self._io.publish(path, [memoryview(body)], len(body))

    # -- operator surface --------------------------------------------------------------------

    def storage_name(self, name: str) -> str:
        """The Redis key of the engine's blob ``name``: ``<prefix>:<name>`` (REDIS-2)."""
        return self._io.key(name)


def _conforms(tier: RedisTier) -> tuple[SecondaryTier, BatchLookup]:
    """Never called: mypy proves here that RedisTier satisfies SecondaryTier structurally and offers lookup_many
    (BatchLookup)."""
    return tier, tier
