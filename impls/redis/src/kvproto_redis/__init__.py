"""The Redis/Valkey tier of kvproto: one verified envelope per block as a string key, on redis-py.

* :class:`RedisTier` satisfies :class:`kvproto.SecondaryTier` (checked by mypy in its module):
  a :class:`kvproto.tierkit.BlobTier` over :class:`RedisBackend`, the server's I/O (a
  :class:`kvproto.tierkit.BlobBackend`), one server or a Redis Cluster.
* :class:`RedisTierConfig` is its pydantic configuration (address, ACL credentials, TLS, key
  prefix, timeouts); :func:`make_client` builds the redis-py client it names.
* :class:`RedisOps` is the seam every request goes through (the kit's faults and request counts).
* :class:`LocalRedis` starts a throwaway ``redis-server`` (one node or a cluster) on loopback: what
  ``kvproto conform redis`` uses when no server is named, and what the tests start.
* :func:`conformance_spec` is the ``redis`` entry point of ``kvproto.tiers``; :func:`redis_spec`
  builds the same spec over any server.

Clauses: kvproto's ``spec/CONTRACT.md``, section "REDIS: the Redis/Valkey tier".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvproto.hosting import lazy_attributes

from kvproto_redis._backend import RedisBackend
from kvproto_redis._client import make_client
from kvproto_redis._config import LayoutValue, RedisTierConfig
from kvproto_redis._local_server import LocalRedis
from kvproto_redis._ops import RedisOps
from kvproto_redis._stats import RedisTierStats
from kvproto_redis._tier import RedisTier

if TYPE_CHECKING:
    from kvproto_redis._conformance import (
        REDIS_HOOKS,
        KitRun,
        cluster_conformance_spec,
        conformance_spec,
        faults_of,
        redis_spec,
    )

#: Loaded on first use: they import the kit, which importing this package does not (KIT-14).
_CONFORMANCE = frozenset({"REDIS_HOOKS", "KitRun", "cluster_conformance_spec", "conformance_spec", "faults_of", "redis_spec"})
__getattr__ = lazy_attributes("kvproto_redis._conformance", _CONFORMANCE, owner=__name__)

__all__ = [
    "REDIS_HOOKS",
    "KitRun",
    "LayoutValue",
    "LocalRedis",
    "RedisBackend",
    "RedisOps",
    "RedisTier",
    "RedisTierConfig",
    "RedisTierStats",
    "cluster_conformance_spec",
    "conformance_spec",
    "faults_of",
    "make_client",
    "redis_spec",
]
