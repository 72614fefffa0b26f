"""With the master gone, requests fail at once instead of each waiting out Mooncake's RPC retries (MC-12):
the first request that finds it gone closes the tier's gate, and until a probe of the master's port
connects again no request reaches Mooncake's client (counted by the kit's ``KitMooncakeOps``); jobs
fail, lookups answer MISS; once the master is back the same tier stores and loads again."""

from __future__ import annotations

import time

from tests.impls._tier_runner import Runner, key, make_buffer
from tests.impls.mooncake._support import MOONCAKE_MISSING

if MOONCAKE_MISSING is None:
    from kvproto_mooncake import LocalMooncake, MooncakeTier
    from kvproto_mooncake._conformance import KitMooncakeOps


def test_with_the_master_gone_no_request_reaches_the_client_until_it_answers(own_cluster: LocalMooncake,
                                                                              prefix: str) -> None:
    ops = KitMooncakeOps()
    buffer = make_buffer()
    tier = MooncakeTier(buffer, own_cluster.config(prefix=prefix), ops=ops)
    run = Runner(tier, buffer)
    try:
        before = [key(i, b"before") for i in range(4)]
        assert run.store(before).success and tier.stats.master_outages == 0
        own_cluster.stop_master()
        assert not run.store([key(i, b"first") for i in range(4)], [4, 5, 6, 7]).success
        assert tier.stats.master_outages == 1  # that store's existence check found the master gone
        asked = ops.requests
        for r in range(5):
            assert not run.store([key(i, f"during-{r}".encode()) for i in range(4)], [8, 9, 10, 11]).success
            result, right, wrong = run.load(before, [12, 13, 14, 15])
            assert not result.success and not right and not wrong
            assert set(run.resolve([key(99, f"unknown-{r}".encode())]).values()) == {"MISS"}
        assert ops.requests == asked, "a request reached Mooncake's client while the master was gone"
        assert tier.stats.refused_while_down >= 15
        own_cluster.start_master()  # the same ports; the storage process registers again
        deadline = time.monotonic() + 60
        after = [key(i, b"after") for i in range(4)]
        while not run.store(after, [16, 17, 18, 19]).success:  # the first probe that connects opens the gate
            assert time.monotonic() < deadline, "the tier never stored again after the master came back"
        _, right, wrong = run.load(after, [20, 21, 22, 23])
        assert right == set(after) and not wrong
        assert ops.requests > asked and tier.stats.master_outages == 1
    finally:
        tier.shutdown()
