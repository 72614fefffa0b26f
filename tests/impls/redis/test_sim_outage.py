"""``kvproto simulate --secondary redis:url=...`` with its server killed for 10 s mid-run and started again,
empty, on the same port (issue 38): 0 wrong bytes throughout; the run is not clean (the redis tier lost its
jobs meanwhile, named as failing); and the tier serves again after the restart."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tests.impls.sim_outage import assert_served_again, simulate_with_outage

if TYPE_CHECKING:
    from kvproto_redis import LocalRedis


def test_a_redis_outage_serves_no_wrong_byte_and_the_tier_serves_again(own_redis: LocalRedis, tmp_path: Path) -> None:
    client = own_redis.client()
    try:
        run = simulate_with_outage(
            tmp_path, ["--secondary", f"redis:url={own_redis.url},prefix=outage"], env={},
            storing=lambda: int(client.dbsize()) >= 20, stop=own_redis.kill, start=own_redis.restart,
        )
    finally:
        client.close()
    assert_served_again(run, "redis")
