"""kvproto-redis under a black-holed network and a server restarted empty (issue 38; REDIS-13).

``redis-server`` runs as a child process (``kvproto_redis.LocalRedis``), behind a black-hole proxy in
another (``tests/impls/blackhole_proxy.py``): the tier's client talks to the proxy's port, and a hole
swallows its new and live connections alike. The empty restart is a SIGKILL of the server and a new
one on the same port (persistence off: it starts empty). The harness (``tests/impls/remote_faults.py``)
drives the tier as the tiering manager does; the tests and their bounds are those of every remote tier
(``tests/impls/remote_fault_tests.py``). Measured here: longest call the tier's doing none (every call
over 1 ms was preempted), HIT-then-failed 32 of 1,024 keys (3.1%) after the restart, 16 of 768 (2.1%)
in the hole.

A Redis Cluster (three nodes) cannot be proxied: its nodes redirect the client to their own ports. Its
network is black-holed by stopping every node (SIGSTOP, ``FrozenProcesses``; SIGCONT after), and its
empty restart kills every node (SIGKILL) and creates the cluster again on the same ports. Measured here:
longest call the tier's doing none, HIT-then-failed 32 of 1,024 (3.1%) after the restart, 12-16 of 768
(1.6-2.1%) in the hole.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvproto import SecondaryTier

from tests.impls.blackhole_proxy import BlackholeProxy
from tests.impls.remote_fault_tests import FrozenProcesses, RemoteFaultTests
from tests.impls.remote_faults import RemoteRig

pytest.importorskip("kvproto_redis", reason="kvproto-redis is not installed: pip install -e impls/redis")
from kvproto_redis import LocalRedis, RedisTier  # noqa: E402 (after importorskip)
from tests.impls.redis._support import config_for  # noqa: E402

TIMEOUTS = dict(retries=0, connect_timeout_s=0.5, socket_timeout_s=1.0, job_timeout_s=2.0)
"""Short enough that the hole's jobs end within the run (REDIS-8); the hole lasts longer than all of them."""


class EmptyRestart:
    """The rig's server: ``LocalRedis.kill`` (SIGKILL) of every node and ``restart`` on the same ports, empty."""

    def __init__(self, server: LocalRedis) -> None:
        self.server = server

    def kill(self) -> None:
        for port in self.server.ports:
            self.server.kill(port)

    def start_empty(self) -> None:
        self.server.restart()


@pytest.fixture
def rig(own_redis: LocalRedis) -> Iterator[RemoteRig]:
    """kvproto-redis on a server of its own, through a black-hole proxy."""
    with BlackholeProxy(own_redis.port) as proxy:
        config = config_for(own_redis, url=f"redis://127.0.0.1:{proxy.port}/0", **TIMEOUTS)

        def open_tier(buffer: memoryview) -> SecondaryTier:
            return RedisTier(buffer, config)

        yield RemoteRig("redis", open_tier, proxy, EmptyRestart(own_redis))


class TestRedisRemoteFaults(RemoteFaultTests):
    """kvproto-redis behind the black-hole proxy, redis-server killed and started empty on its port (REDIS-13)."""


class TestRedisClusterRemoteFaults(RemoteFaultTests):
    """kvproto-redis on a three-node cluster of its own, every node stopped (SIGSTOP) for the black hole,
    killed and the cluster created again empty for the restart (REDIS-13)."""

    @pytest.fixture
    def rig(self, local_redis: type[LocalRedis]) -> Iterator[RemoteRig]:
        with local_redis(nodes=3) as cluster:
            config = config_for(cluster, **TIMEOUTS)

            def open_tier(buffer: memoryview) -> SecondaryTier:
                return RedisTier(buffer, config)

            yield RemoteRig("redis-cluster", open_tier, FrozenProcesses(cluster.pids), EmptyRestart(cluster))
