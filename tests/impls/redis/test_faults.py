"""RedisTier when its server goes away: jobs fail, lookups answer MISS, nothing raises into the scheduler,
and the same instance serves again once a server is back on the port, empty (REDIS-8)."""

from __future__ import annotations

import pytest

from kvproto import TransferJob

redis_tier = pytest.importorskip("kvproto_redis", reason="kvproto-redis is not installed: pip install -e impls/redis")
from kvproto_redis import LocalRedis  # noqa: E402 (after importorskip)
from tests.impls._tier_runner import key, shut_down_after  # noqa: E402
from tests.impls.redis._support import config_for, open_tier  # noqa: E402


def test_server_killed_mid_run_jobs_fail_lookups_miss_and_the_tier_recovers(own_redis: LocalRedis) -> None:
    """Killed: a store and a load fail, an unknown key answers MISS. Back on its port, empty: the same instance
    stores again; keys whose load failed meanwhile answer MISS; keys it still remembers answer HIT, and their
    loads fail (the server lost them: counted in missing_on_load, never other bytes), then MISS."""
    config = config_for(own_redis, retries=0, connect_timeout_s=0.5, socket_timeout_s=1.0, job_timeout_s=5.0)
    with shut_down_after(open_tier(config)) as (tier, run):
        tried, remembered = [key(i) for i in range(4)], [key(i) for i in range(4, 8)]
        assert run.store(tried + remembered).success
        own_redis.kill()  # SIGKILL: what it held is gone
        assert not run.store([key(10)]).success
        result, right, wrong = run.load(tried)
        assert not result.success and not right and not wrong
        assert run.resolve([key(20)]) == {key(20): "MISS"}  # the existence check failed: MISS, never an exception
        assert tier.stats.failed_loads == len(tried) and tier.stats.failed_stores == 1
        own_redis.restart()  # the same port, empty
        fresh = [key(30), key(31)]
        assert run.store(fresh).success  # the same instance works again
        run.finish()
        answers = run.resolve(tried + remembered + fresh)
        assert answers == {**{k: "MISS" for k in tried}, **{k: "HIT" for k in remembered + fresh}}
        result, right, wrong = run.load(remembered)
        assert not result.success and not right and not wrong
        assert tier.stats.missing_on_load == len(remembered)
        run.finish()
        assert run.resolve(remembered) == {k: "MISS" for k in remembered}


def test_shutdown_reports_jobs_and_a_closed_tier_fails_later_jobs_without_raising(redis_server: LocalRedis) -> None:
    tier, run = open_tier(config_for(redis_server))
    run.submit_store([key(1), key(2)])
    tier.shutdown()
    assert [r.success for r in tier.get_finished_jobs()] == [True]
    tier.submit_store(TransferJob(50, (key(3),), (3,), False))
    assert [r.success for r in tier.get_finished_jobs()] == [False]
    tier.shutdown()  # idempotent
