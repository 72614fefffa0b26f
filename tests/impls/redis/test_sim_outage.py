"""``kvproto simulate --secondary redis:url=...`` with its server killed for 10 s mid-run and started again,
empty, on the same port (issue 38): 0 wrong bytes throughout; the run is not clean (the redis tier lost its
jobs meanwhile, named as failing); and the tier serves again after the restart."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tests.impls.sim_outage import BEFORE_S, OUTAGE_S, lost_over_time, simulate_with_outage

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
    data = run.data
    assert data["wrong_bytes"] == 0 and data["problems"] == [], data["problems"]
    assert run.code == 1 and any(w.startswith("failing tier redis: ") for w in data["warnings"]), data["warnings"]
    seconds, lost = lost_over_time(data, "redis")
    first = next(i for i, n in enumerate(lost) if n > 0)
    assert seconds[first] > BEFORE_S / 2  # it worked before the server went away
    last = max(i for i in range(1, len(lost)) if lost[i] > lost[i - 1])
    assert seconds[last] - seconds[first] <= OUTAGE_S + 5  # the losses end with the outage
    served = [p["served"].get("redis", 0) for p in data["timeline"]["points"]]
    assert served[-1] > served[last], "the tier served no block after its server came back"
