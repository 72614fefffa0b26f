"""The master stopped mid-run and restarted empty (MC-5, MC-6): jobs fail and lookups answer MISS, never an
exception into the scheduler and never wrong bytes; once the master is back the tier stores and loads again,
and blocks the restart forgot fail their load, then MISS."""

from __future__ import annotations

import time

from kvproto import members as lr

from tests.impls._tier_runner import Runner, key, make_buffer
from tests.impls.mooncake._support import MOONCAKE_MISSING

if MOONCAKE_MISSING is None:
    from kvproto_mooncake import LocalMooncake, MooncakeTier


def test_a_master_outage_fails_jobs_then_the_tier_serves_again(own_cluster: LocalMooncake, prefix: str) -> None:
    buffer = make_buffer()
    tier = MooncakeTier(buffer, own_cluster.config(prefix=prefix, op_timeout_s=2.0, job_timeout_s=5.0))
    run = Runner(tier, buffer)
    try:
        before = [key(i, b"before") for i in range(4)]
        assert run.store(before).success
        own_cluster.stop_master()
        stores = run.submit_store([key(i, b"during") for i in range(4)], [4, 5, 6, 7])
        loads = run.submit_load_job(before, [8, 9, 10, 11])
        assert not run.wait(stores).success
        result = run.wait(loads)
        assert not result.success and not result.succeeded_keys(run.jobs[loads])
        assert run.resolve([key(99, b"during")]) == {key(99, b"during"): "MISS"}  # the existence check failed: MISS
        own_cluster.start_master()  # the same ports; it knows no key, and the storage process registers again
        deadline = time.monotonic() + 60
        after = [key(i, b"after") for i in range(4)]
        while not run.store(after).success:  # the client reconnects at its next request
            assert time.monotonic() < deadline, "the tier never stored again after the master came back"
        _, right, wrong = run.load(after, [12, 13, 14, 15])
        assert right == set(after) and not wrong
        _, right, wrong = run.load(before, [16, 17, 18, 19])  # remembered as stored, forgotten by the master
        assert not right and not wrong
        assert all(tier.lookup(k, run.req) is not lr.HIT for k in before)
    finally:
        tier.shutdown()
