"""With the master gone, requests fail at once instead of each waiting out Mooncake's RPC retries (MC-12):
the first request that finds it gone closes the tier's gate, and until a probe of the master's port
connects again no request reaches Mooncake's client (counted by the kit's ``KitMooncakeOps``); jobs
fail, lookups answer MISS; once the master is back the same tier stores and loads again."""

from __future__ import annotations

import threading
import time

from tests.impls._tier_runner import Runner, key, make_buffer
from tests.impls.mooncake._support import MOONCAKE_MISSING

if MOONCAKE_MISSING is None:
    from kvproto_mooncake import LocalMooncake, MooncakeTier
    from kvproto_mooncake._conformance import KitMooncakeOps
    from kvproto_mooncake._ops import Client


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
        # >= 1: a store tried while the restarted master accepts connections but does not serve yet closes it again
        assert ops.requests > asked and tier.stats.master_outages >= 1
    finally:
        tier.shutdown()


if MOONCAKE_MISSING is None:

    class HeldGets(KitMooncakeOps):
        """Mooncake's requests, with a batch get held in the client (as its RPC retries hold it when the
        master goes away mid-call) once ``hold`` is set, until ``release`` is."""

        def __init__(self) -> None:
            super().__init__()
            self.hold = False
            self.entered = threading.Event()
            self.release = threading.Event()

        def get_into(self, client: Client, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[int]:
            if self.hold:
                self.entered.set()
                self.release.wait(60)
            return super().get_into(client, keys, ptrs, sizes)


def test_a_load_in_the_client_when_the_master_goes_fails_without_waiting_for_the_client(own_cluster: LocalMooncake,
                                                                                          prefix: str) -> None:
    """MC-12: a load whose batch get is inside Mooncake's client when the master goes away fails while that
    call is still held there (its waiter probed the master, found it gone, closed the gate and gave up):
    the engine's requests behind it are not held for the client's RPC retries. Its row stays untouched, and
    once the master is back the same tier loads again (the given-up call's slot went back)."""
    ops = HeldGets()
    buffer = make_buffer()
    tier = MooncakeTier(buffer, own_cluster.config(prefix=prefix, job_timeout_s=300.0, op_timeout_s=300.0), ops=ops)
    run = Runner(tier, buffer)
    try:
        before = [key(i, b"held") for i in range(4)]
        assert run.store(before).success
        ops.hold = True
        job = run.submit_load_job(before, [4, 5, 6, 7])
        assert ops.entered.wait(20), "the load's batch get never reached the client"
        own_cluster.stop_master()
        result = run.wait(job, timeout=30)
        assert not ops.release.is_set()  # it ended with its call still held in the client
        assert not result.success and tier.stats.master_outages == 1
        assert all(run.row(s) == bytes(run.block) for s in (4, 5, 6, 7))
        ops.hold = False
        ops.release.set()
        own_cluster.start_master()
        deadline = time.monotonic() + 60
        after = [key(i, b"after-held") for i in range(4)]
        while not run.store(after, [8, 9, 10, 11]).success:
            assert time.monotonic() < deadline, "the tier never stored again after the master came back"
        _, right, wrong = run.load(after, [12, 13, 14, 15])
        assert right == set(after) and not wrong
    finally:
        ops.release.set()
        tier.shutdown()
