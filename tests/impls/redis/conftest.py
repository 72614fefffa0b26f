"""Real Redis servers for the Redis tier's tests: ``redis-server`` child processes on 127.0.0.1, free
ports, persistence off, ready when they answer PING (a cluster: when every node says
``cluster_state:ok``), stopped by PID at the end (kvproto_redis.LocalRedis). Nothing is mocked: the
tier talks RESP to the server.

Without ``redis-server`` on PATH the tests skip, saying how to install it, except under CI (``CI=true``),
where they fail: ``.ci/run`` and ``./dev`` install Debian's ``redis-server``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from kvproto_redis import LocalRedis


def _need_server() -> type[LocalRedis]:
    """kvproto-redis's LocalRedis, where the distribution and redis-server are installed."""
    module = pytest.importorskip("kvproto_redis", reason="kvproto-redis is not installed: pip install -e impls/redis")
    if shutil.which("redis-server") is not None:
        local: type[LocalRedis] = module.LocalRedis
        return local
    why = "redis-server is not installed: apt-get install redis-server (./dev and .ci/run do it)"
    if os.environ.get("CI") == "true":
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[LocalRedis]:
    """One loopback server for the session; tests keep apart by key prefix (tests that stop a server use ``own_redis``)."""
    with _need_server()() as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalRedis]:
    """A three-node Redis Cluster on loopback for the session (``redis-cli --cluster create``)."""
    with _need_server()(nodes=3) as cluster:
        yield cluster


@pytest.fixture
def own_redis() -> Iterator[LocalRedis]:
    """A server of this test's own, which the test may kill and restart."""
    with _need_server()() as server:
        yield server


@pytest.fixture
def local_redis() -> type[LocalRedis]:
    """The LocalRedis class, for a test that starts servers of its own with other options (auth, TLS, maxmemory)."""
    return _need_server()
