"""The ``redis`` and ``redis-cluster`` entry points of ``kvproto.tiers``: what ``kvproto conform redis`` checks
(KIT-9, REDIS-11).

The server: ``KVPROTO_REDIS_URL`` (``KVPROTO_REDIS_CLUSTER_URL`` for ``redis-cluster``) names a
running one; without it the run starts its own on loopback (:class:`~kvproto_redis.LocalRedis`: one
node, or three as a cluster) and stops it when the process ends.

What a run writes it deletes (REDIS-11): every tier the spec builds gets a fresh key prefix
``kvproto-kit:<run>:<n>`` (its storage, which ``reopen`` shares); building tier ``n + 1`` deletes
the keys of every earlier storage (their checks are over), and the end of the process deletes the
rest (:meth:`KitRun.clean_up`, registered with ``atexit`` by the process that made the run; a forked
child never sweeps). Each key the kit writes also expires after an hour, so even a run killed with
SIGKILL leaves nothing behind for long.

Job faults (``fail_next_jobs``, ``fail_keys``) are armed on a :class:`kvproto.testing.FaultyBackend`
between the engine and the server and applied by the kit's :func:`kvproto.testing.faulty_jobs` class
of RedisTier (it has no fault knob); request faults and counts go through :class:`KitRedisOps`.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from kvproto import OffloadKey, envelope as env
from kvproto.hosting import TierUnavailable
from kvproto.testing import FaultyBackend, RequestFaults, TierSpec, faulty_jobs, remote_fault_hooks, request_faults_of
from kvproto.tierkit import PROBE_CHUNK_KEYS

from kvproto_redis._backend import short_error
from kvproto_redis._client import make_client
from kvproto_redis._config import RedisTierConfig
from kvproto_redis._hosting import hosted_redis_tier
from kvproto_redis._local_server import LocalRedis
from kvproto_redis._ops import Client, Probe, RedisOps
from kvproto_redis._tier import RedisTier

__all__ = [
    "KIT_PREFIX", "REDIS_HOOKS", "KitRedisOps", "KitRun", "cluster_conformance_spec", "conformance_spec", "faults_of",
    "ops_of", "redis_spec",
]

_log = logging.getLogger("kvproto_redis")

KIT_PREFIX = "kvproto-kit"
"""Every key a kit run writes starts with ``kvproto-kit:<run>:`` (REDIS-11)."""

_KIT_TTL_S = 3600.0  # a key of a run killed before its clean-up expires by itself


class KitRedisOps(RequestFaults, RedisOps):
    """The kit's requests below RedisBackend (REDIS-9): redis-py's, counted, and failed as a server may
    (:class:`~kvproto.testing.RequestFaults`: ``requests``, where a pipeline is one and a SCAN page is
    one; ``fail_transfers``; ``down``)."""

    storage = "the server"
    below = "RedisBackend"

    def ping(self, client: Client) -> None:
        self.request("PING")
        super().ping(client)

    def set_if_absent(self, client: Client, key: str, value: bytes, ttl_ms: int | None) -> bool:
        self.request(f"SET {key} NX")
        return super().set_if_absent(client, key, value, ttl_ms)

    def set_if_absent_many(self, client: Client, items: Sequence[tuple[str, bytes]], ttl_ms: int | None
                           ) -> list[bool | Exception]:
        self.request(f"a pipeline of {len(items)} SET NX")
        return super().set_if_absent_many(client, items, ttl_ms)

    def get(self, client: Client, key: str) -> bytes | None:
        self.request(f"GET {key}")
        return super().get(client, key)

    def get_many(self, client: Client, keys: Sequence[str]) -> list[bytes | None | Exception]:
        self.request(f"a pipeline of {len(keys)} GET")
        return super().get_many(client, keys)

    def probe(self, client: Client, keys: Sequence[str]) -> list[Probe]:
        self.request(f"a pipeline of {len(keys)} existence checks")
        return super().probe(client, keys)

    def delete(self, client: Client, keys: Sequence[str]) -> None:
        self.request(f"UNLINK of {len(keys)} keys")
        super().delete(client, keys)

    def scan(self, client: Client, match: str) -> Iterator[list[str]]:
        """SCAN pages, each counted; the armed ones fail."""
        for page in super().scan(client, match):
            self.request(f"SCAN {match}")
            yield page


def ops_of(tier: RedisTier) -> KitRedisOps:
    """The :class:`KitRedisOps` a tier of the kit's spec makes its requests through."""
    return request_faults_of(tier, KitRedisOps)


