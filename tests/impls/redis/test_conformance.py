"""RedisTier passes the conformance kit against real servers, one node and a three-node cluster, and a kit run
deletes every key it wrote (REDIS-11): through pytest classes here, and ``kvproto conform redis`` from the
command line in a child process."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvproto import SecondaryTier

from tests.impls._conform_child import conform_remote_tier_in_a_child
from tests.impls._kit_hooks import HookTableTests

redis_tier = pytest.importorskip("kvproto_redis", reason="kvproto-redis is not installed: pip install -e impls/redis")
from kvproto_redis import REDIS_HOOKS, KitRun, LocalRedis, RedisTierConfig, redis_spec  # noqa: E402 (after importorskip)
from tests.impls.redis._support import keys_under  # noqa: E402


class _RedisHooks(HookTableTests):
    """The kit's backdoor hooks, every one through the distribution's own REDIS_HOOKS (what ``kvproto conform
    redis`` uses); job faults: a FaultyBackend below a ``faulty_jobs(RedisTier)``."""

    kit_profile = "fast"
    HOOKS = REDIS_HOOKS
    TABLE_HOOKS = ("reopen_other_layout", "start_down", "fail_io", "storage_requests", "grow_storage", "request_plan",
                   "expected_abilities", "storage_names", "namespace_of", "replace_block", "reopen_with_layout")


def _factory_over(server: LocalRedis) -> Iterator[Callable[[memoryview], SecondaryTier]]:
    """The spec's factory over ``server`` for one check; after it, the run's keys are deleted and none is left."""
    run = KitRun(RedisTierConfig(url=server.url, cluster=server.cluster))
    spec = redis_spec(run=run)
    yield spec.factory
    run.clean_up()
    assert keys_under(server, f"{run.token}:") == []


class TestRedisTierKit(_RedisHooks):
    """Every kit check against one redis-server on loopback: a fresh key prefix per tier, deleted after."""

    @pytest.fixture
    def tier_factory(self, redis_server: LocalRedis) -> Iterator[Callable[[memoryview], SecondaryTier]]:
        yield from _factory_over(redis_server)


class TestRedisClusterKit(_RedisHooks):
    """Every kit check against a three-node Redis Cluster on loopback."""

    @pytest.fixture
    def tier_factory(self, redis_cluster: LocalRedis) -> Iterator[Callable[[memoryview], SecondaryTier]]:
        yield from _factory_over(redis_cluster)


def test_a_new_storage_deletes_the_keys_of_the_earlier_ones(redis_server: LocalRedis) -> None:
    """The spec's factory: tier n + 1 gets a fresh prefix, and the keys of tiers 1..n go (their checks are over)."""
    from tests.impls._tier_runner import Runner, key, make_buffer

    run = KitRun(RedisTierConfig(url=redis_server.url))
    spec = redis_spec(run=run)
    first_buffer = make_buffer()
    first = spec.factory(first_buffer)
    try:
        assert Runner(first, first_buffer).store([key(1), key(2)]).success
        assert len(keys_under(redis_server, f"{run.token}:1:")) == 3  # two blocks and the manifest
    finally:
        first.shutdown()
    second = spec.factory(make_buffer())
    try:
        assert keys_under(redis_server, f"{run.token}:1:") == []
        assert second.config.prefix == f"{run.token}:2"
    finally:
        second.shutdown()
    run.clean_up()
    assert keys_under(redis_server, f"{run.token}:") == []


def test_conform_redis_from_the_command_line_passes_and_leaves_no_key_behind(redis_server: LocalRedis, tmp_path: Path) -> None:
    """``kvproto conform redis`` against a server named by KVPROTO_REDIS_URL: every check passes or is skipped
    for what Redis does not declare, and the server holds no ``kvproto-kit:*`` key once the command ended."""
    outcomes, _ = conform_remote_tier_in_a_child("redis", tmp_path / "r.json", env={"KVPROTO_REDIS_URL": redis_server.url},
                                                 options=["--no-typecheck"])
    for check in ("test_sharing_between_instances", "test_persistence_across_instances",
                  "test_a_killed_writer_leaves_no_false_hit", "test_existence_batches_keep_the_declared_request_plan",
                  "test_a_block_replaced_after_its_hit_never_loads_the_new_bytes",
                  "test_io_errors_inside_transfers_fail_cleanly", "test_a_constructor_refuses_storage_that_is_down"):
        assert outcomes[check] == "passed", check
    assert keys_under(redis_server, "kvproto-kit:") == []


def test_simulate_on_a_server_named_by_host_and_port_is_clean_and_leaves_no_key_behind(
    redis_server: LocalRedis, tmp_path: Path
) -> None:
    """``kvproto simulate --secondary redis:host=127.0.0.1,port=P`` (host and port apart: a command-line option
    value cannot hold ``:`` today): the tier stores and serves blocks with no wrong byte, and its keys go at the end."""
    report = tmp_path / "sim.json"
    done = subprocess.run(
        [sys.executable, "-m", "kvproto", "simulate", "--steps", "1500", "--step-ms", "1", "--secondary",
         f"redis:host=127.0.0.1,port={redis_server.port}", "--json", str(report)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(report.read_text())
    assert result["clean"] and result["wrong_bytes"] == 0 and result["exceptions"] == 0
    redis = result["tiers"]["redis"]
    assert redis["stored_blocks"] > 0 and redis["served_blocks"] > 0
    assert redis["jobs"]["store"]["failed"] == 0 and redis["jobs"]["load"]["failed"] == 0
    assert keys_under(redis_server, "kvproto-kit:") == []
