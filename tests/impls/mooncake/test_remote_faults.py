"""kvproto-mooncake under a black-holed network and a cluster restarted empty (issue 38; MC-13).

A cluster of the test's own (``kvproto_mooncake.LocalMooncake``: ``mooncake_master`` and the storage
process ``mooncake_client``, child processes on loopback). No proxy can stand on the client's path:
it talks to the master's RPC port and its HTTP metadata server, and its transfer engine to the
storage process at the address the storage process registered with the master. So the network is
black-holed by stopping both processes (SIGSTOP, ``FrozenProcesses``; SIGCONT after): the kernel
still accepts connections and buffers what is sent, and nothing answers, as behind a dead link; a
stalled server is a real fault too. The master keeps a silent client's segment for ``client_ttl_s``
(10 s here, longer than the hole: a stopped master counts no time anyway). The empty restart kills
both (SIGKILL), starts the master again on its ports and a new storage process: the master knows no
key. The harness (``tests/impls/remote_faults.py``) drives the tier as the tiering manager does; the
tests and their bounds are those of every remote tier (``tests/impls/remote_fault_tests.py``).

After a restart the client's first request on its broken connection to the master answers RPC_FAIL for
every key; the tier sends such a call once more (MC-13), so the first loads find their keys missing and
the engine stops trusting what it remembered (TIERKIT-10): without that, 48 to 64 of the 1,024 keys
(4.7-6.2%) were HIT-then-failed here; with it 32 (3.1%), as for kvproto-obj and kvproto-redis.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from kvproto import SecondaryTier

from tests.impls._tier_runner import Runner, key, make_buffer
from tests.impls.mooncake._support import MOONCAKE_MISSING
from tests.impls.remote_fault_tests import FrozenProcesses, RemoteFaultTests
from tests.impls.remote_faults import RemoteRig

if MOONCAKE_MISSING is None:
    from kvproto_mooncake import LocalMooncake, MooncakeTier

TIMEOUTS = dict(connect_timeout_s=1.0, op_timeout_s=2.0, job_timeout_s=2.5)
"""Short enough that the hole's jobs end within the run (MC-5); the hole lasts longer than all of them."""


class KilledCluster:
    """The rig's server: the master and the storage process killed (SIGKILL), then the master started
    again on its ports and a new storage process, registered with it."""

    def __init__(self, cluster: LocalMooncake) -> None:
        self.cluster = cluster

    def pids(self) -> list[int]:
        """The master's and the storage process's PIDs (the black hole stops them)."""
        return [p.pid for p in (self.cluster.master_process, self.cluster.storage_process) if p is not None]

    def kill(self) -> None:
        for process in (self.cluster.storage_process, self.cluster.master_process):
            if process is not None:
                os.kill(process.pid, signal.SIGKILL)
                process.wait()
        self.cluster.storage_process = self.cluster.master_process = None

    def start_empty(self) -> None:
        self.cluster.start_master()
        self.cluster.start_storage()


@pytest.fixture
def killable(mooncake_cluster: LocalMooncake) -> Iterator[KilledCluster]:
    """A cluster of the test's own (the session's fixture says whether Mooncake runs here and points this
    process's clients at loopback), stopped by PID at the end."""
    cluster = LocalMooncake(storage_bytes=64 << 20, client_ttl_s=10).start()
    try:
        yield KilledCluster(cluster)
    finally:
        cluster.stop()


@pytest.fixture
def rig(killable: KilledCluster, prefix: str) -> RemoteRig:
    """kvproto-mooncake on a cluster of its own, black-holed by stopping its processes."""

    def open_tier(buffer: memoryview) -> SecondaryTier:
        return MooncakeTier(buffer, killable.cluster.config(prefix=prefix, **TIMEOUTS))

    return RemoteRig("mooncake", open_tier, FrozenProcesses(killable.pids), killable)


def test_the_first_load_after_the_cluster_restarted_empty_finds_its_keys_missing(
    killable: KilledCluster, prefix: str
) -> None:
    """The first batch get after a restart goes over the client's broken connection (RPC_FAIL for every key):
    sent once more, it answers that the keys are gone (``missing_on_load``), not a transient failure (MC-13)."""
    buffer = make_buffer()
    tier = MooncakeTier(buffer, killable.cluster.config(prefix=prefix, **TIMEOUTS))
    run = Runner(tier, buffer)
    try:
        stored = [key(i, b"restart") for i in range(8)]
        assert run.store(stored).success
        killable.kill()
        killable.start_empty()
        result, right, wrong = run.load(stored, list(range(8, 16)))
        assert not result.success and not right and not wrong
        assert (tier.stats.missing_on_load, tier.stats.failed_requests) == (len(stored), 0)
    finally:
        tier.shutdown()


class TestMooncakeRemoteFaults(RemoteFaultTests):
    """kvproto-mooncake, its cluster's processes stopped (SIGSTOP) for the black hole, killed and started
    empty for the restart (MC-13)."""