def faults_of(tier: RedisTier) -> FaultyBackend:
    """The :class:`~kvproto.testing.FaultyBackend` a tier built with ``wrap=FaultyBackend`` injects through."""
    return FaultyBackend.below(tier)


class KitRun:
    """One kit run's server and keys (REDIS-11): every storage it hands out lies under ``kvproto-kit:<run>:``.

    ``config`` names the server (its prefix is replaced); ``None``: ``KVPROTO_REDIS_URL``
    (``KVPROTO_REDIS_CLUSTER_URL`` with ``cluster``) or, without it, a :class:`LocalRedis` started at
    the first storage and stopped by :meth:`clean_up`. Nothing happens before the first :meth:`storage`.
    """

    def __init__(self, config: RedisTierConfig | None = None, *, cluster: bool = False) -> None:
        self._given = config
        self.cluster = cluster if config is None else config.cluster
        self.token = f"{KIT_PREFIX}:{uuid.uuid4().hex[:12]}"
        self._base: RedisTierConfig | None = None
        self._server: LocalRedis | None = None
        self._janitor: Client | None = None
        self._storages: list[str] = []
        self._swept = 0
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def storage(self) -> RedisTierConfig:
        """The configuration of a fresh storage (a new key prefix); earlier storages' keys are deleted first."""
        with self._lock:
            base = self._started()
            if os.getpid() == self._pid:  # at exit, once (an explicit clean_up unregisters it)
                atexit.unregister(self.clean_up)
                atexit.register(self.clean_up)
            self._sweep(len(self._storages))
            prefix = f"{self.token}:{len(self._storages) + 1}"
            self._storages.append(prefix)
        return base.model_copy(update={"prefix": prefix})

    def _started(self) -> RedisTierConfig:
        if self._base is not None:
            return self._base
        given = self._given
        if given is None:
            url = os.environ.get("KVPROTO_REDIS_CLUSTER_URL" if self.cluster else "KVPROTO_REDIS_URL")
            if url:
                given = RedisTierConfig(url=url, cluster=self.cluster)
            else:
                self._server = LocalRedis(nodes=3 if self.cluster else 1)
                given = RedisTierConfig(url=self._server.url, cluster=self.cluster)
        self._base = given.model_copy(update={"ttl_s": _KIT_TTL_S, "read_threads": 4, "write_threads": 4,
                                              "probe_min_interval_s": 0.002})
        return self._base

    def _sweep(self, upto: int) -> None:
        """Delete the keys of storages ``[swept, upto)`` (in the process that made the run only)."""
        if os.getpid() != self._pid or self._base is None:
            return
        while self._swept < upto:
            self.delete_under(f"{self._storages[self._swept]}:")
            self._swept += 1

    def delete_under(self, prefix: str) -> int:
        """Delete every key starting with ``prefix`` (no glob characters); how many there were."""
        if self._base is None:
            return 0
        if self._janitor is None:
            self._janitor = make_client(self._base)
        ops, deleted = RedisOps(), 0
        for page in ops.scan(self._janitor, f"{prefix}*"):
            ops.delete(self._janitor, page)
            deleted += len(page)
        return deleted

    def clean_up(self) -> None:
        """Delete every key of this run and stop the server it started (in the process that made it; idempotent)."""
        if os.getpid() != self._pid:
            return
        atexit.unregister(self.clean_up)
        with self._lock:
            try:
                if self._base is not None and self._server is None:
                    self.delete_under(f"{self.token}:")
                    self._swept = len(self._storages)
            except Exception as exc:  # at exit: say so, never raise
                _log.warning("kvproto conform redis: could not delete the keys under %s: %s", self.token, short_error(exc))
            finally:
                if self._janitor is not None:
                    self._janitor.close()
                    self._janitor = None
                if self._server is not None:
                    self._server.stop()
                    self._server = None
                    self._base = None


