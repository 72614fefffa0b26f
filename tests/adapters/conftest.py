"""Fixtures shared by the adapters' tests: a real ``redis-server`` on 127.0.0.1 (kvproto_redis.LocalRedis,
stopped by PID at the end), for hosting the ``redis`` tier in vLLM and LMCache; and a real Mooncake Store
(a master and a storage process on 127.0.0.1, kvproto_mooncake.LocalMooncake, stopped by PID) for hosting
the ``mooncake`` tier (MC-11).

Without ``redis-server`` on PATH (or kvproto-redis) the tests that ask for it skip, saying how to install
it, except under CI (``CI=true``), where they fail: ``.ci/run`` and ``./dev`` install both (as
``tests/impls/redis/conftest.py`` does).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.impls.mooncake._support import running_cluster

if TYPE_CHECKING:
    from kvproto_mooncake import LocalMooncake
    from kvproto_redis import LocalRedis


@pytest.fixture(scope="session")
def redis_server() -> Iterator[LocalRedis]:
    """One loopback Redis server for the session; tests keep apart by key prefix."""
    why = "redis-server is not installed: apt-get install redis-server (./dev and .ci/run do it)"
    try:
        import kvproto_redis
    except ImportError:
        why = "kvproto-redis is not installed: pip install -e impls/redis"
    else:
        if shutil.which("redis-server") is not None:
            with kvproto_redis.LocalRedis() as server:
                yield server
            return
    if os.environ.get("CI") == "true":
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture(scope="session")
def mooncake_cluster() -> Iterator[LocalMooncake]:
    """One Mooncake master and storage process on loopback for the session; tests keep apart by key prefix.
    Skipped without Mooncake (failed in CI), as ``tests/impls/mooncake/conftest.py``'s."""
    with running_cluster() as cluster:
        yield cluster
