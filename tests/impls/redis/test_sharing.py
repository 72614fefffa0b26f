"""Four processes share one Redis server and key prefix through the tier's public API (REDIS-10, issue 38):
each stores an overlapping slice of the same keys, then looks up and loads every key, comparing each
loaded row byte for byte with the block its key names (tests/impls/process_sharing.py). Real ``spawn``
processes, a real server."""

from __future__ import annotations

from functools import partial
from typing import Any

from kvproto_redis import LocalRedis, RedisTier, RedisTierConfig
from tests.impls.process_sharing import DEADLINE_STEPS, share_in_four_processes, share_rounds


def _share(url: str, prefix: str, index: int, barrier: Any, results: Any) -> None:
    """One process: a RedisTier on ``url`` under ``prefix``, sharing its rounds with the others."""
    config = RedisTierConfig(url=url, prefix=prefix, socket_timeout_s=5.0, job_timeout_s=20.0,
                             probe_min_interval_s=0.002, read_threads=4, write_threads=4, probe_deadline_steps=DEADLINE_STEPS)
    share_rounds(partial(RedisTier, config=config, name=f"share-{index}"), index, barrier, results)


def test_four_processes_share_blocks_with_no_wrong_byte(redis_server: LocalRedis) -> None:
    """4 spawned processes, one server and prefix, 3 rounds of 64 overlapping keys: every key loads in
    every process, 0 wrong bytes, and each process loaded blocks only the others stored."""
    share_in_four_processes(_share, redis_server.url, "test-sharing")
