"""Fixtures shared by the adapters' tests: a real ``redis-server`` on 127.0.0.1 (kvproto_redis.LocalRedis,
stopped by PID at the end), for hosting the ``redis`` tier in vLLM and LMCache.

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

if TYPE_CHECKING:
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