def _kit_tier(buffer: memoryview, config: RedisTierConfig, name: str, *, down: bool = False) -> RedisTier:
    tier: RedisTier = faulty_jobs(RedisTier)(buffer, config, name=name, wrap=FaultyBackend, ops=KitRedisOps(down=down))
    return tier


def _reopen(tier: RedisTier, buffer: memoryview) -> RedisTier:
    """A second instance over the same server and prefix (a second engine on the same server)."""
    return _kit_tier(buffer, tier.config, tier.name)


def _reopen_other_layout(tier: RedisTier, buffer: memoryview) -> RedisTier:
    """A second instance over the same server and prefix for another model layout (another namespace, TIER-22)."""
    layout = {**tier.config.layout, "kvproto-kit": "another layout"}
    return _kit_tier(buffer, tier.config.model_copy(update={"layout": layout}), tier.name)


def _reopen_with_layout(tier: RedisTier, buffer: memoryview, layout: Mapping[str, str]) -> RedisTier:
    """A second instance over the same server and prefix whose layout is ``layout`` over the tier's own (TIER-22)."""
    return _kit_tier(buffer, tier.config.model_copy(update={"layout": {**tier.config.layout, **layout}}), tier.name)


def _start_down(tier: RedisTier, buffer: memoryview) -> RedisTier:
    """A second instance while every request fails: REDIS-1's start-up check must refuse it (KIT-20)."""
    return _kit_tier(buffer, tier.config, tier.name, down=True)


def _expected_abilities(tier: RedisTier) -> tuple[str, ...]:
    """What REDIS-10 says a RedisTier declares: async lookups, sharing, partial jobs, persistence (KIT-21)."""
    return ("async_lookup", "sharing", "partial_jobs", "persistence")


