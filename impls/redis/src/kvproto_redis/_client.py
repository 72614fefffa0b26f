"""Building the redis-py client a configuration names: one server or a cluster, ACL credentials, TLS,
and timeouts and retries chosen for a cache (REDIS-1, REDIS-8)."""

from __future__ import annotations

from typing import Any

from redis import BlockingConnectionPool, Connection, Redis, SSLConnection
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from kvproto.errors import ConfigurationError

from kvproto_redis._config import RedisTierConfig
from kvproto_redis._ops import Client

__all__ = ["connection_options", "make_client", "max_connections"]


def max_connections(config: RedisTierConfig) -> int:
    """Connections the client keeps at most (per node in a cluster): every worker thread of the tier,
    the existence checks, the housekeeping and a reset on the scheduler's thread each hold one at most."""
    return config.read_threads + config.write_threads + 4


def connection_options(config: RedisTierConfig) -> dict[str, Any]:
    """redis-py connection settings for ``config``: credentials, TLS, timeouts, retries (REDIS-1, REDIS-8)."""
    username, password = config.credentials
    options: dict[str, Any] = {
        "username": username,
        "password": password,
        "socket_connect_timeout": config.connect_timeout_s,
        "socket_timeout": config.socket_timeout_s,
        "retry": Retry(ExponentialBackoff(cap=config.max_backoff_s, base=config.init_backoff_s), config.retries),
        "client_name": "kvproto-redis",
    }
    if config.uses_tls:
        options |= {
            "ssl_ca_certs": None if config.tls_ca_file is None else str(config.tls_ca_file),
            "ssl_certfile": None if config.tls_cert_file is None else str(config.tls_cert_file),
            "ssl_keyfile": None if config.tls_key_file is None else str(config.tls_key_file),
            "ssl_cert_reqs": "required" if config.tls_verify else "none",
            "ssl_check_hostname": config.tls_verify,
        }
    return options


def make_client(config: RedisTierConfig) -> Client:
    """The client ``config`` describes. One server: a blocking pool of :func:`max_connections`
    connections (a thread waits for a free one, at most ``socket_timeout_s``). A cluster: redis-py's
    ``RedisCluster``, which learns the slots from the node named at once (ConfigurationError, naming the
    server, if it cannot)."""
    host, port = config.address
    options = connection_options(config)
    if not config.cluster:
        connection: type[Connection] = SSLConnection if config.uses_tls else Connection
        pool = BlockingConnectionPool(  # type: ignore[no-untyped-call]  # redis-py leaves the pool's __init__ unannotated
            max_connections=max_connections(config), timeout=config.socket_timeout_s, connection_class=connection,
            host=host, port=port, db=config.database, **options,
        )
        return Redis.from_pool(pool)
    if config.uses_tls:
        options["ssl"] = True
    try:
        return RedisCluster(host=host, port=port, max_connections=max_connections(config), **options)
    except Exception as exc:  # redis-py raises its own errors for a cluster it cannot reach or read
        raise ConfigurationError(f"cannot reach the Redis Cluster at {config.where()}: {type(exc).__name__}: {exc}") from exc