def _request_plan(tier: RedisTier, n: int) -> tuple[int, int]:
    """REDIS-6's plan: one pipeline per chunk of the engine's existence batch, whatever the storage holds."""
    pipelines = -(-n // PROBE_CHUNK_KEYS)
    return pipelines, pipelines


def _keys_under(client: Client, prefix: str) -> list[str]:
    """Every key starting with ``prefix`` (uncounted: not through the tier's ops)."""
    return [k for page in RedisOps().scan(client, f"{prefix}*") for k in page]


def _grow_storage(tier: RedisTier, objects: int) -> None:
    """Add filler keys under the tier's namespace until it holds ``objects`` (TIER-33)."""
    have = len(_keys_under(tier.client, tier.namespace_prefix))
    pipe = tier.client.pipeline(transaction=False)
    for i in range(have, objects):
        pipe.set(f"{tier.namespace_prefix}~/kvproto-kit-filler-{i:06d}", b"filler", px=_ttl_ms(tier))
    pipe.execute()


def _ttl_ms(tier: RedisTier) -> int | None:
    return None if tier.config.ttl_s is None else round(tier.config.ttl_s * 1000)


def _storage_names(tier: RedisTier) -> list[str]:
    """Every key under the tier's configured prefix (every namespace there): what every instance over that
    prefix wrote (REDIS-2, TIER-37)."""
    return _keys_under(tier.client, f"{tier.config.prefix}:")


def _namespace_of(tier: RedisTier) -> str:
    """The prefix every key the tier writes starts with: ``<prefix>:<namespace>/`` (REDIS-2, TIER-37)."""
    return tier.namespace_prefix


def _read_block(tier: RedisTier, key: OffloadKey) -> bytes | None:
    data: object = tier.client.get(tier.key_of(key))
    return bytes(data)[env.HEADER_BYTES :] if isinstance(data, bytes) else None


def _seed_block(tier: RedisTier, key: OffloadKey, data: bytes) -> None:
    tier.client.set(tier.key_of(key), env.encode(key, data, tier.namespace), px=_ttl_ms(tier))


def _corrupt_on_read(tier: RedisTier, keys: Iterable[OffloadKey]) -> None:
    """Overwrite each stored value with one payload byte flipped: the checksum must catch it."""
    for key in keys:
        data: object = tier.client.get(tier.key_of(key))
        if not isinstance(data, bytes):
            continue
        damaged = bytearray(data)
        damaged[env.HEADER_BYTES] ^= 0xFF
        tier.client.set(tier.key_of(key), bytes(damaged), px=_ttl_ms(tier))


REDIS_HOOKS: dict[str, Callable[..., Any]] = {
    "reopen": _reopen,
    "reopen_other_layout": _reopen_other_layout,
    "reopen_with_layout": _reopen_with_layout,
    "read_block": _read_block,
    "seed_block": _seed_block,
    "corrupt_on_read": _corrupt_on_read,
    **remote_fault_hooks(KitRedisOps),
    "grow_storage": _grow_storage,
    "request_plan": _request_plan,
    "start_down": _start_down,
    "expected_abilities": _expected_abilities,
    "storage_names": _storage_names,
    "namespace_of": _namespace_of,
    "replace_block": _seed_block,  # a value replaced after its probe read the checksum fails its load (REDIS-7, TIER-34)
}
"""The kit's backdoor hooks for RedisTier (KIT-5); job faults need a tier built as ``faulty_jobs(RedisTier)(...,
wrap=FaultyBackend)``, request faults and counts one built with ``ops=KitRedisOps()``."""


def redis_spec(name: str = "redis", *, run: KitRun | None = None, description: str = "") -> TierSpec:
    """RedisTier over a fresh key prefix of ``run``'s server per tier (a new :class:`KitRun` by default),
    all capabilities but eviction declared. Each tier is a ``faulty_jobs(RedisTier)`` built with
    ``wrap=FaultyBackend`` and ``ops=KitRedisOps()``: the kit's faults (KIT-5)."""
    kit_run = KitRun() if run is None else run
    named: dict[tuple[object, ...], KitRun] = {}  # a run per server named by options (each cleans up its keys)

    def build(buffer: memoryview, *, url: str | None = None, host: str | None = None, port: int | None = None,
              db: int | None = None, username: str | None = None, password: str | None = None) -> RedisTier:
        """The kit's tier over a fresh key prefix. The options (``kvproto conform redis --option
        url=redis://10.0.0.5:6379/0``, or ``host``, ``port``...) name another server than the run's;
        the keys written there are deleted as the run's are."""
        where = (url, host, port, db, username, password)
        if where == (None,) * 6:
            return _kit_tier(buffer, kit_run.storage(), name)
        if where not in named:
            fields = ("url", "host", "port", "db", "username", "password")
            given = {k: v for k, v in zip(fields, where, strict=True) if v is not None}
            named[where] = KitRun(RedisTierConfig(cluster=kit_run.cluster, **given))
        return _kit_tier(buffer, named[where].storage(), name)

    return TierSpec(
        name,
        "secondary",
        build,
        hooks=REDIS_HOOKS,
        tier_class=RedisTier,
        hosting_factory=hosted_redis_tier,
        description=description or (
            f"kvproto_redis.RedisTier(buffer, RedisTierConfig(url=$KVPROTO_REDIS_URL or a redis-server it starts, "
            f"prefix='{KIT_PREFIX}:<run>:<n>'), ops=KitRedisOps(), wrap=FaultyBackend), as a faulty_jobs(RedisTier)"
        ),
    )


def _servable(name: str, variable: str) -> None:
    """Raise :class:`~kvproto.hosting.TierUnavailable` when the kit has no server to run ``name`` on: no
    ``variable`` names one and there is no ``redis-server`` to start (``kvproto conform`` with no target
    then skips the tier, saying so; named, it is a usage error in one line: KIT-9)."""
    if not os.environ.get(variable) and shutil.which("redis-server") is None:
        raise TierUnavailable(
            f"tier {name!r} needs a Redis server: set {variable}=redis://HOST:PORT/DB, or install redis-server "
            "(Debian: apt-get install redis-server)",
            missing="redis-server",
        )


def conformance_spec() -> TierSpec:
    """``kvproto conform redis``: one server (``KVPROTO_REDIS_URL``, else one started on loopback)."""
    _servable("redis", "KVPROTO_REDIS_URL")
    return redis_spec()


def cluster_conformance_spec() -> TierSpec:
    """``kvproto conform redis-cluster``: a Redis Cluster (``KVPROTO_REDIS_CLUSTER_URL``, else three nodes
    started on loopback)."""
    _servable("redis-cluster", "KVPROTO_REDIS_CLUSTER_URL")
    return redis_spec("redis-cluster", run=KitRun(cluster=True))
